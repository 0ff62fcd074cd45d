"""Every custom op: torch.library.opcheck, torch.compile without graph breaks (fullgraph), CUDA
graph capture, and binding through the registry (config defaults pick `cuda` on this machine)."""

import pytest
import torch

from conftest import requires_cuda

pytestmark = requires_cuda


def _cases():
    from opslot.kernels.cuda import load_balancing, norms, rope, swiglu  # noqa: F401  (registers the ops)

    bf, dev = torch.bfloat16, "cuda"
    x = torch.randn(6, 64, device=dev, dtype=bf, requires_grad=True)
    g = torch.randn(6, 64, device=dev, dtype=bf, requires_grad=True)
    w = torch.randn(64, device=dev, dtype=bf, requires_grad=True)
    w32 = torch.randn(64, device=dev, requires_grad=True)
    q = torch.randn(2, 5, 4, 32, device=dev, dtype=bf).transpose(1, 2).requires_grad_(True)
    k = torch.randn(2, 5, 2, 32, device=dev, dtype=bf).transpose(1, 2).requires_grad_(True)
    cos, sin = torch.randn(2, 5, 32, device=dev, dtype=bf), torch.randn(2, 5, 32, device=dev, dtype=bf)
    rstd = torch.rand(6, device=dev) + 0.5
    logits = [torch.randn(10, 8, device=dev, requires_grad=True) for _ in range(3)]
    mask = (torch.rand(10, device=dev) > 0.3).float()
    O = torch.ops.opslot  # noqa: E741
    return [
        ("rms_norm_fwd standard", O.rms_norm_fwd.default, (x, None, w, 1e-6, 0)),
        ("rms_norm_fwd offset fp32 w", O.rms_norm_fwd.default, (x, None, w32, 1e-6, 1)),
        ("rms_norm_fwd unweighted", O.rms_norm_fwd.default, (x, None, None, 1e-6, 2)),
        ("rms_norm_fwd gated", O.rms_norm_fwd.default, (x, g, w, 1e-6, 3)),
        ("rms_norm_bwd", O.rms_norm_bwd.default, (torch.randn_like(x), x.detach(), g.detach(), w.detach(), rstd, 3)),
        ("rope_fwd", O.rope_fwd.default, (q, k, cos, sin, 1)),
        ("rope_fwd partial", O.rope_fwd.default, (q, k, cos[..., :16], sin[..., :16], 1)),
        ("rope_bwd", O.rope_bwd.default, (q.detach(), k.detach(), cos, sin, 1)),
        ("silu_mul", O.silu_mul.default, (x, g)),
        ("silu_mul_bwd", O.silu_mul_bwd.default, (x.detach(), g.detach(), w.detach().expand(6, 64))),
        ("load_balancing_loss_fwd", O.load_balancing_loss_fwd.default, (logits, None, 8, 2)),
        ("load_balancing_loss_fwd masked", O.load_balancing_loss_fwd.default, (logits, mask, 8, 2)),
        (
            "load_balancing_loss_bwd",
            O.load_balancing_loss_bwd.default,
            (torch.tensor(1.0, device=dev), [t.detach() for t in logits], mask, torch.rand(8, device=dev)),
        ),
    ]


@pytest.mark.parametrize("index", range(13))
def test_opcheck(index):
    name, op, args = _cases()[index]
    torch.library.opcheck(op, args)


def test_compile_fullgraph_and_backward():
    from opslot.kernels.cuda import load_balancing, norms, rope, swiglu  # noqa: F401  (swiglu registers silu_mul)

    def f(x, g, w, q, k, cos, sin, a, b, logits):
        h = norms.rms_norm_standard(x, w, 1e-6) + norms.rms_norm_gated(x, g, w, 1e-6)
        qe, ke = rope.rotary_pos_emb_full(q, k, cos, sin)
        s = torch.ops.opslot.silu_mul(a, b)
        lb = load_balancing.load_balancing_loss(logits, 8, 2, None)
        return h.float().sum() + qe.float().sum() + ke.float().square().sum() + s.float().sum() + lb

    def inputs():
        torch.manual_seed(0)
        bf, dev = torch.bfloat16, "cuda"
        t = lambda *s, dt=bf: torch.randn(*s, device=dev, dtype=dt, requires_grad=True)  # noqa: E731
        q = torch.randn(2, 5, 4, 32, device=dev, dtype=bf).transpose(1, 2).requires_grad_(True)
        k = torch.randn(2, 5, 2, 32, device=dev, dtype=bf).transpose(1, 2).requires_grad_(True)
        cos, sin = torch.randn(2, 5, 32, device=dev, dtype=bf), torch.randn(2, 5, 32, device=dev, dtype=bf)
        return (
            t(6, 64),
            t(6, 64),
            t(64),
            q,
            k,
            cos,
            sin,
            t(6, 64),
            t(6, 64),
            tuple(t(10, 8, dt=torch.float32) for _ in range(3)),
        )

    eager_in, comp_in = inputs(), inputs()
    out_e = f(*eager_in)
    out_e.backward()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out_c = compiled(*comp_in)
    out_c.backward()
    # the same kernels run in both; AOT autograd may order the additions of gradients differently
    torch.testing.assert_close(out_e, out_c, rtol=1e-5, atol=1e-5)
    flat = lambda xs: [y for x in xs for y in (x if isinstance(x, tuple) else (x,))]  # noqa: E731
    for a, b in zip(flat(eager_in), flat(comp_in)):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=1.6e-2, atol=1e-3)


def test_cuda_graph_capture():
    from opslot.kernels.cuda import load_balancing, norms, rope, swiglu  # noqa: F401

    O = torch.ops.opslot  # noqa: E741
    bf, dev = torch.bfloat16, "cuda"
    x = torch.randn(64, 256, device=dev, dtype=bf)
    w = torch.randn(256, device=dev, dtype=bf)
    q = torch.randn(2, 16, 4, 64, device=dev, dtype=bf).transpose(1, 2)
    k = torch.randn(2, 16, 2, 64, device=dev, dtype=bf).transpose(1, 2)
    cos, sin = torch.randn(2, 16, 64, device=dev, dtype=bf), torch.randn(2, 16, 64, device=dev, dtype=bf)
    logits = [torch.randn(32, 16, device=dev) for _ in range(4)]
    grad = torch.tensor(1.0, device=dev)

    def work():
        y, rstd = O.rms_norm_fwd(x, None, w, 1e-6, 0)
        dx, _, dw = O.rms_norm_bwd(y, x, None, w, rstd, 0)
        qe, ke = O.rope_fwd(q, k, cos, sin, 1)
        dq, dk = O.rope_bwd(qe, ke, cos, sin, 1)
        h = O.silu_mul(x, y)
        dg, du = O.silu_mul_bwd(h, x, y)
        loss, coef = O.load_balancing_loss_fwd(logits, None, 16, 2)
        gl = O.load_balancing_loss_bwd(grad, logits, None, coef)
        return [y, dx, dw, qe, ke, dq, dk, h, dg, du, loss, coef] + list(gl)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        expected = work()  # warm-up (library loading, allocations) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = work()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(expected, captured))


def test_device_defaults_bind_cuda():
    from opslot import OpsImplementationConfig

    cfg = OpsImplementationConfig()
    for op, variant in [
        ("rms_norm", "standard"),
        ("rms_norm_gated", "standard"),
        ("rotary_pos_emb", "partial"),
        ("swiglu_mlp", "standard"),
        ("load_balancing_loss", "standard"),
    ]:
        assert cfg.effective_impl(op, variant) == "cuda", op
    assert cfg.validate([("rms_norm", "offset"), ("rotary_pos_emb", "full")]) == {
        ("rms_norm", "offset"): "cuda",
        ("rotary_pos_emb", "full"): "cuda",
    }
