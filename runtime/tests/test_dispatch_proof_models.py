"""Proof of dispatch on real generated models (issue #28's silent cases): patchgen (PATCHGEN_BIN,
skipped when unset) generates the specs against the installed Transformers, tiny configs run one
training step on the CPU, and the error or warning text and the binding plan are compared exactly.

- Qwen3.5's multimodal head: every kernel runs (the spec builds its language model from the generated
  text model, where upstream's `AutoModel.from_config` built Transformers' own, and guards its loss);
- DeepSeek-V3 with `rope_interleave=True` (its default): the attention calls the interleaved RoPE, whose
  slot runs; the rotate_half slot of the other branch is "not used" then, and "not reached" when the
  interleaved slot's kernel did not run;
- Qwen3-MoE with every layer sparse: the dense-MLP swiglu slot is "not used by this model", no error;
- a sequence-classification head: its loss runs the sequence-classification slot (the spec's
  `loss_function` property), where the causal-LM loss slot is "not used"; its whole base model is
  upstream's (`GenericForSequenceClassification` builds it with `AutoModel.from_config`);
- `experts_implementation="batched_mm"` with a moe kernel: the eager experts forward that holds the
  guard is never called.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from opslot import binding_plan, build_model
from opslot.dispatch import UnreachedSlotError, UnreachedSlotWarning, dispatch_report, watch_dispatch

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
PATCHGEN = os.environ.get("PATCHGEN_BIN")
pytestmark = pytest.mark.skipif(not PATCHGEN, reason="set PATCHGEN_BIN to the built patchgen binary")

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """generated(key) -> the import name of specs/<key>/<key>_gpu.yaml generated against the installed
    Transformers (imported under a name of its own: no clash with other tests' modules)."""
    out = tmp_path_factory.mktemp("dispatch_gen")
    source_root = str(Path(transformers.__file__).resolve().parents[1])
    names = {}

    def make(key):
        if key not in names:
            import subprocess

            spec = f"specs/{key}/{key}_gpu.yaml"
            proc = subprocess.run(
                [PATCHGEN, spec, "--source-root", source_root, "-o", str(out / key)],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            assert proc.returncode == 0, proc.stderr
            (path,) = (out / key).rglob(f"patched_modeling_{key}_gpu.py")
            name = f"dispatch_proof_{key}_gpu"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
            names[key] = name
        return names[key]

    yield make
    for name in names.values():
        sys.modules.pop(name, None)


def build(config, ops, module, model_class, allow_unreached=False):
    """build_model, watched as build_model itself does once binding.py calls watch_dispatch."""
    torch.manual_seed(0)
    model = build_model(config, ops=ops, module=module, model_class=model_class)
    return watch_dispatch(model, allow_unreached=allow_unreached)


def step(model, labels=None, **kwargs):
    ids = torch.arange(16).remainder(64).reshape(2, 8)
    out = model(input_ids=ids, labels=ids if labels is None else labels, **kwargs)
    out.loss.backward()
    return out


def plan_rows(model):
    """The plan's table without its first line (which names the private module copy)."""
    return repr(binding_plan(model)).split("\n", 1)[1]


FOOTER = (
    "Fix the cause, remove the field(s) from the ops config, or let these ops run upstream code with a "
    "warning: build_model(..., allow_unreached=[{ops}]) (or allow_unreached=True)."
)


def header(model_class, n):
    return (
        f"opslot: {model_class} did not run {n} bound kernel(s) in its first forward and backward, although the "
        f'model can reach their guarded code (binding_plan says "not reached"):'
    )


# -- Qwen3.5 multimodal head -------------------------------------------------------------------------------
QWEN3_5_TEXT = dict(
    SMALL,
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
)
QWEN3_5_VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=32,
    patch_size=2,
    temporal_patch_size=1,
    spatial_merge_size=1,
)
DENSE_TORCH = {
    "rms_norm_implementation": "torch",
    "rotary_pos_emb_implementation": "torch",
    "swiglu_mlp_implementation": "torch",
    "cross_entropy_loss_implementation": "torch",
}
UP_QWEN3_5 = "transformers.models.qwen3_5.modeling_qwen3_5"


def test_qwen3_5_multimodal_head_runs_every_kernel(generated):
    """The spec builds the multimodal model's language model from the generated Qwen3_5TextModel (upstream:
    AutoModel.from_config, i.e. Transformers' own classes, which ran none of these kernels) and guards the
    head's causal-LM loss, whose vocabulary is in the text config."""
    module = generated("qwen3_5")
    config = transformers.Qwen3_5Config(text_config=QWEN3_5_TEXT, vision_config=QWEN3_5_VISION)
    model = build(config, DENSE_TORCH, module, "Qwen3_5ForConditionalGeneration")
    step(model)
    assert plan_rows(model) == (
        "  slot                               op/variant                                  impl   why       dispatch\n"
        "  causal_conv1d_slot                 causal_conv1d/standard                      eager  default   -\n"
        "  causal_lm_loss_slot                cross_entropy_loss/causal                   torch  explicit  ran\n"
        "  chunk_gated_delta_rule_slot        chunk_gated_delta_rule/standard             eager  default   -\n"
        "  rms_norm_gated_slot                rms_norm_gated/standard                     eager  default   -\n"
        "  rms_norm_slot                      rms_norm/offset                             torch  explicit  ran\n"
        "  rope_slot                          rotary_pos_emb/partial                      torch  explicit  ran\n"
        "  sequence_classification_loss_slot  cross_entropy_loss/sequence_classification  torch  explicit  "
        "not used by this model\n"
        "  swiglu_mlp_slot                    swiglu_mlp/standard                         torch  explicit  ran\n"
        "  attention: sdpa (config._attn_implementation)"
    )


def test_qwen3_5_text_model_runs_every_kernel(generated):
    """The control: the same kernels in Qwen3_5ForCausalLM all run."""
    module = generated("qwen3_5")
    model = build(transformers.Qwen3_5TextConfig(**QWEN3_5_TEXT), DENSE_TORCH, module, "Qwen3_5ForCausalLM")
    step(model)
    assert {e.slot: e.dispatch for e in binding_plan(model) if e.impl != "eager"} == {
        "causal_lm_loss_slot": "ran",
        "rms_norm_slot": "ran",
        "rope_slot": "ran",
        "swiglu_mlp_slot": "ran",
        "sequence_classification_loss_slot": "not used by this model",
    }


# -- DeepSeek-V3 with rope_interleave ------------------------------------------------------------------------
def deepseek_config(**kwargs):
    fields = dict(
        SMALL,
        num_key_value_heads=2,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
    )
    fields.pop("head_dim")
    fields.update(kwargs)
    return transformers.DeepseekV3Config(**fields)


DEEPSEEK_OPS = {"rms_norm_implementation": "torch", "rotary_pos_emb_implementation": "torch"}
ROPE_HINT = (
    "the model instantiates DeepseekV3Attention (model.model.layers.0.self_attn), whose code calls "
    "apply_rotary_pos_emb from DeepseekV3Attention.forward under the else branch of "
    "`if self.config.rope_interleave:` (here config.rope_interleave=True), but that call did not happen in "
    "this step"
)


def test_deepseek_v3_rope_interleave_runs_the_interleaved_kernel(generated, recwarn):
    """rope_interleave=True (the config's default): the attention calls the interleaved RoPE, whose slot
    runs; the rotate_half slot, called only in the other branch of `if self.config.rope_interleave:`, is
    "not used by this model" (the config chose the other variant of the op), no error or warning."""
    module = generated("deepseek_v3")
    assert deepseek_config().rope_interleave is True  # the config's default
    model = build(deepseek_config(), DEEPSEEK_OPS, module, "DeepseekV3ForCausalLM")
    step(model)
    assert not [w for w in recwarn if w.category is UnreachedSlotWarning]
    assert plan_rows(model) == (
        "  slot                               op/variant                                  impl   why       dispatch\n"
        "  causal_lm_loss_slot                cross_entropy_loss/causal                   eager  default   -\n"
        "  moe_slot                           moe/standard                                eager  default   -\n"
        "  rms_norm_slot                      rms_norm/standard                           torch  explicit  ran\n"
        "  rope_interleave_slot               rotary_pos_emb/interleaved                  torch  explicit  ran\n"
        "  rope_slot                          rotary_pos_emb/full                         torch  explicit  "
        "not used by this model\n"
        "  sequence_classification_loss_slot  cross_entropy_loss/sequence_classification  eager  default   -\n"
        "  swiglu_mlp_slot                    swiglu_mlp/standard                         eager  default   -\n"
        "  attention: sdpa (config._attn_implementation)"
    )


def _rebind_eager(model, slot_name):
    """Bind the model's module-level slot `slot_name` to eager directly (what no ops config can do to one
    variant of an op): the other branch's kernel then does not run."""
    with pytest.warns(RuntimeWarning, match=rf"^rebinding OpSlot '{slot_name}' .* from 'torch' to 'eager'"):
        getattr(sys.modules[type(model).__module__], slot_name).bind("eager")


def test_deepseek_v3_the_other_branch_counts_only_when_its_kernel_ran(generated):
    """The rotate_half slot is excused only by the interleaved slot's kernel having run: with that one
    eager, upstream computed the RoPE the user asked a kernel for, an error as before."""
    module = generated("deepseek_v3")
    model = build(deepseek_config(), DEEPSEEK_OPS, module, "DeepseekV3ForCausalLM")
    _rebind_eager(model, "rope_interleave_slot")
    with pytest.raises(UnreachedSlotError) as info:
        step(model)
    assert str(info.value) == "\n".join(
        [
            header("DeepseekV3ForCausalLM", 1),
            f"  - rope_slot (rotary_pos_emb/full -> 'torch', explicit): {ROPE_HINT}",
            FOOTER.format(ops="'rotary_pos_emb'"),
        ]
    )
    assert dispatch_report(model).as_dict()["rope_slot"] == "not reached"


def test_deepseek_v3_the_other_branch_allowed_is_a_warning(generated):
    module = generated("deepseek_v3")
    model = build(deepseek_config(), DEEPSEEK_OPS, module, "DeepseekV3ForCausalLM", allow_unreached=["rotary_pos_emb"])
    _rebind_eager(model, "rope_interleave_slot")
    with pytest.warns(UnreachedSlotWarning) as record:
        step(model)
    assert [str(w.message) for w in record if w.category is UnreachedSlotWarning] == [
        "\n".join(
            [
                header("DeepseekV3ForCausalLM", 1),
                f"  - rope_slot (rotary_pos_emb/full -> 'torch', explicit): {ROPE_HINT}",
                "These run upstream code instead (device defaults and ops in allow_unreached are warnings).",
            ]
        )
    ]
    assert dispatch_report(model).as_dict()["rope_slot"] == "not reached"


def test_deepseek_v3_without_interleave_runs_the_rope_kernel(generated, recwarn):
    module = generated("deepseek_v3")
    model = build(deepseek_config(rope_interleave=False), DEEPSEEK_OPS, module, "DeepseekV3ForCausalLM")
    step(model)
    assert not [w for w in recwarn if w.category is UnreachedSlotWarning]
    report = dispatch_report(model).as_dict()
    assert (report["rope_slot"], report["rope_interleave_slot"]) == ("ran", "not used by this model")


# -- Qwen3-MoE: all layers sparse; experts_implementation ------------------------------------------------
def qwen3_moe_config(**kwargs):
    return transformers.Qwen3MoeConfig(
        **dict(SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1, **kwargs)
    )


def test_qwen3_moe_all_sparse_swiglu_is_not_used_and_not_an_error(generated, recwarn):
    module = generated("qwen3_moe")
    ops = {"swiglu_mlp_implementation": "torch", "moe_implementation": "fused_torch"}
    model = build(qwen3_moe_config(mlp_only_layers=[]), ops, module, "Qwen3MoeForCausalLM")
    step(model)
    assert not [w for w in recwarn if w.category is UnreachedSlotWarning]
    assert plan_rows(model) == (
        "  slot                               op/variant                                  impl   why       dispatch\n"
        "  causal_lm_loss_slot                cross_entropy_loss/causal                   eager  default   -\n"
        "  load_balancing_loss_slot           load_balancing_loss/standard                eager  default   -\n"
        "  moe_slot                           moe/standard                                torch  explicit  ran\n"
        "  rms_norm_slot                      rms_norm/standard                           eager  default   -\n"
        "  rope_slot                          rotary_pos_emb/full                         eager  default   -\n"
        "  sequence_classification_loss_slot  cross_entropy_loss/sequence_classification  eager  default   -\n"
        "  swiglu_mlp_slot                    swiglu_mlp/standard                         torch  explicit  "
        "not used by this model\n"
        "  config slot model.layers.*.mlp.gate.router_implementation (x2): eager (default, "
        "config.router_implementation)\n"
        "  attention: sdpa (config._attn_implementation)"
    )
    # with one dense layer the same slot runs
    model = build(qwen3_moe_config(mlp_only_layers=[0]), ops, module, "Qwen3MoeForCausalLM")
    step(model)
    assert dispatch_report(model).as_dict()["swiglu_mlp_slot"] == "ran"


def test_experts_implementation_batched_mm_bypasses_the_moe_guard(generated):
    module = generated("qwen3_moe")
    model = build(qwen3_moe_config(), {"moe_implementation": "fused_torch"}, module, "Qwen3MoeForCausalLM")
    assert model.config._experts_implementation == "eager"  # what build_model sets for a moe kernel
    model.set_experts_implementation("batched_mm")  # e.g. from_pretrained(..., experts_implementation=...)
    with pytest.raises(UnreachedSlotError) as info:
        step(model)
    assert str(info.value) == "\n".join(
        [
            header("Qwen3MoeForCausalLM", 1),
            "  - moe_slot (moe/standard -> 'torch', explicit): config._experts_implementation is 'batched_mm': "
            "Transformers' @use_experts_implementation runs its 'batched_mm' experts and never calls the eager "
            "Qwen3MoeExperts.forward that holds the guard (build_model sets 'eager' when a moe slot runs a kernel; an "
            "experts_implementation given to from_pretrained or set_experts_implementation overrides it)",
            FOOTER.format(ops="'moe'"),
        ]
    )
    assert dispatch_report(model).as_dict()["moe_slot"] == "not reached"


# -- a sequence-classification head ------------------------------------------------------------------------
RMS_NORM_UPSTREAM_BASE = (
    "  - rms_norm_slot (rms_norm/standard -> 'torch', explicit): model.model is upstream's "
    "transformers.models.qwen3.modeling_qwen3.Qwen3Model (a sub-model built by upstream code, e.g. "
    "AutoModel.from_config), so model.model.layers.0.self_attn.q_norm is upstream's Qwen3RMSNorm, not the "
    "generated class whose Qwen3RMSNorm.forward holds the guard"
)


def test_sequence_classification_head_runs_its_loss_and_base_model_upstream(generated):
    module = generated("qwen3")
    config = transformers.Qwen3Config(**dict(SMALL, num_hidden_layers=1, pad_token_id=0))
    ops = {"cross_entropy_loss_implementation": "torch", "rms_norm_implementation": "torch"}
    model = build(config, ops, module, "Qwen3ForSequenceClassification")
    with pytest.raises(UnreachedSlotError) as info:
        step(model, labels=torch.tensor([0, 1]))
    assert str(info.value) == "\n".join(
        [
            header("Qwen3ForSequenceClassification", 1),
            RMS_NORM_UPSTREAM_BASE,
            FOOTER.format(ops="'rms_norm'"),
        ]
    )
    assert plan_rows(model) == (
        "  slot                               op/variant                                  impl   why       dispatch\n"
        "  causal_lm_loss_slot                cross_entropy_loss/causal                   torch  explicit  "
        "not used by this model\n"
        "  rms_norm_slot                      rms_norm/standard                           torch  explicit  "
        "not reached\n"
        "  rope_slot                          rotary_pos_emb/full                         eager  default   -\n"
        "  sequence_classification_loss_slot  cross_entropy_loss/sequence_classification  torch  explicit  ran\n"
        "  swiglu_mlp_slot                    swiglu_mlp/standard                         eager  default   -\n"
        "  attention: sdpa (config._attn_implementation)"
    )


def test_sequence_classification_head_without_labels_did_not_reach_its_loss(generated):
    """No labels: upstream's forward never reads loss_function, so the head's own loss slot is "not
    reached" (asked for, reachable); the causal-LM loss slot of another head stays "not used"."""
    module = generated("qwen3")
    config = transformers.Qwen3Config(**dict(SMALL, num_hidden_layers=1, pad_token_id=0))
    ops = {"cross_entropy_loss_implementation": "torch", "rms_norm_implementation": "torch"}
    model = build(config, ops, module, "Qwen3ForSequenceClassification")
    with pytest.raises(UnreachedSlotError) as info:
        model(input_ids=torch.arange(16).remainder(64).reshape(2, 8)).logits.sum().backward()
    assert str(info.value) == "\n".join(
        [
            header("Qwen3ForSequenceClassification", 2),
            RMS_NORM_UPSTREAM_BASE,
            "  - sequence_classification_loss_slot (cross_entropy_loss/sequence_classification -> 'torch', explicit): "
            "the model itself is a Qwen3ForSequenceClassification, but Qwen3ForSequenceClassification.loss_function did "
            "not run its guard: the model's forward does not reach it in this configuration (another branch, an early "
            "return, or a replaced forward)",
            FOOTER.format(ops="'cross_entropy_loss', 'rms_norm'"),
        ]
    )
    assert dispatch_report(model).as_dict()["causal_lm_loss_slot"] == "not used by this model"


def test_base_model_computes_no_loss_so_the_loss_slot_is_not_used(generated):
    module = generated("qwen3")
    config = transformers.Qwen3Config(**dict(SMALL, num_hidden_layers=1))
    model = build(config, DENSE_TORCH, module, "Qwen3Model")
    model(input_ids=torch.arange(8).reshape(1, 8)).last_hidden_state.sum().backward()
    assert dispatch_report(model).as_dict() == {
        "causal_lm_loss_slot": "not used by this model",
        "rms_norm_slot": "ran",
        "rope_slot": "ran",
        "swiglu_mlp_slot": "ran",
        "sequence_classification_loss_slot": "not used by this model",
    }
