"""OpsImplementationConfig: loading, strict fields, device defaults and validation messages."""

import pytest

from opslot import (
    CUDA_DEFAULTS,
    DeviceInfo,
    HardwareRequirement,
    KernelRegistry,
    KernelSpec,
    OpsImplementationConfig,
    use_device,
)
from opslot.device_defaults import CPU_DEFAULTS, set_cuda_kernels_check
from opslot.kernels import register_builtin_kernels

NPU = DeviceInfo("npu")
H200 = DeviceInfo("cuda", (9, 0))
CPU = DeviceInfo("cpu")


def test_from_dict_accepts_three_shapes():
    flat = {"rms_norm_implementation": "torch", "moe_implementation": "fused_torch"}
    expected = OpsImplementationConfig(rms_norm_implementation="torch", moe_implementation="fused_torch")
    assert OpsImplementationConfig.from_dict(flat) == expected
    assert OpsImplementationConfig.from_dict({"ops_implementation": flat}) == expected
    assert OpsImplementationConfig.from_dict({"model": {"ops_implementation": flat}}) == expected
    assert OpsImplementationConfig.from_dict({"model": {}}) == OpsImplementationConfig()
    assert OpsImplementationConfig.from_dict(None) == OpsImplementationConfig()


def test_unknown_fields_are_rejected_with_suggestions():
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"rms_norm_implemntation": "torch"})
    assert (
        str(err.value)
        == "unknown ops_implementation field 'rms_norm_implemntation'; did you mean 'rms_norm_implementation'?"
    )
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"rms_norm": "torch"})
    assert str(err.value) == "unknown ops_implementation field 'rms_norm'; did you mean 'rms_norm_implementation'?"
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"flash": "torch"})
    assert str(err.value) == "unknown ops_implementation field 'flash'"


def test_values_are_checked():
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig(moe_implementation="torch")
    assert str(err.value) == (
        "ops_implementation.moe_implementation must be 'eager' or 'fused_<impl>', "
        "got 'torch'; did you mean 'fused_torch'?"
    )
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"rms_norm_implementation": 3})
    assert str(err.value) == "ops_implementation.rms_norm_implementation must be a non-empty string, got 3"
    with pytest.raises(TypeError, match=r"^ops_implementation must be a mapping, got list$"):
        OpsImplementationConfig.from_dict(["torch"])


def test_from_yaml(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(
        "model:\n  ops_implementation:\n    rms_norm_implementation: torch\n"
        "    cross_entropy_loss_implementation: torch_chunked\n    attn_implementation: sdpa\n"
    )
    cfg = OpsImplementationConfig.from_yaml(str(path))
    assert cfg.to_dict() == {
        "rms_norm_implementation": "torch",
        "cross_entropy_loss_implementation": "torch_chunked",
        "attn_implementation": "sdpa",
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text("ops_implementation:\n  rope_implementation: torch\n")
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.coerce(str(bad))
    assert str(err.value) == (
        f"{bad}: unknown ops_implementation field 'rope_implementation'; did you mean 'rotary_pos_emb_implementation'?"
    )


def test_cpu_defaults_are_eager_and_cuda_defaults_need_the_library():
    cfg = OpsImplementationConfig()
    fields = {f.name for f in __import__("dataclasses").fields(cfg) if f.name.endswith("_implementation")}
    assert set(CUDA_DEFAULTS) == fields and set(CPU_DEFAULTS) == fields
    with use_device(CPU):
        assert all(cfg.impl_for(op) == "eager" for op in ("rms_norm", "moe", "cross_entropy_loss", "rotary_pos_emb"))
        assert cfg.value("attn_implementation") is None
    try:
        # a CUDA machine without a usable kernel library: the upstream code
        set_cuda_kernels_check(lambda: "libopslot_kernels.so not found")
        with use_device(H200):
            assert all(cfg.impl_for(op) == "eager" for op in ("rms_norm", "rotary_pos_emb", "swiglu_mlp"))
        # ... with one: every op that has a CUDA kernel here takes it
        set_cuda_kernels_check(lambda: None)
        with use_device(H200):
            for op in (
                "rms_norm",
                "rms_norm_gated",
                "rotary_pos_emb",
                "swiglu_mlp",
                "load_balancing_loss",
                "cross_entropy_loss",
                "causal_conv1d",
                "chunk_gated_delta_rule",
            ):
                assert cfg.impl_for(op) == "cuda", op
            assert cfg.impl_for("moe") == "cuda"  # fused_cuda
            assert cfg.effective_impl("causal_conv1d", "standard") == "cuda"
            assert cfg.effective_impl("chunk_gated_delta_rule", "standard") == "cuda"
            assert cfg.effective_impl("rms_norm", "offset") == "cuda"
            assert cfg.value("attn_implementation") is None
            assert OpsImplementationConfig(rms_norm_implementation="torch").impl_for("rms_norm") == "torch"
        with use_device(DeviceInfo("cuda", (7, 5))):  # the kernels need sm_80+: the default falls back
            assert cfg.effective_impl("rms_norm", "standard") == "eager"
    finally:
        set_cuda_kernels_check(None)


def test_dsa_sparse_attention_defaults_to_its_cuda_kernel_on_sm90():
    """`dsa_attention` keeps the field's default `eager`, but the DeepSeek-V4 and GLM-MoE-DSA variants default
    to `cuda` where the library runs on sm_90+ (CUDA_VARIANT_DEFAULTS); an explicit field overrides them, and
    off CUDA, below sm_90 or without the library they are eager like the field."""
    from opslot import CUDA_VARIANT_DEFAULTS

    variants = ("deepseek_v4", "glm")
    assert CUDA_VARIANT_DEFAULTS == {("dsa_attention", v): ("cuda", (9, 0)) for v in variants}
    cfg = OpsImplementationConfig()
    try:
        set_cuda_kernels_check(lambda: None)
        with use_device(H200):
            assert CUDA_DEFAULTS["dsa_attention_implementation"] == "eager"
            assert cfg.value("dsa_attention_implementation") == "eager"  # the field's default
            for v in variants:
                assert cfg.choose("dsa_attention", v) == ("cuda", "default"), v
            assert cfg.validate([("dsa_attention", v) for v in variants]) == {
                ("dsa_attention", v): "cuda" for v in variants
            }
            for value in ("eager", "torch"):
                explicit = OpsImplementationConfig(dsa_attention_implementation=value)
                for v in variants:
                    assert explicit.choose("dsa_attention", v) == (value, "explicit"), (v, value)
        for older in ((8, 0), (8, 9), (7, 5)):  # below sm_90 the field's default (an A100's shared memory)
            with use_device(DeviceInfo("cuda", older)):
                for v in variants:
                    assert cfg.choose("dsa_attention", v) == ("eager", "default"), (v, older)
        with use_device(DeviceInfo("cuda", (10, 0))):
            for v in variants:
                assert cfg.choose("dsa_attention", v) == ("cuda", "default"), v
        set_cuda_kernels_check(lambda: "libopslot_kernels.so not found")
        for device in (H200, CPU, NPU):
            with use_device(device):
                for v in variants:
                    assert cfg.choose("dsa_attention", v) == ("eager", "default"), (v, device)
    finally:
        set_cuda_kernels_check(None)


def test_a_variant_default_that_fails_is_reported_as_that_default():
    """validate names the variant's own default, not the field's `eager`, when that default cannot load."""
    from opslot import KernelRegistry, KernelSpec

    registry = KernelRegistry()
    register_builtin_kernels(registry)
    real = registry.get("dsa_attention", "deepseek_v4", "cuda")

    def broken():
        raise RuntimeError("libopslot_torch.so: undefined symbol")

    registry.register(KernelSpec("cuda", "dsa_attention", "deepseek_v4", broken, real.hardware, "broken"), force=True)
    try:
        set_cuda_kernels_check(lambda: None)
        with use_device(H200), pytest.raises(ValueError) as err:
            OpsImplementationConfig().validate([("dsa_attention", "deepseek_v4")], registry=registry)
    finally:
        set_cuda_kernels_check(None)
    assert str(err.value) == (
        "invalid ops_implementation:\n  dsa_attention/deepseek_v4 (dsa_attention_implementation unset: "
        "dsa_attention/deepseek_v4's default 'cuda'): libopslot_torch.so: undefined symbol"
    )


def test_cuda_library_check_is_lazy_and_cached(monkeypatch):
    calls = []

    def check():
        calls.append(1)
        return None

    try:
        set_cuda_kernels_check(check)
        cfg = OpsImplementationConfig()
        with use_device(CPU):
            cfg.impl_for("rms_norm")
        with use_device(NPU):
            cfg.impl_for("rms_norm")
        assert calls == []  # never asked off CUDA machines
        set_cuda_kernels_check(None)
        import opslot.device_defaults as config_module
        import opslot.kernels.cuda._lib as lib_module

        monkeypatch.setattr(lib_module, "unavailable_reason", check)
        with use_device(H200):
            cfg.impl_for("rms_norm")
            cfg.impl_for("swiglu_mlp")
        assert calls == [1]
        assert config_module.cuda_kernels_unavailable_reason() is None
    finally:
        set_cuda_kernels_check(None)


def test_npu_normalises_only_unset_fields():
    cfg = OpsImplementationConfig(rotary_pos_emb_implementation="eager", swiglu_mlp_implementation="torch")
    with use_device(NPU):
        assert cfg.impl_for("rms_norm") == "npu"  # unset: NPU default
        assert cfg.impl_for("moe") == "npu"  # fused_npu -> npu
        assert cfg.impl_for("rotary_pos_emb") == "eager"  # explicit eager is kept
        assert cfg.impl_for("swiglu_mlp") == "torch"  # explicit portable kernel is kept
        assert cfg.impl_for("cross_entropy_loss") == "eager"  # no NPU default
        # a default without a kernel for the slot's variant falls back to eager ...
        assert cfg.effective_impl("moe", "gpt_oss") == "eager"
        assert cfg.effective_impl("moe", "standard") == "npu"
        assert cfg.validate([("rms_norm", "offset"), ("moe", "gpt_oss"), ("moe", "standard")]) == {
            ("moe", "gpt_oss"): "eager",
            ("moe", "standard"): "npu",
            ("rms_norm", "offset"): "npu",
        }
    # ... but an explicit value never does
    with use_device(NPU), pytest.raises(ValueError) as err:
        OpsImplementationConfig(moe_implementation="fused_npu").validate([("moe", "gpt_oss")])
    assert str(err.value) == (
        "invalid ops_implementation:\n"
        "  moe/gpt_oss (moe_implementation='fused_npu'): no kernel 'npu' for moe/gpt_oss; "
        "available: eager, fused_cuda [needs cuda sm_80+], fused_torch ('fused_npu' implements moe variant(s) standard only)"
    )


def test_explicit_unsupported_value_on_npu_is_an_error():
    reg = KernelRegistry()
    register_builtin_kernels(reg)
    reg.register(KernelSpec("cuda_fast", "rms_norm", "standard", lambda: abs, HardwareRequirement("cuda")))
    cfg = OpsImplementationConfig(rms_norm_implementation="cuda_fast")
    with use_device(H200):
        assert cfg.validate([("rms_norm", "standard")], registry=reg) == {("rms_norm", "standard"): "cuda_fast"}
    with use_device(NPU), pytest.raises(ValueError) as err:
        cfg.validate([("rms_norm", "standard")], registry=reg)
    assert str(err.value) == (
        "invalid ops_implementation:\n  rms_norm/standard (rms_norm_implementation="
        "'cuda_fast'): kernel 'cuda_fast' for rms_norm/standard cannot run here: "
        "needs cuda; this machine has npu"
    )


def test_validate_reports_every_problem_at_once():
    cfg = OpsImplementationConfig(rms_norm_implementation="torch", moe_implementation="fused_npu")
    with use_device(H200), pytest.raises(ValueError) as err:
        cfg.validate([("rms_norm", "standard"), ("moe", "gpt_oss"), ("fancy_op", "standard")])
    assert str(err.value) == (
        "invalid ops_implementation:\n"
        "  fancy_op/standard (no config field): slot op 'fancy_op' has no field in OpsImplementationConfig "
        "(ops with a field: attn, causal_conv1d, chunk_gated_delta_rule, cross_entropy_loss, dsa_attention, "
        "dsa_indexer, load_balancing_loss, mhc, moe, rms_norm, rms_norm_gated, rotary_pos_emb, rotary_pos_emb_vision, "
        "swiglu_mlp)\n"
        "  moe/gpt_oss (moe_implementation='fused_npu'): no kernel 'npu' for moe/gpt_oss; available: eager, "
        "fused_cuda, fused_torch ('fused_npu' implements moe variant(s) standard only)"
    )


def test_to_dict_keeps_only_explicit_fields():
    assert OpsImplementationConfig(attn_implementation="sdpa").to_dict() == {"attn_implementation": "sdpa"}
    assert OpsImplementationConfig().to_dict() == {}


def test_the_config_fields_are_the_ops_fields():
    import dataclasses

    from opslot.ops import CONFIG_FIELDS

    assert tuple(f.name for f in dataclasses.fields(OpsImplementationConfig)) == CONFIG_FIELDS
