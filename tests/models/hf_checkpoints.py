"""Checkpoints on disk for the real-model parity tests (tests/models/test_hf_parity.py).

`write_hub_layout` writes a model's weights the way the original Hub checkpoints store them,
independently of Transformers' conversion code (so it can check that code, not repeat it):

- MoE experts one module per expert, `mlp.experts.<e>.{gate,up,down}_proj.weight` (Qwen3-MoE,
  Qwen3.5-MoE, DeepSeek-V3, GLM-MoE-DSA), where the models hold fused `gate_up_proj [E, 2I, H]` (gate rows
  first) and `down_proj [E, H, I]`;
- Qwen3.5 / Qwen3.5-MoE: the multimodal checkpoint's `model.language_model.` prefix, plus vision
  tower and MTP tensors the causal LM must ignore (`_keys_to_ignore_on_load_unexpected`);
- DeepSeek-V3: an MTP layer (`model.layers.61.*`), ignored the same way; GLM-MoE-DSA's (`model.layers.78.*`);
- DeepSeek-V4: the original checkpoint's own names (DeepSeek's reference code: no `model.` prefix,
  `embed`, `head`, `layers.<i>.attn.{wq_a,q_norm,wq_b,wkv,norm,wo_a,wo_b,attn_sink}`, the compressor's
  `{wkv,wgate,ape,norm}`, the indexer's `{wq_b,weights_proj}` with its own `compressor`,
  `layers.<i>.ffn.{gate,shared_experts.w1/w2/w3,experts.<e>.w1/w2/w3}`, `attn_norm`/`ffn_norm`,
  `hc_attn_*`/`hc_ffn_*`, `hc_head_*`) and an MTP block (`mtp.*`, ignored), which Transformers'
  conversion mapping renames on load.

Vision-language models (`vl_hub_layout`, tests/models/test_vision_language.py), the layouts their
checkpoints come in besides what `save_pretrained` writes:

- Qwen2-VL / Qwen2.5-VL: `save_pretrained` writes the original Hub layout (`model.layers.*`,
  `visual.*`, `lm_head.*`, renamed by Transformers' conversion mapping on load); the other is the
  module's own parameter names (`model.language_model.*`, `model.visual.*`), which load as they are;
- Qwen3-VL-MoE: the Hub stores the fused experts transposed, `gate_up_proj [E, H, 2I]` and
  `down_proj [E, I, H]` (the models hold `[E, 2I, H]` and `[E, H, I]`);
- Qwen2.5-Omni: the Thinker is loaded from the whole model's checkpoint, its tensors under `thinker.`,
  beside the Talker's (`talker.*`) and the speech decoder's (`token2wav.*`; a few stand-ins here);
- Qwen3-Omni-MoE: likewise (`talker.*`, `code2wav.*`), and the Thinker's experts one module per expert
  (`mlp.experts.<e>.{gate,up,down}_proj`, as Qwen3-MoE's).

Not covered: the quantized originals (DeepSeek-V3 FP8 block scales, GPT-OSS MXFP4), which need
Transformers' quantizers; GPT-OSS's bf16 layout is the one `save_pretrained` writes.
"""

from __future__ import annotations

import os
import re
from typing import Dict

import torch

EXPERTS_SPLIT = {"qwen3_moe", "qwen3_5_moe", "deepseek_v3", "glm_moe_dsa"}
LANGUAGE_MODEL_PREFIX = {"qwen3_5", "qwen3_5_moe"}
_FUSED = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<name>gate_up_proj|down_proj)$")


def hub_layout(model_key: str, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The state dict of a `*ForCausalLM` (upstream layout) rewritten in the Hub checkpoints' layout."""
    out: Dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        value = value.detach().cpu()
        m = _FUSED.match(key)
        if m and model_key in EXPERTS_SPLIT:
            prefix = m.group("prefix")
            for e in range(value.shape[0]):
                if m.group("name") == "gate_up_proj":
                    gate, up = value[e].chunk(2, dim=0)
                    out[f"{prefix}.{e}.gate_proj.weight"] = gate
                    out[f"{prefix}.{e}.up_proj.weight"] = up
                else:
                    out[f"{prefix}.{e}.down_proj.weight"] = value[e]
        else:
            out[key] = value
    if model_key in LANGUAGE_MODEL_PREFIX:
        out = {
            ("model.language_model." + k[len("model.") :] if k.startswith("model.") else k): v for k, v in out.items()
        }
        gen = torch.Generator().manual_seed(7)
        out["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2, 2, generator=gen)
        out["mtp.fc.weight"] = torch.randn(8, 8, generator=gen)
    if model_key == "deepseek_v3":
        out["model.layers.61.eh_proj.weight"] = torch.randn(8, 8, generator=torch.Generator().manual_seed(7))
    if model_key == "glm_moe_dsa":  # GLM-5's MTP layer (its 79th), which the causal LM ignores
        out["model.layers.78.eh_proj.weight"] = torch.randn(8, 8, generator=torch.Generator().manual_seed(7))
    if model_key == "deepseek_v4":
        out = deepseek_v4_original(out)
    return out


#: DeepSeek-V4: (pattern, replacement) from the Transformers module's names to the original
#: checkpoint's, applied in order to each name (the per-layer ones after `model.layers.` -> `layers.`).
_DEEPSEEK_V4_NAMES = [
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.", ""),
    (r"\.(attn|ffn)_hc\.(fn|base|scale)$", r".hc_\1_\2"),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.", ".attn.indexer.weights_proj."),
    (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".attn.indexer.wq_b."),
    (r"\.self_attn\.compressor\.indexer\.", ".attn.indexer.compressor."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.", ".ffn."),
    (r"\.sinks$", ".attn_sink"),
    (r"\.q_a_proj\.", ".wq_a."),
    (r"\.q_a_norm\.", ".q_norm."),
    (r"\.attn\.q_b_proj\.", ".attn.wq_b."),
    (r"\.kv_proj\.", ".wkv."),
    (r"\.kv_norm\.", ".norm."),
    (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."),
    (r"\.compressor\.gate_proj\.", ".compressor.wgate."),
    (r"\.position_bias$", ".ape"),
    (r"\.gate\.e_score_correction_bias$", ".gate.bias"),
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."),
    (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),
]


def deepseek_v4_original(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A DeepSeek-V4 `*ForCausalLM` state dict under the original checkpoint's names (the module
    docstring lists them): the fused experts one module per expert (`w1` gate, `w3` up, `w2` down),
    plus an MTP tensor that loading must ignore."""
    out: Dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        m = _FUSED.match(key)
        name = key
        for pattern, replacement in _DEEPSEEK_V4_NAMES:
            name = re.sub(pattern, replacement, name)
        if m:
            prefix = name[: -len(m.group("name")) - 1]  # layers.<i>.ffn.experts
            for e in range(value.shape[0]):
                if m.group("name") == "gate_up_proj":
                    gate, up = value[e].chunk(2, dim=0)
                    out[f"{prefix}.{e}.w1.weight"], out[f"{prefix}.{e}.w3.weight"] = gate, up
                else:
                    out[f"{prefix}.{e}.w2.weight"] = value[e]
        else:
            out[name] = value
    out["mtp.0.hc_head_fn"] = torch.randn(8, 8, generator=torch.Generator().manual_seed(7))
    return out


#: Vision-language models whose checkpoints come in a layout other than what `save_pretrained` writes.
VL_HUB_LAYOUT = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl_moe", "qwen2_5_omni", "qwen3_omni_moe"}
#: Tensors of such a checkpoint that belong to other parts of the whole model (upstream's from_pretrained
#: lists them as unexpected before 5.23, which declares them ignorable).
VL_OTHER_PARTS = {"qwen2_5_omni": ("talker.", "token2wav."), "qwen3_omni_moe": ("talker.", "code2wav.")}


def vl_hub_layout(model_key: str, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The state dict of a vision-language `*ForConditionalGeneration` (its module layout) in the other
    layout its checkpoints come in (the module docstring says which)."""
    if model_key not in VL_HUB_LAYOUT:
        raise ValueError(f"{model_key}: no other checkpoint layout (save_pretrained writes the Hub's)")
    if model_key == "qwen3_omni_moe":  # experts one module per expert, as Qwen3-MoE's Hub checkpoints
        state_dict = hub_layout("qwen3_moe", state_dict)
    out: Dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        value = value.detach().cpu()
        if model_key == "qwen3_vl_moe" and re.search(r"\.mlp\.experts\.(gate_up_proj|down_proj)$", key):
            value = value.transpose(1, 2)
        out[key] = value
    if model_key in VL_OTHER_PARTS:
        out = {f"thinker.{k}": v for k, v in out.items()}
        gen = torch.Generator().manual_seed(7)
        talker, speech = VL_OTHER_PARTS[model_key]
        out[f"{talker}model.norm.weight"] = torch.randn(8, generator=gen)
        out[f"{talker}codec_head.weight"] = torch.randn(8, 8, generator=gen)
        out[f"{speech}decoder.0.conv.weight"] = torch.randn(8, 8, generator=gen)
    return out


def write_checkpoint(directory: str, config, state_dict: Dict[str, torch.Tensor]) -> str:
    """Write `config.json` and a single `model.safetensors` holding `state_dict` as given."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    config.save_pretrained(directory)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state_dict.items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return directory


def write_hub_layout(directory: str, model_key: str, config, state_dict: Dict[str, torch.Tensor]) -> str:
    return write_checkpoint(directory, config, hub_layout(model_key, state_dict))


def read_safetensors(directory: str) -> Dict[str, torch.Tensor]:
    """Every tensor of every `*.safetensors` file in `directory`."""
    from safetensors.torch import load_file

    out: Dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name)))
    return out
