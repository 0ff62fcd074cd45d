"""Load-balancing loss over the per-layer router logits: loss and every layer's gradient vs the fp32
reference (with and without attention mask), layer counts past one launch's 64, expert counts,
top-k, dtypes; bitwise determinism."""

import pytest
import torch

from conftest import DTYPES, assert_close, bench_library, fp32_leaf, knob, requires_cuda

pytestmark = requires_cuda


def _logits(layers, rows, experts, dtype):
    """Logits whose values are exact in `dtype` and distinct within a row (top-k without ties)."""
    step = 1 / 16 if experts <= 128 else 1 / 4
    out = []
    for _ in range(layers):
        perm = torch.argsort(torch.rand(rows, experts, device="cuda"), dim=-1).float()
        out.append(((perm - experts / 2) * step).to(dtype))
    return tuple(out)


def check(layers, rows, experts, top_k, dtype, masked):
    from opslot import reference as R
    from opslot.kernels.cuda import load_balancing as LB

    logits = _logits(layers, rows, experts, dtype)
    mask = None
    if masked:
        mask = torch.rand(1, rows, device="cuda") > 0.3
        mask[0, 0] = True
    ours = tuple(t.detach().requires_grad_(True) for t in logits)
    loss = LB.load_balancing_loss(ours, experts, top_k, mask)
    # A large upstream gradient keeps the logits' gradients (~1 / rows) out of fp16's subnormals.
    loss.backward(torch.tensor(1.7e4, device="cuda"))
    refs = tuple(fp32_leaf(t) for t in logits)
    lref = R.load_balancing_loss(refs, experts, top_k, mask)
    (lref * 1.7e4).backward()
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert_close(loss, lref.detach(), torch.float32, "loss", scale=20)
    for i, (a, b) in enumerate(zip(ours, refs)):
        assert_close(a.grad, b.grad, dtype, f"grad of layer {i}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "layers,rows,experts,top_k",
    [
        (1, 1, 8, 2),
        (3, 37, 8, 2),
        (3, 37, 60, 4),
        (2, 1000, 128, 8),
        (70, 64, 128, 2),
        (2, 33, 512, 8),
        (4, 20, 5, 1),
        (2, 10, 16, 15),
        (2, 300, 32, 3),
        (2, 65, 256, 2),
        (1, 9, 3, 0),
    ],
)
@pytest.mark.parametrize("masked", [False, True])
def test_against_reference(dtype, layers, rows, experts, top_k, masked):
    check(layers, rows, experts, top_k, dtype, masked)


def test_big():
    check(48, 16384, 128, 8, torch.bfloat16, True)


def test_not_a_tuple_and_strided_layers():
    from opslot import reference as R
    from opslot.kernels.cuda import load_balancing as LB

    assert LB.load_balancing_loss(None, 8) == 0
    assert LB.load_balancing_loss([torch.randn(2, 8, device="cuda")], 8) == 0
    wide = torch.randn(40, 3 * 64, device="cuda")
    layers = (wide[:, :64], wide[:, 64:128])  # row stride 192
    assert_close(LB.load_balancing_loss(layers, 64, 2), R.load_balancing_loss(layers, 64, 2), torch.float32, "loss")


def test_bitwise_deterministic():
    from opslot.kernels.cuda import load_balancing as LB

    logits = _logits(48, 4096, 128, torch.bfloat16)
    mask = torch.rand(4, 1024, device="cuda") > 0.2

    def run():
        xs = tuple(t.clone().requires_grad_(True) for t in logits)
        loss = LB.load_balancing_loss(xs, 128, 8, mask)
        loss.backward()
        return [loss] + [x.grad for x in xs]

    assert all(torch.equal(a, b) for a, b in zip(run(), run()))


def _tie_reference(logits, experts, top_k):
    """The loss with the documented tie rule (equal logits: the lower expert index is selected),
    via a stable descending sort; the softmax in fp32 as the kernel does."""
    cnt = torch.zeros(experts, device="cuda")
    psum = torch.zeros(experts, device="cuda")
    rows = 0
    for layer in logits:
        x = layer.float()
        order = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :top_k]
        cnt = cnt + torch.bincount(order.reshape(-1), minlength=experts).float()
        psum = psum + torch.softmax(x, dim=-1).sum(0)
        rows += x.shape[0]
    return experts * torch.sum((cnt / rows) * (psum / rows))


@pytest.mark.parametrize("experts,top_k", [(128, 8), (64, 6), (256, 16), (40, 3), (8, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_take_the_lower_index(experts, top_k, dtype):
    """Rows full of equal logits (four distinct values): the selection at the threshold follows the
    lower index, in the fast forward (8 <= E <= 256, top_k <= 16) as in the general kernel."""
    from opslot.kernels.cuda import load_balancing as LB

    torch.manual_seed(experts * 100 + top_k)
    logits = tuple((torch.randint(0, 4, (523, experts), device="cuda").float() / 4).to(dtype) for _ in range(3))
    ours = tuple(t.detach().clone().requires_grad_(True) for t in logits)
    loss = LB.load_balancing_loss(ours, experts, top_k)
    refs = tuple(t.detach().float().requires_grad_(True) for t in logits)
    lref = _tie_reference(refs, experts, top_k)
    assert_close(loss, lref.detach(), torch.float32, "loss", scale=20)
    loss.backward()
    lref.backward()
    for i, (a, b) in enumerate(zip(ours, refs)):
        assert_close(a.grad, b.grad, dtype, f"grad of layer {i}")


def test_fast_and_general_forward_agree_on_counts():
    """The same logits through the fast forward (aligned rows) and the general one (a row stride
    that is not a multiple of 16 bytes): the loss is the same up to fp32 summation order."""
    from opslot.kernels.cuda import load_balancing as LB

    torch.manual_seed(7)
    base = torch.randint(0, 8, (2, 777, 129), device="cuda").float().div(8).to(torch.bfloat16)
    fast = tuple(base[i, :, :128].contiguous() for i in range(2))
    general = tuple(base[i, :, :128] for i in range(2))  # row stride 129: not 16-byte aligned
    a = LB.load_balancing_loss(fast, 128, 8)
    b = LB.load_balancing_loss(general, 128, 8)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=0)


def _set_paths(lib, forward, backward):
    assert knob(lib, "opslot_load_balancing_set_tuning", 2)(forward, backward) == 0


def test_tuning_rejects_bad_values():
    with bench_library() as lib:
        f = knob(lib, "opslot_load_balancing_set_tuning", 2)
        for bad in [(3, 0), (0, 2), (-1, 0), (0, -1)]:
            assert f(*bad) != 0
        assert f(0, 0) == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("experts,top_k", [(64, 6), (128, 8), (128, 2), (256, 16), (256, 9)])
def test_every_path_agrees(dtype, experts, top_k):
    """The warp-per-row forward and backward (the defaults for 64/128/256 experts, here on the
    production library), the tile forward and the general kernels (forced on the bench library) on
    the same logits (ties included: few distinct values, signed zeros): the loss equal up to fp32
    summation order, the gradients within the dtype's tolerance of each other and of the tie
    reference."""
    from opslot.kernels.cuda import load_balancing as LB

    torch.manual_seed(experts + top_k)
    vals = torch.tensor([-1.5, -0.5, -0.0, 0.0, 0.25, 0.5], device="cuda")
    logits = tuple(vals[torch.randint(0, 6, (1031, experts), device="cuda")].to(dtype) for _ in range(3))
    mask = torch.rand(1, 1031, device="cuda") > 0.25
    refs = tuple(t.detach().float().requires_grad_(True) for t in logits)
    lref = _tie_reference(refs, experts, top_k)
    results = {}

    def run(fwd, bwd):
        xs = tuple(t.detach().clone().requires_grad_(True) for t in logits)
        loss = LB.load_balancing_loss(xs, experts, top_k)
        loss.backward()
        results[(fwd, bwd)] = (loss.detach(), [x.grad for x in xs])
        xs = tuple(t.detach().clone().requires_grad_(True) for t in logits)
        masked = LB.load_balancing_loss(xs, experts, top_k, mask)
        masked.backward()
        results[(fwd, bwd, "mask")] = (masked.detach(), [x.grad for x in xs])

    run(0, 0)  # the automatic paths, on the library in use
    assert_close(results[(0, 0)][0], lref.detach(), torch.float32, "loss", scale=20)
    lref.backward()
    for a, b in zip(results[(0, 0)][1], refs):
        assert_close(a, b.grad, dtype, "grad vs tie reference")
    with bench_library() as lib:  # the forced paths
        try:
            for fwd, bwd in [(1, 1), (2, 1), (0, 1), (2, 0)]:
                _set_paths(lib, fwd, bwd)
                run(fwd, bwd)
        finally:
            _set_paths(lib, 0, 0)
    for key, (loss, grads) in results.items():
        base = results[(0, 0, "mask")] if "mask" in key else results[(0, 0)]
        torch.testing.assert_close(loss, base[0], rtol=2e-6, atol=0, msg=f"loss of path {key}")
        for a, b in zip(grads, base[1]):
            assert_close(a, b.float(), dtype, f"grad of path {key}")


def test_backward_fills_no_zero_gradient():
    """coef has no gradient: one fwd+bwd runs opslot's kernels and no fill (autograd used to
    materialise a zero gradient for coef on every backward)."""
    from torch.profiler import ProfilerActivity, profile

    from opslot.kernels.cuda import load_balancing as LB

    logits = tuple(t.detach().requires_grad_(True) for t in _logits(3, 257, 128, torch.bfloat16))
    seed = torch.ones((), device="cuda")

    def run():
        loss = LB.load_balancing_loss(logits, 128, 8)
        return torch.autograd.grad(loss, logits, seed)

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        grads = run()
        torch.cuda.synchronize()
    assert all(g is not None and g.shape == (257, 128) for g in grads)
    names = sorted({e.key for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0})
    assert not [n for n in names if "Fill" in n], names
    assert any("lb_" in n for n in names), names
