"""opslot::sparse_mha_attention (kernels/torch/sparse_mha.cc) on a machine without a GPU: the dispatch keys,
opcheck on meta and CPU tensors, the CPU kernel (the op's fp32 reference math) against an independent dense
fp64 reference (GQA, odd sizes, K = 1, T = 1, K > T, rows without keys, indices out of range, empty inputs),
strided views, the Autograd kernel's refusal, and the argument checks' exact messages. The CUDA kernel:
tests/gpu/kernels/test_sparse_mha.py."""

from __future__ import annotations

import pytest
import torch

from test_kernel_library_symbols import _library
from test_torch_ops_sparse_attention import distinct_indices

O = torch.ops.opslot  # noqa: E741
INF = float("inf")


@pytest.fixture(scope="module", autouse=True)
def lib():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import _lib

    _lib.torch_ops()


def dense_reference(q, k, v, idx, scale):
    """fp64 attention of every (query, head) over all T keys of its kv head, the keys not listed for the query
    masked. q [B, S, H, dk], k [B, Hkv, T, dk], v [B, Hkv, T, dv]."""
    q, k, v = q.double(), k.double(), v.double()
    B, S, H, _ = q.shape
    T, group = k.shape[2], H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    idx = idx.long()
    allowed = torch.zeros(B, S, T + 1, dtype=torch.bool)
    allowed.scatter_(-1, torch.where((idx >= 0) & (idx < T), idx, T), True)
    scores = torch.einsum("bshd,bhtd->bsht", q, k) * scale
    scores = scores.masked_fill(~allowed[:, :, None, :T], -INF)
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
    return torch.einsum("bsht,bhtd->bshd", p, v), lse


def inputs(B, S, H, Hkv, dk, dv, T, K, skip=0.0, oob=False, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, dk, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, T, dk, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, T, dv, generator=gen).to(dtype)
    return q, k, v, distinct_indices(B, S, T, K, skip, oob, gen)


def test_registered_from_cpp_with_every_key():
    name = "opslot::sparse_mha_attention"
    for key in ("CUDA", "Meta", "CPU", "Autograd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), key
    assert torch._library.custom_ops.OPDEFS.get(name) is None


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_opcheck(device):
    q, k, v, idx = inputs(2, 3, 4, 2, 40, 24, 9, 5, skip=0.3, dtype=torch.bfloat16)
    args = [x.to(device) for x in (q, k, v, idx)] + [0.3]
    torch.library.opcheck(O.sparse_mha_attention.default, tuple(args), test_utils=("test_schema", "test_faketensor"))


CASES = {
    # B, S, H, Hkv, dk, dv, T, K, skip, out-of-range
    "decode": (1, 1, 4, 4, 64, 64, 33, 16, 0.0, False),
    "gqa_odd": (2, 3, 6, 2, 40, 24, 11, 5, 0.2, True),
    "t1_k1": (2, 2, 3, 1, 8, 8, 1, 1, 0.0, False),
    "k_over_t": (3, 2, 2, 2, 16, 12, 4, 6, 0.5, False),  # the tail of every row is -1
    "odd_dims": (1, 2, 5, 5, 37, 19, 13, 7, 0.1, False),
    "glm5_dims": (1, 1, 2, 2, 256, 256, 20, 8, 0.0, False),
    "max_dims": (1, 2, 2, 1, 512, 512, 9, 4, 0.0, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_kernel_matches_a_dense_reference(name):
    B, S, H, Hkv, dk, dv, T, K, skip, oob = CASES[name]
    q, k, v, idx = inputs(B, S, H, Hkv, dk, dv, T, K, skip, oob, seed=len(name))
    scale = dk**-0.5
    out, lse = O.sparse_mha_attention(q, k, v, idx, scale)
    ref, rlse = dense_reference(q, k, v, idx, scale)
    assert out.shape == (B, S, H, dv) and out.dtype == torch.float32 and lse.shape == (B, S, H)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(rlse))
    torch.testing.assert_close(lse.double()[~torch.isinf(rlse)], rlse[~torch.isinf(rlse)], rtol=1e-5, atol=1e-5)


def test_rows_without_keys_give_zero_and_minus_inf():
    q, k, v, idx = inputs(2, 3, 4, 2, 16, 8, 10, 5)
    idx[0, 1] = -1
    idx[1, 2] = torch.tensor([10, 11, -1, -5, 12], dtype=torch.int32)  # all out of range
    out, lse = O.sparse_mha_attention(q, k, v, idx, 0.25)
    assert torch.equal(out[0, 1], torch.zeros(4, 8)) and torch.equal(out[1, 2], torch.zeros(4, 8))
    assert torch.isneginf(lse[0, 1]).all() and torch.isneginf(lse[1, 2]).all()
    assert torch.isfinite(lse[0, 0]).all() and not torch.isnan(out).any()


#: B, S, T, K of the empty-input cases (the GPU test runs them too)
EMPTY = {"B0": (0, 3, 10, 5), "S0": (2, 0, 10, 5), "T0": (2, 3, 0, 5), "K0": (2, 3, 10, 0)}


def check_empty(make, B, S, T, K):
    """An empty batch, query, cache or index list: the right shapes, zeros and -inf (make: the inputs)."""
    q, k, v, idx = make(B, S, 4, 2, 16, 8, T, K)
    out, lse = O.sparse_mha_attention(q, k, v, idx, 0.25)
    assert out.shape == (B, S, 4, 8) and lse.shape == (B, S, 4)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("case", list(EMPTY))
def test_empty_inputs(case):
    check_empty(inputs, *EMPTY[case])


def test_strided_views_match_contiguous():
    """q as the transpose the GLM glue passes ([B, H, S, dk] viewed as [B, S, H, dk]), k and v the first T
    positions of a longer (static) cache, indices a slice."""
    q, k, v, idx = inputs(2, 3, 4, 2, 16, 8, 10, 6, skip=0.2)
    qv = q.transpose(1, 2).contiguous().transpose(1, 2)
    big_k, big_v = torch.zeros(2, 2, 15, 16), torch.zeros(2, 2, 15, 8)
    big_k[:, :, :10], big_v[:, :, :10] = k, v
    wide = torch.full((2, 3, 9), -1, dtype=torch.int32)
    wide[..., :6] = idx
    out, lse = O.sparse_mha_attention(qv, big_k[:, :, :10], big_v[:, :, :10], wide[..., :6], 0.3)
    ref, rlse = O.sparse_mha_attention(q, k, v, idx, 0.3)
    assert not qv.is_contiguous() and not big_k[:, :, :10].is_contiguous()
    assert torch.equal(out, ref) and torch.equal(lse, rlse)


def test_meta_shapes_and_dtypes():
    out, lse = O.sparse_mha_attention(
        torch.empty(2, 3, 8, 40, device="meta", dtype=torch.bfloat16),
        torch.empty(2, 4, 11, 40, device="meta", dtype=torch.bfloat16),
        torch.empty(2, 4, 11, 24, device="meta", dtype=torch.bfloat16),
        torch.empty(2, 3, 5, device="meta", dtype=torch.int32),
        0.1,
    )
    assert out.shape == (2, 3, 8, 24) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 3, 8) and lse.dtype == torch.float32


def test_no_backward_refused_by_name_and_allowed_without_grad():
    q, k, v, idx = inputs(1, 1, 2, 2, 8, 8, 5, 3)
    q.requires_grad_()
    with pytest.raises(NotImplementedError) as err:
        O.sparse_mha_attention(q, k, v, idx, 0.5)
    assert str(err.value).splitlines()[0] == (
        "sparse_mha_attention: has no backward (a decoding-step forward); call it under torch.no_grad() or with "
        "inputs that do not require grad"
    )
    with torch.no_grad():
        out, _ = O.sparse_mha_attention(q, k, v, idx, 0.5)
    ref, _ = O.sparse_mha_attention(q.detach(), k, v, idx, 0.5)
    assert torch.equal(out, ref) and not out.requires_grad


def _refused(exc, message, *args):
    with pytest.raises(exc) as err:
        O.sparse_mha_attention(*args)
    assert str(err.value).splitlines()[0] == message


def test_argument_checks_have_clear_messages():
    q, k, v, idx = inputs(2, 3, 4, 2, 16, 8, 10, 5)
    _refused(
        TypeError,
        "sparse_mha_attention: q: opslot cuda kernels take float32, float16 or bfloat16 tensors, got torch.int64",
        q.long(),
        k,
        v,
        idx,
        1.0,
    )
    _refused(
        TypeError,
        "sparse_mha_attention: q and k must share a dtype, got torch.float32 and torch.bfloat16",
        q,
        k.bfloat16(),
        v,
        idx,
        1.0,
    )
    _refused(
        TypeError,
        "sparse_mha_attention: q and v must share a dtype, got torch.float32 and torch.float16",
        q,
        k,
        v.half(),
        idx,
        1.0,
    )
    _refused(
        ValueError,
        "sparse_mha_attention: q must be [batch, seq, heads, dk], got (2, 3, 64)",
        q.flatten(2),
        k,
        v,
        idx,
        1.0,
    )
    _refused(
        ValueError,
        "sparse_mha_attention: k and v must be [batch, kv_heads, kv_len, dim], got (2, 20, 16) and (2, 2, 10, 8)",
        q,
        k.flatten(1, 2),
        v,
        idx,
        1.0,
    )
    _refused(
        ValueError,
        "sparse_mha_attention: q (2, 3, 4, 16) and k (2, 2, 10, 12) must agree in batch and dk",
        q,
        k[..., :12],
        v,
        idx,
        1.0,
    )
    _refused(
        ValueError,
        "sparse_mha_attention: k (2, 2, 10, 16) and v (2, 2, 9, 8) must agree in batch, kv_heads and kv_len",
        q,
        k,
        v[:, :, :9],
        idx,
        1.0,
    )
    _refused(
        ValueError,
        "sparse_mha_attention: heads 4 must be a positive multiple of kv_heads 3",
        q,
        k[:, [0, 1, 1]],
        v[:, [0, 1, 1]],
        idx,
        1.0,
    )
    big = torch.zeros(2, 3, 4, 520)
    _refused(
        ValueError,
        "sparse_mha_attention: the kernel takes head dims 1 <= dk, dv <= 512, got dk 520 and dv 8",
        big,
        torch.zeros(2, 2, 10, 520),
        v,
        idx,
        1.0,
    )
    _refused(TypeError, "sparse_mha_attention: indices must be int32, got torch.int64", q, k, v, idx.long(), 1.0)
    _refused(
        ValueError,
        "sparse_mha_attention: indices must be [batch, seq, topk] with batch and seq of q (2, 3), got (2, 2, 5)",
        q,
        k,
        v,
        idx[:, :2],
        1.0,
    )
    _refused(
        ValueError,
        "sparse_mha_attention: k is on meta, q on cpu (an op's tensors share one device)",
        q,
        k.to("meta"),
        v,
        idx,
        1.0,
    )
