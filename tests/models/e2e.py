#!/usr/bin/env python3
"""End-to-end test of the real-model specs (specs/<model>/*.yaml) against upstream Transformers,
on the CPU (CI, `ctest -R real_models`, fp32) or the GPU (tests/models/run_e2e.sh): `--device`.

First, `patchgen --validate` on every spec under specs/ (example excluded), and every
specs/<model>/ folder must have a case below. Then, for every model:
  1. generate its GPU (and NPU) spec with patchgen against the installed transformers;
  2. build a tiny random config, construct the upstream *ForCausalLM and the generated one, and
     load the same state_dict into both (strict);
  3. eager: every slot on "eager" -> logits (and loss) must be torch.equal to upstream, fp32;
  4. torch: every slot on opslot's portable `torch` kernel (wrapped so each call is counted: a slot
     that never fires fails the model; and opslot's own proof of dispatch, `check_dispatch`, must say
     "ran" for every bound slot) -> logits, loss and every parameter gradient must be close
     to upstream's; the max abs errors are recorded; then again with the causal-LM loss on the
     chunked fused linear + cross-entropy (`torch_chunked`, no full logits): loss and gradients;
  4c. the model's `*ForSequenceClassification` head (upstream's GenericForSequenceClassification, whose
     forward calls `self.loss_function`; the spec's `loss_function` property returns the
     cross_entropy_loss/sequence_classification slot), single-label, regression and multi-label:
     every slot on "eager" -> pooled logits, loss and gradients torch.equal to upstream's head with the
     same weights; every slot on the counted `torch` kernels -> loss and gradients close (fp32), the
     loss kernel counted, the proof of dispatch "ran" for its slot and "not used by this model" for
     the causal-LM loss slot (which the causal-LM model, in turn, reports for this one); an instance
     override set through Transformers' setter (`model.loss_function = f`) wins over the slot; every
     `*ForSequenceClassification` class of the module (multimodal ones too) has the property;
  5. one AdamW step on the torch-kernel model: losses finite before and after, weights moved;
  5d. a spec's config slot `router_implementation` (the MoE specs' opt-in fp32 router): built with
     `router_implementation: fp32` (on the text config), the fp32 model equals upstream exactly, and in
     bf16 every router's logits are the fp32 linear of its input, its routing weights bf16, its weight
     gets a gradient, the loss finite;
  6. NPU sibling: generates, imports, declares the GPU slots minus the ones it removes, binds with
     the NPU defaults (pretending to be an NPU machine; a fake `torch_npu` is installed when the
     real one is missing) and, run eagerly here, equals upstream; then it runs with the NPU defaults
     on a simulated NPU (runtime/tests/fake_torch_npu.py computes each torch_npu operator's math):
     logits close to upstream's, a training step, every bound slot ran.
The vision-language and omni models (tests/models/vision_language.py: Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3-VL-MoE, and the Thinkers of Qwen2.5-Omni and Qwen3-Omni-MoE) go through the same stages with
their processor-facing `*ForConditionalGeneration` in place of the `*ForCausalLM`: a tiny composite
(text + vision [+ audio]) config, and real multimodal inputs (an image in one row, a video in the
other, an audio for the omni models, `mm_token_type_ids` where taken, padding, labels -100 on padding
and placeholders), so every gradient includes the towers'; they have no sequence-classification head.
One model's failure is reported and the others continue; the exit status is 1 if any failed.
The per-model table is printed and written to $OUT (e2e.md, e2e.csv, e2e.json).

Usage (normally through tests/models/run_e2e.sh):
  python3 tests/models/e2e.py --patchgen .device-bin/patchgen --source-root SITE --gen-dir DIR [--only qwen3,llama]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before torch
os.environ.setdefault("USE_HUB_KERNELS", "0")  # upstream must run its own code

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime"))

import torch  # noqa: E402

from opslot.testing import max_abs_diff  # noqa: E402  (runtime/ is on sys.path above)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vision_language  # noqa: E402  (tests/models/vision_language.py: the vision-language cases)

#: Tolerances for the `torch` kernels against upstream eager, fp32 (outputs and gradients).
RTOL, ATOL = 1e-3, 1e-4
#: Name under which the counting wrappers of the `torch` kernels are registered.
COUNTED_IMPL = "e2e_torch"

BATCH, SEQ = 2, 16


# -- the models ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    key: str  # folder under specs/
    config_class: str  # transformers.<name>
    config_kwargs: Dict[str, Any]  # model-specific (passed as is)
    causal_lm: str  # class name in the modeling module
    offset_norm: bool = False  # (1 + w) RMSNorm: norm weights are initialised around 0
    moe: bool = False  # forward with output_router_logits=True
    npu_removes: Optional[List[str]] = None  # None: no NPU sibling; else the slots it removes
    softcapped_loss_refused: bool = False  # the loss slot covers final_logit_softcapping (Gemma3)
    fp32_router: bool = False  # the spec's config slot router_implementation (fp32 router)
    seq_cls: Optional[str] = None  # the text *ForSequenceClassification head (None: the module has none)
    #: (op, variant) of the slots whose guarded code sits in a branch of upstream's forward that this
    #: config does not take (DeepSeek-V3's `if self.config.rope_interleave:`): never dispatched, and
    #: "not used by this model" in the proof of dispatch (BRANCH_CASES runs the other branch).
    other_branch: Tuple[Tuple[str, str], ...] = ()
    name: Optional[str] = None  # the row's name when a model has several cases (default: key)

    @property
    def upstream_module(self) -> str:
        return f"transformers.models.{self.key}.modeling_{self.key}"

    def spec(self, target: str) -> Path:
        return ROOT / "specs" / self.key / f"{self.key}_{target}.yaml"

    def output_name(self, target: str) -> str:
        return f"patched_modeling_{self.key}_{target}.py"


#: Dense defaults, passed only where the config class has the field.
BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_dropout=0.0,
    use_cache=False,
)

CASES = [
    Case("llama", "LlamaConfig", {}, "LlamaForCausalLM", seq_cls="LlamaForSequenceClassification"),
    Case("qwen2", "Qwen2Config", {}, "Qwen2ForCausalLM", seq_cls="Qwen2ForSequenceClassification"),
    Case("qwen3", "Qwen3Config", {}, "Qwen3ForCausalLM", npu_removes=[], seq_cls="Qwen3ForSequenceClassification"),
    Case(
        "qwen3_moe",
        "Qwen3MoeConfig",
        dict(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
            mlp_only_layers=[0],
            norm_topk_prob=True,
            output_router_logits=True,
            router_aux_loss_coef=0.01,
        ),
        "Qwen3MoeForCausalLM",
        moe=True,
        npu_removes=[],
        fp32_router=True,
        seq_cls="Qwen3MoeForSequenceClassification",
    ),
    Case(
        "qwen3_5",
        "Qwen3_5TextConfig",
        dict(
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            layer_types=["linear_attention", "full_attention"],
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        ),
        "Qwen3_5ForCausalLM",
        offset_norm=True,
        npu_removes=["causal_conv1d_slot", "chunk_gated_delta_rule_slot"],
        seq_cls="Qwen3_5TextForSequenceClassification",
    ),
    Case(
        "qwen3_5_moe",
        "Qwen3_5MoeTextConfig",
        dict(
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            layer_types=["linear_attention", "full_attention"],
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            output_router_logits=True,
            router_aux_loss_coef=0.01,
        ),
        "Qwen3_5MoeForCausalLM",
        offset_norm=True,
        moe=True,
        npu_removes=["causal_conv1d_slot", "chunk_gated_delta_rule_slot"],
        fp32_router=True,
    ),
    Case(
        "gemma3",
        "Gemma3TextConfig",
        dict(
            query_pre_attn_scalar=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
        ),
        "Gemma3ForCausalLM",
        offset_norm=True,
        softcapped_loss_refused=True,
        seq_cls="Gemma3TextForSequenceClassification",
    ),
    Case(
        "seed_oss",
        "SeedOssConfig",
        dict(residual_dropout=0.0, attention_bias=True),
        "SeedOssForCausalLM",
        npu_removes=[],
        seq_cls="SeedOssForSequenceClassification",
    ),
    Case(
        "deepseek_v3",
        "DeepseekV3Config",
        dict(
            num_key_value_heads=4,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_shared_experts=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            v_head_dim=16,
            qk_nope_head_dim=16,
            rope_interleave=True,  # the config's default, what the released checkpoints use
            norm_topk_prob=True,
        ),
        "DeepseekV3ForCausalLM",
        npu_removes=[],
        seq_cls="DeepseekV3ForSequenceClassification",
        other_branch=(("rotary_pos_emb", "full"),),
    ),
    Case(
        "deepseek_v4",
        "DeepseekV4Config",
        dict(
            num_hidden_layers=3,  # one layer of each attention type: sliding, CSA (indexer), HCA
            num_key_value_heads=1,
            moe_intermediate_size=32,
            q_lora_rank=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            mlp_layer_types=["hash_moe", "moe", "moe"],  # a hash-routed layer (random tid2eid: randomize_)
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            index_n_heads=2,
            index_head_dim=16,
            index_topk=2,  # fewer than the CSA entries of SEQ: the indexer really selects
            hc_mult=2,
            hc_sinkhorn_iters=3,
            sliding_window=8,
            o_groups=2,
            o_lora_rank=16,
            partial_rotary_factor=0.5,
            swiglu_limit=0.5,  # reached by the tiny model's pre-activations: the clamps act
            output_router_logits=True,
            router_aux_loss_coef=0.01,
        ),
        "DeepseekV4ForCausalLM",
        moe=True,
        fp32_router=True,  # both routers (the first MoE layer is hash-routed: the checked one)
    ),
    Case(
        "glm_moe_dsa",
        "GlmMoeDsaConfig",
        dict(
            num_hidden_layers=3,
            num_key_value_heads=4,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_shared_experts=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            v_head_dim=16,
            qk_nope_head_dim=16,
            norm_topk_prob=True,
            index_n_heads=8,  # with few heads relu(q.k) is often 0 for every head: ties, which top-k breaks arbitrarily
            index_head_dim=16,
            index_topk=4,  # fewer than SEQ: the indexer really selects
            indexer_types=["full", "shared", "full"],  # a layer reusing the previous layer's top-k
        ),
        "GlmMoeDsaForCausalLM",
        npu_removes=[],
    ),
    Case(
        "gpt_oss",
        "GptOssConfig",
        dict(
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            output_router_logits=True,
            router_aux_loss_coef=0.01,
        ),
        "GptOssForCausalLM",
        moe=True,
        fp32_router=True,
        seq_cls="GptOssForSequenceClassification",
    ),
]

#: The vision-language and omni models (tests/models/vision_language.py): their processor-facing
#: *ForConditionalGeneration with a tiny composite config and real multimodal inputs (image, video, audio).
VL_CASES = vision_language.VL_CASES


def _other_branch(key: str, name: str, config_kwargs: Dict[str, Any], other_branch) -> Case:
    base = next(c for c in CASES if c.key == key)
    return dataclasses.replace(
        base, name=name, config_kwargs=dict(base.config_kwargs, **config_kwargs), other_branch=other_branch
    )


#: The same spec under a config that takes the other branch of upstream's forward, so that every slot
#: runs in some case (CASES keeps one case per key: the other tests index it by key).
BRANCH_CASES = [
    _other_branch(
        "deepseek_v3",
        "deepseek_v3 (rope_interleave=False)",
        dict(rope_interleave=False),
        (("rotary_pos_emb", "interleaved"),),
    ),
]
ALL_CASES = [*CASES, *BRANCH_CASES, *VL_CASES]


# -- result record -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    model: str
    status: str = "FAIL"
    gen_lines: Optional[int] = None
    diff_added: Optional[int] = None
    diff_removed: Optional[int] = None
    slots: str = ""
    eager_logits_equal: Optional[bool] = None
    eager_loss_equal: Optional[bool] = None
    eager_grads_equal: Optional[bool] = None
    torch_logits_max_abs_err: Optional[float] = None
    torch_loss_abs_err: Optional[float] = None
    chunked_ce_loss_abs_err: Optional[float] = None
    chunked_ce_grads_max_abs_err: Optional[float] = None
    torch_grads_max_abs_err: Optional[float] = None
    slot_calls: str = ""
    cuda_logits_max_abs_err: Optional[float] = None
    cuda_loss_abs_err: Optional[float] = None
    cuda_grads_max_abs_err: Optional[float] = None
    cuda_slot_calls: str = ""
    seq_cls: str = ""
    seq_cls_loss_max_abs_err: Optional[float] = None
    seq_cls_grads_max_abs_err: Optional[float] = None
    step: str = ""
    npu: str = ""
    errors: List[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


class CheckFailed(Exception):
    """A check of the e2e run did not hold (the message says which)."""


# -- generation ---------------------------------------------------------------------------------------
def generate(patchgen: str, spec: Path, source_root: str, out_dir: Path, output_name: str) -> Tuple[Path, Path]:
    """Run patchgen on one spec; returns (generated .py, .diff). Raises CheckFailed with its stderr."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [patchgen, str(spec.relative_to(ROOT)), "--source-root", source_root, "-o", str(out_dir), "--diff"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckFailed(f"patchgen exit {proc.returncode}: {' '.join(cmd)}\n{proc.stderr.strip()}")
    found = sorted(out_dir.rglob(output_name))
    if len(found) != 1:
        raise CheckFailed(f"patchgen wrote {len(found)} files named {output_name} under {out_dir}")
    diff = found[0].with_suffix(".diff")
    if not diff.is_file():
        raise CheckFailed(f"patchgen --diff wrote no {diff.name}")
    return found[0], diff


def diff_counts(diff: Path) -> Tuple[int, int]:
    added = removed = 0
    for line in diff.read_text(encoding="utf-8").splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def import_generated(path: Path, name: Optional[str] = None) -> types.ModuleType:
    """Import a generated module from `path` as `name` (default: the file's stem)."""
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- models and inputs --------------------------------------------------------------------------------
def make_config(case: Case):
    import transformers

    cls = getattr(transformers, case.config_class)
    fields = getattr(cls, "__dataclass_fields__", None)
    kwargs = {k: v for k, v in BASE.items() if fields is None or k in fields}
    kwargs.update(case.config_kwargs)
    config = cls(**kwargs)
    config._attn_implementation = "eager"
    if case.moe or hasattr(config, "num_experts") or hasattr(config, "n_routed_experts"):
        config._experts_implementation = "eager"  # the moe guards live in the eager experts forward
    return config


def randomize_(model: torch.nn.Module, offset_norm: bool, seed: int = 1234) -> None:
    """Deterministic non-trivial weights: matrices N(0, 0.1); RMSNorm weights around 1, or around 0
    for the (1 + w) norms of offset models (gated norms multiply by w: around 1); other vectors
    (biases, A_log, dt_bias, sinks) N(0, 0.1); DeepSeek-V4's hash-routing tables random experts."""
    gen = torch.Generator().manual_seed(seed)
    norm_centre = {}
    for mod_name, mod in model.named_modules():
        kind = type(mod).__name__
        if kind.endswith("RMSNorm") or kind.endswith("RMSNormGated"):
            offset = offset_norm and not kind.endswith("Gated")
            norm_centre[f"{mod_name}.weight" if mod_name else "weight"] = 0.0 if offset else 1.0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            centre = norm_centre.get(name, 0.0)
            p.copy_((centre + 0.1 * noise).to(p.dtype))
        # DeepSeek-V4's hash routers: a token -> experts table (a buffer, zeros until a checkpoint fills
        # it: every token would go to expert 0); distinct random experts per token
        for name, table in sorted(model.named_buffers()):
            if name.endswith("tid2eid"):
                experts = model.config.get_text_config().n_routed_experts
                picks = torch.rand(table.shape[0], experts, generator=gen).argsort(dim=-1)[:, : table.shape[1]]
                table.copy_(picks.to(table.dtype))


def make_inputs(vocab: int, device: torch.device) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(4321)
    input_ids = torch.randint(0, vocab, (BATCH, SEQ), generator=gen)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, -4:] = 0  # right padding in the second row
    labels = input_ids.clone()
    labels[attention_mask == 0] = -100
    return {k: v.to(device) for k, v in dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels).items()}


def case_config(case):
    """The tiny config of a text case (`make_config`) or of a vision-language one (its composite config)."""
    if isinstance(case, vision_language.VLCase):
        return vision_language.make_config(case)
    return make_config(case)


def case_inputs(case, config, device: torch.device) -> Dict[str, torch.Tensor]:
    """The inputs of a text case (`make_inputs`) or of a vision-language one (an image in one row, a
    video in the other, padding, labels)."""
    if isinstance(case, vision_language.VLCase):
        return vision_language.make_inputs(case, config, device)
    return make_inputs(config.vocab_size, device)


def forward_kwargs(inputs, moe: bool) -> Dict[str, Any]:
    kwargs = dict(inputs, use_cache=False)
    if moe:
        kwargs["output_router_logits"] = True  # reaches load_balancing_loss_func
    return kwargs


def run_model(model, inputs, moe: bool):
    """Forward + backward; returns (logits, loss, {param name: grad})."""
    model.zero_grad(set_to_none=True)
    out = model(**forward_kwargs(inputs, moe))
    if out.loss is None or not torch.isfinite(out.loss):
        raise CheckFailed(f"loss is {out.loss}")
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    logits = None if out.logits is None else out.logits.detach().clone()
    return logits, out.loss.detach().clone(), grads


# -- counting kernels ------------------------------------------------------------------------------
#: Calls per (op, variant) of the counted kernels, per counted implementation name.
CALLS: Dict[Tuple[str, str], int] = {}
CUDA_CALLS: Dict[Tuple[str, str], int] = {}
#: Name under which the counting wrappers of the `cuda` kernels are registered.
COUNTED_CUDA = "e2e_cuda"
#: (op, variant) pairs that have a `cuda` kernel (filled by main on a GPU).
CUDA_PAIRS: List[Tuple[str, str]] = []


def register_counted_kernels(base: str = "torch", counted: str = COUNTED_IMPL, calls=CALLS) -> List[Tuple[str, str]]:
    """Register, for every (op, variant) that has a `base` kernel, an impl `counted` that calls it
    and counts the call (public registry API; proves that each guard really dispatches). Returns
    the (op, variant) pairs covered."""
    from opslot.registry import KERNEL_REGISTRY, KernelSpec

    pairs = []
    for (op, variant), names in sorted(KERNEL_REGISTRY.list_available(include_unsupported=True).items()):
        if base not in names:
            continue
        pairs.append((op, variant))
        if KERNEL_REGISTRY.get(op, variant, counted) is not None:
            continue
        spec = KERNEL_REGISTRY.get(op, variant, base)

        def factory(op=op, variant=variant):
            inner = KERNEL_REGISTRY.get(op, variant, base).load()

            def wrapper(*args, **kwargs):
                calls[(op, variant)] = calls.get((op, variant), 0) + 1
                return inner(*args, **kwargs)

            return wrapper

        KERNEL_REGISTRY.register(
            KernelSpec(counted, op, variant, factory, spec.hardware, description=f"e2e: counted {base}")
        )
    return pairs


#: The sequence-classification loss: its slot runs in a *ForSequenceClassification head only.
SEQ_CLS = ("cross_entropy_loss", "sequence_classification")


def case_label(case) -> str:
    """A case's row name: its `name` (a model's other-branch case), else its key."""
    return getattr(case, "name", None) or case.key


def guarded_slots(module) -> Dict[str, Any]:
    """The module's slots (`opslot.module_slots`) less those it declares without a guard: a spec whose
    every guard of a slot is for other upstream releases (DeepSeek-V4's RMSNorm before 5.23) still
    declares the slot (patchgen's header lists it under "slots without a guard"); nothing can
    dispatch through it, so it is not bound here, and its op's kernels are not expected to run."""
    from opslot import module_slots
    from opslot.dispatch import source_index

    guarded = {g.slot for g in source_index(module.__file__).guards}
    return {name: s for name, s in module_slots(module).items() if name in guarded}


def causal_lm_slots(slots: Dict[str, Any], case: Any = None) -> Dict[str, Any]:
    """The slots a *ForCausalLM can run: all but the sequence-classification loss (and the slots of
    `case.other_branch`, whose code this case's config does not take)."""
    skip = {SEQ_CLS, *getattr(case, "other_branch", ())}
    return {name: s for name, s in slots.items() if (s.op, s.variant) not in skip}


def dispatch_errors(model, stage: str, slots: Optional[Dict[str, Any]] = None, case: Any = None) -> List[str]:
    """opslot's proof of dispatch after the step just taken (the model's first): every slot bound to
    a kernel must have run ("not reached" raises UnreachedSlotError; "not used by this model" is not
    expected in these configurations either), except those of `slots` (name -> OpSlot of the module)
    that the model cannot use: in a *ForCausalLM, the sequence-classification loss slot must be
    "not used by this model", and so must the slots of `case.other_branch` and the module-level
    slots declared without a guard (not in `slots`, from `guarded_slots`: DeepSeek-V4's RMSNorm
    from 5.23, which `rms_norm_implementation` binds with the guarded unweighted norm)."""
    from opslot.dispatch import UnreachedSlotError, check_dispatch

    try:
        report = check_dispatch(model, allow_unreached=False)
    except UnreachedSlotError as exc:
        return [f"{stage}: {exc}"]
    not_taken = {SEQ_CLS, *getattr(case, "other_branch", ())}
    unused = {name for name, s in (slots or {}).items() if (s.op, s.variant) in not_taken}
    if slots is not None:
        unused |= {e.slot for e in report.entries if e.scope == "module" and e.slot not in slots}
    return [
        f"{stage}: slot {e.slot} ({e.op}/{e.variant} -> {e.impl}) is {e.status!r}, not "
        f"{'not used by this model' if e.slot in unused else 'ran'}"
        for e in report.entries
        if e.impl != "eager" and e.status != ("not used by this model" if e.slot in unused else "ran")
    ]


def ops_for(slots: Dict[str, Any], impl: str) -> Dict[str, str]:
    """An ops config choosing `impl` for every op the slots use (`fused_<impl>` for moe)."""
    ops = {}
    for slot in slots.values():
        ops[f"{slot.op}_implementation"] = f"fused_{impl}" if (slot.op == "moe" and impl != "eager") else impl
    return ops


@contextlib.contextmanager
def fake_torch_npu():
    """Install a stand-in `torch_npu` module when the real one is not importable (binding only)."""
    if importlib.util.find_spec("torch_npu") is not None:
        yield
        return
    fake = types.ModuleType("torch_npu")
    fake.__dict__["__opslot_e2e_fake__"] = True
    sys.modules["torch_npu"] = fake
    try:
        yield
    finally:
        sys.modules.pop("torch_npu", None)


# -- one model -------------------------------------------------------------------------------------
def check_model(case: Case, args, device: torch.device) -> Result:
    from opslot import build_model
    from opslot.dispatch import watch_dispatch
    from opslot.testing import compare_models

    res = Result(case_label(case))
    started = time.time()
    try:
        # 1. generate
        gen_py, gen_diff = generate(
            args.patchgen, case.spec("gpu"), args.source_root, Path(args.gen_dir) / case.key, case.output_name("gpu")
        )
        res.gen_lines = len(gen_py.read_text(encoding="utf-8").splitlines())
        res.diff_added, res.diff_removed = diff_counts(gen_diff)
        module = import_generated(gen_py)
        slots = guarded_slots(module)
        if not slots:
            raise CheckFailed("generated module declares no OpSlot")
        res.slots = " ".join(f"{s.op}/{s.variant}" for _, s in sorted(slots.items()))

        # 2. upstream model with deterministic random weights
        config = case_config(case)
        upstream_cls = getattr(importlib.import_module(case.upstream_module), case.causal_lm)
        torch.manual_seed(0)
        upstream = upstream_cls(config)
        randomize_(upstream, case.offset_norm)
        upstream.to(device).train()
        state = upstream.state_dict()
        inputs = case_inputs(case, config, device)
        up_logits, up_loss, up_grads = run_model(upstream, inputs, case.moe)

        def build(ops, module_=module):
            model = build_model(config, ops=ops, module=module_, model_class=case.causal_lm)
            model.load_state_dict(state, strict=True)
            # As build_model does (idempotent), but warning only: stage 4 then reports every unreached
            # kernel (dispatch_errors) after comparing the whole model with upstream.
            watch_dispatch(model, allow_unreached=True)
            return model.to(device).train()

        # 3. eager: bit-exact
        eager = build(ops_for(slots, "eager"))
        e_logits, e_loss, e_grads = run_model(eager, inputs, case.moe)
        res.eager_logits_equal = bool(torch.equal(e_logits, up_logits))
        res.eager_loss_equal = bool(torch.equal(e_loss, up_loss))
        res.eager_grads_equal = set(e_grads) == set(up_grads) and all(
            torch.equal(e_grads[n], up_grads[n]) for n in up_grads
        )
        if not res.eager_logits_equal:
            res.errors.append(f"eager logits differ from upstream (max abs {max_abs_diff(e_logits, up_logits):.3g})")
        if not res.eager_loss_equal:
            res.errors.append(f"eager loss {e_loss.item()!r} != upstream {up_loss.item()!r}")
        if not res.eager_grads_equal:
            differ = sorted(
                n
                for n in set(up_grads) | set(e_grads)
                if n not in e_grads or n not in up_grads or not torch.equal(e_grads[n], up_grads[n])
            )
            res.errors.append(
                f"eager gradients differ from upstream: {', '.join(differ[:5])}"
                + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
            )
        del eager

        # 4. torch kernels (counted): close to upstream (opslot.testing.compare_models), every slot fires
        CALLS.clear()
        tmodel = build(ops_for(slots, COUNTED_IMPL))
        diff = compare_models(upstream, tmodel, forward_kwargs(inputs, case.moe))
        if diff.logits is None:
            res.errors.append("torch kernels returned no logits")
        else:
            res.torch_logits_max_abs_err = diff.logits
            if diff.logits > ATOL + RTOL * float(up_logits.abs().max()):
                res.errors.append(f"torch logits not close (max abs {diff.logits:.3g})")
        if diff.loss is None:
            res.errors.append("torch kernels returned no loss")
        else:
            res.torch_loss_abs_err = diff.loss
            if diff.loss > ATOL + RTOL * abs(float(up_loss)):
                res.errors.append(f"torch loss off by {diff.loss:.3g} (upstream {float(up_loss):.6f})")
        res.torch_grads_max_abs_err = diff.grads
        for n, err in diff.grad_by_param.items():
            if err > ATOL + RTOL * float(up_grads[n].abs().max()):
                res.errors.append(f"torch grad of {n} not close (max abs {err:.3g})")
        fired = {f"{s.op}/{s.variant}": CALLS.get((s.op, s.variant), 0) for s in causal_lm_slots(slots, case).values()}
        res.slot_calls = " ".join(f"{k}:{v}" for k, v in sorted(fired.items()))
        for k, v in sorted(fired.items()):
            if v == 0:
                res.errors.append(f"slot {k} never dispatched with the torch kernels")
        res.errors += dispatch_errors(tmodel, "torch kernels", slots, case)

        # 4b. the chunked fused linear + cross-entropy (no full logits) in place of the causal-LM loss
        if any(sl.op == "cross_entropy_loss" for sl in slots.values()):
            ops = dict(ops_for(slots, COUNTED_IMPL), cross_entropy_loss_implementation="torch_chunked")
            cdiff = compare_models(upstream, build(ops), forward_kwargs(inputs, case.moe))
            res.chunked_ce_loss_abs_err, res.chunked_ce_grads_max_abs_err = cdiff.loss, cdiff.grads
            if cdiff.loss is None or cdiff.loss > ATOL + RTOL * abs(float(up_loss)):
                res.errors.append(f"chunked cross-entropy loss off by {cdiff.loss}")
            for n, err in cdiff.grad_by_param.items():
                if err > ATOL + RTOL * float(up_grads[n].abs().max()):
                    res.errors.append(f"chunked cross-entropy: grad of {n} not close (max abs {err:.3g})")

        # 4c. the sequence-classification head: eager equal, torch kernels close, the loss slot ran
        check_sequence_classification_classes(case, module, res)
        if case.seq_cls is not None:
            res.seq_cls = check_sequence_classification(case, module, slots, device, res)

        # 5. one optimizer step on the torch-kernel model
        _, loss_before, _ = run_model(tmodel, inputs, case.moe)
        opt = torch.optim.AdamW(tmodel.parameters(), lr=1e-3)
        before = {n: p.detach().clone() for n, p in tmodel.named_parameters()}
        opt.step()
        moved = max(max_abs_diff(p.detach(), before[n]) for n, p in tmodel.named_parameters())
        _, loss_after, _ = run_model(tmodel, inputs, case.moe)
        res.step = f"loss {float(loss_before):.4f} -> {float(loss_after):.4f}"
        if not math.isfinite(float(loss_after)) or moved == 0.0:
            res.errors.append(f"optimizer step: loss after {float(loss_after)}, max weight change {moved}")
        del tmodel, opt

        # 5c. on a GPU: every slot that has a `cuda` kernel on it (the others on `torch`), counted
        if device.type == "cuda" and args.cuda_kernels:
            check_cuda_kernels(slots, build, upstream, inputs, case, up_loss, up_logits, up_grads, res)
            if case.seq_cls is not None and SEQ_CLS in CUDA_PAIRS:
                res.seq_cls += "; cuda: " + check_sequence_classification(
                    case, module, slots, device, res, kernel=COUNTED_CUDA, calls=CUDA_CALLS, eager=False
                )

        # 5b. a soft-capped config must make the loss kernel refuse, never silently drop the capping
        if case.softcapped_loss_refused:
            res.step += "; " + check_softcap_refused(case, config, state, inputs, build_model, module, device, res)

        # 5d. the opt-in fp32 MoE router (the spec's config slot `router_implementation`)
        if case.fp32_router:
            res.step += "; " + check_router_fp32(
                case, config, state, inputs, build, module, slots, up_logits, device, res
            )

        # 6. NPU sibling
        if case.npu_removes is not None:
            res.npu = check_npu(case, args, config, slots, state, inputs, up_logits, device, res)
    except CheckFailed as exc:
        res.errors.append(str(exc))
    except Exception as exc:  # one model's crash must not stop the others
        res.errors.append(f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    res.status = "PASS" if not res.errors else "FAIL"
    res.seconds = round(time.time() - started, 1)
    return res


def check_cuda_kernels(slots, build, upstream, inputs, case, up_loss, up_logits, up_grads, res) -> None:
    """opslot's `cuda` kernels in the model: close to upstream (fp32), every cuda slot fires (counted,
    and opslot's proof of dispatch says every bound slot ran), and an AdamW step works."""
    from opslot.testing import compare_models

    cuda_pairs = set(CUDA_PAIRS)
    ops = ops_for(slots, COUNTED_IMPL)
    for slot in slots.values():
        if (slot.op, slot.variant) in cuda_pairs:
            ops[f"{slot.op}_implementation"] = f"fused_{COUNTED_CUDA}" if slot.op == "moe" else COUNTED_CUDA
    CUDA_CALLS.clear()
    cmodel = build(ops)
    diff = compare_models(upstream, cmodel, forward_kwargs(inputs, case.moe))
    res.cuda_logits_max_abs_err, res.cuda_loss_abs_err, res.cuda_grads_max_abs_err = diff.logits, diff.loss, diff.grads
    if diff.logits is not None and diff.logits > ATOL + RTOL * float(up_logits.abs().max()):
        res.errors.append(f"cuda logits not close (max abs {diff.logits:.3g})")
    if diff.loss is None or diff.loss > ATOL + RTOL * abs(float(up_loss)):
        res.errors.append(f"cuda loss off by {diff.loss}")
    for n, err in diff.grad_by_param.items():
        if err > ATOL + RTOL * float(up_grads[n].abs().max()):
            res.errors.append(f"cuda: grad of {n} not close (max abs {err:.3g})")
    fired = {
        f"{s.op}/{s.variant}": CUDA_CALLS.get((s.op, s.variant), 0)
        for s in causal_lm_slots(slots, case).values()
        if (s.op, s.variant) in cuda_pairs
    }
    res.cuda_slot_calls = " ".join(f"{k}:{v}" for k, v in sorted(fired.items()))
    for k, v in sorted(fired.items()):
        if v == 0:
            res.errors.append(f"slot {k} never dispatched with the cuda kernels")
    res.errors += dispatch_errors(cmodel, "cuda kernels", slots, case)
    _, loss_before, _ = run_model(cmodel, inputs, case.moe)
    opt = torch.optim.AdamW(cmodel.parameters(), lr=1e-3)
    opt.step()
    _, loss_after, _ = run_model(cmodel, inputs, case.moe)
    res.step += f"; cuda: loss {float(loss_before):.4f} -> {float(loss_after):.4f}"
    if not math.isfinite(float(loss_after)):
        res.errors.append(f"cuda optimizer step: loss after {float(loss_after)}")


#: The problem types of the sequence-classification head: (problem, num_labels, labels of a batch of
#: BATCH). config.problem_type is left unset: upstream's loss and the kernel both infer it from the
#: labels and num_labels (and set it on the config).
SEQ_CLS_PROBLEMS = [
    ("single_label_classification", 3, lambda: torch.tensor([0, 2])),
    ("regression", 1, lambda: torch.tensor([0.5, -1.25])),
    ("multi_label_classification", 3, lambda: torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])),
]


def seq_cls_inputs(vocab: int, device: torch.device) -> Dict[str, torch.Tensor]:
    """Two rows, the second right-padded with pad_token_id 0 (the head pools the last non-pad token)."""
    gen = torch.Generator().manual_seed(2468)
    input_ids = torch.randint(1, vocab, (BATCH, SEQ), generator=gen)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    input_ids[1, -4:], attention_mask[1, -4:] = 0, 0
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}


def check_sequence_classification_classes(case: Case, module, res: Result) -> None:
    """Every *ForSequenceClassification class of the generated module (the multimodal ones too) has
    the spec's `loss_function`: a property with Transformers' own setter; case.seq_cls is one of them,
    and a case without one has none."""
    from transformers.modeling_utils import PreTrainedModel

    classes = sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type)
        and name.endswith("ForSequenceClassification")
        and value.__module__ == module.__name__
    )
    if (case.seq_cls is None) != (not classes) or (case.seq_cls is not None and case.seq_cls not in classes):
        res.errors.append(f"sequence-classification heads of the module: {classes}, case.seq_cls {case.seq_cls!r}")
    for name in classes:
        prop = vars(getattr(module, name)).get("loss_function")
        if not isinstance(prop, property) or prop.fset is not PreTrainedModel.loss_function.fset:
            res.errors.append(f"{name}.loss_function is {prop!r}, not a property with Transformers' setter")


def check_sequence_classification(
    case: Case,
    module,
    slots,
    device: torch.device,
    res: Result,
    kernel: str = COUNTED_IMPL,
    calls=CALLS,
    eager: bool = True,
) -> str:
    """The `case.seq_cls` head (upstream's GenericForSequenceClassification) against upstream's head with
    the same weights, for each of SEQ_CLS_PROBLEMS: every slot "eager" -> pooled logits, loss and
    gradients torch.equal (when `eager`); every slot on the counted torch kernels and the loss on
    `kernel` -> loss, logits and gradients close, the loss kernel called once, the proof of dispatch
    "ran" for the sequence-classification slot and "not used by this model" for the causal-LM loss
    slot. Then an instance's own loss function (Transformers' setter) wins over the slot. The head's
    base model is built by upstream's AutoModel.from_config (upstream's classes): its slots are not
    asserted on here (docs/runtime.md, "Proof of dispatch")."""
    import copy
    import warnings

    from opslot import OpSlot, build_model
    from opslot.dispatch import UnreachedSlotWarning, check_dispatch, watch_dispatch

    up_cls = getattr(importlib.import_module(case.upstream_module), case.seq_cls)
    seq_slot = next(name for name, s in slots.items() if (s.op, s.variant) == SEQ_CLS)
    causal_loss = [name for name, s in slots.items() if (s.op, s.variant) == ("cross_entropy_loss", "causal")]
    ops = dict(ops_for(slots, COUNTED_IMPL), cross_entropy_loss_implementation=kernel)
    tol = lambda ref: ATOL + RTOL * float(ref.abs().max())  # noqa: E731
    worst_loss = worst_grad = 0.0
    done = []
    for problem, num_labels, make_labels in SEQ_CLS_PROBLEMS:
        where = f"{case.seq_cls} ({problem}, {kernel})"
        config = make_config(case)
        config.num_labels, config.pad_token_id = num_labels, 0
        torch.manual_seed(0)
        upstream = up_cls(copy.deepcopy(config))
        randomize_(upstream, case.offset_norm)
        upstream.to(device).train()
        state = upstream.state_dict()
        inputs = dict(seq_cls_inputs(config.vocab_size, device), labels=make_labels().to(device))
        up_logits, up_loss, up_grads = run_model(upstream, inputs, False)
        if upstream.config.problem_type != problem:
            raise CheckFailed(f"{where}: upstream inferred problem_type {upstream.config.problem_type!r}")

        def build(ops_):
            model = build_model(copy.deepcopy(config), ops=ops_, module=module, model_class=case.seq_cls)
            model.load_state_dict(state, strict=True)
            watch_dispatch(model, allow_unreached=True)  # the base model's slots: upstream's classes
            return model.to(device).train()

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreachedSlotWarning)
            if eager:
                e_logits, e_loss, e_grads = run_model(build(ops_for(slots, "eager")), inputs, False)
                same_grads = set(e_grads) == set(up_grads) and all(
                    torch.equal(e_grads[n], up_grads[n]) for n in up_grads
                )
                if not (torch.equal(e_logits, up_logits) and torch.equal(e_loss, up_loss) and same_grads):
                    res.errors.append(
                        f"{where}: eager head differs from upstream (loss {float(e_loss)!r} vs "
                        f"{float(up_loss)!r}, logits max abs {max_abs_diff(e_logits, up_logits):.3g})"
                    )
            calls.pop(SEQ_CLS, None)
            model = build(ops)
            logits, loss, grads = run_model(model, inputs, False)
            status = check_dispatch(model, allow_unreached=True).as_dict()
        if calls.get(SEQ_CLS, 0) != 1:
            res.errors.append(f"{where}: the loss kernel ran {calls.get(SEQ_CLS, 0)} time(s), not once")
        expected = dict({seq_slot: "ran"}, **{name: "not used by this model" for name in causal_loss})
        got = {name: status.get(name) for name in expected}
        if got != expected:
            res.errors.append(f"{where}: proof of dispatch {got}, expected {expected}")
        if model.config.problem_type != problem:
            res.errors.append(f"{where}: problem_type {model.config.problem_type!r}")
        worst_loss = max(worst_loss, max_abs_diff(loss, up_loss))
        if max_abs_diff(loss, up_loss) > tol(up_loss) or max_abs_diff(logits, up_logits) > tol(up_logits):
            res.errors.append(f"{where}: loss {float(loss)!r} / logits not close to upstream ({float(up_loss)!r})")
        if set(grads) != set(up_grads):
            res.errors.append(f"{where}: parameters with gradients differ: {sorted(set(grads) ^ set(up_grads))}")
        for n in sorted(set(grads) & set(up_grads)):
            err = max_abs_diff(grads[n], up_grads[n])
            worst_grad = max(worst_grad, err)
            if err > tol(up_grads[n]):
                res.errors.append(f"{where}: grad of {n} not close (max abs {err:.3g})")
        done.append(problem.split("_")[0])

        if problem == SEQ_CLS_PROBLEMS[0][0]:  # Transformers' setter: an instance's own loss function wins
            own = []
            upstream_loss = upstream.loss_function

            def spy(**kwargs):
                own.append(1)
                return upstream_loss(**kwargs)

            before = calls.get(SEQ_CLS, 0)
            model.loss_function = spy
            out = model(**forward_kwargs(inputs, False))
            if not (
                own
                and calls.get(SEQ_CLS, 0) == before
                and model.loss_function is spy
                and vars(model).get("_loss_function") is spy
                and max_abs_diff(out.loss, up_loss) <= tol(up_loss)
            ):
                res.errors.append(
                    f"{where}: `model.loss_function = f` did not make the head use f "
                    f"(f called {len(own)}x, kernel {calls.get(SEQ_CLS, 0) - before}x)"
                )
            del model._loss_function
            if not (isinstance(model.loss_function, OpSlot) and model.loss_function.impl == kernel):
                res.errors.append(f"{where}: without an own loss function, loss_function is {model.loss_function!r}")
    if kernel == COUNTED_IMPL:
        res.seq_cls_loss_max_abs_err, res.seq_cls_grads_max_abs_err = worst_loss, worst_grad
    return (
        f"{'/'.join(done)}: {'eager equal, ' if eager else ''}loss Δ {worst_loss:.1e}, grads Δ {worst_grad:.1e}, "
        f"{seq_slot} ran"
    )


def check_softcap_refused(case, config, state, inputs, build_model, module, device, res) -> str:
    import copy

    capped = copy.deepcopy(config)
    capped.final_logit_softcapping = 30.0
    try:  # refused when the model is built (opslot checks the config at bind time), else at the forward
        model = build_model(
            capped, ops={"cross_entropy_loss_implementation": COUNTED_IMPL}, module=module, model_class=case.causal_lm
        )
        model.load_state_dict(state, strict=True)
        model.to(device).train()
        model(**forward_kwargs(inputs, case.moe))
    except ValueError as exc:
        if "softcapping" in str(exc):
            return "softcapped loss refused"
        res.errors.append(f"softcapped config: unexpected ValueError {exc}")
        return "softcapped: wrong error"
    res.errors.append("softcapped config: the causal-LM loss kernel ran instead of refusing")
    return "softcapped: NOT refused"


def router_of(model) -> torch.nn.Module:
    """The first module of `model` that has the router's config slot."""
    routers = [m for m in model.modules() if hasattr(m, "router_implementation")]
    if not routers:
        raise CheckFailed("no module has the config slot router_implementation (the spec's config_slot)")
    return routers[0]


def check_router_fp32(case, config, state, inputs, build, module, slots, up_logits, device, res) -> str:
    """`router_implementation: fp32` on the model config (the MoE specs' config_slot + edit_body):
    in fp32 the router computes what upstream's does, so the model equals upstream exactly; in bf16
    its logits are the fp32 linear of the router's bf16 input (upstream's are rounded to bf16), the
    routing weights come back in bf16, and the model trains (loss finite, router weights get
    gradients). Without the attribute the router runs upstream's code (step 3 checks it)."""
    import copy

    from opslot import build_model

    fp32_config = copy.deepcopy(config)
    # the router is built from the text config (a composite VL/omni config's text_config)
    fp32_config.get_text_config().router_implementation = "fp32"
    model = build_model(fp32_config, ops=ops_for(slots, "eager"), module=module, model_class=case.causal_lm)
    model.load_state_dict(state, strict=True)
    model.to(device).train()
    router = router_of(model)
    if (router.router_implementation.value, router_of(build(ops_for(slots, "eager"))).router_implementation.value) != (
        "fp32",
        "eager",
    ):
        res.errors.append("router config slot: not bound from config.router_implementation")
    with torch.no_grad():
        logits = model(**forward_kwargs(inputs, case.moe)).logits
    if not torch.equal(logits, up_logits):
        res.errors.append(
            f"fp32 router, fp32 model: logits differ from upstream (max abs {max_abs_diff(logits, up_logits):.3g})"
        )

    # every router of the model (DeepSeek-V4: hash-routed and top-k layers), its first call each
    routers = [m for m in model.modules() if hasattr(m, "router_implementation")]
    seen = {}

    def hook(mod, args, out):
        seen.setdefault(mod, (args[0].detach(), out))

    model.to(torch.bfloat16)
    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        out = model(**forward_kwargs(inputs, case.moe))
        out.loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    for r in routers:
        if r not in seen:
            res.errors.append(f"fp32 router, bf16 model: a {type(r).__name__} was never called")
            continue
        hidden, (router_logits, router_scores, _) = seen[r]
        bias = getattr(r, "bias", None)
        expected = torch.nn.functional.linear(
            hidden.reshape(-1, hidden.shape[-1]).float(), r.weight.float(), None if bias is None else bias.float()
        )
        if router_logits.dtype != torch.float32 or not torch.equal(router_logits.detach(), expected):
            res.errors.append(
                f"fp32 router, bf16 model: {type(r).__name__} logits ({router_logits.dtype}) are not the fp32 "
                f"linear of the router input"
            )
        if router_scores.dtype != torch.bfloat16:
            res.errors.append(
                f"fp32 router, bf16 model: {type(r).__name__} routing weights are {router_scores.dtype}, not bf16"
            )
    no_grad = [type(r).__name__ for r in routers if r.weight.grad is None]
    if not torch.isfinite(out.loss) or no_grad:
        res.errors.append(f"fp32 router, bf16 model: loss {float(out.loss)}, no weight gradient in {no_grad}")
    return (
        f"fp32 router: fp32 equal={torch.equal(logits, up_logits)}, bf16 logits fp32 in {len(routers)} routers, "
        f"bf16 loss {float(out.loss):.4f}"
    )


def check_npu(case, args, config, gpu_slots, state, inputs, up_logits, device, res) -> str:
    from opslot import DeviceInfo, OpsImplementationConfig, build_model, module_slots, use_device

    npu_py, _ = generate(
        args.patchgen, case.spec("npu"), args.source_root, Path(args.gen_dir) / case.key, case.output_name("npu")
    )
    module = import_generated(npu_py)
    slots = module_slots(module)
    expected = sorted(set(gpu_slots) - set(case.npu_removes))
    if sorted(slots) != expected:
        res.errors.append(f"NPU slots {sorted(slots)} != GPU slots minus removed {expected}")
    with fake_torch_npu(), use_device(DeviceInfo("npu")):
        chosen = OpsImplementationConfig().validate({(s.op, s.variant) for s in slots.values()})
    model = build_model(config, ops=ops_for(slots, "eager"), module=module, model_class=case.causal_lm)
    model.load_state_dict(state, strict=True)
    model.to(device).train()
    with torch.no_grad():
        logits = model(**forward_kwargs(inputs, case.moe)).logits
    if not torch.equal(logits, up_logits):
        res.errors.append(
            f"NPU file, eager on {device.type}: logits differ (max abs {max_abs_diff(logits, up_logits):.3g})"
        )
    npu_kernels = sorted(f"{op}:{impl}" for (op, _), impl in chosen.items() if impl != "eager")
    ran = run_npu_defaults(case, config, module, state, inputs, up_logits, device, res) if npu_kernels else ""
    return (
        f"{len(slots)} slots, NPU defaults {'/'.join(npu_kernels) or 'eager'}, "
        f"eager equal={torch.equal(logits, up_logits)}{ran}"
    )


def run_npu_defaults(case, config, module, state, inputs, up_logits, device, res) -> str:
    """The NPU file with the NPU defaults on a simulated NPU: runtime/tests/fake_torch_npu.py's
    torch_npu computes each operator's math on the CPU (installed after Transformers is imported, which
    probes for it). Logits close to upstream's, a training step, every bound slot ran."""
    from opslot import DeviceInfo, build_model, module_slots, use_device

    spec = importlib.util.spec_from_file_location("fake_torch_npu", ROOT / "runtime" / "tests" / "fake_torch_npu.py")
    fake_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake_mod)
    fake = fake_mod.make_fake_torch_npu()
    saved = sys.modules.get("torch_npu")
    sys.modules["torch_npu"] = fake
    try:
        with use_device(DeviceInfo("npu")):
            model = build_model(config, module=module, model_class=case.causal_lm)
            model.load_state_dict(state, strict=True)
            model.to(device).train()
            out = model(**forward_kwargs(inputs, case.moe))
            out.loss.backward()
            res.errors.extend(dispatch_errors(model, "NPU defaults", module_slots(module), case))
    finally:
        if saved is None:
            sys.modules.pop("torch_npu", None)
        else:
            sys.modules["torch_npu"] = saved
    err = max_abs_diff(out.logits.detach(), up_logits)
    if not torch.allclose(out.logits.detach(), up_logits, rtol=RTOL, atol=ATOL):
        res.errors.append(f"NPU defaults on the simulated NPU: logits differ from upstream (max abs {err:.3g})")
    called = sorted({c[0] for c in fake.calls})
    return f"; NPU defaults run on a simulated torch_npu ({', '.join(called)}): logits max abs err {err:.2e}"


# -- report ---------------------------------------------------------------------------------------
COLUMNS = [
    ("model", "model"),
    ("status", "status"),
    ("gen_lines", "generated lines"),
    ("diff", "diff +/-"),
    ("slots", "slots (op/variant)"),
    ("eager_logits_equal", "eager logits equal"),
    ("eager_grads_equal", "eager grads equal"),
    ("torch_logits_max_abs_err", "torch max abs err logits"),
    ("torch_grads_max_abs_err", "torch max abs err grads"),
    ("torch_loss_abs_err", "torch loss abs err"),
    ("chunked_ce_loss_abs_err", "chunked CE loss abs err"),
    ("chunked_ce_grads_max_abs_err", "chunked CE max abs err grads"),
    ("cuda_logits_max_abs_err", "cuda max abs err logits"),
    ("cuda_grads_max_abs_err", "cuda max abs err grads"),
    ("cuda_loss_abs_err", "cuda loss abs err"),
    ("seq_cls", "sequence-classification head"),
    ("step", "AdamW step"),
    ("npu", "NPU sibling"),
]


def cell(res: Result, key: str) -> str:
    if key == "diff":
        return "" if res.diff_added is None else f"+{res.diff_added}/-{res.diff_removed}"
    value = getattr(res, key)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.2e}"
    return str(value)


def write_report(results: List[Result], out_dir: Path, env: Dict[str, str], setup_errors: List[str]) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    header = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    rows = ["| " + " | ".join(cell(r, k).replace("|", "\\|") for k, _ in COLUMNS) + " |" for r in results]
    env_line = ", ".join(f"{k} {v}" for k, v in env.items())
    md = "\n".join(
        [
            f"Real-model end-to-end ({env_line}); torch-kernel tolerance rtol={RTOL:g}, atol={ATOL:g}.",
            "",
            header,
            rule,
            *rows,
            "",
        ]
    )
    md += "\nCalls per slot with the `torch` kernels (one forward + backward):\n\n"
    md += "\n".join(f"- {r.model}: {r.slot_calls or '-'}" for r in results) + "\n"
    if any(r.cuda_slot_calls for r in results):
        md += "\nCalls per slot with the `cuda` kernels (one forward + backward):\n\n"
        md += "\n".join(f"- {r.model}: {r.cuda_slot_calls or '-'}" for r in results) + "\n"
    failures = [f"- setup: {e}" for e in setup_errors]
    failures += [f"- {r.model}: " + "; ".join(r.errors) for r in results if r.errors]
    if failures:
        md += "\nFailures:\n" + "\n".join(failures) + "\n"
    (out_dir / "e2e.md").write_text(md, encoding="utf-8")
    with open(out_dir / "e2e.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([title for _, title in COLUMNS] + ["slot calls", "seconds", "errors"])
        for r in results:
            writer.writerow([cell(r, k) for k, _ in COLUMNS] + [r.slot_calls, r.seconds, "; ".join(r.errors)])
    (out_dir / "e2e.json").write_text(
        json.dumps(
            {"env": env, "setup_errors": setup_errors, "results": [dataclasses.asdict(r) for r in results]}, indent=2
        ),
        encoding="utf-8",
    )
    return md


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patchgen", required=True, help="patchgen binary")
    parser.add_argument("--source-root", required=True, help="folder holding the transformers package")
    parser.add_argument("--gen-dir", required=True, help="where generated files go (not committed)")
    parser.add_argument(
        "--out", default=os.environ.get("OUT", str(ROOT / "build-gpu-e2e")), help="where the table goes (default $OUT)"
    )
    parser.add_argument("--only", default="", help="comma-separated model keys")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--no-cuda-kernels",
        dest="cuda_kernels",
        action="store_false",
        help="on a GPU, skip the stage with opslot's cuda kernels",
    )
    args = parser.parse_args(argv)

    import transformers

    import opslot  # registers the built-in kernels

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    register_counted_kernels()
    device = torch.device(args.device)
    CUDA_PAIRS.clear()
    if device.type == "cuda" and args.cuda_kernels:
        from opslot.kernels.cuda import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            parser.error(f"opslot's cuda kernels cannot run here ({reason}); pass --no-cuda-kernels to skip them")
        CUDA_PAIRS.extend(register_counted_kernels("cuda", COUNTED_CUDA, CUDA_CALLS))
    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "opslot": opslot.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else device.type,
    }
    only = {k for k in args.only.split(",") if k}
    unknown = only - {c.key for c in ALL_CASES}
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; known: {', '.join(c.key for c in ALL_CASES)}")

    # Every real-model spec is covered by a case, and validates without its upstream.
    specs = sorted(p for p in (ROOT / "specs").glob("*/*.yaml") if p.parent.name != "example")
    uncovered = sorted({p.parent.name for p in specs} - {c.key for c in ALL_CASES})
    proc = subprocess.run(
        [args.patchgen, "--validate", *[str(p.relative_to(ROOT)) for p in specs]],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    validate_line = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    env["patchgen --validate"] = validate_line.replace("validate: ", "")
    setup_errors = []
    if proc.returncode != 0:
        setup_errors.append(f"patchgen --validate failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    if uncovered:
        setup_errors.append(f"specs without a case in tests/models/e2e.py: {', '.join(uncovered)}")
    for err in setup_errors:
        print(f"FAIL {err}", flush=True)

    results = []
    for case in ALL_CASES:
        if only and case.key not in only:
            continue
        print(f"== {case_label(case)}", flush=True)
        res = check_model(case, args, device)
        for err in res.errors:
            print(f"   FAIL {err}", flush=True)
        print(f"   {res.status} in {res.seconds}s", flush=True)
        results.append(res)
    md = write_report(results, Path(args.out), env, setup_errors)
    print(md)
    return 0 if not setup_errors and all(r.status == "PASS" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
