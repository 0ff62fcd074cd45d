"""topk_indices (the columns of the k largest scores of each row; DeepSeek sparse attention's top-k over
the lightning indexer's scores) and mask_limit (one past the last key each mask row shows), impl
`cuda`, against the ops' CPU kernels, which compute the contracts with ATen
(runtime/tests/test_torch_ops_topk.py checks them against plain Python and torch.topk): every result
bitwise equal to them.

Rows of 1 to 131072 columns and k from 1 to all of them; limits (none, random, negative, past the row,
exactly k, causal); ties (a few distinct values, all equal, values one ulp apart so the select runs
all three digits), NaN, infinities and signed zeros; rows that are not 16-byte aligned, strided and
transposed views, leading dimensions, empty inputs; bool and additive (float32/16, bfloat16) masks,
broadcast over the batch, rows not aligned for the vector loads; mask_limit on causal, random and
padding masks of every kind, broadcast and strided; every kernel: rows of up to 1024 and 2048
columns a warp per row, of up to 4096 two warps a row (without a mask) or a block per row (128 threads
up to 2048 in the bench library's path 2, 256), of up to 8192 four warps a row, keys in registers, longer
ones by the long-row kernel (256-thread blocks up to 16384 columns) with each of its paths (the row read
once, its candidates in shared memory; or twice, the keys at or above the top digit's bucket held in shared
memory; or more often, more of them than it holds),
each kernel at its bounds, and all of them bitwise equal on the same rows (the bench library's
knob); the long-row kernel's one-read pass cutting its candidates and giving up, and the bench library's
probe counting its rows, rounds and cuts; a bucket that holds exactly the keys still needed, long aligned rows with every mask kind,
and rows whose large values crowd into one part; every element written (the caching allocator
poisoned first); bitwise-equal reruns; opcheck; CUDA-graph capture; torch.compile.
"""

import pytest
import torch

from conftest import bench_library, knob, requires_cuda

DEV = "cuda"
pytestmark = requires_cuda
INF, NAN = float("inf"), float("nan")


@pytest.fixture(autouse=True)
def _register_ops():
    from opslot.kernels.cuda import dsa_indexer  # noqa: F401  (loads libopslot_torch.so)


def op(scores, k, limit=None, mask=None):
    return torch.ops.opslot.topk_indices(scores, k, limit, mask)


def cpu(t):
    return None if t is None else t.cpu()


def check(scores, k, limit=None, what="", mask=None):
    torch.full((scores[..., :1].numel() * k + 4096,), -7, dtype=torch.int32, device=DEV)  # poison
    got = op(scores, k, limit, mask)
    want = op(scores.cpu(), k, cpu(limit), cpu(mask))
    assert got.device.type == "cuda" and got.dtype == torch.int32, what
    assert torch.equal(got.cpu(), want), f"{what}: {(got.cpu() != want).sum().item()} indices differ"
    return got


def same_bits_on_paths(paths, cases, want):
    """Each case's result equals its `want` on each of the bench library's top-k paths
    (opslot_topk_set_tuning; path 0, production's choice, set again after); returns the knob."""
    with bench_library() as lib:
        f = knob(lib, "opslot_topk_set_tuning", 1)
        try:
            for path in paths:
                assert f(path) == 0
                for c, w in zip(cases, want):
                    mask = None if c[3] is None else c[3].dtype
                    assert torch.equal(op(*c), w), (path, c[0].shape, c[1], c[2] is None, mask)
        finally:
            assert f(0) == 0
        return f


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (2, 33), (5, 4099), (17, 10000), (4, 65536), (2, 131072)])
def test_random_rows(rows, cols):
    s = torch.randn(rows, cols, device=DEV)
    limit = torch.randint(-3, cols + 5, (rows,), device=DEV, dtype=torch.int32)
    for k in sorted({1, 7 % cols + 1, cols // 3, max(1, cols - 1), cols}):
        check(s, k, what=f"{rows}x{cols} k={k}")
        check(s, k, limit, what=f"{rows}x{cols} k={k} limited")


def test_causal_rows_as_the_indexer_gives_them():
    S, k = 4096, 2048
    s = torch.randn(1, S, S, device=DEV)
    limit = (torch.arange(S, device=DEV, dtype=torch.int32) + 1).view(1, S)
    s.masked_fill_(torch.arange(S, device=DEV).view(1, 1, S) >= limit.unsqueeze(-1), -INF)
    got = check(s, k, limit, "causal")
    assert torch.equal(got, check(s, k, None, "causal, no limit"))  # the -inf tail never wins


@pytest.mark.parametrize("cols", [29, 3000, 70001])
def test_ties_and_special_values(cols):
    pool = torch.tensor([-INF, -1.0, -0.0, 0.0, 1.0, 2.5, INF, NAN], device=DEV)
    s = pool[torch.randint(0, len(pool), (6, cols), device=DEV)]
    limit = torch.randint(0, cols + 3, (6,), device=DEV, dtype=torch.int32)
    for k in (1, 3, cols // 2, cols - 1):
        check(s, k, what=f"pool k={k}")
        check(s, k, limit, what=f"pool k={k} limited")


@pytest.mark.parametrize("cols", [3000, 6000, 50000])  # the bucket held in shared memory (<= 8192) or not
def test_all_equal_and_one_ulp_apart(cols):
    same = torch.full((3, cols), 1.5, device=DEV)
    for k in (1, 2048, cols - 1):
        got = check(same, k, what=f"all equal k={k}")
        assert torch.equal(got[0].cpu(), torch.arange(k, dtype=torch.int32))  # lowest columns first
    # consecutive fp32 values around 1: the top 22 bits agree, so all three digits run
    ulps = (torch.arange(cols, device=DEV, dtype=torch.int32) + 0x3F800000).view(torch.float32)
    perm = torch.randperm(cols, device=DEV)
    rows = torch.stack([ulps, ulps[perm], ulps.flip(0)])
    for k in (1, 511, min(4096, cols - 1)):
        check(rows, k, what=f"ulps k={k}")
        check(rows[:, 1:], k, what=f"ulps k={k}, rows not aligned")
    got = op(rows[:1], 5)
    assert got.tolist() == [list(range(cols - 5, cols))]


@pytest.mark.parametrize("cols", [9000, 50000, 131072])
def test_candidates_crowded_into_one_part_of_the_row(cols):
    # Large values together (ascending, descending, 700 boosted in a row) rather than spread: a way of
    # gathering the candidates by parts of the row (one tried: docs/kernels.md) would overflow a part.
    ramp = torch.linspace(-3, 3, cols, device=DEV)
    noise = torch.randn(cols, device=DEV)
    boosted = noise.clone()
    boosted[cols // 3 : cols // 3 + 700] += 10  # 700 large values in one warp's part
    rows = torch.stack([ramp, ramp.flip(0), boosted, noise])
    limit = torch.tensor([cols, cols - 17, cols, cols // 2 + 3], device=DEV, dtype=torch.int32)
    for k in (100, 511, 513, 2048, 5000):
        check(rows, k, what=f"crowded k={k}")
        check(rows, k, limit, what=f"crowded k={k} limited")


@pytest.mark.parametrize("k", [2048, 5000])
def test_bucket_holds_exactly_the_keys_needed(k):
    s = torch.randn(3, 12000, device=DEV)
    big = torch.randperm(12000, device=DEV)[:k]
    s[:, big] = 100.0  # the top bucket holds the k largest and nothing else
    got = check(s, k, what=f"exact bucket k={k}")
    assert torch.equal(got[0].cpu(), big.sort().values.int().cpu())
    check(s[:, 3:], k, what=f"exact bucket k={k}, rows not aligned")


@pytest.mark.parametrize("kind", [None, torch.bool, torch.bfloat16, torch.float32])
def test_long_aligned_rows_with_masks(kind):
    """Rows of 65536 columns with causal limits, the mask's rows aligned for vector loads (broadcast over
    the batch) or offset by one entry."""
    B, S, T = 2, 5, 65536
    s = torch.randn(B, S, T, device=DEV)
    limit = torch.tensor([[T, T - 1, T - 4099, 40001, 3000]] * B, device=DEV, dtype=torch.int32)
    masks = [None]
    if kind is not None:
        shown = torch.rand(1, S, T + 1, device=DEV) > 0.2
        if kind == torch.bool:
            wide = shown
        else:
            wide = torch.where(shown, torch.randn(shown.shape, device=DEV), torch.finfo(kind).min).to(kind)
        masks = [wide[..., :T].contiguous(), wide[..., 1:]]
    for scores in (s, s.round()):  # rounded: buckets of more keys than shared memory holds
        for mask in masks:
            for k in (1, 2048, 4097):
                check(scores, k, limit, f"{kind} k={k}", mask)
                check(scores, k, None, f"{kind} k={k} no limit", mask)


def tier_rows(cols):
    """Rows of `cols` columns that run every digit of the select: ties, one-ulp neighbours, rounded values
    (crowded buckets), special values; limits inside, at and past the row."""
    g = torch.Generator(device=DEV).manual_seed(cols)
    noise = torch.randn(6, cols, device=DEV, generator=g)
    ulps = (torch.arange(cols, device=DEV, dtype=torch.int32) + 0x3F800000).view(torch.float32)
    pool = torch.tensor([-INF, -0.0, 0.0, 1.0, INF, NAN], device=DEV)
    special = pool[torch.randint(0, len(pool), (cols,), device=DEV, generator=g)]
    rows = torch.cat(
        [noise, noise[:2].round(), ulps[torch.randperm(cols, device=DEV, generator=g)][None], special[None]]
    )
    limit = torch.tensor([cols, cols - 1, cols // 2 + 1, 0, cols + 7, 3, cols, cols - 5, cols, cols], device=DEV)
    return rows, limit.to(torch.int32)


# The one-warp kernel's tiers end at 1024 and 2048 columns (kernels/src/topk.cu, warp_chunks), the two-warp
# kernel's (without a mask) and the block register kernel's (with one; 2048 in the bench library's path 2) at
# 4096 (group_warps, reg_threads), the four-warp kernel's at 8192; the long-row kernel takes longer rows in
# 256-thread blocks up to 16384 columns (long_threads), 512 above (16385: the one-read pass).
@pytest.mark.parametrize("cols", [1024, 1025, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193, 16384, 16385])
@pytest.mark.parametrize("kind", [None, torch.bool, torch.float16])
def test_each_kernel_at_its_bounds(cols, kind):
    rows, limit = tier_rows(cols)
    mask = None
    if kind is not None:
        shown = torch.rand(1, cols + 1, device=DEV) > 0.25
        wide = shown if kind == torch.bool else torch.where(shown, 0.5, torch.finfo(kind).min).to(kind)
        mask = wide[:, 1:]  # broadcast over the rows, not aligned for the vector loads
    for k in (1, 511, min(2048, cols - 2), cols - 1):
        check(rows, k, limit, f"{cols} {kind} k={k}", mask)
        shifted = None if mask is None else mask[:, 1:]
        check(rows[:, 1:], k, limit, f"{cols} {kind} k={k}, rows not aligned", shifted)


@pytest.mark.parametrize("kind", [None, torch.bool])
def test_rows_of_every_length_in_one_call(kind):
    """Rows of 2049 to 4096 columns with limits and k < 2048 take two launches (kernels/src/topk.cu, launch):
    the rows of up to 2048 columns before their limit by the warp kernel, the longer ones two warps a row
    without a mask and by the block register kernel with one, each skipping the other's; k = 2048 one. Limits
    on both sides of the bound and of the row's end, in one call, in two batches; the same bits as the two-read
    kernel for every row (the bench library)."""
    cols = 4000
    lengths = [1, 500, 1024, 1025, 1999, 2047, 2048, 2049, 2050, 3000, 3999, 4000, 5000, -5]
    g = torch.Generator(device=DEV).manual_seed(5)
    s = torch.randn(2, len(lengths), cols, device=DEV, generator=g)
    s[1] = s[1].round()  # crowded buckets
    limit = torch.tensor([lengths, lengths[::-1]], device=DEV, dtype=torch.int32)
    mask = None if kind is None else torch.rand(1, len(lengths), cols, device=DEV, generator=g) > 0.3
    cases = [(s, k, limit, mask) for k in (1, 511, 1500, 2000, 2047, 2048)]
    want = [check(*c[:3], f"lengths k={c[1]} {kind}", c[3]) for c in cases]
    same_bits_on_paths((1,), cases, want)


def test_every_kernel_gives_the_same_bits():
    """The bench library's opslot_topk_set_tuning(1) runs the long-row kernel on every row, (2) the block
    register kernel where production runs the warp kernel (rows up to 2048 columns) and 512-thread long-row
    blocks above 4096, (3) production with the long-row kernel's one-read pass off, (4) the long-row kernel
    without it on every row, (5) the pass on rows of any length, (6) 5cb1570's choice on rows of 2049 to 16384
    columns (the block register kernel up to 4096, 512-thread long-row blocks above), production with (7) two
    warps a row on rows of 2049 to 4096 columns with a mask too, (8) four warps a row there, (9) two warps a row
    on rows of 1025 to 2048 columns, (10) 256-thread long-row blocks on rows of 4097 to 8192 columns (production:
    four warps a row), (11) eight warps a row on rows of 8193 to 16384 columns (production: 256-thread long-row
    blocks), (12) the one-read pass asking L2 for the round after next. The same bits with each: the rows the
    one-warp kernel takes in production (700 and 1500 columns; 10 and 13 rows: the last block of 4 rows, or of
    2 in path 9, partly filled; 1 row of 2000), the two-warp kernel's without a mask and the block
    register kernel's with one (2049, 3000 and 4096 columns; 11 rows of 3000: a two-warp block partly filled;
    a bfloat16 additive mask too), the four-warp kernel's (4097, 6000, 8192 columns), the 256-thread long-row
    blocks' (8193 and 16384 columns: eight warps a row in path 11) and the one-read pass's (16385 columns, the
    shortest that production reads once)."""
    cases = []
    for cols in (700, 1500, 2000, 2049, 3000, 4096, 4097, 6000, 8192, 8193, 16384, 16385):
        rows, limit = tier_rows(cols)
        if cols in (1500, 3000):
            rows, limit = torch.cat([rows, rows[:3]]), torch.cat([limit, limit[:3]])
        if cols == 3000:
            rows, limit = rows[:11], limit[:11]
        elif cols == 2000:
            rows, limit = rows[:1], limit[:1]
        mask = torch.rand(rows.shape, device=DEV) > 0.1
        additive = torch.where(mask, torch.randn(rows.shape, device=DEV), -1e30).to(torch.bfloat16)
        for k in (1, 512, min(2048, cols - 1)):
            cases.append((rows, k, limit, None))
            cases.append((rows, k, limit, mask))
            if cols in (3000, 4096):
                cases.append((rows, k, limit, additive))
    want = [check(*c[:3], f"{c[0].shape} k={c[1]}", c[3]) for c in cases]
    f = same_bits_on_paths((1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 0), cases, want)
    assert f(17) != 0 and f(-1) != 0


def test_one_read_pass_cuts_its_candidates_and_gives_up():
    """The long-row kernel's one-read pass (kernels/src/topk_long.cuh, stream_topk): rounds of 8192 keys whose keys at
    or above a threshold join at most 11264 candidates in shared memory; a round that would overflow them is
    taken again after the candidates are cut to the k-th largest's bucket, and a second overflow hands the row
    to the two-read path. An ascending row (a cut every round), a descending one (none after the first; from a
    sampled threshold, the second round adds too few keys: lowered there), ties at the k-th largest filling the
    candidates before an ascending run (the pass gives up), a boosted run in noise, noise that drops after two
    rounds (from a sampled threshold, fewer than k candidates at the row's end: lowered there); rows of 65536
    columns (the most it takes) and 65537 (the two-read path), k = 2048 (the most it takes) and 2049; with limits
    and a bool mask: the CPU kernel's bits, and the same with the pass off (the bench library's paths 3 and 4),
    on rows of any length (5), asking L2 for the round after next (12), and from a sampled threshold (15, and in
    256-thread blocks 16)."""
    T = 65536
    ramp = torch.linspace(-3, 3, T + 1, device=DEV)
    ties = torch.cat([torch.ones(8192, device=DEV), torch.linspace(2, 3, T + 1 - 8192, device=DEV)])
    noise = torch.randn(T + 1, device=DEV, generator=torch.Generator(device=DEV).manual_seed(7))
    boosted = noise.clone()
    boosted[30000:33000] += 5
    dropped = noise.clone()
    dropped[16384:] -= 10
    rows = torch.stack([ramp, ramp.flip(0), ties, boosted, noise, dropped])
    limit = torch.tensor([T, T - 9, T, 20001, 8191, T - 3], device=DEV, dtype=torch.int32)
    mask = torch.rand(1, T + 1, device=DEV) > 0.05
    cases = []
    for cols in (T, T + 1):
        for k in (1, 513, 2048, 2049):
            cases += [(rows[:, :cols], k, None, None), (rows[:, :cols], k, limit, mask[:, :cols])]
    want = [check(*c[:3], f"{c[0].shape[1]} k={c[1]} {c[2] is None}", c[3]) for c in cases]
    same_bits_on_paths((3, 4, 5, 12, 15, 16), cases, want)


def order_keys(t):
    """kernels/src/topk_select.cuh's order_key of each fp32 value (NaN above +inf, -0.0 below +0.0), as int32 bits."""
    b = t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    k = torch.where(b >= 0x80000000, b ^ 0xFFFFFFFF, b | 0x80000000)
    k = torch.where(t.isnan(), 0xFFFFFFFF, k)
    return (k - (k >= 2**31).to(torch.int64) * 2**32).to(torch.int32)


def test_one_read_pass_from_a_given_threshold():
    """The bench library's paths 13 and 14 (experiments): the one-read pass starts from a threshold given per row
    (opslot_topk_set_hint) instead of its first round's select, in 512-thread blocks (13) or 256 (14). The CPU
    kernel's bits on the rows of the test above, each with limits and a bool mask and without: from the k-th
    largest itself, from one ulp below it, from the lowest key (every column a candidate: cuts), and from one ulp
    above it (fewer than k candidates: the row takes the two-read path); without a hint the paths are refused."""
    import ctypes

    T = 65536
    ramp = torch.linspace(-3, 3, T, device=DEV)
    noise = torch.randn(T, device=DEV, generator=torch.Generator(device=DEV).manual_seed(7))
    boosted = noise.clone()
    boosted[30000:33000] += 5
    rows = torch.stack([ramp, ramp.flip(0), boosted, noise])
    limit = torch.tensor([T, T - 9, 20001, 30000], device=DEV, dtype=torch.int32)
    mask = torch.rand(1, T, device=DEV) > 0.05
    with bench_library() as lib:
        set_path = knob(lib, "opslot_topk_set_tuning", 1)
        set_hint = lib.opslot_topk_set_hint
        set_hint.argtypes, set_hint.restype = [ctypes.c_void_p], ctypes.c_int
        try:
            for path in (13, 14):
                assert set_hint(None) == 0 and set_path(path) == 0
                with pytest.raises(RuntimeError, match=f"path {path} without opslot_topk_set_hint"):
                    op(rows, 512)
            for lim, m in ((None, None), (limit, mask)):
                shown = rows if m is None else rows.masked_fill(~m, float("-inf"))
                if lim is not None:
                    cols = torch.arange(T, device=DEV)
                    shown = shown.masked_fill(cols >= lim.unsqueeze(1), float("-inf"))
                for k in (513, 2048):
                    set_path(0)
                    want = check(rows, k, lim, f"k={k}", m)
                    kth = shown.topk(k, dim=-1).values[:, -1]
                    inf = torch.full_like(kth, float("inf"))
                    for what, hint in (
                        ("the k-th largest", order_keys(kth)),
                        ("an ulp below", order_keys(torch.nextafter(kth, -inf))),
                        ("the lowest key", torch.zeros_like(kth, dtype=torch.int32)),
                        ("an ulp above", order_keys(torch.nextafter(kth, inf))),
                    ):
                        assert set_hint(hint.data_ptr()) == 0
                        for path in (13, 14):
                            assert set_path(path) == 0
                            assert torch.equal(op(rows, k, lim, m), want), (path, what, k, lim is None)
                        assert set_path(0) == 0
        finally:
            assert set_path(0) == 0 and set_hint(None) == 0


def test_the_phase_probe_counts_the_one_read_pass():
    """The bench library's opslot_topk_probe_phases: rows through the one-read pass (longer than 16384 columns;
    rows of k or fewer columns and shorter ones do not count), their rounds and cuts, cycles in each phase."""
    import ctypes

    g = torch.Generator(device=DEV).manual_seed(11)
    s = torch.randn(5, 40000, device=DEV, generator=g)
    s[1] = torch.linspace(-3, 3, 40000, device=DEV)  # ascending: a cut every round after the first
    limit = torch.tensor([40000, 40000, 16384, 100, 20000], device=DEV, dtype=torch.int32)
    want = check(s, 512, limit, "probe")
    with bench_library() as lib:
        probe = lib.opslot_topk_probe_phases
        probe.argtypes, probe.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
        c = (ctypes.c_ulonglong * 10)()
        assert probe(None, 1) == 0
        assert torch.equal(op(s, 512, limit), want)
        torch.cuda.synchronize()
        assert probe(ctypes.addressof(c), 0) == 0
        assert c[5] == 3, list(c)  # rows 0, 1 and 4
        assert c[7] == 5 + 5 + 3 + c[6], list(c)  # rounds of 8192 keys, each cut's retry counted
        assert c[6] >= 3, list(c)  # the ascending row: rounds 2 to 5 overflow the candidates
        assert c[8] == 0 and c[9] == 0, list(c)  # no threshold lowered, no row handed on
        assert all(x > 0 for x in c[:5]), list(c)
        assert probe(None, 1) == 0 and probe(ctypes.addressof(c), 0) == 0 and list(c) == [0] * 10


def test_a_sampled_threshold_too_high_is_lowered():
    """The bench library's path 15: the one-read pass from a sampled first threshold (kernels/src/topk_long.cuh, Start:
    kSample), counted by the probe: on noise it stays; where the second round adds fewer than half the sampled
    rank (a descending row) or the row ends with fewer than k candidates (noise that drops after two rounds), it
    is lowered to the first round's k-th largest and the pass starts again (two rounds read again for the first,
    eight for the second), no row handed to the two-read path; the CPU kernel's bits."""
    import ctypes

    T = 65536
    noise = torch.randn(T, device=DEV, generator=torch.Generator(device=DEV).manual_seed(5))
    dropped = noise.clone()
    dropped[16384:] -= 10
    rows = [noise, torch.linspace(3, -3, T, device=DEV), dropped]
    wants = [check(row.view(1, T), 2048, what="sampled threshold") for row in rows]
    with bench_library() as lib:
        probe = lib.opslot_topk_probe_phases
        probe.argtypes, probe.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
        set_path = knob(lib, "opslot_topk_set_tuning", 1)
        try:
            assert set_path(15) == 0
            for row, want, lowered, rounds in zip(rows, wants, (0, 1, 1), (8, 8 + 2, 8 + 8)):
                c = (ctypes.c_ulonglong * 10)()
                assert probe(None, 1) == 0
                assert torch.equal(op(row.view(1, T), 2048), want)
                torch.cuda.synchronize()
                assert probe(ctypes.addressof(c), 0) == 0
                assert (c[5], c[6], c[8], c[9]) == (1, 0, lowered, 0), list(c)
                assert c[7] == rounds, list(c)
        finally:
            assert set_path(0) == 0


def test_views_and_shapes():
    base = torch.randn(9, 1027, device=DEV)
    check(base[:, 1:], 100, what="rows not 16-byte aligned")
    check(base[::2, 3:1000], 64, what="strided rows")
    check(base.t()[:50], 4, what="transposed")
    lim = torch.randint(0, 40, (2, 3), device=DEV, dtype=torch.int32)
    check(torch.randn(2, 3, 37, device=DEV), 5, lim, "leading dimensions")
    assert op(torch.randn(0, 5, device=DEV), 3).shape == (0, 3)
    assert op(torch.randn(4, 5, device=DEV), 0).shape == (4, 0)
    assert op(torch.randn(4, 0, device=DEV), 0).shape == (4, 0)
    assert op(torch.tensor([3.0], device=DEV), 1).tolist() == [0]


@pytest.mark.parametrize("kind", [torch.bool, torch.float32, torch.float16, torch.bfloat16])
def test_masks(kind):
    B, S, T = 2, 33, 3001
    s = torch.randn(B, S, T + 5, device=DEV)[..., 3:-2]  # rows not 16-byte aligned
    limit = torch.randint(0, T + 9, (B, S), device=DEV, dtype=torch.int32)
    shown = torch.rand(1, S, T + 3, device=DEV)[..., 1:-2] > 0.3  # broadcast over the batch, odd offset
    if kind == torch.bool:
        mask = shown
    else:
        lo = torch.finfo(kind).min
        mask = torch.where(shown, torch.randn(1, S, T, device=DEV), lo).to(kind)
    for k in (1, 100, 2048, T):
        check(s, k, limit, f"{kind} k={k}", mask)
        check(s, k, None, f"{kind} k={k} no limit", mask)
        check(s.contiguous(), k, limit, f"{kind} k={k} aligned", mask.contiguous())
    hidden = torch.zeros(B, S, T, dtype=torch.bool, device=DEV)
    assert torch.equal(op(s, 7, limit, hidden).cpu(), torch.arange(7, dtype=torch.int32).expand(B, S, 7))


@pytest.mark.parametrize("kind", [torch.bool, torch.float32, torch.float16, torch.bfloat16])
def test_mask_limit(kind):
    def as_kind(shown):
        if kind == torch.bool:
            return shown
        lo = torch.finfo(kind).min
        return torch.where(shown, torch.zeros((), device=DEV), torch.tensor(lo, device=DEV)).to(kind)

    S = 4096
    causal = as_kind(torch.ones(S, S, dtype=torch.bool, device=DEV).tril_()).unsqueeze(0)
    got = torch.ops.opslot.mask_limit(causal)
    assert torch.equal(got.cpu(), (torch.arange(S, dtype=torch.int32) + 1).view(1, S))
    for shown in [
        torch.rand(3, 70, 1003, device=DEV) > 0.9,
        torch.rand(2, 9, 5000, device=DEV) > 0.9999,  # mostly empty rows
        torch.zeros(2, 4, 300, dtype=torch.bool, device=DEV),
    ]:
        m = as_kind(shown)
        want = torch.ops.opslot.mask_limit(m.cpu())
        assert torch.equal(torch.ops.opslot.mask_limit(m).cpu(), want)
        assert torch.equal(torch.ops.opslot.mask_limit(m[:1].expand_as(m)).cpu(), want[:1].expand_as(want))
        assert torch.equal(
            torch.ops.opslot.mask_limit(m[:, :, 1:]).cpu(), torch.ops.opslot.mask_limit(m.cpu()[:, :, 1:])
        )
        assert torch.equal(torch.ops.opslot.mask_limit(m.transpose(0, 1)).cpu(), want.transpose(0, 1))
    assert (
        torch.ops.opslot.mask_limit(as_kind(torch.ones(2, 3, 0, dtype=torch.bool, device=DEV))).tolist()
        == [[0] * 3] * 2
    )


def test_the_indexer_glue_as_before():
    """The GLM slot's tail: limits from the mask, top-k with the mask folded in, against the mask
    applied to the scores first (what the slot did before the fold)."""
    from opslot.kernels.cuda import dsa_indexer as DI

    S = 3000
    scores = torch.randn(2, S, S, device=DEV)
    mask = torch.ones(S, S, dtype=torch.bool, device=DEV).tril_().expand(2, S, S).clone()
    mask[1, :, :100] = False  # left padding in the second row of the batch
    limit = DI.visible_limit(mask)
    folded = DI.topk_indices(scores, 2048, limit, mask)
    assert torch.equal(folded, DI.topk_indices(scores.masked_fill(~mask, float("-inf")), 2048, limit))
    assert torch.equal(folded, DI.topk_indices(scores.masked_fill(~mask, float("-inf")), 2048))
    add = torch.zeros(2, S, S, device=DEV).masked_fill_(~mask, torch.finfo(torch.float32).min)
    assert torch.equal(DI.topk_indices(scores, 2048, DI.visible_limit(add), add), DI.topk_indices(scores + add, 2048))


def test_deterministic_graph_compile_opcheck():
    s = torch.randn(64, 20000, device=DEV)
    s[:, ::7] = 0.25  # many ties
    limit = torch.randint(100, 20000, (64,), device=DEV, dtype=torch.int32)
    first = op(s, 700, limit)
    for _ in range(3):
        assert torch.equal(op(s, 700, limit), first)
    out = torch.empty_like(first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out.copy_(op(s, 700, limit))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(op(s, 700, limit))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)
    compiled = torch.compile(lambda a, b: op(a, 700, b), fullgraph=True)
    assert torch.equal(compiled(s, limit), first)
    torch.library.opcheck(torch.ops.opslot.topk_indices.default, (s[:8, :3000], 100, limit[:8]))
    torch.library.opcheck(torch.ops.opslot.topk_indices.default, (s[:8], 5, None))
    mask = torch.rand(8, 20000, device=DEV) > 0.5
    torch.library.opcheck(torch.ops.opslot.topk_indices.default, (s[:8], 50, limit[:8], mask))
    torch.library.opcheck(torch.ops.opslot.mask_limit.default, (mask,))
