"""ConfigSlot: an implementation chosen from the model config when the model is built (a spec's
`config_slot` patch), checked against its declared implementations with errors that name the
attribute, the value and the implementations allowed.

The second half runs generated code: patchgen (PATCHGEN_BIN, skipped when unset) generates
tests/fixtures/config_slot/toy_config_slot.yaml over the example upstream, and the module is built
with each value of the slot."""

import os
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import opslot
from opslot import ConfigSlot, binding_plan, build_model, declared_config_slots

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATCHGEN = os.environ.get("PATCHGEN_BIN")
SPEC = "runtime/tests/fixtures/config_slot/toy_config_slot.yaml"
UPSTREAM_ROOT = os.path.join(REPO, "examples", "upstream")
MODULE = "patched_modeling_toy_config_slot"


def slot(default="eager"):
    return ConfigSlot("ToyAttention.attention_kernel", "toy_attention_kernel", ("eager", "sdpa"), default=default)


# ---- the runtime class -------------------------------------------------------------------------


def test_value_from_the_config():
    s = slot().bind_from(SimpleNamespace(toy_attention_kernel="sdpa"))
    assert (s.value, s.why) == ("sdpa", "config")
    assert s.uses("sdpa") and not s.uses("eager")


def test_default_when_the_config_does_not_set_it():
    for config in (SimpleNamespace(), SimpleNamespace(toy_attention_kernel=None), None):
        s = slot().bind_from(config)
        assert (s.value, s.why) == ("eager", "default")


def test_text_config_of_a_multimodal_config():
    config = SimpleNamespace(text_config=SimpleNamespace(toy_attention_kernel="sdpa"))
    assert slot().bind_from(config).value == "sdpa"


def test_value_not_allowed_names_attribute_value_and_allowed():
    with pytest.raises(ValueError) as err:
        slot().bind_from(SimpleNamespace(toy_attention_kernel="spda"))
    assert str(err.value) == (
        "config slot 'ToyAttention.attention_kernel': config.toy_attention_kernel is 'spda', which is not one "
        "of its implementations: 'eager', 'sdpa' (did you mean 'sdpa'?)"
    )


def test_value_not_a_string():
    with pytest.raises(ValueError) as err:
        slot().bind_from(SimpleNamespace(toy_attention_kernel=2))
    assert str(err.value) == (
        "config slot 'ToyAttention.attention_kernel': config.toy_attention_kernel is 2 (int); "
        "it must name one of the implementations: 'eager', 'sdpa'"
    )


def test_missing_without_default():
    with pytest.raises(ValueError) as err:
        slot(default=None).bind_from(SimpleNamespace())
    assert str(err.value) == (
        "config slot 'ToyAttention.attention_kernel' reads config.toy_attention_kernel, which the model config "
        "does not set, and it has no default; set config.toy_attention_kernel to one of: 'eager', 'sdpa'"
    )


def test_uses_refuses_an_undeclared_implementation():
    s = slot().bind_from(SimpleNamespace())
    with pytest.raises(ValueError) as err:
        s.uses("flash")
    assert str(err.value) == (
        "config slot 'ToyAttention.attention_kernel' has no implementation 'flash'; "
        "its implementations: 'eager', 'sdpa'"
    )


def test_unbound_value_is_an_error():
    with pytest.raises(RuntimeError, match="is not bound: call bind_from"):
        slot().value


def test_declaration_errors():
    with pytest.raises(ValueError, match="default 'flash' is not one of 'eager', 'sdpa'"):
        ConfigSlot("A.k", "k", ("eager", "sdpa"), default="flash")
    with pytest.raises(ValueError, match="distinct, non-empty"):
        ConfigSlot("A.k", "k", ("eager", "eager"))
    with pytest.raises(ValueError, match="distinct, non-empty"):
        ConfigSlot("A.k", "k", ())


def test_pickles_with_its_value():
    s = pickle.loads(pickle.dumps(slot().bind_from(SimpleNamespace(toy_attention_kernel="sdpa"))))
    assert (s.name, s.attribute, s.values, s.default, s.value, s.why) == (
        "ToyAttention.attention_kernel",
        "toy_attention_kernel",
        ("eager", "sdpa"),
        "eager",
        "sdpa",
        "config",
    )


def test_repr():
    assert repr(slot()) == (
        "ConfigSlot('ToyAttention.attention_kernel', config.toy_attention_kernel='<unbound>', "
        "why='unbound', values=('eager', 'sdpa'))"
    )


# ---- generated code ----------------------------------------------------------------------------

needs_patchgen = pytest.mark.skipif(not PATCHGEN, reason="set PATCHGEN_BIN to the built patchgen binary")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The fixture spec generated into a temporary folder and imported."""
    out = tmp_path_factory.mktemp("generated")
    proc = subprocess.run(
        [PATCHGEN, SPEC, "--source-root", UPSTREAM_ROOT, "-o", str(out)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"patchgen failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
    path = out / f"{MODULE}.py"
    assert path.is_file(), f"patchgen wrote no {MODULE}.py"
    sys.path[:0] = [UPSTREAM_ROOT, str(out)]
    sys.modules.pop(MODULE, None)
    import importlib

    module = importlib.import_module(MODULE)
    yield SimpleNamespace(module=module, source=path.read_text())
    sys.modules.pop(MODULE, None)
    sys.path.remove(UPSTREAM_ROOT)
    sys.path.remove(str(out))


def toy_config(**kwargs):
    from toyformers.models.toy.configuration_toy import ToyConfig

    return ToyConfig(num_hidden_layers=2, **kwargs)


def logits_of(model, seed=0):
    torch.manual_seed(seed)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 7))
    model.eval()
    with torch.no_grad():
        return model(input_ids=input_ids).logits


@needs_patchgen
def test_generated_init_sets_the_slot(generated):
    assert (
        "        # patchgen: config_slot ToyAttention.attention_kernel - the attention math, chosen per model "
        "from its config (runtime/tests/fixtures/config_slot/toy_config_slot.yaml:22)\n"
        '        self.attention_kernel = ConfigSlot("ToyAttention.attention_kernel", "toy_attention_kernel", '
        '("eager", "sdpa"), default="eager").bind_from(config, owner=self)\n'
    ) in generated.source
    assert "from opslot import ConfigSlot\n" in generated.source
    assert [(s.name, s.attribute, s.values, s.default) for s in declared_config_slots(generated.module)] == [
        ("ToyAttention.attention_kernel", "toy_attention_kernel", ("eager", "sdpa"), "eager")
    ]


@needs_patchgen
def test_two_config_values_two_code_paths(generated, monkeypatch):
    calls = []
    sdpa = generated.module.sdpa_attention_forward
    monkeypatch.setattr(generated.module, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or sdpa(*a, **k))

    torch.manual_seed(0)
    eager = build_model(toy_config(), module=generated.module, model_class="ToyForCausalLM")
    torch.manual_seed(0)
    fused = build_model(toy_config(toy_attention_kernel="sdpa"), module=generated.module, model_class="ToyForCausalLM")
    kernels = {m.attention_kernel.value for m in eager.modules() if hasattr(m, "attention_kernel")}
    assert kernels == {"eager"}
    assert {m.attention_kernel.value for m in fused.modules() if hasattr(m, "attention_kernel")} == {"sdpa"}

    reference = logits_of(eager)
    assert calls == []  # the default: upstream's eager attention
    result = logits_of(fused)
    assert len(calls) == 2  # one per layer: the config's choice, in the same module, same process
    torch.testing.assert_close(result, reference, rtol=1e-5, atol=1e-5)
    assert not torch.equal(result, torch.zeros_like(result))

    plan = binding_plan(fused)
    assert repr(plan).splitlines()[1:] == [
        "  slot  op/variant  impl  why",
        "  (no slots)",
        "  config slot model.layers.*.self_attn.attention_kernel (x2): sdpa (config, config.toy_attention_kernel)",
        "  attention: eager (config._attn_implementation)",
    ]
    assert plan.as_dict() == {} and len(plan) == 0  # no kernel binding: listed apart
    assert [(e.slot, e.variant, e.impl, e.why, e.count) for e in binding_plan(eager).config_slots] == [
        ("model.layers.*.self_attn.attention_kernel", "toy_attention_kernel", "eager", "default", 2)
    ]


@needs_patchgen
def test_refused_value_before_the_model_is_constructed(generated, monkeypatch):
    constructed = []
    monkeypatch.setattr(generated.module.ToyForCausalLM, "__init__", lambda self, config: constructed.append(1))
    with pytest.raises(ValueError) as err:
        build_model(toy_config(toy_attention_kernel="flash"), module=generated.module, model_class="ToyForCausalLM")
    assert str(err.value) == (
        "config slot 'ToyAttention.attention_kernel': config.toy_attention_kernel is 'flash', which is not one "
        "of its implementations: 'eager', 'sdpa'"
    )
    assert constructed == []


@needs_patchgen
def test_refused_value_when_constructed_directly(generated):
    with pytest.raises(
        ValueError,
        match=r"config.toy_attention_kernel is 'sdpa2', which is not one of its "
        r"implementations: 'eager', 'sdpa' \(did you mean 'sdpa'\?\)",
    ):
        generated.module.ToyForCausalLM(toy_config(toy_attention_kernel="sdpa2"))


def test_opslot_exports():
    assert opslot.ConfigSlot is ConfigSlot
    assert "ConfigSlot" in opslot.__all__ and "declared_config_slots" in opslot.__all__


@needs_patchgen
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_compiles_without_graph_breaks(generated, kernel):
    torch.manual_seed(0)
    model = build_model(
        toy_config(toy_attention_kernel=kernel), module=generated.module, model_class="ToyForCausalLM"
    ).eval()
    input_ids = torch.randint(0, model.config.vocab_size, (2, 7))
    with torch.no_grad():
        reference = model(input_ids=input_ids).logits
        compiled = torch.compile(model, backend="eager", fullgraph=True)(input_ids=input_ids).logits
    assert torch.equal(compiled, reference)
