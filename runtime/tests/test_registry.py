"""KernelSpec, KernelRegistry and HardwareRequirement: registration, lookup and exact error texts."""

import dataclasses

import pytest

from opslot import (
    KERNEL_REGISTRY,
    DeviceInfo,
    HardwareRequirement,
    KernelRegistry,
    KernelSpec,
    register_kernel,
    use_device,
)


def fresh():
    return KernelRegistry()


def test_kernel_spec_is_frozen_and_loads_once():
    built = []

    def factory():
        built.append(1)
        return lambda x: x + 1

    spec = KernelSpec("mine", "rms_norm", "standard", factory)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"
    assert built == []  # lazy: nothing built at registration
    assert spec.load()(1) == 2
    assert spec.load() is spec.load()
    assert built == [1]


def test_kernel_spec_string_factory_is_imported_lazily():
    spec = KernelSpec("mine", "rms_norm", "standard", "opslot.kernels.torch_ops:rms_norm_standard")
    from opslot.kernels import torch_ops

    assert spec.load() is torch_ops.rms_norm_standard


def test_kernel_spec_rejects_bad_fields():
    with pytest.raises(ValueError, match=r"^'eager' means the upstream code and cannot be registered as a kernel$"):
        KernelSpec("eager", "rms_norm", "standard", lambda: len)
    with pytest.raises(ValueError, match=r"^KernelSpec.factory string must be 'module:attr', got 'nocolon'$"):
        KernelSpec("x", "rms_norm", "standard", "nocolon")
    with pytest.raises(ValueError, match=r"^KernelSpec.variant must be a non-empty string, got ''$"):
        KernelSpec("x", "rms_norm", "", lambda: len)


def test_factory_returning_non_callable_is_an_error():
    reg = fresh()
    reg.register(KernelSpec("bad", "rms_norm", "standard", lambda: 3))
    with pytest.raises(TypeError, match=r"^factory of kernel 'bad' \(rms_norm/standard\) returned 3, not a callable$"):
        reg.resolve("rms_norm", "standard", "bad")


def test_register_duplicate_is_an_error_unless_forced():
    reg = fresh()
    reg.register(KernelSpec("k", "rms_norm", "standard", lambda: abs, description="first"))
    with pytest.raises(ValueError) as err:
        reg.register(KernelSpec("k", "rms_norm", "standard", lambda: round))
    assert str(err.value) == (
        "kernel 'k' is already registered for rms_norm/standard (first); pass force=True to replace it"
    )
    reg.register(KernelSpec("k", "rms_norm", "standard", lambda: round), force=True)
    assert reg.resolve("rms_norm", "standard", "k") is round


def test_decorator_registers_each_variant():
    reg = fresh()

    @reg.kernel("deco", "rotary_pos_emb", ["full", "partial"], description="test rope")
    def rope(q, k, cos, sin, unsqueeze_dim=1):
        return q, k

    assert reg.resolve("rotary_pos_emb", "full", "deco") is rope
    assert reg.resolve("rotary_pos_emb", "partial", "deco") is rope
    assert reg.get("rotary_pos_emb", "full", "deco").description == "test rope"
    assert reg.list_available() == {("rotary_pos_emb", "full"): ["deco"], ("rotary_pos_emb", "partial"): ["deco"]}


def test_module_level_decorator_uses_given_registry():
    reg = fresh()

    @register_kernel("fn", "swiglu_mlp", "standard", registry=reg)
    def mlp(module, x):
        """Doc line one.

        more"""

    assert reg.get("swiglu_mlp", "standard", "fn").description == "Doc line one."
    assert KERNEL_REGISTRY.get("swiglu_mlp", "standard", "fn") is None


def test_resolve_eager_is_none():
    assert KERNEL_REGISTRY.resolve("rms_norm", "standard", "eager") is None
    assert fresh().resolve("anything", "at_all", "eager") is None


CPU = DeviceInfo("cpu")


def test_resolve_unknown_names_say_what_exists():
    with pytest.raises(KeyError) as err, use_device(CPU):
        KERNEL_REGISTRY.resolve("rms_norm", "offset", "liger")
    assert err.value.args[0] == (
        "no kernel 'liger' for rms_norm/offset; available: eager, cuda [needs cuda sm_80+], npu [needs npu], torch"
    )
    with pytest.raises(KeyError) as err:
        KERNEL_REGISTRY.resolve("rms_norm", "ofset", "torch")
    assert err.value.args[0] == (
        "unknown variant 'ofset' of op 'rms_norm'; did you mean 'offset'? "
        "(known variants: offset, standard, unweighted, unweighted_cast)"
    )
    with pytest.raises(KeyError) as err:
        KERNEL_REGISTRY.resolve("rmsnorm", "standard", "torch")
    assert err.value.args[0] == (
        "unknown op 'rmsnorm'; did you mean 'rms_norm'? (known ops: causal_conv1d, chunk_gated_delta_rule, "
        "cross_entropy_loss, dsa_attention, dsa_indexer, load_balancing_loss, mhc, moe, rms_norm, rms_norm_gated, "
        "rotary_pos_emb, rotary_pos_emb_vision, swiglu_mlp)"
    )
    with pytest.raises(KeyError) as err, use_device(CPU):
        KERNEL_REGISTRY.resolve("rms_norm", "standard", "trch")
    assert err.value.args[0] == (
        "no kernel 'trch' for rms_norm/standard; available: eager, cuda [needs cuda sm_80+], "
        "npu [needs npu], torch; did you mean 'torch'?"
    )


def test_resolve_kernel_of_another_variant_says_so():
    with pytest.raises(KeyError) as err, use_device(CPU):
        KERNEL_REGISTRY.resolve("moe", "gpt_oss", "npu")
    assert err.value.args[0] == (
        "no kernel 'npu' for moe/gpt_oss; available: eager, cuda [needs cuda sm_80+], torch "
        "('npu' implements moe variant(s) standard only)"
    )


def test_every_cross_entropy_value_binds_both_loss_variants():
    """One cross_entropy_loss_implementation binds a model's causal-LM and sequence-classification
    slots alike: `torch_chunked` (nothing to chunk on [batch, num_labels] pooled logits) is the torch
    kernel of the sequence-classification loss."""
    available = KERNEL_REGISTRY.list_available("cross_entropy_loss", include_unsupported=True)
    causal, seq_cls = (set(available[("cross_entropy_loss", v)]) for v in ("causal", "sequence_classification"))
    assert causal <= seq_cls, sorted(causal - seq_cls)
    get = KERNEL_REGISTRY.get
    assert (
        get("cross_entropy_loss", "sequence_classification", "torch_chunked").factory
        == get("cross_entropy_loss", "sequence_classification", "torch").factory
    )


def test_hardware_requirement():
    with pytest.raises(ValueError, match=r"^unknown device type 'tpu'; expected one of: any, cuda, npu$"):
        HardwareRequirement("tpu")
    with pytest.raises(ValueError, match=r"^min_cc/max_cc only apply to device_type 'cuda'$"):
        HardwareRequirement("npu", min_cc=(8, 0))
    hopper = HardwareRequirement("cuda", min_cc=(9, 0))
    assert hopper.is_satisfied(DeviceInfo("cuda", (9, 0)))
    assert hopper.unmet_reason(DeviceInfo("cuda", (8, 0))) == "needs cuda sm_90+; this machine has cuda (sm_80)"
    assert hopper.unmet_reason(DeviceInfo("cpu")) == "needs cuda sm_90+; this machine has cpu"
    ampere_only = HardwareRequirement("cuda", min_cc=(8, 0), max_cc=(8, 9))
    assert ampere_only.unmet_reason(DeviceInfo("cuda", (9, 0))) == (
        "needs cuda sm_80+ up to sm_89; this machine has cuda (sm_90)"
    )
    assert HardwareRequirement().is_satisfied(DeviceInfo("npu"))


def test_resolve_checks_the_hardware_and_list_available_filters():
    reg = fresh()
    reg.register(KernelSpec("hopper", "rms_norm", "standard", lambda: abs, HardwareRequirement("cuda", min_cc=(9, 0))))
    reg.register(KernelSpec("torch", "rms_norm", "standard", lambda: round))
    with use_device(DeviceInfo("cuda", (8, 6))):
        with pytest.raises(RuntimeError) as err:
            reg.resolve("rms_norm", "standard", "hopper")
        assert str(err.value) == (
            "kernel 'hopper' for rms_norm/standard cannot run here: needs cuda sm_90+; this machine has cuda (sm_86)"
        )
        assert reg.list_available() == {("rms_norm", "standard"): ["torch"]}
        assert reg.list_available(include_unsupported=True) == {("rms_norm", "standard"): ["hopper", "torch"]}
    with use_device(DeviceInfo("cuda", (9, 0))):
        assert reg.resolve("rms_norm", "standard", "hopper") is abs
        assert reg.list_available("rms_norm", "standard") == {("rms_norm", "standard"): ["hopper", "torch"]}
        assert reg.list_available("moe") == {}


#: Issue #35's ops while their kernels are being written: (op, variant) -> the kernels it still lacks.
#: Whoever registers one of them removes it here.
PENDING_KERNELS: dict = {}


def test_builtin_kernels_cover_every_documented_variant():
    everything = KERNEL_REGISTRY.list_available(include_unsupported=True)
    torch_pairs = sorted(k for k, names in everything.items() if "torch" in names)
    from opslot import KNOWN_OPS

    def documented(impl):
        return sorted(
            (op, v) for op, vs in KNOWN_OPS.items() for v in vs if impl not in PENDING_KERNELS.get((op, v), ())
        )

    assert torch_pairs == documented("torch")
    assert everything[("cross_entropy_loss", "causal")] == ["cuda", "torch", "torch_chunked"]
    cuda_pairs = sorted(k for k, names in everything.items() if "cuda" in names)
    assert cuda_pairs == documented("cuda")
    npu_pairs = sorted(k for k, names in everything.items() if "npu" in names)
    assert npu_pairs == [
        ("moe", "standard"),
        ("rms_norm", "offset"),
        ("rms_norm", "standard"),
        ("rms_norm", "unweighted"),
        ("rotary_pos_emb", "full"),
        ("rotary_pos_emb", "interleaved"),
        ("rotary_pos_emb", "partial"),
        ("rotary_pos_emb_vision", "standard"),
        ("swiglu_mlp", "standard"),
    ]
