"""DeepSeek-V4's hyper-connections on the GPU (`mhc/pre`, `mhc/head`, `mhc/post`, impl `cuda`:
runtime/opslot/kernels/cuda/mhc.py, kernels/src/mhc.cu, kernels/torch/mhc.cc) against Transformers'
own modules run in fp32 on fp32 copies of the inputs: outputs and the gradients of the streams,
fn/base/scale (hc_fn/hc_base/hc_scale) and of post/comb/block output; bf16/fp16/fp32; hidden sizes
on every kernel path (16-byte vectors held in registers or streamed twice, scalar accesses), hc_mult
1 to 4, empty and single-token inputs, non-contiguous views, bitwise determinism, CUDA-graph
capture, torch.library.opcheck and torch.compile.

Run: OPSLOT_KERNELS_LIB=<libopslot_kernels.so> python3 -m pytest -q tests/gpu/kernels/test_mhc.py
"""

import pytest
import torch

from conftest import TOLERANCE, assert_close, bench_library, capture_graph, knob, requires_cuda

pytestmark = requires_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
#: post, comb and the fp32 parameter gradients: fp32 math on the same (exactly representable)
#: inputs; the bf16 path's split GEMM is within 2^-24 of fn.
FP32_TOL = 1e-4


@pytest.fixture(autouse=True)
def _ops():
    from opslot.kernels.cuda import mhc  # noqa: F401  (registers the ops)


def _config(hidden, hc=4, iters=20):
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    return DeepseekV4Config(hidden_size=hidden, hc_mult=hc, hc_sinkhorn_iters=iters, rms_norm_eps=1e-6)


def _init(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in ("fn", "hc_fn"):
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif name in ("base", "hc_base"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:
                p.copy_(1 + torch.rand(p.shape, generator=g))
    return module.cuda()


def hyper_connection(hidden, hc=4, iters=20, seed=0):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    return _init(DeepseekV4HyperConnection(_config(hidden, hc, iters)), seed)


def hyper_head(hidden, hc=4, seed=0):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperHead

    return _init(DeepseekV4HyperHead(_config(hidden, hc)), seed)


def streams(b, s, hc, d, dtype, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(b, s, hc, d, device="cuda", generator=g) * 2).to(dtype)


def grads_of(fn, x, params, gos=None, seed=3):
    """(outputs, gradients of x and params) for output gradients `gos` (random when None)."""
    x = x.detach().clone().requires_grad_(True)
    outs = fn(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if gos is None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        gos = [torch.randn(o.shape, device="cuda", generator=g).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, [x] + params, gos)
    return [o.detach() for o in outs], list(grads), gos


def check_pre(m, x, dtype):
    from opslot.kernels.cuda import mhc

    params = [m.fn, m.base, m.scale]
    out, grads, gos = grads_of(lambda t: mhc.mhc_pre(m, t), x, params)
    ref, ref_grads, _ = grads_of(lambda t: m(t), x.float(), params, [g.float() for g in gos])
    for name, a, r in zip(["post", "comb"], out[:2], ref[:2]):
        assert a.dtype == torch.float32
        assert_close(a, r, torch.float32, name, scale=FP32_TOL / TOLERANCE[torch.float32])
    assert out[2].dtype == dtype
    assert_close(out[2], ref[2], dtype, "collapsed")
    assert grads[0].dtype == dtype
    assert_close(grads[0], ref_grads[0], dtype, "d streams")
    for name, a, r in zip(["d fn", "d base", "d scale"], grads[1:], ref_grads[1:]):
        assert a.dtype == torch.float32
        assert_close(a, r, torch.float32, name, scale=FP32_TOL / TOLERANCE[torch.float32])
    return out, grads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape",
    [
        (2, 37, 4, 64),  # 16-byte vectors, row in registers
        (1, 5, 4, 33),  # odd hidden: scalar accesses
        (1, 3, 4, 4096),  # DeepSeek-V4-Flash's hidden size
        (1, 2, 4, 7168),  # DeepSeek-V4-Pro's
        (1, 2, 4, 8200),  # rows too wide for registers: the collapse reads them twice
        (1, 2, 4, 2051),  # odd and wide: scalar, read twice
        (1, 300, 4, 40),  # more than one 256-token tile of the dx kernel
        (1, 603, 4, 4096),  # three dx tiles, the last one ending in a partial group of 8 tokens
    ],
)
def test_pre_matches_transformers(dtype, shape):
    b, s, hc, d = shape
    check_pre(hyper_connection(d, hc), streams(b, s, hc, d, dtype), dtype)


@pytest.mark.parametrize("hc", [1, 2, 3])
def test_pre_other_hc_mult(hc):
    check_pre(hyper_connection(48, hc), streams(2, 5, hc, 48, torch.bfloat16), torch.bfloat16)


@pytest.mark.parametrize("iters", [1, 2, 5, 60])
def test_pre_sinkhorn_iterations(iters):
    check_pre(hyper_connection(64, 4, iters), streams(1, 9, 4, 64, torch.float32), torch.float32)


def test_pre_gradient_of_each_output_alone():
    """Only one of post / comb / collapsed used (the others' gradients absent)."""
    from opslot.kernels.cuda import mhc

    m = hyper_connection(64, 4)
    x = streams(1, 7, 4, 64, torch.float32)
    for i in range(3):
        xa, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        a, r = mhc.mhc_pre(m, xa)[i], m(xr)[i]
        go = torch.randn_like(a)
        ga = torch.autograd.grad(a, [xa, m.fn, m.base, m.scale], go)
        gr = torch.autograd.grad(r, [xr, m.fn, m.base, m.scale], go, allow_unused=True)
        for u, v in zip(ga, gr):
            v = torch.zeros_like(u) if v is None else v
            assert_close(u, v, torch.float32, f"output {i}", scale=5, floor=1e-3)


def check_head(h, x, dtype):
    """mhc/head against Transformers' module in fp32: the output and the gradients of the streams and
    of hc_fn/hc_base/hc_scale (the last three fp32); returns our gradients."""
    from opslot.kernels.cuda import mhc

    params = [h.hc_fn, h.hc_base, h.hc_scale]
    out, grads, gos = grads_of(lambda t: mhc.mhc_head(h, t), x, params)
    ref, ref_grads, _ = grads_of(lambda t: h(t), x.float(), params, [g.float() for g in gos])
    assert out[0].dtype == dtype
    assert_close(out[0], ref[0], dtype, "out")
    assert_close(grads[0], ref_grads[0], dtype, "d streams")
    for name, a, r in zip(["d hc_fn", "d hc_base", "d hc_scale"], grads[1:], ref_grads[1:]):
        assert_close(a, r, torch.float32, name, scale=FP32_TOL / TOLERANCE[torch.float32])
    return grads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 37, 4, 64), (1, 5, 4, 33), (1, 3, 4, 7168), (1, 2, 4, 8200), (2, 3, 2, 40)])
def test_head_matches_transformers(dtype, shape):
    b, s, hc, d = shape
    check_head(hyper_head(d, hc), streams(b, s, hc, d, dtype), dtype)


def upstream_post(post, comb, block_output, hidden_states):
    """DeepseekV4DecoderLayer.forward's expansion, verbatim."""
    dtype = hidden_states.dtype
    return post.to(dtype).unsqueeze(-1) * block_output.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), hidden_states
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 37, 4, 64), (1, 5, 4, 33), (1, 3, 4, 7168), (2, 3, 3, 40), (1, 4, 1, 16)])
def test_post_matches_upstream(dtype, shape):
    from opslot.kernels.cuda import mhc

    b, s, hc, d = shape
    g = torch.Generator(device="cuda").manual_seed(4)
    post = torch.rand(b, s, hc, device="cuda", generator=g) * 2
    comb = torch.rand(b, s, hc, hc, device="cuda", generator=g)
    bo = torch.randn(b, s, d, device="cuda", generator=g).to(dtype)
    h = torch.randn(b, s, hc, d, device="cuda", generator=g).to(dtype)
    ins = [t.clone().requires_grad_(True) for t in (post, comb, bo, h)]
    out = mhc.mhc_post(*ins)
    go = torch.randn(out.shape, device="cuda", generator=g).to(dtype)
    ga = torch.autograd.grad(out, ins, go)
    # fp32 reference on the values upstream uses: post/comb rounded to the streams' dtype
    refs = [post.to(dtype).float(), comb.to(dtype).float(), bo.float(), h.float()]
    refs = [t.clone().requires_grad_(True) for t in refs]
    ref = upstream_post(*refs)
    gr = torch.autograd.grad(ref, refs, go.float())
    assert out.dtype == dtype and out.shape == ref.shape
    assert_close(out, ref, dtype, "out")
    for name, a, r in zip(["d post", "d comb", "d block_output", "d hidden_states"], ga, gr):
        assert a.dtype == (torch.float32 if name in ("d post", "d comb") else dtype), name
        assert_close(a, r, dtype if a.dtype == dtype else torch.float32, name, scale=1 if a.dtype == dtype else 10)


def test_empty_and_single_token():
    from opslot.kernels.cuda import mhc

    m = hyper_connection(64, 4)
    for b, s in [(0, 3), (2, 0), (1, 1)]:
        x = streams(b, s, 4, 64, torch.bfloat16).requires_grad_(True)
        post, comb, col = mhc.mhc_pre(m, x)
        assert post.shape == (b, s, 4) and comb.shape == (b, s, 4, 4) and col.shape == (b, s, 64)
        (post.sum() + comb.sum() + col.float().sum()).backward()
        assert x.grad.shape == x.shape
        m.zero_grad()
    check_pre(m, streams(1, 1, 4, 64, torch.bfloat16), torch.bfloat16)
    h = hyper_head(64, 4)
    assert mhc.mhc_head(h, streams(0, 2, 4, 64, torch.bfloat16)).shape == (0, 2, 64)
    out = mhc.mhc_post(
        torch.zeros(0, 2, 4, device="cuda"),
        torch.zeros(0, 2, 4, 4, device="cuda"),
        torch.zeros(0, 2, 64, device="cuda"),
        torch.zeros(0, 2, 4, 64, device="cuda"),
    )
    assert out.shape == (0, 2, 4, 64)


def test_non_contiguous_and_unaligned_views():
    m = hyper_connection(64, 4)
    wide = streams(2, 9, 4, 80, torch.bfloat16)
    check_pre(m, wide[..., 3:67], torch.bfloat16)  # misaligned view of a wider tensor
    check_pre(m, streams(9, 2, 4, 64, torch.bfloat16).transpose(0, 1), torch.bfloat16)


def test_bitwise_deterministic():
    from opslot.kernels.cuda import mhc

    m = hyper_connection(4096, 4)
    x = streams(1, 700, 4, 4096, torch.bfloat16)
    h = hyper_head(4096, 4)

    def run():
        a = grads_of(lambda t: mhc.mhc_pre(m, t), x, [m.fn, m.base, m.scale])
        b = grads_of(lambda t: mhc.mhc_head(h, t), x, [h.hc_fn, h.hc_base, h.hc_scale])
        return a[0] + a[1] + b[0] + b[1]

    assert all(torch.equal(u, v) for u, v in zip(run(), run()))


def test_cuda_graph_capture_and_replay():
    """Forward + backward of pre, post and head captured in one CUDA graph (no host sync), replayed
    on new streams: equal to an eager run."""
    from opslot.kernels.cuda import mhc

    m, h = hyper_connection(256, 4), hyper_head(256, 4)
    params = [m.fn, m.base, m.scale, h.hc_fn, h.hc_base, h.hc_scale]
    x0, x1 = streams(2, 64, 4, 256, torch.bfloat16, 1), streams(2, 64, 4, 256, torch.bfloat16, 2)
    sx = x0.clone().requires_grad_(True)

    def step():
        post, comb, col = mhc.mhc_pre(m, sx)
        y = mhc.mhc_post(post, comb, col * 2, sx)
        out = mhc.mhc_head(h, y)
        return (out,) + torch.autograd.grad(out.float().square().sum(), [sx] + params)

    graph, static = capture_graph(step)
    with torch.no_grad():
        sx.copy_(x1)
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    assert all(torch.equal(a, b) for a, b in zip(static, eager))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_opcheck(dtype):
    ops = torch.ops.opslot
    m, h = hyper_connection(64, 4), hyper_head(64, 4)
    x = streams(1, 5, 4, 64, dtype).requires_grad_(True)
    fn, base, scale = (p.detach().clone().requires_grad_(True) for p in (m.fn, m.base, m.scale))
    torch.library.opcheck(ops.mhc_pre_fwd.default, (x, fn, base, scale, 20, 1e-6, 1e-6))
    hp = [p.detach().clone().requires_grad_(True) for p in (h.hc_fn, h.hc_base, h.hc_scale)]
    torch.library.opcheck(ops.mhc_head_fwd.default, (x, *hp, 1e-6, 1e-6))
    post, comb, col, mix, rstd = (t.detach() for t in ops.mhc_pre_fwd(x, fn, base, scale, 20, 1e-6, 1e-6))
    torch.library.opcheck(
        ops.mhc_pre_bwd.default,
        (post, comb, col, x.detach(), fn.detach(), base.detach(), scale.detach(), mix, rstd, 20, 1e-6, 1e-6),
    )
    torch.library.opcheck(
        ops.mhc_head_bwd.default,
        (col, x.detach(), *(p.detach() for p in hp), mix[:, :4].contiguous(), rstd, 1e-6, 1e-6),
    )
    ins = (post.clone().requires_grad_(True), comb.clone().requires_grad_(True), col.clone().requires_grad_(True), x)
    torch.library.opcheck(ops.mhc_post.default, ins)
    torch.library.opcheck(ops.mhc_post_bwd.default, (x.detach(), post, comb, col, x.detach()))


def test_torch_compile_fullgraph():
    from opslot.kernels.cuda import mhc

    m, h = hyper_connection(64, 4), hyper_head(64, 4)

    def layer(x):
        post, comb, col = mhc.mhc_pre(m, x)
        return mhc.mhc_head(h, mhc.mhc_post(post, comb, col, x))

    x = streams(2, 6, 4, 64, torch.bfloat16)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled = torch.compile(layer, fullgraph=True)
    ya, yb = compiled(xa), layer(xb)
    assert torch.equal(ya, yb)
    ya.float().sum().backward()
    yb.float().sum().backward()
    assert torch.equal(xa.grad, xb.grad)


@pytest.mark.parametrize("hidden", [64, 4096, 7168])
def test_row_paths_agree_bitwise(hidden):
    """The forward with the row held in registers (blocks up to 64 / 128 / 256 threads) or read twice
    (the default) computes the same bits (bench library knob)."""
    from opslot.kernels.cuda import mhc

    m, h = hyper_connection(hidden, 4), hyper_head(hidden, 4)
    x = streams(1, 37, 4, hidden, torch.bfloat16)

    def run():
        with torch.no_grad():
            return list(mhc.mhc_pre(m, x)) + [mhc.mhc_head(h, x)]

    ref = run()
    with bench_library() as lib:
        f = knob(lib, "opslot_mhc_set_tuning", 2)
        try:
            for hold in (0, 64, 128, 256):
                assert f(hold, 1) == 0
                got = run()
                assert all(torch.equal(a, b) for a, b in zip(ref, got)), hold
        finally:
            assert f(0, 1) == 0
        assert f(100, 1) != 0 and f(0, 18) != 0 and f(0, 0) != 0


@pytest.mark.parametrize(
    "dtype, hc, hidden, iters",
    [
        (torch.bfloat16, 4, 4096, 20),
        (torch.bfloat16, 4, 7168, 20),
        (torch.bfloat16, 4, 64, 1),
        (torch.bfloat16, 3, 136, 7),
        (torch.bfloat16, 2, 24, 20),
        (torch.bfloat16, 1, 40, 3),
        (torch.float16, 4, 520, 20),
        (torch.float32, 4, 260, 20),
        (torch.float32, 4, 66, 20),  # rows without 16-byte vectors: the block-a-token kernel only
        (torch.bfloat16, 4, 64, 1600),  # the backward's steps fill 200 KB a token: blocks of one
    ],
)
def test_token_kernel_forms_agree_bitwise(dtype, hc, hidden, iters):
    """The forms of the token kernels (bench knob opslot_mhc_forms_set_tuning): collapse_fwd as a
    block a token or as pipelined blocks that walk the tokens, the Sinkhorn comb forward and backward
    as a thread a token or a lane a matrix entry: every output and gradient of pre and head bitwise
    equal to production's. The tokens outnumber the pipelined grid's blocks on an H100 or H200 (one
    or two blocks an SM of 512 threads at hidden 4096 and 7168, up to 32 of 64 threads on the narrow
    rows), so that blocks walk more than one token."""
    from opslot.kernels.cuda import mhc

    m, h = hyper_connection(hidden, hc, iters), hyper_head(hidden, hc)
    tokens = 7 if iters == 1600 else (700 if hidden >= 4096 else 5000)
    x = streams(1, tokens, hc, hidden, dtype)

    def run():
        a = grads_of(lambda t: mhc.mhc_pre(m, t), x, [m.fn, m.base, m.scale])
        b = grads_of(lambda t: mhc.mhc_head(h, t), x, [h.hc_fn, h.hc_base, h.hc_scale])
        return a[0] + a[1] + b[0] + b[1]

    ref = run()
    with bench_library() as lib:
        f = knob(lib, "opslot_mhc_forms_set_tuning", 2)
        try:
            for forms in ((1, 1), (2, 2), (1, 2), (2, 1)):
                assert f(*forms) == 0
                got = run()
                bad = [i for i, (a, b) in enumerate(zip(ref, got)) if not torch.equal(a, b)]
                assert not bad, (forms, bad)
        finally:
            assert f(0, 0) == 0
        assert f(3, 0) != 0 and f(0, -1) != 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 603, 4, 4096), (2, 37, 4, 72), (1, 5, 2, 136), (1, 70, 4, 33), (1, 300, 3, 34)])
def test_dx_variants_agree_bitwise(dtype, shape):
    """Every CUDA-core dx configuration of the bench library (knob dx_version 2 to 12: the previous
    kernel, prefetching pairs of columns, 512 threads, 64-token tiles, 4 columns and 16-byte vectors
    per thread, registers capped for 3 blocks per SM, a cp.async ring; one column where a shape does
    not fit) gives the bits of version 11, the production CUDA-core dx (which runs where the fused dx
    + d fn kernel does not fit), for the gradients of pre and head. Versions 2 to 12 run the CUDA-core
    dx and the d fn GEMM wherever the fused kernel would fit too (the next test checks which runs)."""

    b, s, hc, d = shape
    m, h = hyper_connection(d, hc), hyper_head(d, hc)
    x = streams(b, s, hc, d, dtype)

    def run():
        a, c = _pre_head_grads(m, h, x)
        return a + c

    with bench_library() as lib:
        f = knob(lib, "opslot_mhc_set_tuning", 2)
        try:
            assert f(0, 11) == 0
            ref = run()
            for version in range(2, 13):
                assert f(0, version) == 0
                got = run()
                assert all(torch.equal(u, v) for u, v in zip(ref, got)), version
        finally:
            assert f(0, 1) == 0


def _pre_head_grads(m, h, x):
    """The opslot cuda gradients of pre (streams, fn, base, scale) and of head (streams, hc_fn,
    hc_base, hc_scale) on x."""
    from opslot.kernels.cuda import mhc

    a = grads_of(lambda t: mhc.mhc_pre(m, t), x, [m.fn, m.base, m.scale])
    c = grads_of(lambda t: mhc.mhc_head(h, t), x, [h.hc_fn, h.hc_base, h.hc_scale])
    return a[1], c[1]


def _backward_kernels(fn, x, params):
    """The names of the CUDA kernels one forward + backward of `fn` launches."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        grads_of(fn, x, params)
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def _sm90():
    return torch.cuda.get_device_capability() == (9, 0)


# The fused kernel each dx_version runs (None: the CUDA-core dx and the d fn GEMM), on compute
# capability 9.0 and elsewhere (versions 16 and 17 run only on 9.0).
_WGMMA, _MMA = "dx_dfn_wgmma_kernel", "dx_dfn_kernel"


def _fused_kernel(version):
    if 2 <= version <= 12:
        return None
    if version in (13, 14, 15):
        return _MMA
    return _WGMMA if _sm90() else _MMA


@pytest.mark.parametrize(
    "dtype, hidden, version",
    [
        (torch.bfloat16, 128, 1),
        (torch.bfloat16, 72, 1),  # not whole 64-column tiles
        (torch.float16, 128, 1),
        (torch.float32, 128, 1),
        (torch.bfloat16, 128, 11),  # the bench library's CUDA-core dx
        (torch.bfloat16, 128, 13),  # the bench library's other rings of the mma.sync kernel
        (torch.bfloat16, 128, 14),
        (torch.bfloat16, 128, 15),  # the mma.sync kernel where the wgmma one would run
        (torch.bfloat16, 128, 16),  # the wgmma kernel's other rings (compute capability 9.0)
        (torch.bfloat16, 128, 17),
    ],
)
def test_backward_takes_the_fused_kernel_where_it_fits(dtype, hidden, version):
    """pre's and head's backward launch one fused dx + d fn kernel (no d fn GEMM) exactly where
    opslot_mhc_dx_dfn_fits says so, else dx_kernel and the GEMM: dx_dfn_wgmma_kernel on compute
    capability 9.0, dx_dfn_kernel elsewhere, and the one the bench knob names."""
    from opslot.kernels.cuda import mhc

    if version in (16, 17) and not _sm90():
        pytest.skip("dx_version 16 and 17 run on compute capability 9.0 only")
    m, h = hyper_connection(hidden, 4), hyper_head(hidden, 4)
    x = streams(1, 70, 4, hidden, dtype)
    fits = dtype == torch.bfloat16 and hidden % 64 == 0

    def names():
        pre = _backward_kernels(lambda t: mhc.mhc_pre(m, t), x, [m.fn, m.base, m.scale])
        head = _backward_kernels(lambda t: mhc.mhc_head(h, t), x, [h.hc_fn, h.hc_base, h.hc_scale])
        return pre, head

    if version == 1:
        got = names()
    else:
        with bench_library() as lib:
            f = knob(lib, "opslot_mhc_set_tuning", 2)
            try:
                assert f(0, version) == 0
                got = names()
            finally:
                assert f(0, 1) == 0
    want = _fused_kernel(version) if fits else None
    for kernels in got:
        fused = {k.split("<")[0].split("::")[-1].split("(")[0] for k in kernels if "dx_dfn" in k}
        assert fused == ({want} if want else set()), sorted(kernels)
        assert any("dx_kernel" in k for k in kernels) == (want is None), sorted(kernels)


# Shapes of the fused dx + d fn kernel (bf16, hidden a multiple of 64): several 64-token tiles and a
# partial one, two 4096-token ranges (the d fn scratch), hc_mult 1 to 4 (3, 8, 15, 24 mixes for pre).
FUSED_SHAPES = [(1, 603, 4, 4096), (2, 37, 4, 128), (1, 4100, 4, 128), (1, 70, 3, 192), (1, 9, 1, 64), (1, 5, 2, 128)]


@pytest.mark.parametrize("shape", FUSED_SHAPES)
def test_fused_backward_matches_transformers(shape):
    """The production backward of pre and head on bf16 streams whose rows fit the fused dx + d fn
    kernel: the gradients against Transformers in fp32, the same bits on a second run, and pre with
    only post/comb used (no collapsed gradient)."""
    from opslot.kernels.cuda import mhc

    b, s, hc, d = shape
    m = hyper_connection(d, hc)
    x = streams(b, s, hc, d, torch.bfloat16)
    _, grads = check_pre(m, x, torch.bfloat16)
    again = grads_of(lambda t: mhc.mhc_pre(m, t), x, [m.fn, m.base, m.scale])[1]
    assert all(torch.equal(u, v) for u, v in zip(grads, again))
    h = hyper_head(d, hc)
    grads = check_head(h, x, torch.bfloat16)
    again = grads_of(lambda t: mhc.mhc_head(h, t), x, [h.hc_fn, h.hc_base, h.hc_scale])[1]
    assert all(torch.equal(u, v) for u, v in zip(grads, again))
    xa, xr = x.clone().requires_grad_(True), x.float().requires_grad_(True)
    post, comb = mhc.mhc_pre(m, xa)[:2]
    rp, rc = m(xr)[:2]
    gp, gc = torch.randn_like(post), torch.randn_like(comb)
    ga = torch.autograd.grad((post, comb), [xa, m.fn], (gp, gc))
    gr = torch.autograd.grad((rp, rc), [xr, m.fn], (gp, gc))
    assert_close(ga[0], gr[0], torch.bfloat16, "d streams, post and comb only")
    assert_close(ga[1], gr[1], torch.float32, "d fn, post and comb only", scale=FP32_TOL / TOLERANCE[torch.float32])


@pytest.mark.parametrize("shape", [(1, 603, 4, 4096), (1, 4100, 4, 128), (1, 70, 3, 192)])
def test_fused_rings_agree_bitwise(shape):
    """The rings of one fused kernel give the same bits for the gradients of pre and head: the
    mma.sync kernel's (knob dx_version 13: 2-deep, 14: 4-deep) those of its production ring (15); on
    compute capability 9.0 the one-warpgroup forms of the warpgroup-MMA kernel (16: 2-deep ring,
    three blocks per SM; 17: 3-deep, two) each other's. (The production two-warpgroup form sums d fn
    over tokens in another order: the next test.)"""

    b, s, hc, d = shape
    m, h = hyper_connection(d, hc), hyper_head(d, hc)
    x = streams(b, s, hc, d, torch.bfloat16)

    def run():
        a, c = _pre_head_grads(m, h, x)
        return a + c

    with bench_library() as lib:
        f = knob(lib, "opslot_mhc_set_tuning", 2)
        try:
            pairs = [(13, 15), (14, 15)] + ([(17, 16)] if _sm90() else [])
            ref = {}
            for base in sorted({p[1] for p in pairs}):
                assert f(0, base) == 0
                ref[base] = run()
            for version, base in pairs:
                assert f(0, version) == 0
                got = run()
                assert all(torch.equal(u, v) for u, v in zip(ref[base], got)), version
        finally:
            assert f(0, 1) == 0


@pytest.mark.parametrize("shape", FUSED_SHAPES)
@pytest.mark.parametrize("version", [15, 16], ids=["mma_sync", "wgmma_one_warpgroup"])
def test_fused_kernels_agree(shape, version):
    """On compute capability 9.0 the production kernel's (the warpgroup-MMA kernel, two warpgroups)
    gradients of pre and head against the mma.sync kernel's (knob dx_version 15) and its own
    one-warpgroup form's (16) on the same inputs: dx bitwise equal (the same products in the same
    order, one rounding), d fn within 1e-5 of its largest magnitude (its sums over tokens taken in
    another fixed order), d base and d scale bitwise equal."""

    if not _sm90():
        pytest.skip("the warpgroup-MMA kernel runs on compute capability 9.0 only")
    b, s, hc, d = shape
    m, h = hyper_connection(d, hc), hyper_head(d, hc)
    x = streams(b, s, hc, d, torch.bfloat16)

    def run():
        return _pre_head_grads(m, h, x)

    production = run()
    with bench_library() as lib:
        f = knob(lib, "opslot_mhc_set_tuning", 2)
        try:
            assert f(0, version) == 0
            other = run()
        finally:
            assert f(0, 1) == 0
    for u, v in zip(production, other):  # (d streams, d fn, d base, d scale) of pre, then of head
        assert torch.equal(u[0], v[0]), "d streams"
        err = (u[1] - v[1]).abs().max().item()
        assert err <= 1e-5 * v[1].abs().max().item(), ("d fn", err)
        assert torch.equal(u[2], v[2]) and torch.equal(u[3], v[3]), "d base, d scale"


def _dx_dfn_abi():
    import ctypes

    from opslot.kernels.cuda import _lib

    lib = _lib.library()
    i64, p = ctypes.c_int64, ctypes.c_void_p
    fits = lib.opslot_mhc_dx_dfn_fits
    fits.argtypes, fits.restype = [ctypes.c_int, i64, i64, i64, p, p, p], ctypes.c_int
    scratch = lib.opslot_mhc_dx_dfn_scratch_floats
    scratch.argtypes, scratch.restype = [i64] * 4, i64
    run = lib.opslot_mhc_dx_dfn
    run.argtypes, run.restype = [i64] * 4 + [p] * 10, ctypes.c_int
    return _lib, fits, scratch, run


def _ptr(t):
    return None if t is None else t.data_ptr()


@pytest.mark.parametrize(
    "shape",
    [
        (37, 4, 64, 24),
        (603, 4, 4096, 24),
        (4100, 4, 128, 24),
        (8193, 4, 64, 4),
        (70, 3, 192, 15),
        (9, 1, 64, 3),
        (1, 2, 128, 2),
    ],
)
@pytest.mark.parametrize("with_g", [True, False], ids=["g", "no_g"])
@pytest.mark.parametrize("version", [1, 15], ids=["production", "mma_sync"])
def test_dx_dfn_kernel_against_fp64(shape, with_g, version):
    """opslot_mhc_dx_dfn through the C ABI (the production library's kernel, and the mma.sync kernel
    through the bench library's dx_version 15 where the production one is the warpgroup-MMA kernel)
    on random coefficients (split as collapse_bwd splits them):
    dx within one bf16 rounding of the fp64 value of the unsplit math (plus 4e-5 of the terms'
    magnitudes: the split's three left-out products are each below 2^-18), d fn within 1e-4 of the magnitudes of its sums, the scratch of the ranges past 4096
    tokens, bitwise equal runs."""
    if version == 1:
        _check_dx_dfn(shape, with_g)
        return
    with bench_library() as lib:
        f = knob(lib, "opslot_mhc_set_tuning", 2)
        try:
            assert f(0, version) == 0
            _check_dx_dfn(shape, with_g)
        finally:
            assert f(0, 1) == 0


def _check_dx_dfn(shape, with_g):
    _lib, fits, scratch, run = _dx_dfn_abi()
    T, hc, D, M = shape
    K = hc * D
    gen = torch.Generator(device="cuda").manual_seed(7)

    def rn(*s):
        return torch.randn(*s, device="cuda", generator=gen)

    x = (rn(T, hc, D) * 2).to(torch.bfloat16)
    g = rn(T, D).to(torch.bfloat16) if with_g else None
    fn, coef_a, coef_c, pre = rn(M, K) / K**0.5, rn(T, M), rn(T), torch.rand(T, hc, device="cuda", generator=gen)
    # coef_a as collapse_bwd splits it: rows [hi mid lo], zero-padded to 16 ceil(3M / 16)
    hi = coef_a.to(torch.bfloat16)
    mid = (coef_a - hi.float()).to(torch.bfloat16)
    lo = (coef_a - hi.float() - mid.float()).to(torch.bfloat16)
    coef3 = torch.zeros(T, (3 * M + 15) // 16 * 16, device="cuda", dtype=torch.bfloat16)
    coef3[:, : 3 * M] = torch.cat([hi, mid, lo], 1)
    dx = torch.full_like(x, float("nan"))
    bf16 = _lib.DTYPE_CODES[torch.bfloat16]
    assert fits(bf16, hc, D, M, _ptr(x), _ptr(g), _ptr(dx)) == 1
    n = scratch(T, hc, D, M)
    assert n == (0 if T <= 4096 else (T + 4095) // 4096 * M * K)
    buf = torch.full((max(n, 1),), float("nan"), device="cuda")

    def call():
        dfn = torch.full((M, K), float("nan"), device="cuda")
        rc = run(
            T,
            hc,
            D,
            M,
            _ptr(x),
            _ptr(g),
            _ptr(fn),
            _ptr(coef3),
            _ptr(coef_c),
            _ptr(pre),
            _ptr(dx),
            _ptr(dfn),
            _ptr(buf) if n else None,
            _lib.stream_of(x),
        )
        assert rc == 0, _lib.library().opslot_last_error()
        torch.cuda.synchronize()
        return dx.clone(), dfn

    got_dx, got_dfn = call()
    xd, cd, fd = x.double(), coef_a.double(), fn.double()
    s = (cd @ fd).view(T, hc, D)
    ref = s - coef_c.double().view(T, 1, 1) * xd
    mag = (cd.abs() @ fd.abs()).view(T, hc, D) + (coef_c.double().view(T, 1, 1) * xd).abs()
    if with_g:
        pg = pre.double().view(T, hc, 1) * g.double().view(T, 1, D)
        ref, mag = ref + pg, mag + pg.abs()
    err = (got_dx.double() - ref).abs()
    assert bool((err <= ref.abs() * 2**-8 + 4e-5 * mag).all()), float((err - ref.abs() * 2**-8).max())
    ref_dfn = cd.t() @ xd.view(T, K)
    bound = 1e-4 * (cd.abs().t() @ xd.view(T, K).abs()) + 1e-30
    assert bool(((got_dfn.double() - ref_dfn).abs() <= bound).all())
    again = call()
    assert torch.equal(got_dx, again[0]) and torch.equal(got_dfn, again[1])


def test_dx_dfn_fits_and_refusals():
    """The fused kernel takes bf16 rows of whole 64-column tiles, 16-byte aligned; elsewhere
    opslot_mhc_dx_dfn_fits says 0 and opslot_mhc_dx_dfn refuses with a message (the op then runs the
    CUDA-core dx and the d fn GEMM: the tests above cover both)."""
    _lib, fits, scratch, run = _dx_dfn_abi()
    bf16, f16 = _lib.DTYPE_CODES[torch.bfloat16], _lib.DTYPE_CODES[torch.float16]
    x = torch.zeros(4, 4, 192, device="cuda", dtype=torch.bfloat16)
    p = x.data_ptr()
    assert fits(bf16, 4, 192, 24, p, p, p) == 1 and fits(bf16, 4, 192, 4, p, None, p) == 1
    assert fits(f16, 4, 192, 24, p, p, p) == 0  # fp16: the CUDA-core dx
    assert fits(bf16, 4, 96, 24, p, p, p) == 0  # 96 columns: not whole 64-column tiles
    assert fits(bf16, 4, 192, 24, p + 2, p, p) == 0  # x not 16-byte aligned
    assert fits(bf16, 4, 192, 20, p, p, p) == 0 and fits(bf16, 5, 192, 35, p, p, p) == 0
    assert scratch(4, 4, 192, 20) == -1
    f = torch.zeros(24, 4 * 96, device="cuda")
    rc = run(4, 4, 96, 24, p, p, f.data_ptr(), f.data_ptr(), f.data_ptr(), f.data_ptr(), p, f.data_ptr(), None, None)
    assert rc != 0
    message = _lib.library().opslot_last_error().decode()
    assert message == (
        "opslot_mhc_dx_dfn: bfloat16 streams with hidden a multiple of 64 and 16-byte aligned rows only "
        "(hidden 96; opslot_mhc_dx_dfn_fits)"
    )


@pytest.mark.parametrize("tokens, na, nb", [(16384, 24, 3), (1, 4, 1), (3000, 9, 0), (0, 24, 3), (5, 0, 3)])
def test_token_sums_against_fp64(tokens, na, nb):
    """opslot_mhc_token_sums (d base and d scale from the backward's per-token da and dsc): each
    column's sum within fp32's accumulation error of the fp64 sum, bitwise equal on a rerun; nb 0 with
    NULL b; argument refusals with their message."""
    import ctypes

    from opslot.kernels.cuda import _lib

    lib = _lib.library()
    f = lib.opslot_mhc_token_sums
    i64, p = ctypes.c_int64, ctypes.c_void_p
    f.argtypes, f.restype = [i64, p, i64, p, i64, p, p, p], ctypes.c_int
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(tokens, na, device="cuda", generator=g)
    b = torch.randn(tokens, nb, device="cuda", generator=g) if nb else None
    sa = torch.full((na,), float("nan"), device="cuda")
    sb = torch.full((nb,), float("nan"), device="cuda") if nb else None

    def run():
        assert f(tokens, _ptr(a), na, _ptr(b), nb, _ptr(sa), _ptr(sb), torch.cuda.current_stream().cuda_stream) == 0
        torch.cuda.synchronize()
        return [t.clone() for t in (sa, sb) if t is not None]

    got = run()
    for out, src in zip(got, [a] + ([b] if nb else [])):
        ref = src.double().sum(0)
        bound = 1e-6 * src.double().abs().sum(0) + 1e-30
        assert ((out.double() - ref).abs() <= bound).all(), (out, ref)
    assert all(torch.equal(u, v) for u, v in zip(got, run()))
    assert f(4, _ptr(a), na, None, 2, _ptr(sa), None, 0) != 0
    assert lib.opslot_last_error().decode() == "opslot_mhc_token_sums: bad arguments (tokens 4, na %d, nb 2)" % na
    assert f(-1, _ptr(a), na, _ptr(b), nb, _ptr(sa), _ptr(sb), 0) != 0
