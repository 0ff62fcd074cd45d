"""opslot::topk_indices and opslot::mask_limit, registered from C++ by libopslot_torch.so
(kernels/torch/topk.cc, mask_limit.cc), on a machine without a GPU: the dispatch keys and schemas, the
CPU kernels (the contracts the CUDA kernels must meet bit for bit) against plain-Python references and
against torch.topk, ties, NaN, infinities and signed zeros, limits of every kind, bool and additive
masks (broadcast), empty and one-column inputs, views, opcheck on CPU and meta tensors, and every
argument check's exact message and exception type. The CUDA kernels: tests/gpu/kernels/test_topk.py."""

from __future__ import annotations

import struct

import pytest
import torch

from test_kernel_library_symbols import _library

O = torch.ops.opslot  # noqa: E741
INF, NAN = float("inf"), float("nan")


@pytest.fixture(scope="module", autouse=True)
def lib():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import _lib

    _lib.torch_ops()


def order_key(v: float) -> int:
    """torch.topk's order of fp32 values as integers: NaN above +inf, -0.0 below +0.0."""
    if v != v:
        return 2**32 - 1
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    return bits ^ 0xFFFFFFFF if bits & 0x80000000 else bits ^ 0x80000000


def ref_row(row, k, limit=None):
    """The contract for one row, by sorting: columns at or past the limit below every value, equal
    values lowest column first; the chosen columns ascending."""
    n = len(row) if limit is None else max(0, min(int(limit), len(row)))
    rank = {t: ((order_key(v), -t) if t < n else (-1, -t)) for t, v in enumerate(row)}
    return sorted(sorted(rank, key=rank.__getitem__, reverse=True)[:k])


def masked(scores, mask):
    """What `masked_fill_(~mask, -inf)` (bool) or `add_(mask)` (float, fp32 sums) makes of the scores."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, -INF)
    return scores + mask.float()


def ref(scores, k, limit=None, mask=None):
    rows = masked(scores, mask).reshape(-1, scores.shape[-1]).tolist()
    lims = [None] * len(rows) if limit is None else limit.reshape(-1).tolist()
    out = [ref_row(r, k, lim) for r, lim in zip(rows, lims)]
    return torch.tensor(out, dtype=torch.int32).reshape(*scores.shape[:-1], k)


def test_ops_are_registered_from_cpp():
    for name in ("opslot::topk_indices", "opslot::mask_limit"):
        for key in ("CUDA", "Meta", "CPU"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch._library.custom_ops.OPDEFS.get(name) is None
    assert str(O.mask_limit.default._schema) == "opslot::mask_limit(Tensor mask) -> Tensor"
    assert str(O.topk_indices.default._schema) == (
        "opslot::topk_indices(Tensor scores, SymInt k, Tensor? limit=None, Tensor? mask=None) -> Tensor"
    )


def test_special_values_by_hand():
    row = torch.tensor([[1.0, NAN, -0.0, 0.0, INF, -INF, 1.0, 2.0]])
    assert O.topk_indices(row, 4).tolist() == [[0, 1, 4, 7]]  # NaN, inf, 2, the first 1
    assert O.topk_indices(row, 6).tolist() == [[0, 1, 3, 4, 6, 7]]  # +0.0 above -0.0
    assert O.topk_indices(row, 7).tolist() == [[0, 1, 2, 3, 4, 6, 7]]  # -inf last
    assert O.topk_indices(row, 8).tolist() == [list(range(8))]
    assert O.topk_indices(row, 0).shape == (1, 0)


def test_limits_by_hand():
    row = torch.tensor([[0.5, 3.0, -1.0, 7.0, 2.0, 9.0]] * 6)
    limit = torch.tensor([6, 4, 3, 2, 0, -5], dtype=torch.int32)
    assert O.topk_indices(row, 3, limit).tolist() == [
        [1, 3, 5],  # every column
        [0, 1, 3],  # columns 0..3: 7, 3, 0.5
        [0, 1, 2],  # exactly k before the limit
        [0, 1, 2],  # fewer: both, then the first column past the limit
        [0, 1, 2],
        [0, 1, 2],
    ]
    big = torch.tensor([99, 6], dtype=torch.int32)
    assert O.topk_indices(row[:2], 2, big).tolist() == [[3, 5], [3, 5]]
    masked = torch.tensor([[-INF, -INF, 4.0, -INF, 1.0]])
    lim = torch.tensor([4], dtype=torch.int32)
    assert O.topk_indices(masked, 3, lim).tolist() == [[0, 1, 2]]  # -inf before the limit first
    assert O.topk_indices(masked, 3).tolist() == [[0, 2, 4]]


@pytest.mark.parametrize("seed", range(4))
def test_against_python_and_torch_topk(seed):
    g = torch.Generator().manual_seed(seed)
    rows, cols = 7, 37 + seed
    scores = torch.randn(rows, cols, generator=g)
    limit = torch.randint(-3, cols + 4, (rows,), generator=g, dtype=torch.int32)
    for k in (1, 5, cols // 2, cols):
        got = O.topk_indices(scores, k)
        assert torch.equal(got, ref(scores, k))
        assert torch.equal(got.long(), scores.topk(k, dim=-1).indices.sort(-1).values)  # distinct values
        assert torch.equal(O.topk_indices(scores, k, limit), ref(scores, k, limit))


def test_ties_and_special_values():
    g = torch.Generator().manual_seed(11)
    pool = torch.tensor([-INF, -1.0, -0.0, 0.0, 1.0, 2.5, INF, NAN])
    scores = pool[torch.randint(0, len(pool), (9, 3, 29), generator=g)]
    limit = torch.randint(0, 33, (9, 3), generator=g, dtype=torch.int32)
    for k in (1, 3, 14, 28, 29):
        assert torch.equal(O.topk_indices(scores, k), ref(scores, k))
        assert torch.equal(O.topk_indices(scores, k, limit), ref(scores, k, limit))


def test_shapes_and_views():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 40, generator=g)
    view = base.t()[:13]  # [13, 6], strided columns
    assert torch.equal(O.topk_indices(view, 4), ref(view, 4))
    one = torch.tensor([5.0])  # a single row of one column, no batch dimension
    assert O.topk_indices(one, 1).tolist() == [0] and O.topk_indices(one, 0).shape == (0,)
    assert O.topk_indices(torch.empty(0, 5), 2).shape == (0, 2)
    assert O.topk_indices(torch.empty(3, 0), 0).shape == (3, 0)
    lim = torch.tensor([[2, 9], [0, 1]], dtype=torch.int32)
    s = torch.randn(2, 2, 9, generator=g)
    out = O.topk_indices(s, 3, lim)
    assert out.dtype == torch.int32 and out.shape == (2, 2, 3) and torch.equal(out, ref(s, 3, lim))


def test_opcheck_on_cpu_and_meta():
    g = torch.Generator().manual_seed(5)
    s = torch.randn(3, 4, 17, generator=g)
    lim = torch.randint(0, 20, (3, 4), generator=g, dtype=torch.int32)
    meta = torch.empty(5, 1000, device="meta")
    for args in [
        (s, 5, lim),
        (s, 17, None),
        (meta, 64, None),
        (meta, 1, torch.empty(5, dtype=torch.int32, device="meta")),
    ]:
        torch.library.opcheck(O.topk_indices.default, args)
    out = O.topk_indices(meta, 7)
    assert out.shape == (5, 7) and out.dtype == torch.int32 and out.device.type == "meta"


def test_masks():
    row = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.5]])
    hide = torch.tensor([[False, True, True, False, True]])
    assert O.topk_indices(row, 2, None, hide).tolist() == [[1, 2]]
    assert O.topk_indices(row, 4, None, hide).tolist() == [[0, 1, 2, 4]]  # hidden ones -inf, lowest first
    bias = torch.tensor([[0.0, -3.0, 5.0, torch.finfo(torch.float32).min, 0.0]])
    assert O.topk_indices(row, 2, None, bias).tolist() == [[0, 2]]  # 4, 0, 7, min, 0.5
    g = torch.Generator().manual_seed(7)
    s = torch.randn(2, 5, 41, generator=g)
    limit = torch.randint(0, 45, (2, 5), generator=g, dtype=torch.int32)
    lo = {
        torch.float32: torch.finfo(torch.float32).min,
        torch.float16: -65504.0,
        torch.bfloat16: torch.finfo(torch.bfloat16).min,
    }
    for mask in [
        torch.rand(2, 5, 41, generator=g) > 0.3,
        torch.rand(1, 5, 41, generator=g) > 0.7,  # broadcast over the batch
        torch.rand(41, generator=g) > 0.5,  # one row for all
    ] + [
        torch.where(torch.rand(2, 1, 41, generator=g) > 0.4, torch.randn(2, 1, 41, generator=g), lo[dt]).to(dt)
        for dt in (torch.float32, torch.float16, torch.bfloat16)
    ]:
        for k in (1, 6, 41):
            got = O.topk_indices(s, k, limit, mask)
            assert torch.equal(got, ref(s, k, limit, mask.expand(s.shape))), (mask.dtype, k)
            assert torch.equal(O.topk_indices(s, k, None, mask), ref(s, k, None, mask.expand(s.shape)))
            assert torch.equal(O.topk_indices(masked(s, mask), k, limit), got)  # the same as applying it first


def test_mask_limit():
    mask = torch.tensor([[[True, False, True, False], [False] * 4, [True] * 4]])
    assert O.mask_limit(mask).tolist() == [[3, 0, 4]] and O.mask_limit(mask).dtype == torch.int32
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        lo = torch.finfo(dt).min
        add = torch.tensor([[0.0, lo, -3.0, lo], [lo, NAN, lo, -INF], [0.0, 0.0, 0.0, -INF], [lo, 1e-3, lo, lo]]).to(dt)
        assert O.mask_limit(add).tolist() == [3, 0, 3, 2], dt
    assert O.mask_limit(torch.ones(2, 3, 0, dtype=torch.bool)).tolist() == [[0] * 3] * 2
    assert O.mask_limit(torch.ones(0, 4, dtype=torch.bool)).shape == (0,)
    assert O.mask_limit(torch.tensor([False, True, False])).tolist() == 2  # one row: a 0-d result
    g = torch.Generator().manual_seed(2)
    big = torch.rand(2, 3, 37, 11, generator=g) > 0.6
    brute = [max([t + 1 for t in range(11) if row[t]], default=0) for row in big.reshape(-1, 11).tolist()]
    assert O.mask_limit(big).reshape(-1).tolist() == brute
    assert torch.equal(O.mask_limit(big.transpose(0, 2)), O.mask_limit(big.transpose(0, 2).contiguous()))
    torch.library.opcheck(O.mask_limit.default, (big,))
    torch.library.opcheck(O.mask_limit.default, (torch.empty(3, 9, dtype=torch.bfloat16, device="meta"),))
    for bad, exc, msg in [
        (
            torch.zeros(3, dtype=torch.int32),
            TypeError,
            "mask_limit: the mask must be bool, float32, float16 or bfloat16, got torch.int32",
        ),
        (
            torch.tensor(True),
            ValueError,
            "mask_limit: mask must have at least one dimension (rows of keys), got shape ()",
        ),
    ]:
        with pytest.raises(exc) as info:
            O.mask_limit(bad)
        assert str(info.value).splitlines()[0] == msg


def test_argument_checks():
    s = torch.randn(2, 3, 5)
    lim = torch.zeros(2, 3, dtype=torch.int32)
    cases = [
        ((s.half(), 2, None), TypeError, "topk_indices: scores must be torch.float32, got torch.float16"),
        (
            (torch.tensor(1.0), 0, None),
            ValueError,
            "topk_indices: scores must have at least one dimension (rows of columns), got shape ()",
        ),
        ((s, 6, None), ValueError, "topk_indices: k must be in [0, 5] (the columns), got 6"),
        ((s, -1, None), ValueError, "topk_indices: k must be in [0, 5] (the columns), got -1"),
        ((s, 2, lim.long()), TypeError, "topk_indices: limit must be torch.int32, got torch.int64"),
        (
            (s, 2, lim[:, :2]),
            ValueError,
            "topk_indices: limit must have the shape of the scores without their last dimension, (2, 3), got (2, 2)",
        ),
    ]
    cases += [
        (
            (s, 2, None, lim),
            TypeError,
            "topk_indices: the mask must be bool, float32, float16 or bfloat16, got torch.int32",
        ),
        (
            (s, 2, None, torch.ones(4, 5, dtype=torch.bool)),
            ValueError,
            "topk_indices: mask of shape (4, 5) does not broadcast to the scores (2, 3, 5)",
        ),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc) as info:
            O.topk_indices(*args)
        assert str(info.value).splitlines()[0] == msg
