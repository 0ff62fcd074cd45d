"""The sparse multi-head attention kernel over per-head caches (opslot::sparse_mha_attention,
kernels/src/sparse_mha.cu) against a dense fp64 reference (every key not listed for a query masked): output
and lse, bf16 / fp16 / fp32; the 16-byte path (one, two and four chunks a lane) and the one-element path
(head dims or strides that rule out 16-byte loads); one split a row and keys split over CTAs (with the merge
kernel); GQA, K = 1, T = 1, K > T, rows without keys, indices out of range, empty inputs; strided views;
bitwise determinism; opcheck and CUDA-graph capture; the Autograd kernel's refusal."""

import pytest
import torch

from conftest import assert_close, launched, requires_cuda, runtime_test_module

pytestmark = requires_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
O = torch.ops.opslot  # noqa: E741


def _cpu_tests():
    return runtime_test_module("test_torch_ops_sparse_mha")


@pytest.fixture(scope="module", autouse=True)
def ops():
    from opslot.kernels.cuda import sparse_attention  # noqa: F401  (loads the ops)


def make(B, S, H, Hkv, dk, dv, T, K, skip=0.0, oob=False, dtype=torch.bfloat16, seed=0):
    q, k, v, idx = _cpu_tests().inputs(B, S, H, Hkv, dk, dv, T, K, skip, oob, seed=seed)
    return [x.to("cuda", dtype) for x in (q, k, v)] + [idx.cuda()]


CASES = {
    # B, S, H, Hkv, dk, dv, T, K, skip, out-of-range
    "glm5_decode": (1, 1, 64, 64, 256, 256, 4096, 2048, 0.0, False),  # 64 rows: keys split over 16 CTAs
    "glm5_batch_chunk": (2, 3, 16, 16, 256, 256, 700, 300, 0.2, True),
    "gqa_odd": (2, 5, 6, 2, 40, 24, 50, 17, 0.3, True),
    "unaligned_dims": (1, 4, 3, 3, 36, 20, 30, 9, 0.0, False),  # 72- and 40-byte bf16 rows: one element a load
    "odd_dims": (2, 3, 5, 5, 37, 19, 21, 10, 0.2, False),
    "t1_k1": (3, 2, 4, 1, 32, 32, 1, 1, 0.0, False),
    "k_over_t": (2, 2, 4, 4, 64, 64, 5, 70, 0.0, False),  # more slots than keys: the tail of every row -1
    "max_dims": (1, 2, 4, 2, 512, 512, 300, 130, 0.1, False),  # two chunks a lane (16-bit), four (fp32)
    "many_rows": (4, 64, 8, 8, 128, 128, 200, 96, 0.1, False),  # 2048 rows: one split a row
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense_reference(name, dtype):
    B, S, H, Hkv, dk, dv, T, K, skip, oob = CASES[name]
    q, k, v, idx = make(B, S, H, Hkv, dk, dv, T, K, skip, oob, dtype, seed=len(name))
    scale = dk**-0.5
    out, lse = O.sparse_mha_attention(q, k, v, idx, scale)
    ref, rlse = _cpu_tests().dense_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), scale)
    assert out.dtype == dtype and out.shape == (B, S, H, dv) and lse.dtype == torch.float32
    assert_close(out, ref.cuda(), dtype, "out")
    finite = torch.isfinite(rlse).cuda()
    assert torch.equal(torch.isfinite(lse), finite), "lse: -inf exactly where no key"
    assert_close(lse[finite], rlse.cuda()[finite], torch.float32, "lse", scale=1.0 if dtype == torch.float32 else 10.0)


def test_rows_without_keys_give_zero_and_minus_inf():
    for K in (10, 700):  # one split a row; split keys (every split of the row empty)
        q, k, v, idx = make(2, 3, 4, 2, 64, 32, 800, K)
        idx[0, 1] = -1
        idx[1, 2] = 900  # out of range
        out, lse = O.sparse_mha_attention(q, k, v, idx, 0.2)
        assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1])) and torch.equal(
            out[1, 2], torch.zeros_like(out[1, 2])
        )
        assert torch.isneginf(lse[0, 1]).all() and torch.isneginf(lse[1, 2]).all()
        assert torch.isfinite(lse[0, 0]).all() and not torch.isnan(out).any()
        # a split with no valid key beside splits with keys: only the first 5 slots valid
        idx2 = idx.clone()
        idx2[..., 5:] = -1
        out2, _ = O.sparse_mha_attention(q, k, v, idx2, 0.2)
        ref, _ = O.sparse_mha_attention(q, k, v, idx2[..., :5].contiguous(), 0.2)
        torch.testing.assert_close(out2, ref, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("case", ["B0", "S0", "T0", "K0"])
def test_empty_inputs(case):
    _cpu_tests().check_empty(make, *_cpu_tests().EMPTY[case])


def test_which_kernels_run():
    """One split a row: split_kernel alone; few rows with many keys: split_kernel and merge_kernel."""
    q, k, v, idx = make(1, 1, 64, 64, 256, 256, 4096, 2048)
    assert launched(lambda: O.sparse_mha_attention(q, k, v, idx, 0.1), "mha::") == {"split_kernel", "merge_kernel"}
    q, k, v, idx = make(4, 64, 8, 8, 128, 128, 200, 96)
    assert launched(lambda: O.sparse_mha_attention(q, k, v, idx, 0.1), "mha::") == {"split_kernel"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bitwise_deterministic(dtype):
    for case in ("glm5_decode", "gqa_odd", "many_rows"):
        B, S, H, Hkv, dk, dv, T, K, skip, oob = CASES[case]
        q, k, v, idx = make(B, S, H, Hkv, dk, dv, T, K, skip, oob, dtype)
        a = O.sparse_mha_attention(q, k, v, idx, 0.1)
        b = O.sparse_mha_attention(q, k, v, idx, 0.1)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), case


def test_strided_inputs_match_contiguous():
    """q as the GLM glue passes it (a transpose of [B, H, S, dk]), k and v the first T rows of a longer static
    cache, the index lists a slice: the same bits as contiguous copies (16-byte path); a head stride that is
    not a multiple of 16 bytes takes the one-element path and agrees within rounding."""
    q, k, v, idx = make(2, 3, 8, 8, 128, 128, 300, 100, skip=0.1)
    qv = q.transpose(1, 2).contiguous().transpose(1, 2)
    big_k = torch.zeros(2, 8, 400, 128, device="cuda", dtype=q.dtype)
    big_v = torch.zeros_like(big_k)
    big_k[:, :, :300], big_v[:, :, :300] = k, v
    wide = torch.full((2, 3, 130), -1, device="cuda", dtype=torch.int32)
    wide[..., :100] = idx
    got = O.sparse_mha_attention(qv, big_k[:, :, :300], big_v[:, :, :300], wide[..., :100], 0.1)
    ref = O.sparse_mha_attention(q, k, v, idx, 0.1)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    odd = torch.zeros(2, 3, 8, 129, device="cuda", dtype=q.dtype)[..., 1:]  # rows 2 bytes off 16-byte alignment
    odd.copy_(q)
    got = O.sparse_mha_attention(odd, k, v, idx, 0.1)
    assert_close(got[0], ref[0].float(), torch.bfloat16, "one-element path")


def test_opcheck():
    q, k, v, idx = make(2, 3, 4, 2, 64, 32, 300, 130, 0.2)
    torch.library.opcheck(
        O.sparse_mha_attention.default, (q, k, v, idx, 0.3), test_utils=("test_schema", "test_faketensor")
    )


def test_cuda_graph_capture():
    q, k, v, idx = make(1, 1, 64, 64, 256, 256, 1000, 512)
    O.sparse_mha_attention(q, k, v, idx, 0.1)  # warm up (library load) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = O.sparse_mha_attention(q, k, v, idx, 0.1)
    q.copy_(q * 0.5)
    graph.replay()
    torch.cuda.synchronize()
    ref = O.sparse_mha_attention(q, k, v, idx, 0.1)
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])


def test_autograd_refuses_a_call_needing_grad():
    q, k, v, idx = make(1, 1, 2, 2, 16, 16, 5, 3)
    with pytest.raises(NotImplementedError, match="sparse_mha_attention: has no backward"):
        O.sparse_mha_attention(q.requires_grad_(), k, v, idx, 0.5)
    with torch.no_grad():
        assert O.sparse_mha_attention(q, k, v, idx, 0.5)[0].shape == (1, 1, 2, 16)
