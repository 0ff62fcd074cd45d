"""causal_conv1d (Qwen3.5 Gated DeltaNet's depthwise causal conv), impl `cuda`: forward, backward,
packed sequences and the decode update against a local fp32 reference (F.conv1d per sequence) and
opslot.reference; widths 2-4, dtypes, odd sizes, layouts (upstream's transposed view and contiguous
inputs, the vector path's partial last vector, the scalar path), empty inputs, bitwise determinism,
opcheck, torch.compile(fullgraph=True) and CUDA-graph capture. The last test runs without a GPU
(fake implementations)."""

import inspect

import pytest
import torch
import torch.nn.functional as F

from conftest import DTYPES, assert_close, capture_graph, requires_cuda

DEV = "cuda"


@pytest.fixture(autouse=True)
def _register_ops():
    from opslot.kernels.cuda import causal_conv1d  # noqa: F401  (registers torch.ops.opslot.causal_conv1d_*)


def _mod():
    from opslot.kernels.cuda import causal_conv1d

    return causal_conv1d


# -- local fp32 reference ----------------------------------------------------------------------------


def ref_conv(x, weight, bias=None, silu=False, cu=None):
    """fp32 upstream `causal_conv1d_fn`; with `cu` (a list of ints) every segment on its own."""
    width = weight.shape[1]

    def one(xs):
        t = xs.shape[-1]
        out = F.conv1d(xs, weight.unsqueeze(1), bias, padding=width - 1, groups=xs.shape[1])[:, :, :t]
        return F.silu(out) if silu else out

    if cu is None:
        return one(x)
    pieces = [one(x[:, :, s:e]) for s, e in zip(cu[:-1], cu[1:]) if e > s]
    return torch.cat(pieces, dim=-1) if pieces else x * 0


def ref_update(x, state, weight, bias=None, silu=False):
    """Upstream `causal_conv1d_update` in fp32 on copies: (out, new state)."""
    s = state.shape[-1]
    full = torch.cat([state.float(), x.float()], dim=-1)
    out = F.conv1d(full, weight.float().unsqueeze(1), None if bias is None else bias.float(), groups=x.shape[1])
    out = out[:, :, -x.shape[-1] :]
    return (F.silu(out) if silu else out), full[:, :, -s:]


def channels_last(b, c, t, dtype, width=None):
    """Upstream's layout: the transpose of a contiguous [B, T, C] (`width` > c: a channel slice)."""
    return torch.randn(b, t, width or c, device=DEV, dtype=dtype)[:, :, :c].transpose(1, 2)


def params(c, w, dtype, bias=True):
    weight = torch.randn(c, w, device=DEV, dtype=dtype) * 0.5
    b = torch.randn(c, device=DEV, dtype=dtype) if bias else None
    return weight, b


def run(x, weight, bias, silu, cu=None, dy=None, **kw):
    """The kernel forward + backward on fresh leaves: (out, dx, dweight, dbias, dy)."""
    m = _mod()
    xa = x.detach().requires_grad_(True)  # x's own strides (a clone could densify a sliced view)
    wa = weight.detach().clone().requires_grad_(True)
    ba = bias.detach().clone().requires_grad_(True) if bias is not None else None
    out = m.causal_conv1d(xa, wa, ba, "silu" if silu else None, cu_seqlens=cu, **kw)
    if dy is None:
        dy = torch.randn(out.shape, device=DEV, dtype=out.dtype)
    out.backward(dy)
    return out, xa.grad, wa.grad, (ba.grad if ba is not None else None), dy


def check(x, weight, bias, silu, cu=None, scale=1.0):
    """Kernel vs the fp32 reference: output and every gradient; the output keeps x's layout."""
    dtype = x.dtype
    out, dx, dw, db, dy = run(x, weight, bias, silu, cu=cu)
    assert out.dtype == dtype and out.shape == x.shape
    assert out.stride() == (
        x.transpose(1, 2).contiguous().transpose(1, 2).stride()
        if x.stride(1) < x.stride(2)
        else x.contiguous().stride()
    )
    xr = x.detach().float().requires_grad_(True)
    wr = weight.detach().float().requires_grad_(True)
    br = bias.detach().float().requires_grad_(True) if bias is not None else None
    cu_list = cu.tolist() if cu is not None else None
    ref = ref_conv(xr, wr, br, silu, cu_list)
    ref.backward(dy.float())
    assert_close(out, ref, dtype, "out", scale)
    assert_close(dx, xr.grad, dtype, "dx", scale)
    assert dw.dtype == weight.dtype
    assert_close(dw, wr.grad, dtype, "dweight", scale)
    if bias is not None:
        assert db.dtype == bias.dtype
        assert_close(db, br.grad, dtype, "dbias", scale)
    return out, dx, dw, db


# -- correctness ----------------------------------------------------------------------------------


SHAPES = [(2, 7, 1), (1, 100, 3), (2, 64, 63), (1, 200, 4097), (3, 1024, 130)]


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("bias,silu", [(True, True), (False, True), (True, False), (False, False)])
def test_against_reference(dtype, width, bias, silu):
    for b, c, t in SHAPES:
        weight, bb = params(c, width, dtype, bias)
        check(channels_last(b, c, t, dtype), weight, bb, silu)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp32_weight(dtype):  # fp32 parameters with half activations
    weight, b = params(256, 4, torch.float32)
    check(channels_last(2, 256, 333, dtype), weight, b, True)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "channel_slice", "misaligned", "time_strided", "batch_strided"])
def test_layouts(dtype, layout):
    """Every layout is read in place (no copy of x) and gives the reference's values. C = 102 makes the
    dense outputs' rows unaligned to the vector: the scalar path (one channel per lane)."""
    b, c, t = 2, 102, 257
    if layout == "contiguous":
        x = torch.randn(b, c, t, device=DEV, dtype=dtype)
    elif layout == "channel_slice":
        x = channels_last(b, c, t, dtype, width=112)  # x's rows 16-byte aligned (outputs dense)
    elif layout == "misaligned":
        x = torch.randn(b, t, c + 1, device=DEV, dtype=dtype)[:, :, 1:].transpose(1, 2)
    elif layout == "time_strided":
        x = torch.randn(b, 2 * t, c, device=DEV, dtype=dtype)[:, ::2].transpose(1, 2)
    else:
        x = torch.randn(2 * b, t, c, device=DEV, dtype=dtype)[::2].transpose(1, 2)
    weight, bias = params(c, 4, dtype)
    check(x, weight, bias, True)


def _abi():
    import ctypes

    from opslot.kernels.cuda import _lib, _ops_common as C

    return ctypes, _lib, C


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("silu", [False, True])
def test_partial_last_vector_through_the_abi(dtype, silu):
    """C not a multiple of the vector with every row 16-byte aligned (x, grad and the outputs are
    channel slices of padded rows; the binding allocates dense outputs, so this layout comes
    through the C ABI): the vector path with an element-wise last vector. The padding is never
    written."""
    ctypes, _lib, C = _abi()
    m = _mod()
    b, c, t, pad, width = 2, 102, 200, 112, 4
    x = channels_last(b, c, t, dtype, width=pad)
    dy = channels_last(b, c, t, dtype, width=pad)
    weight, bias = params(c, width, dtype)
    padded = lambda: torch.full((b, t, pad), float("nan"), device=DEV, dtype=dtype)  # noqa: E731
    out_base, dx_base = padded(), padded()
    out, dx = out_base[:, :, :c].transpose(1, 2), dx_base[:, :, :c].transpose(1, 2)
    dw, db = torch.empty_like(weight), torch.empty_like(bias)
    code = _lib.DTYPE_CODES[dtype]
    st = lambda u: (ctypes.c_int64 * 3)(*u.stride())  # noqa: E731
    C.fn("opslot_causal_conv1d_fwd", m._FWD_ARGS)(
        code,
        b,
        c,
        t,
        width,
        C.ptr(x),
        st(x),
        code,
        C.ptr(weight),
        code,
        C.ptr(bias),
        None,
        0,
        0,
        int(silu),
        C.ptr(out),
        st(out),
        C.stream(x),
    )
    n = C.raw("opslot_causal_conv1d_bwd_scratch_floats", _lib.I64, m._SCRATCH_ARGS)(code, b, c, t, width)
    assert n > 0
    scratch = torch.empty(n, device=DEV)
    C.fn("opslot_causal_conv1d_bwd", m._BWD_ARGS)(
        code,
        b,
        c,
        t,
        width,
        C.ptr(x),
        st(x),
        C.ptr(dy),
        st(dy),
        code,
        C.ptr(weight),
        code,
        C.ptr(bias),
        None,
        0,
        0,
        int(silu),
        C.ptr(dx),
        st(dx),
        C.ptr(dw),
        C.ptr(db),
        scratch.data_ptr(),
        n,
        C.stream(x),
    )
    xr, wr, br = (v.detach().float().requires_grad_(True) for v in (x, weight, bias))
    ref = ref_conv(xr, wr, br, silu)
    ref.backward(dy.float())
    assert_close(out, ref, dtype, "out")
    assert_close(dx, xr.grad, dtype, "dx")
    assert_close(dw, wr.grad, dtype, "dweight")
    assert_close(db, br.grad, dtype, "dbias")
    assert out_base[:, :, c:].isnan().all() and dx_base[:, :, c:].isnan().all()
    with pytest.raises(RuntimeError, match="scratch of 1 floats"):
        C.fn("opslot_causal_conv1d_bwd", m._BWD_ARGS)(
            code,
            b,
            c,
            t,
            width,
            C.ptr(x),
            st(x),
            C.ptr(dy),
            st(dy),
            code,
            C.ptr(weight),
            code,
            C.ptr(bias),
            None,
            0,
            0,
            int(silu),
            C.ptr(dx),
            st(dx),
            C.ptr(dw),
            C.ptr(db),
            scratch.data_ptr(),
            1,
            C.stream(x),
        )
    with pytest.raises(RuntimeError, match="kernel width 5"):
        C.fn("opslot_causal_conv1d_fwd", m._FWD_ARGS)(
            code,
            b,
            c,
            t,
            5,
            C.ptr(x),
            st(x),
            code,
            C.ptr(weight),
            code,
            C.ptr(bias),
            None,
            0,
            0,
            0,
            C.ptr(out),
            st(out),
            C.stream(x),
        )


@requires_cuda
def test_qwen35_shape():
    """B=2, T=4096, C=2*2048+4096, W=4, bf16 (the benchmark shape), upstream's layout."""
    weight, bias = params(8192, 4, torch.bfloat16)
    out, *_ = check(channels_last(2, 8192, 4096, torch.bfloat16), weight, bias, True)
    assert out.transpose(1, 2).is_contiguous()  # the caller's transpose back is free


@requires_cuda
@pytest.mark.parametrize("shape", [(2, 64, 0), (0, 64, 5), (1, 0, 5)])
def test_empty(shape):
    b, c, t = shape
    x = channels_last(b, c, t, torch.bfloat16)
    weight, bias = params(c, 4, torch.bfloat16)
    out, dx, dw, db, _ = run(x, weight, bias, True)
    assert out.shape == x.shape and dx.shape == x.shape
    assert dw.shape == weight.shape and not dw.any() and not db.any()


# -- packed sequences -------------------------------------------------------------------------------


PACKED = [
    (10, [0, 3, 3, 4, 10]),  # an empty and a length-1 segment
    (200, [0, 1, 77, 77, 200]),
    (4097, [0, 1, 2, 1000, 1000, 1001, 2500, 4097]),
    (3000, [0, 3000]),
    (129, [0, 0, 64, 65, 129, 129]),  # empty first and last segments
]


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_packed_equals_separate(dtype, width, index_dtype):
    """Packed sequences give the outputs and gradients of running each on its own: outputs and dx
    bitwise (the same arithmetic per position), the parameter gradients as sums over the sequences."""
    c = 96
    for t, cu in PACKED:
        x = channels_last(1, c, t, dtype)
        weight, bias = params(c, width, dtype)
        cu_t = torch.tensor(cu, device=DEV, dtype=index_dtype)
        out, dx, dw, db = check(x, weight, bias, True, cu=cu_t)
        dy = torch.randn(out.shape, device=DEV, dtype=dtype)
        out, dx, dw, db, _ = run(x, weight, bias, True, cu=cu_t, dy=dy)
        dw_sum, db_sum = torch.zeros(c, width, device=DEV), torch.zeros(c, device=DEV)
        for s, e in zip(cu[:-1], cu[1:]):
            if e == s:
                continue
            o1, dx1, dw1, db1, _ = run(x[:, :, s:e], weight, bias, True, dy=dy[:, :, s:e].contiguous())
            assert torch.equal(out[:, :, s:e], o1)
            assert torch.equal(dx[:, :, s:e], dx1)
            dw_sum += dw1.float()
            db_sum += db1.float()
        assert_close(dw, dw_sum, dtype, "dweight vs separate")
        assert_close(db, db_sum, dtype, "dbias vs separate")


@requires_cuda
def test_packed_against_opslot_reference():
    from opslot import reference as R

    if "cu_seqlens" not in inspect.signature(R.causal_conv1d).parameters:
        pytest.skip("opslot.reference.causal_conv1d has no cu_seqlens yet")
    t, cu = PACKED[2]
    x = channels_last(1, 64, t, torch.float32)
    weight, bias = params(64, 4, torch.float32)
    cu_t = torch.tensor(cu, device=DEV, dtype=torch.int32)
    out = _mod().causal_conv1d(x, weight, bias, "silu", cu_seqlens=cu_t)
    assert_close(out, R.causal_conv1d(x, weight, bias, "silu", cu_seqlens=cu_t), torch.float32, "out")
    plain = _mod().causal_conv1d(x, weight, bias, "swish")
    assert_close(plain, R.causal_conv1d(x, weight, bias, "swish"), torch.float32, "out")


# -- decode ---------------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("state_extra", [0, 1])
def test_decode_update(dtype, width, t, state_extra):
    """Upstream `causal_conv1d_update`: output over cat(state, x), state updated in place (its own
    storage: the same tensor object and data pointer)."""
    b, c = 3, 136
    s = width - 1 + state_extra
    x = channels_last(b, c, t, dtype)
    state = torch.randn(b, c, s, device=DEV, dtype=dtype)
    weight, bias = params(c, width, dtype, bias=(width != 3))
    ref_out, ref_state = ref_update(x, state, weight, bias, silu=True)
    ptr = state.data_ptr()
    with torch.no_grad():
        out = _mod().causal_conv1d(x, weight, bias, "silu", conv_state=state)
    assert state.data_ptr() == ptr
    assert out.shape == x.shape and out.dtype == dtype and out.stride() == x.stride()
    assert_close(out, ref_out, dtype, "out")
    assert torch.equal(state.float(), ref_state)  # the state is moved, not computed


@requires_cuda
def test_decode_against_opslot_reference():
    from opslot import reference as R

    if "conv_state" not in inspect.signature(R.causal_conv1d).parameters:
        pytest.skip("opslot.reference.causal_conv1d has no conv_state yet")
    x = channels_last(2, 64, 1, torch.bfloat16)
    weight, bias = params(64, 4, torch.bfloat16)
    s1 = torch.randn(2, 64, 4, device=DEV, dtype=torch.bfloat16)
    s2 = s1.clone()
    with torch.no_grad():
        out = _mod().causal_conv1d(x, weight, bias, "silu", conv_state=s1)
        ref = R.causal_conv1d(x, weight, bias, "silu", conv_state=s2)
    assert_close(out, ref, torch.bfloat16, "out")
    assert torch.equal(s1, s2)


@requires_cuda
def test_decode_refuses_autograd_and_packing():
    m = _mod()
    x = channels_last(1, 8, 1, torch.float32)
    weight, bias = params(8, 4, torch.float32)
    state = torch.zeros(1, 8, 3, device=DEV)
    with pytest.raises(ValueError, match="decode update .* computes no gradients"):
        m.causal_conv1d(x, weight.requires_grad_(True), bias, conv_state=state)
    with pytest.raises(ValueError, match="cannot be combined"):
        m.causal_conv1d(x, weight, bias, conv_state=state, cu_seqlens=torch.tensor([0, 1], device=DEV))


# -- arguments ------------------------------------------------------------------------------------------


@requires_cuda
def test_refusals():
    m = _mod()
    x = channels_last(2, 8, 5, torch.float32)
    weight, bias = params(8, 4, torch.float32)
    with pytest.raises(ValueError, match=r"^causal_conv1d supports activation None, 'silu' or 'swish', got 'gelu'$"):
        m.causal_conv1d(x, weight, bias, "gelu")
    for w in (1, 5):
        with pytest.raises(ValueError, match=f"kernel width {w}"):
            m.causal_conv1d(x, torch.randn(8, w, device=DEV), bias)
    with pytest.raises(ValueError, match="needs batch size 1"):
        m.causal_conv1d(x, weight, bias, cu_seqlens=torch.tensor([0, 5], device=DEV, dtype=torch.int32))
    with pytest.raises(ValueError, match="1-D int32 or int64"):
        m.causal_conv1d(x[:1], weight, bias, cu_seqlens=torch.tensor([0.0, 5.0], device=DEV))
    with pytest.raises(TypeError, match="weight dtype"):
        m.causal_conv1d(x.half(), weight.bfloat16(), None)


# -- determinism, opcheck, compile, graphs ----------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("packed", [False, True])
def test_bitwise_deterministic(packed):
    b, t = (1, 8192) if packed else (2, 4096)
    x = channels_last(b, 8192, t, torch.bfloat16)
    weight, bias = params(8192, 4, torch.bfloat16)
    cu = torch.tensor([0, 1, 3000, 3001, 8192], device=DEV, dtype=torch.int32) if packed else None
    dy = torch.randn(x.shape, device=DEV, dtype=torch.bfloat16)
    first = run(x, weight, bias, True, cu=cu, dy=dy)[:4]
    second = run(x, weight, bias, True, cu=cu, dy=dy)[:4]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@requires_cuda
def test_opcheck():
    O = torch.ops.opslot  # noqa: E741
    x = channels_last(1, 40, 37, torch.float32).requires_grad_(True)
    weight, bias = params(40, 4, torch.float32)
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    cu = torch.tensor([0, 1, 20, 37], device=DEV, dtype=torch.int32)
    torch.library.opcheck(O.causal_conv1d_fwd.default, (x, weight, bias, None, True))
    torch.library.opcheck(O.causal_conv1d_fwd.default, (x, weight, None, cu, False))
    xc = torch.randn(2, 40, 37, device=DEV, requires_grad=True)  # contiguous [B, C, T]
    torch.library.opcheck(O.causal_conv1d_fwd.default, (xc, weight.detach().half().float(), bias, None, True))
    g = torch.randn(1, 40, 37, device=DEV)
    torch.library.opcheck(O.causal_conv1d_bwd.default, (g, x.detach(), weight.detach(), bias.detach(), cu, True))
    torch.library.opcheck(O.causal_conv1d_bwd.default, (g, x.detach(), weight.detach(), None, None, False))
    state = torch.randn(1, 40, 4, device=DEV)
    torch.library.opcheck(
        O.causal_conv1d_update.default, (x.detach()[:, :, :1], state, weight.detach(), bias.detach(), True)
    )


@requires_cuda
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_and_backward(backend):
    m = _mod()

    def f(h, weight, bias, proj):
        mixed = h @ proj  # [B, T, C], as in_proj_qkv
        out = m.causal_conv1d(mixed.transpose(1, 2), weight, bias, "silu").transpose(1, 2)
        return out.float().square().sum()

    def inputs():
        torch.manual_seed(0)
        mk = lambda *s: torch.randn(*s, device=DEV, dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
        return mk(2, 70, 32), mk(256, 4), mk(256), mk(32, 256)

    eager_in, comp_in = inputs(), inputs()
    loss_e = f(*eager_in)
    loss_e.backward()
    loss_c = torch.compile(f, fullgraph=True, backend=backend)(*comp_in)
    loss_c.backward()
    torch.testing.assert_close(loss_e, loss_c, rtol=1e-2, atol=1e-2)  # the compiler may reorder the sum
    for a, b in zip(eager_in, comp_in):
        torch.testing.assert_close(a.grad, b.grad, rtol=1.6e-2, atol=1e-2)


@requires_cuda
def test_compile_packed_and_decode():
    m = _mod()
    cu = torch.tensor([0, 5, 5, 40], device=DEV, dtype=torch.int64)
    x = channels_last(1, 64, 40, torch.bfloat16)
    weight, bias = params(64, 4, torch.bfloat16)

    def packed(x, w, b):
        return m.causal_conv1d(x, w, b, "silu", cu_seqlens=cu)

    assert torch.equal(torch.compile(packed, fullgraph=True)(x, weight, bias), packed(x, weight, bias))

    def decode(x, state, w, b):
        return m.causal_conv1d(x, w, b, "silu", conv_state=state)

    s1 = torch.randn(1, 64, 4, device=DEV, dtype=torch.bfloat16)
    s2 = s1.clone()
    with torch.no_grad():
        o1 = torch.compile(decode, fullgraph=True)(x[:, :, :1], s1, weight, bias)
        o2 = decode(x[:, :, :1], s2, weight, bias)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


@requires_cuda
@pytest.mark.parametrize("packed", [False, True])
def test_cuda_graph_capture(packed):
    x = channels_last(1 if packed else 2, 512, 300, torch.bfloat16).requires_grad_(True)
    weight, bias = params(512, 4, torch.bfloat16)
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    cu = torch.tensor([0, 1, 150, 150, 300], device=DEV, dtype=torch.int32) if packed else None
    dy = torch.randn(x.shape, device=DEV, dtype=torch.bfloat16)
    state = torch.randn(x.shape[0], 512, 4, device=DEV, dtype=torch.bfloat16)
    state_start = state.clone()
    m = _mod()

    def step():
        out = m.causal_conv1d(x, weight, bias, "silu", cu_seqlens=cu)
        grads = torch.autograd.grad(out, (x, weight, bias), dy)
        with torch.no_grad():
            dec = m.causal_conv1d(x[:, :, :1].detach(), weight.detach(), bias.detach(), "silu", conv_state=state)
        return [out, *grads, dec]

    graph, captured = capture_graph(step)
    state.copy_(state_start)
    graph.replay()
    torch.cuda.synchronize()
    after_replay = state.clone()
    state.copy_(state_start)
    expected = step()
    assert all(torch.equal(a, b) for a, b in zip(expected, captured))
    assert torch.equal(after_replay, state)


# -- without a GPU ---------------------------------------------------------------------------------------


def test_fake_implementations_cpu():
    """The fake implementations (what torch.compile traces) give the real ops' shapes, strides and
    dtypes; they run anywhere."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    m = _mod()
    with FakeTensorMode():
        x = torch.randn(2, 9, 8192, dtype=torch.bfloat16).transpose(1, 2).requires_grad_(True)
        w = torch.randn(8192, 4, dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(8192, dtype=torch.float32, requires_grad=True)
        y = m.causal_conv1d(x, w, b, "silu")
        assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == torch.bfloat16
        y.float().sum().backward()
        assert x.grad.stride() == x.stride() and w.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.float32
        xc = torch.randn(2, 100, 9)
        yc = m.causal_conv1d(xc, torch.randn(100, 3), None, None, cu_seqlens=None)
        assert yc.stride() == (900, 9, 1)
        dx, dw, db = torch.ops.opslot.causal_conv1d_bwd(yc, xc, torch.randn(100, 3), None, None, False)
        assert dx.stride() == xc.stride() and dw.shape == (100, 3) and db.shape == (100,)
        state = torch.zeros(2, 100, 4)
        with torch.no_grad():
            yd = m.causal_conv1d(xc[:, :, :1], torch.randn(100, 4), conv_state=state)
        assert yd.shape == (2, 100, 1)
    with pytest.raises(ValueError, match="got 'relu'"):
        m.causal_conv1d(torch.randn(1, 4, 3), torch.randn(4, 2), activation="relu")
    with pytest.raises(ValueError, match="kernel width 5"):
        m.causal_conv1d(torch.randn(1, 4, 3), torch.randn(4, 5))
