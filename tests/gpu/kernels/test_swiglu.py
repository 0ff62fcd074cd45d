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
