"""The sparse multi-query attention kernels (opslot::sparse_mqa_attention, kernels/src/sparse_attention.cu)
against a dense fp64 reference (every key not listed for a query masked): outputs, lse and the gradients of
q, kv and the sinks, bf16 / fp16 (tensor cores) and fp32 (CUDA cores); odd sizes (heads not a multiple of 16,
more than one 64-head block, partial key tiles, head dims that rule out 16-byte copies, odd head dims
(the backward's one-column stores and per-column dkv reduction), K = 1, T = 1, batch > 1), rows without keys,
whole key tiles without keys, indices out of range; which forward and backward kernels run (the wgmma ones on
Hopper for dv 512) and the mma.sync ones there through the bench library's knob, with the same bits; bitwise
determinism across runs and across the backward's chunking; strided inputs; opcheck, torch.compile and CUDA-graph capture; the mask-to-index
kernel against its CPU kernel; the GLM and DeepSeek-V4 glue against upstream's eager attention and the
slots' `torch` kernels on tiny modules."""

import pytest
import torch

from conftest import assert_close, bench_library, knob, launched, requires_cuda, runtime_test_module

pytestmark = requires_cuda

INF = float("inf")
#: relative L2 error against the fp64 reference (outputs; gradients get GRAD_SCALE times more): operands of
#: the tensor-core products are rounded to the input dtype, P and dS too; fp32 runs on CUDA cores in fp32.
GRAD_SCALE = {torch.float32: 5.0, torch.float16: 2.5, torch.bfloat16: 1.5}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _sa():
    from opslot.kernels.cuda import sparse_attention

    return sparse_attention


def _runtime_tests():
    return runtime_test_module("test_torch_ops_sparse_attention")


def dense_reference(q, kv, idx, sinks, scale, dv):
    return _runtime_tests().dense_reference(q, kv, idx, sinks, scale, dv)


def make_indices(B, S, T, K, skip=0.0, oob=False, device="cuda"):
    """Distinct keys per row (random), some slots -1, optionally one slot >= T."""
    idx = torch.rand(B, S, max(T, K), device=device).argsort(-1)[..., :K]
    idx = torch.where(idx < T, idx, torch.full_like(idx, -1))
    if skip:
        idx = torch.where(torch.rand(B, S, K, device=device) < skip, torch.full_like(idx, -1), idx)
    if oob:
        idx[..., 0] = T + 5
    return idx.to(torch.int32)


def tile_edge_indices(T, K):
    """make_indices(2, 9, T, K) with the tiles of 32 keys the kernels skip or stop at: whole tiles without keys
    in the middle (query [0, 1]), a query without keys ([1, 2]), the first tile without keys ([1, 3]), keys in
    the first tile only ([1, 4])."""
    ix = make_indices(2, 9, T, K, skip=0.3)
    ix[0, 1, 32:96] = -1
    ix[1, 2] = -1
    ix[1, 3, :32] = -1
    ix[1, 4, 32:] = -1
    return ix


def run(q, kv, idx, sinks, scale, dv, dout):
    leaves = [q.detach().clone().requires_grad_(True), kv.detach().clone().requires_grad_(True)]
    s = None if sinks is None else sinks.detach().clone().requires_grad_(True)
    out, lse = _sa().sparse_mqa_attention(leaves[0], leaves[1], idx, s, scale, dv)
    (out.float() * dout).sum().backward()
    grads = [x.grad for x in leaves] + ([s.grad] if s is not None else [])
    return out, lse, grads


CASES = {
    # B, S, H, Dqk, T, K, dv, sinks, skip, out-of-range
    "odd": (2, 7, 5, 40, 13, 6, 24, True, 0.3, True),
    "h17": (1, 9, 17, 64, 50, 33, 64, False, 0.1, False),
    "h70_two_blocks": (2, 4, 70, 96, 40, 37, 80, True, 0.2, False),
    "k1_t1": (3, 2, 4, 32, 1, 1, 32, True, 0.0, False),
    "unaligned_dims": (1, 5, 6, 36, 21, 10, 20, False, 0.0, False),
    "odd_dims": (2, 5, 6, 37, 21, 10, 19, True, 0.2, False),  # one-column w stores, the per-column reduction
    "glm5": (1, 24, 64, 576, 700, 256, 512, False, 0.0, False),
    "deepseek_v4": (2, 16, 64, 512, 400, 160, 512, True, 0.25, False),
    # dv 512 (the Hopper forward): heads in two padded blocks, a partial last tile, a key out of range
    "dv512_h70_k45": (2, 5, 70, 512, 90, 45, 512, True, 0.2, True),
    "dv512_d520": (1, 7, 3, 520, 40, 33, 512, False, 0.1, False),  # Dqk not a multiple of 64
    # empty index lists (K = 0: no index pointer): out 0, lse -inf or the sink, zero gradients
    "k0_sinks": (2, 3, 5, 40, 13, 0, 24, True, 0.0, False),
    "k0_dv512": (1, 2, 3, 512, 9, 0, 512, False, 0.0, False),
}


def check_case(case, dtype, device="cuda"):
    B, S, H, D, T, K, dv, with_sinks, skip, oob = case
    q = torch.randn(B, S, H, D, device=device)
    kv = torch.randn(B, T, D, device=device)
    sinks = torch.randn(H, device=device) if with_sinks else None
    idx = make_indices(B, S, T, K, skip, oob)
    scale = D**-0.5
    dout = torch.randn(B, S, H, dv, device=device)
    out, lse, grads = run(q.to(dtype), kv.to(dtype), idx, sinks, scale, dv, dout)
    leaves = [x.double().requires_grad_(True) for x in (q.to(dtype), kv.to(dtype))]
    rs = None if sinks is None else sinks.double().requires_grad_(True)
    rout, rlse = dense_reference(leaves[0], leaves[1], idx, rs, scale, dv)
    (rout * dout.double()).sum().backward()
    rgrads = [x.grad for x in leaves] + ([rs.grad] if rs is not None else [])
    assert out.dtype == dtype and out.shape == (B, S, H, dv) and lse.dtype == torch.float32
    assert_close(out, rout, dtype, "out")
    finite = torch.isfinite(rlse)
    assert torch.equal(torch.isfinite(lse), finite), "lse: -inf exactly where no key"
    assert_close(lse[finite], rlse[finite], torch.float32, "lse", scale=10.0 if dtype != torch.float32 else 1.0)
    for a, r, name in zip(grads, rgrads, ("dq", "dkv", "dsinks")):
        assert a.dtype == (torch.float32 if name == "dsinks" else dtype), name
        assert_close(a, r, dtype, name, scale=GRAD_SCALE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense_reference(name, dtype):
    if dtype == torch.float32 and name in ("glm5", "deepseek_v4"):
        pytest.skip("the fp32 kernels are checked on the small cases (CUDA cores, slow)")
    check_case(CASES[name], dtype)


def _launched(prefix, q, kv, idx, dv):
    """Names of the sparse attention kernels with `prefix` in their names ("fwd_": those one forward call launches;
    "bwd_": the backward of one call), from torch.profiler."""
    backward = prefix == "bwd_"
    leaves = [x.detach().clone().requires_grad_(backward) for x in (q, kv)]

    def call():
        return _sa().sparse_mqa_attention(leaves[0], leaves[1], idx, None, 0.1, dv)[0]

    if not backward:
        return launched(call, prefix)
    out = call()
    return launched(lambda: out.float().sum().backward(), prefix)


def _probe():
    """Whether this is compute capability 9.0, and bf16 inputs of GLM-5's head dims for _launched."""
    q = torch.randn(1, 4, 64, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 50, 576, device="cuda", dtype=torch.bfloat16)
    return torch.cuda.get_device_capability() == (9, 0), q, kv, make_indices(1, 4, 50, 40)


def test_which_forward_kernel_runs():
    """The wgmma kernel on compute capability 9.0 for dv 512 with 16-byte rows, else the mma.sync one; the
    bench library's knob selects the mma.sync one everywhere, which then matches the reference too and gives
    the same bits as the wgmma kernel (the same products in the same order: S's two halves of Dqk added, then P V
    per 16 keys)."""
    hopper, q, kv, idx = _probe()
    assert _launched("fwd_", q, kv, idx, 512) == {"fwd_wgmma_kernel" if hopper else "fwd_mma_kernel"}
    assert _launched("fwd_", q, kv, idx, 448) == {"fwd_mma_kernel"}
    assert _launched("fwd_", q[..., :516], kv[..., :516], idx, 512) == {"fwd_mma_kernel"}  # 1032-byte rows
    shapes = [  # H, D, T, K, sinks: 7, 5, 1 and 2 tiles of keys; Dqk 520 (not a multiple of 64: the
        # copies' per-chunk form, load_row_sw)
        (70, 576, 300, 200, None),
        (64, 512, 260, 160, torch.randn(64, device="cuda")),
        (64, 576, 40, 20, None),
        (64, 576, 50, 40, torch.randn(64, device="cuda")),
        (5, 520, 90, 77, torch.randn(5, device="cuda")),
    ]
    inputs = []
    for dtype in (torch.bfloat16, torch.float16):
        for H, D, T, K, sinks in shapes:
            ix = tile_edge_indices(T, K)
            qkv = (
                torch.randn(2, 9, H, D, device="cuda", dtype=dtype),
                torch.randn(2, T, D, device="cuda", dtype=dtype),
            )
            inputs.append((*qkv, ix, sinks))

    def forwards():
        return [_sa().sparse_mqa_attention(a, b, c, d, a.shape[-1] ** -0.5, 512) for a, b, c, d in inputs]

    with bench_library() as lib:
        default = forwards()
        set_fwd = knob(lib, "opslot_sparse_mqa_set_tuning", 1)
        assert set_fwd(4) != 0 and set_fwd(-1) != 0
        assert set_fwd(1) == 0
        try:
            assert _launched("fwd_", q, kv, idx, 512) == {"fwd_mma_kernel"}
            for name in ("glm5", "deepseek_v4"):
                check_case(CASES[name], torch.bfloat16)
            for (out, lse), (out1, lse1) in zip(default, forwards()):
                assert torch.equal(out, out1) and torch.equal(lse, lse1), "the two forward kernels differ"
        finally:
            assert set_fwd(0) == 0
        assert _launched("fwd_", q, kv, idx, 512) == {"fwd_wgmma_kernel" if hopper else "fwd_mma_kernel"}


def _bf16_pass(H, D, T, ix, sinks):
    """bf16 inputs of a forward + backward pass (_fwd_bwd with dv 512) over the index lists ix [2, 9, K]."""
    q = torch.randn(2, 9, H, D, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, T, D, device="cuda", dtype=torch.bfloat16)
    return q, kv, ix, sinks, torch.randn(2, 9, H, 512, device="cuda")


def _assert_same_passes(got, ref, what):
    """Each pass's out, lse, dq, dkv and dsinks equal bit for bit."""
    for g, r in zip(got, ref):
        for a, b, name in zip(g, r, ("out", "lse", "dq", "dkv", "dsinks")):
            assert torch.equal(a, b), f"{name}: {what}"


def test_which_backward_kernel_runs():
    """The wgmma backward on compute capability 9.0 for bf16 with dv 512 and 16-byte rows, else the mma.sync
    one (fp16, other dv); the bench library's knob (bit 1) selects the mma.sync one, which gives the same bits
    as the wgmma kernel (the same products in the same order) on odd shapes: heads in two padded blocks, a
    partial last tile, whole tiles without keys, Dqk 576, 520 (not a multiple of 64) and 512, sinks."""
    hopper, q, kv, idx = _probe()
    assert _launched("bwd_", q, kv, idx, 512) == {"bwd_wgmma_kernel" if hopper else "bwd_mma_kernel"}
    assert _launched("bwd_", q, kv, idx, 448) == {"bwd_mma_kernel"}
    assert _launched("bwd_", q.half(), kv.half(), idx, 512) == {"bwd_mma_kernel"}
    inputs = []
    for H, D, T, K, sinks in [
        (70, 576, 300, 200, None),
        (64, 512, 260, 160, torch.randn(64, device="cuda")),
        (5, 520, 90, 77, torch.randn(5, device="cuda")),
    ]:
        ix = make_indices(2, 9, T, K, skip=0.3)
        ix[0, 1, 32:96] = -1  # whole tiles without keys
        ix[1, 3] = -1  # a query without keys
        inputs.append(_bf16_pass(H, D, T, ix, sinks))

    def backwards():
        return [_fwd_bwd(*a, 512) for a in inputs]

    with bench_library() as lib:
        default = backwards()
        set_kernels = knob(lib, "opslot_sparse_mqa_set_tuning", 1)
        assert set_kernels(2) == 0
        try:
            assert _launched("bwd_", q, kv, idx, 512) == {"bwd_mma_kernel"}
            _assert_same_passes(default, backwards(), "the two backward kernels differ")
        finally:
            assert set_kernels(0) == 0
    for a, b in zip(backwards()[0], default[0]):  # the production library: the bench library's default bits
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("D", [64, 512])
def test_rows_without_keys(dtype, with_sinks, D):
    B, S, H, T = 2, 3, 5, 9
    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    kv = torch.randn(B, T, D, device="cuda", dtype=dtype)
    idx = torch.full((B, S, 40), -1, dtype=torch.int32, device="cuda")
    idx[1, 1, 7] = 4
    sinks = torch.randn(H, device="cuda") if with_sinks else None
    out, lse, grads = run(q, kv, idx, sinks, 0.125, D, torch.randn(B, S, H, D, device="cuda"))
    rows = torch.ones(B, S, dtype=torch.bool, device="cuda")
    rows[1, 1] = False
    assert (out[rows] == 0).all()
    if with_sinks:
        torch.testing.assert_close(lse[rows], sinks.expand(B, S, H)[rows])
    else:
        assert torch.isneginf(lse[rows]).all()
    assert torch.isfinite(lse[1, 1]).all()
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][rows] == 0).all()
    kv_rows = torch.ones(B, T, dtype=torch.bool, device="cuda")
    kv_rows[1, 4] = False
    assert (grads[1][kv_rows] == 0).all()  # only the one selected key gets a gradient


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D,dv", [(64, 48), (576, 512)], ids=["d64", "d576_dv512"])
def test_whole_tiles_without_keys(dtype, D, dv):
    """Tiles of 32 slots that are all -1 (first, middle, last; what a causal top-k gives early queries) are
    skipped: the dense reference's result, and the same bits as the same keys with the gaps moved to the end
    (dv 512: the Hopper forward)."""
    B, S, H, T = 2, 6, 20, 200
    keys = make_indices(B, S, T, 64, skip=0.2)  # two tiles' worth of keys per query
    gap = torch.full((B, S, 32), -1, dtype=torch.int32, device="cuda")
    gapped = torch.cat([gap, keys[..., :32], gap, keys[..., 32:], gap], -1)
    packed = torch.cat([keys, gap, gap, gap], -1)
    gapped[0, 2] = -1  # a query without keys in five tiles
    packed[0, 2] = -1
    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    kv = torch.randn(B, T, D, device="cuda", dtype=dtype)
    sinks = torch.randn(H, device="cuda")
    dout = torch.randn(B, S, H, dv, device="cuda")
    got = _fwd_bwd(q, kv, gapped, sinks, dout, dv)
    for a, b, name in zip(got, _fwd_bwd(q, kv, packed, sinks, dout, dv), ("out", "lse", "dq", "dkv", "dsinks")):
        assert torch.equal(a, b), f"{name}: the gaps changed the bits"
    leaves = [x.double().requires_grad_(True) for x in (q, kv)]
    rs = sinks.double().requires_grad_(True)
    rout, rlse = dense_reference(leaves[0], leaves[1], gapped, rs, D**-0.5, dv)
    (rout * dout.double()).sum().backward()
    assert_close(got[0], rout, dtype, "out")
    assert_close(got[1], rlse, torch.float32, "lse", scale=10.0 if dtype != torch.float32 else 1.0)
    for a, r, name in zip(got[2:], (leaves[0].grad, leaves[1].grad, rs.grad), ("dq", "dkv", "dsinks")):
        assert_close(a, r, dtype, name, scale=GRAD_SCALE[dtype])
    assert (got[0][0, 2] == 0).all() and (got[2][0, 2] == 0).all()


def _fwd_bwd(q, kv, idx, sinks, dout, dv):
    out, lse, grads = run(q, kv, idx, sinks, q.shape[-1] ** -0.5, dv, dout)
    return [out, lse] + grads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D,dv", [(96, 64), (576, 512)], ids=["d96", "d576_dv512"])
def test_bitwise_deterministic_and_independent_of_chunking(dtype, D, dv, monkeypatch):
    B, S, H, T, K = 2, 33, 70, 60, 48
    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    kv = torch.randn(B, T, D, device="cuda", dtype=dtype)
    idx = make_indices(B, S, T, K, skip=0.1)
    idx[:, :, :8] = torch.arange(8, device="cuda", dtype=torch.int32)  # every query selects keys 0..7: deep sums
    sinks = torch.randn(H, device="cuda")
    dout = torch.randn(B, S, H, dv, device="cuda")
    first = _fwd_bwd(q, kv, idx, sinks, dout, dv)
    second = _fwd_bwd(q, kv, idx, sinks, dout, dv)
    monkeypatch.setenv("OPSLOT_SPARSE_MQA_CHUNK", "5")
    chunked = _fwd_bwd(q, kv, idx, sinks, dout, dv)
    for a, b, c, name in zip(first, second, chunked, ("out", "lse", "dq", "dkv", "dsinks")):
        assert torch.equal(a, b), f"{name} differs between two runs"
        assert torch.equal(a, c), f"{name} differs with 5-query chunks"


@pytest.mark.parametrize("D", [64, 512])
def test_strided_inputs_match_contiguous(D):
    B, S, H, T, K = 2, 6, 8, 20, 12
    qt = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    q = qt.transpose(1, 2)  # [B, S, H, D] view of the head-major layout (what upstream passes)
    wide = torch.randn(B, T, D + 32, device="cuda", dtype=torch.bfloat16)
    kv = wide[..., :D]  # rows D + 32 apart
    idx_wide = make_indices(B, S, T, 2 * K)
    idx = idx_wide[..., ::2]
    assert not q.is_contiguous() and not kv.is_contiguous() and not idx.is_contiguous()
    dout = torch.randn(B, S, H, D, device="cuda")
    strided = _fwd_bwd(q, kv, idx, None, dout, D)
    contiguous = _fwd_bwd(q.contiguous(), kv.contiguous(), idx.contiguous(), None, dout, D)
    for a, b, name in zip(strided, contiguous, ("out", "lse", "dq", "dkv")):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("D,dv", [(64, 48), (576, 512)], ids=["d64", "d576_dv512"])
def test_opcheck(with_sinks, D, dv):
    q = torch.randn(2, 5, 3, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(2, 11, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    idx = make_indices(2, 5, 11, 6, skip=0.2)
    sinks = torch.randn(3, device="cuda", requires_grad=True) if with_sinks else None
    torch.library.opcheck(torch.ops.opslot.sparse_mqa_attention.default, (q, kv, idx, sinks, 0.1, dv))
    mask = torch.zeros(2, 5, 11, device="cuda")
    torch.library.opcheck(torch.ops.opslot.sparse_mqa_mask_indices.default, (mask, 6))


@pytest.mark.parametrize("D", [128, 512])  # 512: the Hopper forward
def test_torch_compile_and_cuda_graph(D):
    B, S, H, T, K = 1, 8, 16, 40, 24
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16)
    idx = make_indices(B, S, T, K)
    sinks = torch.randn(H, device="cuda")
    dout = torch.randn(B, S, H, D, device="cuda")
    eager = _fwd_bwd(q, kv, idx, sinks, dout, D)

    def step(q, kv, sinks):
        out, _ = _sa().sparse_mqa_attention(q, kv, idx, sinks, D**-0.5, D)
        return out

    compiled = torch.compile(step, fullgraph=True)
    leaves = [q.clone().requires_grad_(True), kv.clone().requires_grad_(True), sinks.clone().requires_grad_(True)]
    out = compiled(*leaves)
    (out.float() * dout).sum().backward()
    assert torch.equal(out, eager[0])
    for a, b in zip([x.grad for x in leaves], eager[2:]):
        assert torch.equal(a, b)
    # CUDA graph: forward and backward captured, replayed on new data
    static = [q.clone().requires_grad_(True), kv.clone().requires_grad_(True), sinks.clone().requires_grad_(True)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            (step(*static).float() * dout).sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for x in static:
        x.grad = None
    with torch.cuda.graph(graph):
        gout = step(*static)
        (gout.float() * dout).sum().backward()
    with torch.no_grad():
        static[0].copy_(q * 0.5)
    graph.replay()
    torch.cuda.synchronize()
    ref = _fwd_bwd(q * 0.5, kv, idx, sinks, dout, D)
    assert torch.equal(gout, ref[0])
    for a, b in zip([x.grad for x in static], ref[2:]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool], ids=str)
def test_mask_indices_match_the_cpu_kernel(dtype):
    valid = torch.rand(3, 37, 301, device="cuda") < 0.3
    valid[0, :5] = False
    if dtype == torch.bool:
        mask = valid
    else:
        mask = torch.zeros(valid.shape, device="cuda", dtype=dtype).masked_fill(~valid, torch.finfo(dtype).min)
        mask[1, 3, ::7] = -INF
    for m in (mask, mask[:1].expand(3, 37, 301), mask[..., ::2]):
        topk = int((m == 0 if dtype != torch.bool else m).sum(-1).max())
        for k in (topk, topk + 9, max(topk - 3, 0)):
            gpu = torch.ops.opslot.sparse_mqa_mask_indices(m, k)
            cpu = torch.ops.opslot.sparse_mqa_mask_indices(m.cpu(), k)
            assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1]), (dtype, k)
    bias = torch.zeros(1, 2, 40, device="cuda")
    bias[0, 1, 33] = -5.0
    assert torch.ops.opslot.sparse_mqa_mask_indices(bias, 40)[1].item() == 2


# --- the slot glue on tiny upstream modules (bf16 on the GPU) ---


def _maybe_torch_kernel(name):
    """The slot's `torch` kernel where this checkout has it (helpers A/B write them), else None."""
    try:
        from opslot.kernels import torch_ops
    except Exception:  # noqa: BLE001
        return None
    return getattr(torch_ops, name, None)


def test_glm_glue_against_upstream_and_the_torch_kernel():
    """bf16 on the GPU against upstream's eager attention in fp32 on the same (bf16-valued) weights and inputs."""
    import copy

    cpu = _runtime_tests()
    mod, attn = cpu.glm_module(heads=8)
    attn = attn.to("cuda", torch.bfloat16)
    attn32 = copy.deepcopy(attn).float()
    gen = torch.Generator().manual_seed(1)
    ins = [x.to("cuda") for x in cpu.glm_inputs(attn, B=2, S=40, pad=3, gen=gen)]
    ins = [x.to(torch.bfloat16) for x in ins[:4]] + [ins[4], torch.where(ins[5] == 0, 0.0, -3e38).to(torch.bfloat16)]
    dout = torch.randn(2, 40, 8, attn.v_head_dim, device="cuda")
    real = torch.ones(2, 40, dtype=torch.bool, device="cuda")
    real[1, :3] = False  # padded queries: upstream averages every key there, the kernel gives 0 (docs)

    def grads_of(module, fn, dtype):
        leaves = [x.detach().to(dtype).requires_grad_(True) for x in ins[:4]]
        module.kv_b_proj.weight.grad = None
        out = fn(*leaves, ins[4], ins[5].to(dtype))
        (out.float() * dout * real[..., None, None]).sum().backward()
        return out, [x.grad for x in leaves] + [module.kv_b_proj.weight.grad.clone()]

    sa = _sa()
    out, grads = grads_of(attn, lambda *a: sa.dsa_attention_glm(attn, *a)[0], torch.bfloat16)
    ref, rgrads = grads_of(attn32, lambda *a: cpu.glm_upstream(mod, attn32, *a), torch.float32)
    assert out.dtype == torch.bfloat16
    assert_close(out[real], ref[real], torch.bfloat16, "out")
    assert (out[~real] == 0).all()
    for a, b, name in zip(grads, rgrads, ("q_pass", "q_rot", "k_pass", "k_rot", "kv_b_proj")):
        assert_close(a, b, torch.bfloat16, name, scale=GRAD_SCALE[torch.bfloat16])
    torch_kernel = _maybe_torch_kernel("dsa_attention_glm")
    if torch_kernel is not None:  # the slot's torch kernel (upstream's code, bf16) lands within bf16 too
        with torch.no_grad():
            tout, _ = torch_kernel(attn, *ins)
        assert_close(tout[real], ref[real], torch.bfloat16, "torch kernel", scale=2.0)


@pytest.mark.parametrize("S,past", [(1, 700), (37, 300)])  # a decoding step; a chunk after a cached prompt
def test_glm_glue_after_cached_latents(S, past):
    """Transformers 5.23's generation (no cache given to the slot, the cached latents first: T > S), bf16 on
    the GPU against upstream's eager attention in fp32; a bool mask and no mask (causal, the queries last)."""
    import copy

    cpu = _runtime_tests()
    mod, attn = cpu.glm_module(heads=8)
    attn = attn.to("cuda", torch.bfloat16)
    attn32 = copy.deepcopy(attn).float()
    gen = torch.Generator().manual_seed(S)
    ins = [x.to("cuda") for x in cpu.glm_inputs(attn, B=2, S=S, pad=3, gen=gen, past=past)]
    with torch.no_grad():
        ref = cpu.glm_upstream(mod, attn32, *[x.float() for x in ins[:4]], ins[4], ins[5])
        ins = [x.to(torch.bfloat16) for x in ins[:4]] + [ins[4], ins[5]]
        out, _ = _sa().dsa_attention_glm(attn, *ins[:5], torch.where(ins[5] == 0, 0.0, -3e38).to(torch.bfloat16))
        out_bool, _ = _sa().dsa_attention_glm(attn, *ins[:5], ins[5] == 0)
        out_none, _ = _sa().dsa_attention_glm(attn, *ins[:5], None)
    assert out.dtype == torch.bfloat16 and out.shape == (2, S, 8, attn.v_head_dim)
    assert_close(out, ref, torch.bfloat16, "out")
    assert torch.equal(out_bool, out)
    assert torch.equal(out_none[0], out[0])  # batch row 0 has no padding


# a decoding step and a chunk (S * K < T: the selected rows gathered); a longer chunk (the whole cache)
@pytest.mark.parametrize("S,past", [(1, 700), (37, 300), (64, 40)])
def test_glm_glue_over_the_expanded_cache(S, past):
    """Transformers 5.17's generation (the cache holds the expanded keys and values of `past` tokens), bf16 on
    the GPU against upstream's eager attention in fp32 over the same cache: output, cache contents and the
    gradients of the queries, the new latents and kv_b_proj."""
    import copy

    cpu = _runtime_tests()
    mod, attn = cpu.glm_module(heads=8)
    attn = attn.to("cuda", torch.bfloat16)
    attn32 = copy.deepcopy(attn).float()
    gen = torch.Generator().manual_seed(100 + S)
    ins = [x.to("cuda") for x in cpu.glm_inputs(attn, B=2, S=S, pad=3, gen=gen, past=past)]
    ins = [x.to(torch.bfloat16).float() for x in ins[:4]] + ins[4:]  # bf16 values for both sides
    dout = torch.randn(2, S, 8, attn.v_head_dim, device="cuda")
    out, keys, values, grads = cpu.glm_over_expanded_cache(_sa(), mod, attn, ins, past, dout, torch.bfloat16)
    ref, ref_keys, ref_values, ref_grads = cpu.glm_over_expanded_cache(None, mod, attn32, ins, past, dout)
    assert out.dtype == torch.bfloat16 and out.shape == (2, S, 8, attn.v_head_dim)
    assert keys.dtype == torch.bfloat16 and keys.shape[2] == values.shape[2] == past + S
    assert_close(out, ref, torch.bfloat16, "out")
    assert_close(keys, ref_keys, torch.bfloat16, "cached keys")
    assert_close(values, ref_values, torch.bfloat16, "cached values")
    for a, b, name in zip(grads, ref_grads, ("q_pass", "q_rot", "k_pass", "k_rot", "kv_b_proj")):
        assert_close(a, b, torch.bfloat16, name, scale=GRAD_SCALE[torch.bfloat16])
    # deterministic: the same call again gives the same bits
    again = cpu.glm_over_expanded_cache(_sa(), mod, attn, ins, past, dout, torch.bfloat16)
    assert torch.equal(again[0], out) and all(torch.equal(a, b) for a, b in zip(again[3], grads))
    # under no_grad (generate()) sparse_mha_attention reads the cache itself: upstream's output within bf16
    # tolerance, the same cache, and the same bits on a second call
    plain = cpu.glm_over_expanded_cache(_sa(), mod, attn, ins, past, None, torch.bfloat16)
    assert plain[3] is None and plain[0].dtype == torch.bfloat16
    assert_close(plain[0], ref, torch.bfloat16, "out without autograd")
    assert torch.equal(plain[1], keys) and torch.equal(plain[2], values)
    assert torch.equal(cpu.glm_over_expanded_cache(_sa(), mod, attn, ins, past, None, torch.bfloat16)[0], plain[0])


def test_deepseek_v4_glue_against_upstream_and_the_torch_kernel():
    """bf16 on the GPU against upstream's eager attention (with sinks) in fp32 on the same values."""
    cpu = _runtime_tests()
    mod = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    module = cpu.v4_module(H=16, topk=8)
    module.sinks = torch.nn.Parameter(torch.randn(16, device="cuda").to(torch.bfloat16))
    module32 = cpu.v4_module(H=16, topk=8)
    module32.sinks = torch.nn.Parameter(module.sinks.detach().float())
    gen = torch.Generator().manual_seed(4)
    q, kv, mask = cpu.v4_inputs(B=2, H=16, S=96, D=128, window=32, comp=24, topk=8, gen=gen)
    q, kv, mask = q.to("cuda", torch.bfloat16), kv.to("cuda", torch.bfloat16), mask.to("cuda", torch.bfloat16)
    dout = torch.randn(2, 96, 16, 128, device="cuda")
    scaling = 128**-0.5

    def grads_of(m, fn, dtype):
        leaves = [x.detach().to(dtype).clone().requires_grad_(True) for x in (q, kv)]
        m.sinks.grad = None
        out = fn(*leaves)
        (out.float() * dout).sum().backward()
        return out, [x.grad for x in leaves] + [m.sinks.grad.clone()]

    sa = _sa()
    kw = dict(scaling=scaling, sliding_window=32, s_aux=module.sinks)
    out, grads = grads_of(
        module, lambda q, kv: sa.dsa_attention_deepseek_v4(module, q, kv, mask, **kw)[0], torch.bfloat16
    )
    ref, rgrads = grads_of(
        module32,
        lambda q, kv: mod.eager_attention_forward(module32, q, kv, kv, mask.float(), scaling=scaling)[0],
        torch.float32,
    )
    assert out.dtype == torch.bfloat16 and out.shape == (2, 96, 16, 128)
    assert_close(out, ref, torch.bfloat16, "out")
    for a, b, name in zip(grads, rgrads, ("dq", "dkv", "dsinks")):
        assert_close(a, b, torch.bfloat16, name, scale=GRAD_SCALE[torch.bfloat16])
    torch_kernel = _maybe_torch_kernel("dsa_attention_deepseek_v4")
    if torch_kernel is not None:
        with torch.no_grad():
            tout, _ = torch_kernel(module, q, kv, mask, **kw)
        assert_close(tout, ref, torch.bfloat16, "torch kernel", scale=2.0)
