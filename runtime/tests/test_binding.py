"""bind_ops and build_model on a small generated-style module: binding, errors, and two models with
different kernel choices in one process (module-level slots via private copies, instance slots)."""

import types
import uuid

import pytest
import torch

from generated_fixture import SOURCE
from opslot import KERNEL_REGISTRY, KernelSpec, OpsImplementationConfig, bind_ops, build_model, module_slots
from opslot.kernels import torch_ops


@pytest.fixture
def gen_module(tmp_path, monkeypatch):
    """A fresh importable module written from SOURCE; returns its name."""
    name = f"tiny_generated_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.fixture
def spies():
    """Kernels named "spy" in the global registry that record which ops ran, then delegate."""
    calls = []

    def spy(op, fn):
        def kernel(*args, **kwargs):
            calls.append(op)
            return fn(*args, **kwargs)

        return kernel

    specs = [
        KernelSpec("spy", "rms_norm", "standard", lambda: spy("rms_norm", torch_ops.rms_norm_standard)),
        KernelSpec("spy", "swiglu_mlp", "standard", lambda: spy("swiglu_mlp", torch_ops.swiglu_mlp)),
        KernelSpec("spy", "rotary_pos_emb", "full", lambda: spy("rotary_pos_emb", torch_ops.rotary_pos_emb_full)),
    ]
    for s in specs:
        KERNEL_REGISTRY.register(s)
    yield calls
    for s in specs:
        KERNEL_REGISTRY.unregister(s.op, s.variant, s.name)


def hf_config():
    return types.SimpleNamespace(hidden_size=8, hidden_act="silu")


def test_bind_ops_binds_every_module_slot(gen_module):
    import importlib

    mod = importlib.import_module(gen_module)
    bound = bind_ops(mod, {"rms_norm_implementation": "torch"})
    assert bound == {"rms_norm_slot": "torch", "swiglu_slot": "eager"}
    assert repr(mod.rms_norm_slot) == "OpSlot('rms_norm', 'standard', impl='torch', name='rms_norm_slot')"
    assert sorted(module_slots(mod)) == ["rms_norm_slot", "swiglu_slot"]


def test_bind_ops_validates_before_binding(gen_module):
    import importlib

    mod = importlib.import_module(gen_module)
    mod.extra_slot = mod.OpSlot("fancy_op", "standard")
    with pytest.raises(ValueError) as err:
        bind_ops(mod, {"rms_norm_implementation": "torch"})
    assert str(err.value).startswith(
        "invalid ops_implementation:\n  fancy_op/standard (no config field): slot op 'fancy_op' has no field "
        "in OpsImplementationConfig"
    )
    assert mod.rms_norm_slot.impl == "eager"  # nothing was bound


def test_build_model_eager_and_torch_agree(gen_module):
    x = torch.randn(3, 8)
    eager = build_model(hf_config(), ops=None, module=gen_module, model_class="TinyModel")
    fast = build_model(
        hf_config(),
        ops={"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"},
        module=gen_module,
        model_class="TinyModel",
    )
    fast.load_state_dict(eager.state_dict())
    assert torch.allclose(eager(x), fast(x), atol=1e-6)


def test_two_models_with_module_slots_do_not_interfere(gen_module, spies):
    a = build_model(hf_config(), ops={"rms_norm_implementation": "spy"}, module=gen_module, model_class="TinyModel")
    b = build_model(hf_config(), ops={"swiglu_mlp_implementation": "spy"}, module=gen_module, model_class="TinyModel")
    assert type(a).__module__ != type(b).__module__  # each has its private copy of the module
    x = torch.randn(2, 8)
    a(x)
    assert spies == ["rms_norm"]
    b(x)
    assert spies == ["rms_norm", "swiglu_mlp"]
    a(x)
    assert spies == ["rms_norm", "swiglu_mlp", "rms_norm"]
    import importlib

    original = importlib.import_module(gen_module)
    assert original.rms_norm_slot.impl == "eager" and original.swiglu_slot.impl == "eager"


def test_two_models_with_instance_slots_do_not_interfere(gen_module, spies):
    a = build_model(
        hf_config(), ops={"rotary_pos_emb_implementation": "spy"}, module=gen_module, model_class="TinyModel"
    )
    b = build_model(hf_config(), ops={}, module=gen_module, model_class="TinyModel")
    assert a.rope_slot.impl == "spy" and b.rope_slot.impl == "eager"
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    cos, sin = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    qa, ka = a.rope(q, k, cos, sin)
    qb, kb = b.rope(q, k, cos, sin)
    assert spies == ["rotary_pos_emb"]
    assert torch.allclose(qa, qb, atol=1e-6) and torch.allclose(ka, kb, atol=1e-6)
    assert a.config.ops_implementation == {"rotary_pos_emb_implementation": "spy"}
    assert not hasattr(hf_config(), "ops_implementation")  # the caller's config is not touched


def test_build_model_without_private_copy_shares_and_warns(gen_module):
    a = build_model(
        hf_config(),
        ops={"rms_norm_implementation": "torch"},
        module=gen_module,
        model_class="TinyModel",
        private_copy=False,
    )
    with pytest.warns(
        RuntimeWarning,
        match=r"^rebinding OpSlot 'rms_norm_slot' \(rms_norm/standard\) from 'torch' "
        r"to 'eager' changes the 1 live model instance\(s\) that share it",
    ):
        build_model(hf_config(), ops={}, module=gen_module, model_class="TinyModel", private_copy=False)
    assert type(a).__module__ == gen_module


def test_build_model_sets_attn_implementation(gen_module):
    m = build_model(hf_config(), ops={"attn_implementation": "sdpa"}, module=gen_module, model_class="TinyModel")
    assert m.config._attn_implementation == "sdpa"
    m = build_model(hf_config(), ops=None, module=gen_module, model_class="TinyModel")
    assert not hasattr(m.config, "_attn_implementation")


def test_build_model_errors(gen_module):
    with pytest.raises(ValueError, match=r"^build_model needs `model_class` \(a class or a class name in "):
        build_model(hf_config(), module=gen_module)
    with pytest.raises(AttributeError, match=r"has no class 'Nope'$"):
        build_model(hf_config(), module=gen_module, model_class="Nope")
    with pytest.raises(ValueError, match=r"^build_model needs `module`, or `model_class` as a class$"):
        build_model(hf_config())


def test_build_model_from_class(gen_module):
    import importlib

    cls = importlib.import_module(gen_module).TinyModel
    m = build_model(hf_config(), ops={"rms_norm_implementation": "torch"}, model_class=cls)
    assert type(m).__name__ == "TinyModel" and type(m) is not cls
    assert OpsImplementationConfig.from_dict(m.config.ops_implementation).rms_norm_implementation == "torch"
