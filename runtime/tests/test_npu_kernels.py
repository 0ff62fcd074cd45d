"""The "npu" kernels against a fake torch_npu (contracts + math), compared with the fp32 references.
Unverified on Ascend hardware: these tests pin what the adapters pass, not what the NPU computes."""

import sys

import pytest
import torch

from fake_torch_npu import ContractError, make_fake_torch_npu
from kernel_harness import DTYPES, compare
from opslot import KERNEL_REGISTRY, DeviceInfo, reference, use_device
from test_kernels import MLP, Experts, _cos_sin, _routing, randn

pytestmark = pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])


@pytest.fixture
def npu(monkeypatch):
    fake = make_fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    with use_device(DeviceInfo("npu")):
        yield fake


def kernel(op, variant):
    return KERNEL_REGISTRY.resolve(op, variant, "npu")


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_rms_norm(npu, dtype, variant):
    t = {"x": randn(2, 5, 32, seed=1) * 3, "w": 1 + randn(32, seed=2, scale=0.1)}
    compare(
        kernel("rms_norm", variant),
        getattr(reference, f"rms_norm_{variant}"),
        t,
        lambda f, t, m: f(t["x"], t["w"], 1e-6),
        "cpu",
        dtype,
        out_dtype=dtype,
    )
    assert npu.calls == [("npu_rms_norm", (2, 5, 32), dtype, {"epsilon": 1e-6})]


def test_rms_norm_unweighted(npu, dtype):
    compare(
        kernel("rms_norm", "unweighted"),
        reference.rms_norm_unweighted,
        {"x": randn(3, 4, 16, seed=3)},
        lambda f, t, m: f(t["x"], None, 1e-5),
        "cpu",
        dtype,
        out_dtype=dtype,
    )
    assert [c[0] for c in npu.calls] == ["npu_rms_norm"]


@pytest.mark.parametrize("variant,rot_dim", [("full", 16), ("partial", 8)])
def test_rotary_pos_emb(npu, dtype, variant, rot_dim):
    cos, sin = _cos_sin(2, 5, rot_dim, seed=7)
    t = {"q": randn(2, 4, 5, 16, seed=8), "k": randn(2, 2, 5, 16, seed=9), "cos": cos, "sin": sin}
    compare(
        kernel("rotary_pos_emb", variant),
        getattr(reference, f"rotary_pos_emb_{variant}"),
        t,
        lambda f, t, m: f(t["q"], t["k"], t["cos"], t["sin"], unsqueeze_dim=1),
        "cpu",
        dtype,
        out_dtype=dtype,
    )
    d = rot_dim
    assert npu.calls == [("npu_rotary_mul", (2, 4, 5, d), dtype, {}), ("npu_rotary_mul", (2, 2, 5, d), dtype, {})]


def test_rotary_pos_emb_rejects_3d(npu, dtype):
    cos, sin = _cos_sin(1, 5, 16, seed=7)
    q = randn(5, 4, 16).to(dtype)
    with pytest.raises(
        ValueError, match=r"^npu rotary_pos_emb needs 4-D q/k and cos/sin after unsqueeze, got 3-D and 4-D$"
    ):
        kernel("rotary_pos_emb", "full")(q, q, cos.to(dtype), sin.to(dtype), unsqueeze_dim=1)


def test_swiglu_mlp(npu, dtype):
    compare(
        kernel("swiglu_mlp", "standard"),
        reference.swiglu_mlp,
        {"x": randn(2, 5, 16, seed=11)},
        lambda f, t, m: f(m[0], t["x"]),
        "cpu",
        dtype,
        modules=[MLP()],
        out_dtype=dtype,
    )
    assert npu.calls == [("npu_swiglu", (2, 5, 48), dtype, {"dim": -1})]


def test_moe_standard(npu, dtype):
    index, weights = _routing(10, 6, 2, seed=32, unused=(4,))
    compare(
        kernel("moe", "standard"),
        reference.moe_standard,
        {"x": randn(10, 16, seed=33), "w": weights},
        lambda f, t, m: f(m[0], t["x"], index, t["w"]),
        "cpu",
        dtype,
        modules=[Experts()],
        out_dtype=dtype,
    )
    assert [c[0] for c in npu.calls] == ["npu_grouped_matmul", "npu_swiglu", "npu_grouped_matmul"]
    assert npu.calls[0][1:] == ((20, 16), dtype, {"groups": 6})
    assert npu.calls[1][1] == (20, 24)


def test_moe_refuses_non_silu_experts(npu, dtype):
    experts = Experts()
    experts.act_fn = torch.nn.GELU()
    del experts.config
    index, weights = _routing(4, 6, 2, seed=32)
    with pytest.raises(ValueError, match=r"^moe computes SiLU gating but the module's act_fn is GELU; use 'eager'$"):
        kernel("moe", "standard")(experts, randn(4, 16), index, weights)
    assert npu.calls == []


def test_fake_contract_is_enforced(npu, dtype):
    """The fake really checks: gamma in another dtype is refused."""
    x = randn(2, 8).to(dtype)
    with pytest.raises(ContractError, match="gamma dtype"):
        npu.npu_rms_norm(x, torch.ones(8, dtype=torch.float64))


def test_npu_kernels_refused_off_npu(dtype):
    with use_device(DeviceInfo("cuda", (9, 0))):
        with pytest.raises(
            RuntimeError,
            match=r"^kernel 'npu' for rms_norm/standard cannot run here: needs npu; this machine has cuda \(sm_90\)$",
        ):
            KERNEL_REGISTRY.resolve("rms_norm", "standard", "npu")
