"""SwiGLU: the fused silu(gate) * up kernels vs the fp32 reference (outputs, both gradients),
sizes, determinism, and the MLP op (module GEMMs + fused kernel) including its SiLU check."""

import pytest
import torch
import torch.nn as nn

from conftest import DTYPES, assert_close, bench_library, fp32_leaf, knob, requires_cuda

pytestmark = requires_cuda


@pytest.fixture(autouse=True)
def _register_ops():
    from opslot.kernels.cuda import swiglu  # noqa: F401  (registers torch.ops.opslot.silu_mul)


def check(gate, up, dtype):
    ga, ua = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
    h = torch.ops.opslot.silu_mul(ga, ua)
    d = torch.randn_like(h)
    h.backward(d)
    gr, ur = fp32_leaf(gate), fp32_leaf(up)
    hr = torch.nn.functional.silu(gr) * ur
    hr.backward(d.float())
    assert_close(h, hr, dtype, "h")
    assert_close(ga.grad, gr.grad, dtype, "dgate")
    assert_close(ua.grad, ur.grad, dtype, "dup")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (3, 7), (5, 127), (3, 2048), (2, 16384), (1_000_003, 3)])
def test_against_reference(dtype, shape):
    check(3 * torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype), dtype)


def test_strided_and_unaligned():
    base = torch.randn(64, 130, device="cuda", dtype=torch.bfloat16)
    check(base[:, 1:128], base[:, 2:129], torch.bfloat16)  # misaligned views
    check(base.t()[:100], base.t()[1:101], torch.bfloat16)


def test_bitwise_deterministic():
    g = torch.randn(4097, 1024, device="cuda", dtype=torch.bfloat16)
    u = torch.randn_like(g)
    d = torch.randn_like(g)

    def run():
        ga, ua = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
        h = torch.ops.opslot.silu_mul(ga, ua)
        h.backward(d)
        return h, ga.grad, ua.grad

    assert all(torch.equal(a, b) for a, b in zip(run(), run()))


@pytest.mark.parametrize("vectors,n", [(1, 4097 * 1024 + 5), (2, 4097 * 1024 + 5), (4, 9), (1, 0)])
def test_launch_variants_change_nothing(vectors, n):
    """The benchmark geometries (vectors per thread; the backward in index order instead of from the
    end; bench library) give bitwise the default's results (the production library's), the scalar
    tail included."""
    g = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    u, d = torch.randn_like(g), torch.randn_like(g)

    def run():
        ga, ua = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
        h = torch.ops.opslot.silu_mul(ga, ua)
        h.backward(d)
        return h, ga.grad, ua.grad

    ref = run()
    with bench_library() as lib:
        f = knob(lib, "opslot_silu_mul_set_tuning", 2)
        for from_start in (0, 1):
            assert f(vectors, from_start) == 0
            try:
                got = run()
            finally:
                assert f(1, 0) == 0
            assert all(torch.equal(a, b) for a, b in zip(ref, got))
        assert f(3, 0) != 0  # refused: 1, 2 or 4 vectors


class MLP(nn.Module):
    def __init__(self, hidden, inter, act="silu"):
        super().__init__()
        self.config = type("C", (), {"hidden_act": act})()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = nn.SiLU()


@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_against_reference(dtype):
    import copy

    from opslot import reference as R
    from opslot.kernels.cuda import swiglu

    m = MLP(64, 176).cuda().to(dtype)
    ref = copy.deepcopy(m).float()
    x = torch.randn(3, 5, 64, device="cuda", dtype=dtype)
    xa, xr = x.clone().requires_grad_(True), fp32_leaf(x)
    y = swiglu.swiglu_mlp(m, xa)
    yr = R.swiglu_mlp(ref, xr)
    d = torch.randn_like(y)
    y.backward(d)
    yr.backward(d.float())
    scale = 2.0 if dtype != torch.float32 else 50.0  # three GEMMs in the kernel's dtype
    assert_close(y, yr, dtype, "y", scale)
    assert_close(xa.grad, xr.grad, dtype, "dx", scale)
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert_close(getattr(m, name).weight.grad, getattr(ref, name).weight.grad, dtype, name, scale)


def test_refuses_non_silu():
    from opslot.kernels.cuda import swiglu

    m = MLP(8, 16, act="gelu").cuda()
    with pytest.raises(ValueError, match="hidden_act is 'gelu'"):
        swiglu.swiglu_mlp(m, torch.randn(2, 8, device="cuda"))


# -- DeepSeek-V4's clamped SwiGLU (swiglu_mlp/clamped; moe/clamped's activation: test_moe.py) ----
LIMIT = 1.5  # exact in every dtype: the kernel and the fp32 reference clamp the same values


def check_clamped(gate, up, dtype, limit=LIMIT):
    from opslot.kernels.cuda import swiglu

    ga, ua = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
    h = swiglu.silu_mul_clamped(ga, ua, limit)
    d = torch.randn_like(h)
    h.backward(d)
    gr, ur = fp32_leaf(gate), fp32_leaf(up)
    hr = torch.nn.functional.silu(gr.clamp(max=limit)) * ur.clamp(-limit, limit)
    hr.backward(d.float())
    assert h.dtype == dtype and h.is_contiguous()
    assert_close(h, hr, dtype, "h")
    assert_close(ga.grad, gr.grad, dtype, "dgate")
    assert_close(ua.grad, ur.grad, dtype, "dup")
    # where a clamp was active the gradient is exactly zero, as torch's clamp backward
    assert torch.equal(ga.grad.reshape(-1)[(gate.reshape(-1).float() > limit)].abs().sum(), ga.grad.new_zeros(()))
    assert float(ua.grad.reshape(-1)[(up.reshape(-1).float().abs() > limit)].abs().sum()) == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (3, 7), (5, 127), (3, 2048), (2, 16384), (1_000_003, 3)])
def test_clamped_against_reference(dtype, shape):
    g = 3 * torch.randn(shape, device="cuda", dtype=dtype)
    u = 3 * torch.randn(shape, device="cuda", dtype=dtype)
    check_clamped(g, u, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_bounds_and_nan(dtype):
    """Inputs exactly at the bounds pass the gradient (torch: min <= x <= max); NaN propagates in the
    forward and gets a zero gradient through its clamp."""
    from opslot.kernels.cuda import swiglu

    vals = torch.tensor([-2.0, -1.5, -1.0, 0.0, 1.0, 1.5, 2.0, float("nan")], device="cuda")
    g = vals.repeat_interleave(8).to(dtype).requires_grad_(True)
    u = vals.repeat(8).to(dtype).requires_grad_(True)
    h = swiglu.silu_mul_clamped(g, u, LIMIT)
    d = torch.ones_like(h)
    h.backward(d)
    gr, ur = g.detach().float().requires_grad_(True), u.detach().float().requires_grad_(True)
    hr = torch.nn.functional.silu(gr.clamp(max=LIMIT)) * ur.clamp(-LIMIT, LIMIT)
    hr.backward(d.float())
    torch.testing.assert_close(h.float(), hr.to(dtype).float(), equal_nan=True, rtol=2e-2, atol=0)
    torch.testing.assert_close(g.grad.float(), gr.grad.to(dtype).float(), equal_nan=True, rtol=2e-2, atol=0)
    torch.testing.assert_close(u.grad.float(), ur.grad.to(dtype).float(), equal_nan=True, rtol=2e-2, atol=0)
    assert torch.equal(g.grad == 0, gr.grad == 0) and torch.equal(u.grad == 0, ur.grad == 0)


def test_clamped_limit_rounds_as_torch():
    """A limit that bf16 cannot hold is rounded to bf16 first (torch.clamp's `max.to<T>()`): an input
    equal to the rounded limit is inside the bounds and passes its gradient."""
    from opslot.kernels.cuda import swiglu

    g = torch.tensor([7.3125, 7.25, 8.0], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    u = torch.tensor([7.3125, -7.3125, -8.0], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    h = swiglu.silu_mul_clamped(g, u, 7.3)  # bf16(7.3) = 7.3125
    h.backward(torch.ones_like(h))
    gr, ur = g.detach().clone().requires_grad_(True), u.detach().clone().requires_grad_(True)
    hr = torch.nn.functional.silu(gr.clamp(max=7.3)) * ur.clamp(-7.3, 7.3)
    hr.backward(torch.ones_like(hr))
    assert torch.equal(g.grad == 0, gr.grad == 0) and torch.equal(u.grad == 0, ur.grad == 0)
    assert g.grad[2] == 0 and g.grad[0] != 0 and u.grad[0] != 0 and u.grad[2] == 0


def test_clamped_strided_and_deterministic():
    base = 3 * torch.randn(64, 130, device="cuda", dtype=torch.bfloat16)
    check_clamped(base[:, 1:128], base[:, 2:129], torch.bfloat16)
    check_clamped(base.t()[:100], base.t()[1:101], torch.bfloat16)
    from opslot.kernels.cuda import swiglu

    g, u = (
        3 * torch.randn(4097, 1024, device="cuda", dtype=torch.bfloat16),
        torch.randn(4097, 1024, device="cuda").bfloat16(),
    )
    d = torch.randn_like(g)

    def run():
        ga, ua = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
        h = swiglu.silu_mul_clamped(ga, ua, LIMIT)
        h.backward(d)
        return h, ga.grad, ua.grad

    assert all(torch.equal(a, b) for a, b in zip(run(), run()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_with_infinite_limit_is_silu_mul_bitwise(dtype):
    """The clamped kernels with no clamp active compute exactly what silu_mul computes."""
    from opslot.kernels.cuda import swiglu

    g = 3 * torch.randn(1000, 33, device="cuda", dtype=dtype)
    u, d = torch.randn_like(g), torch.randn_like(g)
    outs = []
    for f in (lambda a, b: swiglu.silu_mul(a, b), lambda a, b: swiglu.silu_mul_clamped(a, b, float("inf"))):
        ga, ua = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
        h = f(ga, ua)
        h.backward(d)
        outs.append((h, ga.grad, ua.grad))
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_clamped_opcheck_and_errors():
    g = 3 * torch.randn(5, 24, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    u = torch.randn(5, 24, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(torch.ops.opslot.silu_mul_clamped.default, (g, u, 1.5))
    torch.library.opcheck(torch.ops.opslot.silu_mul_clamped_bwd.default, (u.detach(), g.detach(), u.detach(), 1.5))
    with pytest.raises(ValueError, match=r"^silu_mul_clamped: limit must be a number >= 0, got -1$"):
        torch.ops.opslot.silu_mul_clamped(g, u, -1.0)


class ClampedMLP(MLP):
    def __init__(self, hidden, inter, limit, act="silu"):
        super().__init__(hidden, inter, act)
        self.limit = limit


@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_clamped_against_reference(dtype):
    import copy

    from opslot import reference as R
    from opslot.kernels.cuda import swiglu

    # fp32: a small limit, so that many clamps are hit; bf16/fp16: 7.0 (rarely hit), because a GEMM
    # output within rounding of the limit can flip the clamp's zero/nonzero derivative
    m = ClampedMLP(64, 176, limit=0.5 if dtype == torch.float32 else 7.0).cuda().to(dtype)
    ref = copy.deepcopy(m).float()
    x = 4 * torch.randn(3, 5, 64, device="cuda", dtype=dtype)
    xa, xr = x.clone().requires_grad_(True), fp32_leaf(x)
    y = swiglu.swiglu_mlp_clamped(m, xa)
    yr = R.swiglu_mlp_clamped(ref, xr)
    d = torch.randn_like(y)
    y.backward(d)
    yr.backward(d.float())
    scale = 2.0 if dtype != torch.float32 else 50.0  # three GEMMs in the kernel's dtype
    assert_close(y, yr, dtype, "y", scale)
    assert_close(xa.grad, xr.grad, dtype, "dx", scale)
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert_close(getattr(m, name).weight.grad, getattr(ref, name).weight.grad, dtype, name, scale)
