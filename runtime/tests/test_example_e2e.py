"""End to end on CPU: patchgen generates the bundled example models, build_model binds them, and the
generated models compute what the upstream example computes — exactly with every slot on `eager`,
within tolerance (forward and backward) with the portable kernels.

Needs the built binary: PATCHGEN_BIN=/path/to/patchgen (skipped when unset)."""

import glob
import os
import subprocess
import sys

import pytest
import torch

from opslot import OpSlot, build_model, module_slots
from opslot.testing import compare_models

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATCHGEN = os.environ.get("PATCHGEN_BIN")
SPECS = ["specs/example/toy_gpu.yaml", "specs/example/toy_moe_gpu.yaml"]
UPSTREAM_ROOT = os.path.join(REPO, "examples", "upstream")

pytestmark = pytest.mark.skipif(not PATCHGEN, reason="set PATCHGEN_BIN to the built patchgen binary")

ALL_TORCH = {
    f"{op}_implementation": "torch"
    for op in ("rms_norm", "rotary_pos_emb", "swiglu_mlp", "cross_entropy_loss", "load_balancing_loss")
}
ALL_TORCH["moe_implementation"] = "fused_torch"
# One choice for both models: each lacks some of these ops, on purpose.
ALL_TORCH["allow_unbound"] = ["rms_norm", "rotary_pos_emb", "swiglu_mlp", "load_balancing_loss", "moe"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """{output file stem: path} of the example modules generated into a temporary folder."""
    out = tmp_path_factory.mktemp("generated")
    proc = subprocess.run(
        [PATCHGEN, *SPECS, "--source-root", UPSTREAM_ROOT, "-o", str(out)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"patchgen failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
    files = {os.path.basename(p)[:-3]: p for p in glob.glob(str(out / "**" / "*.py"), recursive=True)}
    for name in ("patched_modeling_toy_gpu", "patched_modeling_toy_moe_gpu"):
        assert name in files, f"patchgen wrote no {name}.py (wrote {sorted(files)})"
    sys.path.insert(0, UPSTREAM_ROOT)
    for folder in {os.path.dirname(p) for p in files.values()}:
        sys.path.insert(0, folder)
    stale = ("patched_modeling_toy_gpu", "patched_modeling_toy_moe_gpu")  # e.g. the committed ones, imported earlier
    for name in stale:
        sys.modules.pop(name, None)
    yield files
    sys.path.remove(UPSTREAM_ROOT)
    for name in stale:
        sys.modules.pop(name, None)


def bound_impls(model):
    """{slot name: impl} of the model's module-level and instance-scoped slots."""
    impls = {name: slot.impl for name, slot in module_slots(sys.modules[type(model).__module__]).items()}
    for sub in model.modules():
        impls.update({f"self.{k}": v.impl for k, v in vars(sub).items() if isinstance(v, OpSlot)})
    return impls


def inputs(vocab):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 9), generator=gen)
    labels = ids.clone()
    labels[0, -3:] = -100
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def models(kind):
    import importlib

    if kind == "toy":
        from toyformers.models.toy.configuration_toy import ToyConfig as Config

        upstream = importlib.import_module("toyformers.models.toy.modeling_toy")
        return Config(), upstream, "patched_modeling_toy_gpu", "ToyForCausalLM"
    from toyformers.models.toy_moe.configuration_toy_moe import ToyMoeConfig as Config

    upstream = importlib.import_module("toyformers.models.toy_moe.modeling_toy_moe")
    return Config(output_router_logits=True), upstream, "patched_modeling_toy_moe_gpu", "ToyMoeForCausalLM"


@pytest.mark.parametrize("kind", ["toy", "toy_moe"])
def test_eager_slots_equal_upstream_exactly(generated, kind):
    config, upstream, module, cls = models(kind)
    torch.manual_seed(0)
    ref = getattr(upstream, cls)(config)
    patched = build_model(config, ops=None, module=module, model_class=cls)
    assert set(bound_impls(patched).values()) == {"eager"}
    diff = compare_models(ref, patched, inputs(config.vocab_size))
    assert (diff.logits, diff.loss, diff.grads) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("kind", ["toy", "toy_moe"])
def test_torch_kernels_match_upstream(generated, kind):
    config, upstream, module, cls = models(kind)
    torch.manual_seed(0)
    ref = getattr(upstream, cls)(config)
    patched = build_model(config, ops=ALL_TORCH, module=module, model_class=cls)
    expected = {
        "toy": ["causal_lm_loss_slot", "rms_norm_slot", "rope_slot", "swiglu_mlp_slot"],
        "toy_moe": ["causal_lm_loss_slot", "load_balancing_loss_slot", "self.moe_experts_slot"],
    }[kind]
    assert bound_impls(patched) == {name: "torch" for name in expected}
    diff = compare_models(ref, patched, inputs(config.vocab_size))
    assert diff.logits < 1e-5 and diff.loss < 1e-5 and diff.grads < 1e-5, diff


def test_chunked_cross_entropy_matches_upstream(generated):
    config, upstream, module, cls = models("toy")
    torch.manual_seed(0)
    ref = getattr(upstream, cls)(config)
    patched = build_model(
        config, ops={"cross_entropy_loss_implementation": "torch_chunked"}, module=module, model_class=cls
    )
    diff = compare_models(ref, patched, inputs(config.vocab_size))
    assert diff.logits is None  # the fused kernel never built the logits
    assert diff.loss < 1e-5 and diff.grads < 1e-5, diff


# ---- bind_from(config, owner=self): no frame lookup (issue #34) ------------------------------------

LEGACY = "patched_modeling_toy_moe_gpu_legacy"


@pytest.fixture
def frame_lookups(monkeypatch):
    """The calls of opslot.legacy_caller.caller_namespace, answered as it answers (bind_from's caller)."""
    import opslot.legacy_caller

    looked = []

    def spy():
        looked.append(sys._getframe(1).f_code.co_name)
        return sys._getframe(2).f_globals

    monkeypatch.setattr(opslot.legacy_caller, "caller_namespace", spy)
    return looked


@pytest.fixture
def legacy_module(generated, tmp_path):
    """The MoE example as an earlier patchgen wrote it: `bind_from(config)`, no owner."""
    import importlib

    with open(generated["patched_modeling_toy_moe_gpu"], encoding="utf-8") as f:
        source = f.read()
    assert source.count(".bind_from(config, owner=self)") == 1
    (tmp_path / f"{LEGACY}.py").write_text(source.replace(".bind_from(config, owner=self)", ".bind_from(config)"))
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop(LEGACY, None)
    yield importlib.import_module(LEGACY)
    sys.path.remove(str(tmp_path))
    sys.modules.pop(LEGACY, None)


def refusal(module_name):
    return (
        f"a model of {module_name} is being built from a config whose ops_implementation its module-level slots "
        "do not follow: causal_lm_loss_slot (cross_entropy_loss/causal) runs 'eager', the config chooses 'torch'; "
        "load_balancing_loss_slot (load_balancing_loss/standard) runs 'eager', the config chooses 'torch'. Build it "
        "with opslot.build_model(config, module=..., model_class=...) or opslot.hf.from_pretrained(path, module), "
        "which bind every slot"
    )


def test_the_generated_init_names_its_owner_and_never_looks_at_the_call_stack(generated, frame_lookups):
    with open(generated["patched_modeling_toy_moe_gpu"], encoding="utf-8") as f:
        source = f.read()
    assert 'self.moe_experts_slot = OpSlot("moe", "standard").bind_from(config, owner=self)\n' in source
    assert ".bind_from(config)" not in source
    config, _, module, cls = models("toy_moe")
    model = build_model(config, ops=ALL_TORCH, module=module, model_class=cls)
    assert bound_impls(model)["self.moe_experts_slot"] == "torch"
    plain = getattr(sys.modules[module], cls)  # its module-level slots unbound: build_model bound a private copy
    with pytest.raises(ValueError) as err:
        plain(model.config)  # a saved choice its module-level slots do not follow
    assert str(err.value) == refusal(module)
    assert frame_lookups == []


def test_a_file_of_an_earlier_patchgen_is_refused_alike_through_the_call_stack(legacy_module, frame_lookups):
    config, _, _, cls = models("toy_moe")
    model = build_model(config, ops=ALL_TORCH, module=legacy_module, model_class=cls)
    assert bound_impls(model)["self.moe_experts_slot"] == "torch"
    layers = config.num_hidden_layers
    assert frame_lookups == ["bind_from"] * layers  # one per instance slot: the layers' experts
    with pytest.raises(ValueError) as err:
        getattr(legacy_module, cls)(model.config)
    assert str(err.value) == refusal(LEGACY)
    assert frame_lookups == ["bind_from"] * (layers + 1)  # refused at the first layer's experts
