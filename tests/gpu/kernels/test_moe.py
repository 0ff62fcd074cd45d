"""GPU tests of opslot's `cuda` MoE experts (runtime/opslot/kernels/cuda/moe.py, kernels/src/moe.cu)
against the fp32 references of opslot.reference: outputs and the gradients of hidden states, expert
weights, biases and routing weights; uniform and skewed routing, experts without tokens, the masking
index (dropped assignments); bf16/fp16/fp32; both GEMM paths; determinism; CUDA-graph capture and
replay of forward + backward; torch.library.opcheck of every custom op.

Run: OPSLOT_KERNELS_LIB=<path to libopslot_kernels.so> python3 -m pytest -q tests/gpu/kernels/test_moe.py
Skips cleanly without CUDA or without the library.
"""

import types

import pytest
import torch
import torch.nn as nn

from conftest import capture_graph
from opslot import reference  # noqa: E402
from opslot.kernels.cuda import unavailable_reason  # noqa: E402

_REASON = unavailable_reason() if torch.cuda.is_available() else "no CUDA device"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or _REASON is not None, reason=str(_REASON))

if torch.cuda.is_available() and _REASON is None:
    from opslot.kernels.cuda import moe  # noqa: E402
else:  # pragma: no cover
    moe = None

torch.backends.cuda.matmul.allow_tf32 = False

# relative Frobenius error vs the fp32 reference
TOL = {torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 2.5e-2}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def qwen_module(E, H, I, dtype, seed=0):  # noqa: E741  (I: the intermediate size)
    g = torch.Generator(device="cuda").manual_seed(seed)
    m = types.SimpleNamespace(num_experts=E, act_fn=nn.SiLU())
    m.gate_up_proj = nn.Parameter((torch.randn(E, 2 * I, H, device="cuda", generator=g) / H**0.5).to(dtype))
    m.down_proj = nn.Parameter((torch.randn(E, H, I, device="cuda", generator=g) / I**0.5).to(dtype))
    return m


def gpt_oss_module(E, H, I, dtype, seed=0):  # noqa: E741  (I: the intermediate size)
    g = torch.Generator(device="cuda").manual_seed(seed)
    # fp32: a small limit, so that many clamps are hit. bf16/fp16: GPT-OSS's 7.0 (rarely hit), because
    # an element within rounding of the limit can flip the clamp's zero/nonzero derivative
    m = types.SimpleNamespace(num_experts=E, alpha=1.702, limit=1.5 if dtype == torch.float32 else 7.0)
    m.gate_up_proj = nn.Parameter((torch.randn(E, H, 2 * I, device="cuda", generator=g) * 1.5 / H**0.5).to(dtype))
    m.gate_up_proj_bias = nn.Parameter((torch.randn(E, 2 * I, device="cuda", generator=g) * 0.5).to(dtype))
    m.down_proj = nn.Parameter((torch.randn(E, I, H, device="cuda", generator=g) / I**0.5).to(dtype))
    m.down_proj_bias = nn.Parameter((torch.randn(E, H, device="cuda", generator=g) * 0.1).to(dtype))
    return m


def clamped_module(E, H, I, dtype, seed=0):  # noqa: E741  (I: the intermediate size)
    """DeepSeek-V4's experts (Qwen layout, clamped SwiGLU). fp32: pre-activations of about +-4
    against a limit of 1.5, so that many clamps are hit. bf16/fp16: DeepSeek-V4's 10.0 (rarely hit),
    because a GEMM output within rounding of the limit can flip the clamp's zero/nonzero derivative
    (test_clamped_activation_masks_exactly covers the clamps on exact values in every dtype)."""
    m = qwen_module(E, H, I, dtype, seed)
    if dtype == torch.float32:
        m.gate_up_proj = nn.Parameter(m.gate_up_proj.detach() * 4)
        m.limit = 1.5
    else:
        m.limit = 10.0
    return m


PARAMS = {
    "standard": ["gate_up_proj", "down_proj"],
    "gpt_oss": ["gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"],
    "clamped": ["gate_up_proj", "down_proj"],
}
VARIANTS = ["standard", "gpt_oss", "clamped"]


def variant_fns(variant):
    """(module factory, cuda function, reference) of a variant."""
    return {
        "standard": (qwen_module, moe.moe_standard, reference.moe_standard),
        "gpt_oss": (gpt_oss_module, moe.moe_gpt_oss, reference.moe_gpt_oss),
        "clamped": (clamped_module, moe.moe_clamped, reference.moe_clamped),
    }[variant]


def make_inputs(T, H, E, K, dtype, routing="uniform", seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, H, device="cuda", generator=g).to(dtype)
    if routing == "skewed":  # expert 3 takes ~all first choices, experts >= E//2 get nothing, some drops
        idx = torch.randint(0, max(1, E // 2), (T, K), device="cuda", generator=g)
        idx[:, 0] = 3 % E
        if K > 1:
            idx[:, 1] = torch.where(idx[:, 1] == 3 % E, (idx[:, 1] + 1) % max(1, E // 2), idx[:, 1])
    else:
        idx = torch.argsort(torch.rand(T, E, device="cuda", generator=g), dim=-1)[:, :K]
    if routing in ("skewed", "dropped") and T > 2:
        idx[::5, -1] = E  # the masking index: these assignments are skipped
    if routing == "all_dropped":
        idx[:] = E
    w = torch.softmax(torch.randn(T, K, device="cuda", generator=g), -1).to(dtype)
    return x, idx, w


def run(fn, module, names, x, idx, w, go):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    params = [getattr(module, n) for n in names]
    out = fn(module, x, idx, w)
    if not out.requires_grad:  # the reference with every assignment dropped: a constant zero
        return out.detach(), [torch.zeros_like(t) for t in [x, w] + params]
    grads = torch.autograd.grad(out, [x, w] + params, go, allow_unused=True)
    return out.detach(), [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, [x, w] + params)]


def fp32_copy(module, names):
    m = types.SimpleNamespace(**vars(module))
    for n in names:
        setattr(m, n, nn.Parameter(getattr(module, n).detach().float()))
    return m


def rel(a, b, floor=0.0):
    """||a - b|| / ||b||, the denominator at least floor * sqrt(numel) (for a few small entries)."""
    a, b = a.float(), b.float()
    den = max(float(b.norm()), floor * b.numel() ** 0.5)
    num = float((a - b).norm())
    return num / den if den > 0 else num


def check(variant, dtype, T, E, K, H, I, routing, x_view=None):  # noqa: E741  (I: the intermediate size)
    make, fn, ref = variant_fns(variant)
    names = PARAMS[variant]
    m = make(E, H, I, dtype)
    x, idx, w = make_inputs(T, H, E, K, dtype, routing)
    if x_view is not None:
        x = x_view(x)
    go = torch.randn(x.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7)).to(dtype)
    out, grads = run(fn, m, names, x, idx, w, go)
    assert out.dtype == dtype and out.shape == x.shape and grads[0].shape == x.shape
    x2, go2 = x.reshape(-1, H), go.reshape(-1, H)  # the reference takes [tokens, hidden]
    ref_out, ref_grads = run(ref, fp32_copy(m, names), names, x2.float(), idx, w.float(), go2.float())
    out, grads[0] = out.reshape(-1, H), grads[0].reshape(-1, H)
    assert torch.isfinite(out).all()
    errs = {"out": rel(out, ref_out)}
    for name, a, b in zip(["x", "weights"] + names, grads, ref_grads):
        assert a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        # a routing-weight gradient entry is a dot product over H of O(1) rounded terms: its error
        # scales with sqrt(H) however much the sum cancels, so its entries get that floor
        errs[name] = rel(a, b, floor=H**0.5 if name == "weights" else 0.0)
    bad = {k: v for k, v in errs.items() if v > TOL[dtype]}
    assert not bad, f"relative errors above {TOL[dtype]}: {bad} (all: {errs})"
    return out, grads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "case",
    [
        (96, 8, 2, 64, 32, "uniform"),
        (200, 16, 4, 64, 48, "skewed"),
        (130, 8, 3, 72, 40, "dropped"),
    ],
)
def test_matches_reference(variant, dtype, case):
    check(variant, dtype, *case)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "case",
    [
        (33, 6, 3, 36, 20, "dropped"),  # widths not multiples of 8: portable GEMM, scalar kernels
        (64, 256, 8, 64, 32, "uniform"),  # many experts, most of them empty
        (1, 8, 1, 64, 32, "uniform"),  # a single token, top-1
        (3, 4, 2, 64, 32, "all_dropped"),  # nothing routed
    ],
)
def test_edge_shapes(variant, case):
    check(variant, torch.bfloat16, *case)


def test_zero_tokens():
    m = qwen_module(4, 64, 32, torch.bfloat16)
    x = torch.zeros(0, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    idx = torch.zeros(0, 2, device="cuda", dtype=torch.long)
    w = torch.zeros(0, 2, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = moe.moe_standard(m, x, idx, w)
    assert out.shape == (0, 64)
    gx, gw, g1 = torch.autograd.grad(out, [x, w, m.gate_up_proj], torch.zeros_like(out))
    assert gx.shape == x.shape and float(g1.abs().max()) == 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_portable_gemm_in_bf16(variant, monkeypatch):
    monkeypatch.setattr(moe, "GEMM_BACKEND", "portable")
    check(variant, torch.bfloat16, 200, 16, 4, 64, 48, "skewed")


def test_non_contiguous_and_3d_hidden_states():
    check("standard", torch.bfloat16, 96, 8, 2, 64, 32, "uniform", x_view=lambda x: torch.cat([x, x], dim=1)[:, :64])
    check("gpt_oss", torch.float32, 96, 8, 2, 64, 32, "uniform", x_view=lambda x: x.view(4, 24, 64))


@pytest.mark.parametrize("variant", VARIANTS)
def test_deterministic(variant):
    make, fn, _ = variant_fns(variant)
    m = make(64, 256, 128, torch.bfloat16)
    x, idx, w = make_inputs(4096, 256, 64, 8 if variant == "standard" else 4, torch.bfloat16, "dropped")
    go = torch.randn_like(x)
    a = run(fn, m, PARAMS[variant], x, idx, w, go)
    b = run(fn, m, PARAMS[variant], x, idx, w, go)
    assert torch.equal(a[0], b[0])
    for ga, gb in zip(a[1], b[1]):
        assert torch.equal(ga, gb)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_graph_capture_and_replay(variant):
    """Forward + backward captured in one CUDA graph (impossible with any host sync), replayed on new
    routing and inputs copied into the static tensors; equals an eager run on those inputs."""
    make, fn, _ = variant_fns(variant)
    names = PARAMS[variant]
    m = make(16, 128, 64, torch.bfloat16)
    params = [getattr(m, n) for n in names]
    x0, idx0, w0 = make_inputs(512, 128, 16, 4, torch.bfloat16, "uniform", seed=1)
    x1, idx1, w1 = make_inputs(512, 128, 16, 4, torch.bfloat16, "skewed", seed=2)
    sx = x0.clone().requires_grad_(True)
    sw = w0.clone().requires_grad_(True)
    sidx = idx0.clone()
    sgo = torch.randn_like(x0)

    def step():
        out = fn(m, sx, sidx, sw)
        return (out,) + torch.autograd.grad(out, [sx, sw] + params, sgo)

    graph, static = capture_graph(step)
    with torch.no_grad():
        sx.copy_(x1)
        sw.copy_(w1)
        sidx.copy_(idx1)
    graph.replay()
    torch.cuda.synchronize()
    out, grads = run(fn, m, names, x1, idx1, w1, sgo)
    assert torch.equal(static[0], out)
    for a, b in zip(static[1:], grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "case",
    [
        (1, 8, 1, torch.int64),
        (100, 8, 2, torch.int32),
        (257, 128, 8, torch.int64),
        (5000, 256, 8, torch.int64),
        (70000, 64, 4, torch.int64),
        (3000, 1024, 2, torch.int32),
        (0, 16, 4, torch.int64),
    ],
)
def test_route_kernel_matches_torch(case):
    """The routing kernel (stable counting sort) equals the torch formulation exactly, incl. the
    masking index, out-of-range ids, skewed routing and many chunks."""
    T, E, K, dt = case
    g = torch.Generator(device="cuda").manual_seed(T + E)
    idx = torch.randint(0, E + 1, (T, K), device="cuda", generator=g)  # E = masking index
    if T > 10:
        idx[::3, 0] = 5 % E  # skew
        idx[1, -1] = E + 7  # out of range: dropped
        idx[2, -1] = -3
    idx = idx.to(dt)
    a, b = moe.route(idx, E), moe.route_torch(idx, E)
    for name, x, y in zip(a._fields, a, b):
        assert torch.equal(x, y), name


def _routing(T=40, E=8, K=2, drop=True):
    _, idx, _ = make_inputs(T, 8, E, K, torch.bfloat16, "dropped" if drop else "uniform")
    return moe.route(idx, E), K


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_opcheck(dtype):
    r, K = _routing()
    T, H, I, E = 40, 64, 32, 8  # noqa: E741  (I: the intermediate size)
    dev = "cuda"
    _, idx, _ = make_inputs(T, 8, E, K, torch.bfloat16, "dropped")
    torch.library.opcheck(torch.ops.opslot.moe_route.default, (idx, E))
    x = torch.randn(T, H, device=dev, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.opslot.moe_gather.default, (x, r.inv, r.offs, K))
    rows = torch.randn(T * K, H, device=dev, dtype=dtype, requires_grad=True)
    w = torch.rand(T, K, device=dev, dtype=torch.float32, requires_grad=True)
    bias = torch.randn(E, H, device=dev, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.opslot.moe_combine.default, (rows, r.inv, r.offs, w, r.row_expert, bias))
    torch.library.opcheck(torch.ops.opslot.moe_combine.default, (rows, r.inv, r.offs, w, r.row_expert, None))
    h = torch.randn(T * K, 2 * I, device=dev, dtype=dtype, requires_grad=True)
    b1 = torch.randn(E, 2 * I, device=dev, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.opslot.moe_act.default, (h, r.offs, r.row_expert, None, 0, 0.0, 0.0))
    torch.library.opcheck(torch.ops.opslot.moe_act.default, (h, r.offs, r.row_expert, b1, 1, 1.702, 1.5))
    torch.library.opcheck(torch.ops.opslot.moe_act.default, (h, r.offs, r.row_expert, None, 2, 0.0, 1.5))
    a = torch.randn(T * K, H, device=dev, dtype=dtype, requires_grad=True)
    wq = torch.randn(E, 2 * I, H, device=dev, dtype=dtype, requires_grad=True)
    wg = torch.randn(E, H, 2 * I, device=dev, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.opslot.moe_grouped_mm.default, (a, wq, r.offs, True))
    torch.library.opcheck(torch.ops.opslot.moe_grouped_mm.default, (a, wg, r.offs, False))
    g = torch.randn(T * K, 2 * I, device=dev, dtype=dtype)
    torch.library.opcheck(
        torch.ops.opslot.moe_grouped_mm_backward.default,
        (g, a, wq, r.offs, True),
        test_utils=("test_schema", "test_faketensor"),
    )
    torch.library.opcheck(
        torch.ops.opslot.moe_act_backward.default,
        (g[:, :I].contiguous(), h, r.offs, r.row_expert, b1, 1, 1.702, 1.5),
        test_utils=("test_schema", "test_faketensor"),
    )
    torch.library.opcheck(
        torch.ops.opslot.moe_combine_backward.default,
        (x.detach(), rows, r.inv, r.offs, w, r.row_expert, bias),
        test_utils=("test_schema", "test_faketensor"),
    )
    torch.library.opcheck(
        torch.ops.opslot.moe_gather_backward.default,
        (rows, r.inv, r.offs, K),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_grouped_experts_dispatched_matches_layer():
    """The expert-parallel entry point (tokens already in expert order) gives the rows the layer combines."""
    m = qwen_module(8, 64, 32, torch.bfloat16)
    x, idx, w = make_inputs(50, 64, 8, 2, torch.bfloat16, "dropped")
    r = moe.route(idx, 8)
    xs = moe.moe_gather(x, r.inv, r.offs, 2)
    y = moe.grouped_experts(xs, r.offs, r.row_expert, m.gate_up_proj, m.down_proj)
    out = moe.moe_combine(y, r.inv, r.offs, w.float(), r.row_expert, None)
    assert torch.equal(out, moe.moe_standard(m, x, idx, w).detach())


def test_torch_compile_fullgraph():
    m = qwen_module(8, 64, 32, torch.bfloat16)
    x, idx, w = make_inputs(64, 64, 8, 2, torch.bfloat16, "dropped")
    eager = moe.moe_standard(m, x, idx, w)
    compiled = torch.compile(lambda x, idx, w: moe.moe_standard(m, x, idx, w), fullgraph=True)
    assert torch.allclose(compiled(x, idx, w), eager, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clamped_activation_masks_exactly(dtype):
    """Kind 2 (DeepSeek-V4) on crafted pre-activations: values at, inside and beyond +-limit, and NaN.
    The gradient passes where -L <= up <= L and gate <= L (bounds included, NaN: zero), as torch's
    clamp backward; the forward propagates NaN as torch.clamp does; dropped rows are zero."""
    r, K = _routing(T=40, E=8, K=2, drop=True)
    N, I = 80, 16  # noqa: E741  (I: the intermediate size)
    L = 1.5
    vals = torch.tensor([-2.0, -1.5, -1.0, 0.0, 1.0, 1.5, 2.0, 3.0], device="cuda")
    h = vals[torch.randint(0, 8, (N, 2 * I), device="cuda")].to(dtype)
    h[0, 0] = float("nan")  # gate NaN
    h[0, I + 1] = float("nan")  # up NaN
    h = h.requires_grad_(True)
    a = moe.moe_act(h, r.offs, r.row_expert, None, moe.KIND_CLAMPED, 0.0, L)
    da = torch.randn(N, I, device="cuda").to(dtype)
    (dh,) = torch.autograd.grad(a, h, da)
    kept = int(r.offs[-1])
    hr = h.detach()[:kept].float().requires_grad_(True)
    gate, up = hr.chunk(2, dim=-1)
    ar = torch.nn.functional.silu(gate.clamp(max=L)) * up.clamp(-L, L)
    (dhr,) = torch.autograd.grad(ar, hr, da[:kept].float())
    torch.testing.assert_close(a[:kept].float(), ar.to(dtype).float(), equal_nan=True, atol=0, rtol=TOL[dtype])
    torch.testing.assert_close(dh[:kept].float(), dhr.to(dtype).float(), equal_nan=True, atol=0, rtol=TOL[dtype])
    assert torch.equal(dh[:kept] == 0, dhr == 0)  # the masks, exactly
    assert float(a[kept:].abs().sum()) == 0 and float(dh[kept:].abs().sum()) == 0


def test_clamped_refuses_a_negative_limit():
    r, _ = _routing()
    h = torch.randn(80, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="kind 2 needs a limit >= 0, got -1"):
        moe.moe_act(h, r.offs, r.row_expert, None, moe.KIND_CLAMPED, 0.0, -1.0)
