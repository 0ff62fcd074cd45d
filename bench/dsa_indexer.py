"""Benchmark of DeepSeek sparse attention's lightning indexer (GLM-MoE-DSA and DeepSeek-V4 shapes), in one
run on one GPU: opslot's `opslot::dsa_index_scores` (tensor cores, causal tiles skipped) against
upstream's scoring (the dense fp32 [B, S, H, T] path of `GlmMoeDsaIndexer.forward` /
`DeepseekV4IndexerScorer`, which runs out of memory at long context) and torch.compile of it; and
opslot's top-k, `opslot::topk_indices` (a radix select), against `torch.topk` (upstream's) on the
same scores.

Each row: the device time (one call captured in a CUDA graph, replayed; median) and the user path (CUDA
events around the eager call; median), the FLOPs the scores need (`2 H D` per visible (query, key)
pair; causal: the keys at or before each query), the fraction of the tensor-core bound of those FLOPs
at the bf16 GEMM rate measured in the same run, and the peak memory the call adds. The top-k rows: the
fraction of the copy bandwidth (device-to-device, same run) for the bytes a top-k must move, each visible
score read once (and its mask byte, with the mask) and the k indices written; mask_limit: half the mask
read (a causal row s reads its S - s hidden entries from the end) and the limits written.

Rows per context length (B = 1, bf16 q/k, fp32 weights):
- GLM-5: H = 32, D = 128, T = S, causal, top-2048: `scores` (ours), `topk_indices` (ours; also with
  the bool mask folded in) and `torch.topk` of those scores, `mask_limit` (ours: each query's last
  visible key from the [S, S] bool mask), `indexer tail` (ours: the limits, the scores, the top-k with
  the mask: what the `cuda` slot kernel runs after the projections), `upstream tail` (the same from
  upstream's code), `compiled tail` (torch.compile of upstream's).
- DeepSeek-V4: H = 64, D = 128, T = S / 4 compressed keys, causal threshold (pos + 1) // 4, top-512.

The top-k runs one of four kernels by the rows' length (kernels/src/topk.cu): up to 2048 columns a warp
per row, up to 4096 two warps a row without a mask and a block per row with one, up to 8192 four warps a
row (all with the keys in registers: the row read once), longer rows the long-row kernel (rows of 16385 to
65536 columns read once, others twice); `--topk-paths 0,...,12` times
the bench library's choices (TOPK_PATHS below; opslot_kernels/bench.h says what each runs; 0 is the
production choice on the bench library, whose one-read pass carries the phase clock: the baseline for
path 12 and 13) beside each production top-k row in the same run, after a copy of as many bytes as the top-k
moves. `--topk-hints` times paths 13 and 14 (experiments: the one-read pass from a threshold given per row
instead of its first round's select, in 512- or 256-thread blocks) beside GLM-5's top-k rows past 16k tokens,
from two thresholds (topk_hints): the row's k-th largest itself and the k-th largest of its 8-column groups'
maxima. `--topk-trends` adds GLM-5's top-k rows past 16k tokens (and the --topk-paths beside them) on its
scores plus a ramp over the columns, rising and falling (trend_rows): where a first threshold drawn from the
row's first columns is too low or too high.
`--scores-kernels 1,2,4` times the bench library's other scores kernels beside each production scores row, which
on Hopper runs the warpgroup-MMA kernel (kernels/src/dsa_indexer90.cuh): 1 the mma.sync kernel
(kernels/src/dsa_indexer_mma.cuh), 2 to 4 the warpgroup-MMA kernel with that many warpgroups a CTA
(`--scores-mma-sync`: 1).

    python3 bench/dsa_indexer.py --out $OUT/dsa_indexer_h200.md [--lengths 4096,16384,65536] [--budget 150] \
        [--only topk,mask_limit]   # only the rows whose name holds one of these
        [--topk-paths 1,2 --topk-reps 20] [--topk-hints] [--topk-trends] [--scores-kernels 1,2,4]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import itertools
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "runtime"))
sys.path.insert(0, BENCH)

import kernels as K  # noqa: E402  (bench/kernels.py: the copy bandwidth)
from opslot.kernels.cuda import dsa_indexer as DI  # noqa: E402

BF = torch.bfloat16
DEV = "cuda"


def gemm_rate():
    n = 8192
    a = torch.randn(n, n, dtype=BF, device=DEV)
    b = torch.randn(n, n, dtype=BF, device=DEV)
    for _ in range(3):
        a @ b
    return 2 * n**3 / (median_ms(lambda: a @ b, 20) * 1e-3)


def describe():
    """`git describe --always --dirty` of the checkout ('?' without git): a tree that differs from its
    HEAD says so."""
    try:
        cmd = ["git", "describe", "--always", "--dirty", "--abbrev=7"]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def median_ms(fn, reps):
    """Median of `reps` event-timed calls (after one warm-up call)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graph_ms(fn, reps):
    """Median device time of one call captured in a CUDA graph and replayed `reps` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ms = median_ms(graph.replay, reps)
    del graph
    return ms


def peak_gib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def upstream_glm_tail(q, k, weights, scale, mask, top_k):
    """GlmMoeDsaIndexer.forward from the scores on (Transformers 5.17.0, the dense fp32 path)."""
    scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * scale
    scores = F.relu(scores)
    index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
    index_scores = index_scores.masked_fill(~mask, float("-inf"))
    return index_scores.topk(top_k, dim=-1).indices.to(torch.int32)


def upstream_v4_tail(q, k, weights, scale, threshold, top_k):
    """DeepseekV4Indexer.forward from the scores on (DeepseekV4IndexerScorer, then the causal top-k)."""
    scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1))
    scores = F.relu(scores) * scale
    index_scores = (scores * weights.unsqueeze(-1)).sum(dim=2)
    future = torch.arange(k.shape[1], device=q.device).view(1, 1, -1) >= threshold.unsqueeze(-1)
    picks = index_scores.masked_fill(future, float("-inf")).topk(top_k, dim=-1).indices
    return torch.where(picks >= threshold.unsqueeze(-1), torch.full_like(picks, -1), picks)


def ours_glm_tail(q, k, weights, scale, mask, top_k):
    """The `cuda` slot kernel after the projections: limits from the mask, scores, top-k with the mask."""
    limit = DI.visible_limit(mask)
    scores = DI.dsa_index_scores(q, k, weights, scale, limit)
    return DI.topk_indices(scores, top_k, limit, mask)


def ours_v4_tail(q, k, weights, scale, threshold, top_k):
    limit = threshold.clamp(-1, k.shape[1]).to(torch.int32)
    scores = DI.dsa_index_scores(q, k, weights, scale, limit)
    picks = DI.topk_indices(scores, top_k, limit).long()
    return torch.where(picks >= threshold.unsqueeze(-1), torch.full_like(picks, -1), picks)


class Runner:
    def __init__(
        self,
        budget_s,
        rate,
        bandwidth,
        only=(),
        topk_paths=(),
        topk_reps=5,
        scores_kernels=(),
        topk_hints=False,
        topk_trends=False,
    ):
        self.deadline = time.monotonic() + budget_s
        self.only = only  # run only the rows whose name holds one of these (all when empty)
        self.rate = rate
        self.bandwidth = bandwidth
        self.rows = []
        self.topk_paths = topk_paths  # bench-library top-k paths timed beside each production top-k row
        self.topk_reps = topk_reps
        self.topk_hints = topk_hints  # paths 13 and 14 from topk_hints' thresholds beside GLM-5's top-k rows past 16k
        self.scores_kernels = scores_kernels  # the bench library's scores kernels beside each scores row
        self.topk_trends = topk_trends  # GLM-5's top-k past 16k also on its scores with a rising and a falling ramp

    def left(self):
        return self.deadline - time.monotonic()

    def row(self, model, length, what, fn, flops=None, graph=True, reps=5, min_left=5.0, note="", nbytes=None):
        name = f"{model} {length // 1024}k {what}" if length >= 1024 else f"{model} {length} {what}"
        if self.only and not any(o in what for o in self.only):
            return
        if self.left() < min_left:
            self.rows.append((name, "skipped: out of the run's time budget", "", "", "", "", ""))
            print(f"{name}: skipped (time budget)", flush=True)
            return
        try:
            user = median_ms(fn, reps)
            dev = float("nan")
            if graph:
                try:
                    dev = graph_ms(fn, reps)
                except Exception as exc:  # noqa: BLE001
                    torch.cuda.synchronize()
                    note += f" (no CUDA graph: {type(exc).__name__})"
            peak = peak_gib(fn)
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            msg = str(exc).split("\n")[0][:90]
            self.rows.append((name, f"out of memory ({msg})", "", "", "", "", note))
            print(f"{name}: OOM {msg}", flush=True)
            return
        except Exception as exc:  # noqa: BLE001
            torch.cuda.empty_cache()
            msg = " ".join(str(exc).split())[:90].replace("|", "/")
            self.rows.append((name, f"failed: {type(exc).__name__}: {msg}", "", "", "", "", note))
            print(f"{name}: failed {type(exc).__name__}: {exc}", flush=True)
            return
        best = dev if dev == dev else user
        frac = f"{100 * flops / (best * 1e-3) / self.rate:.1f} %" if flops else ""
        tf = f"{flops / (best * 1e-3) / 1e12:.0f}" if flops else ""
        bw = f"{100 * nbytes / (best * 1e-3) / self.bandwidth:.1f} %" if nbytes else ""
        dev_s = f"{dev:.3f}" if dev == dev else "n/a"
        self.rows.append((name + note, dev_s, f"{user:.3f}", tf, frac, bw, f"{peak:.2f}"))
        print(
            f"{name}: device {dev:.3f} ms, user {user:.3f} ms, {tf} TFLOP/s {frac}, {bw} of copy BW, "
            f"peak +{peak:.2f} GiB {note}",
            flush=True,
        )
        torch.cuda.empty_cache()


def causal_flops(S, T, H, D, limit):
    return 2 * H * D * int(limit.clamp(0, T).sum())


def topk_bytes(limit, T, top_k):
    """What a top-k must move: each visible score read once (fp32), k int32 indices written per row."""
    return 4 * int(limit.clamp(0, T).sum()) + 4 * top_k * limit.numel()


#: The bench library's scores kernels (opslot_dsa_scores_set_tuning's kernel; opslot_kernels/bench.h).
SCORES_KERNELS = {
    1: "the mma.sync kernel",
    2: "warpgroup MMAs, 2 warpgroups a CTA",
    3: "warpgroup MMAs, 3 warpgroups a CTA",
    4: "warpgroup MMAs, 4 warpgroups a CTA",
}
#: The bench library's top-k kernels (opslot_topk_set_tuning's path; kernels/src/topk.cu).
TOPK_PATHS = {
    0: "production's choice, the bench build",
    1: "the long-row kernel for every row",
    2: "the block register kernel up to 4096 columns",
    3: "without the one-read pass",
    4: "the long-row kernel without the one-read pass for every row",
    5: "the one-read pass on rows of any length",
    6: "5cb1570's choice on rows of 2049 to 16384 columns",
    7: "two warps a row on rows of 2049 to 4096 columns with a mask too",
    8: "four warps a row on rows of 2049 to 4096 columns",
    9: "two warps a row on rows of 1025 to 2048 columns",
    10: "256-thread long-row blocks on rows of 4097 to 8192 columns",
    11: "eight warps a row on rows of 8193 to 16384 columns",
    12: "the one-read pass asking L2 for the round after next",
    13: "the one-read pass from a given threshold",
    14: "the one-read pass from a given threshold, 256-thread blocks",
    15: "the one-read pass from a sampled threshold",
    16: "the one-read pass from a sampled threshold, 256-thread blocks",
}


def order_keys(t):
    """kernels/src/topk_select.cuh's order_key of each fp32 value (NaN above +inf, -0.0 below +0.0), as int32 bits."""
    b = t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    k = torch.where(b >= 0x80000000, b ^ 0xFFFFFFFF, b | 0x80000000)
    k = torch.where(t.isnan(), 0xFFFFFFFF, k)
    return (k - (k >= 2**31).to(torch.int64) * 2**32).to(torch.int32)


def topk_hints(scores, top_k):
    """--topk-hints: paths 13 and 14's thresholds for the rows of `scores` (-inf past each row's limit), as order
    keys: the row's k-th largest itself (the best any producer of the scores could give) and the k-th largest of the
    maxima of its 8-column groups (a bound the scores kernel could write beside the scores: at least k columns reach
    it; finite on the rows the one-read pass takes, more than 16384 columns)."""
    flat = scores.reshape(-1, scores.shape[-1])
    kth = flat.topk(top_k, dim=-1).values[:, -1]
    groups = flat.view(flat.shape[0], -1, 8).amax(-1)
    bound = groups.topk(min(top_k, groups.shape[1]), dim=-1).values[:, -1]
    del groups
    return [("the row's k-th largest", order_keys(kth)), ("the k-th largest of 8-column maxima", order_keys(bound))]


def topk_rows(run, model, L, what, fn, nbytes, hints=(), copy=True):
    """The production top-k's row, a copy of as many bytes (what moving them takes at this size: the launch
    and its ramp included; not with a mask, nor without `copy`), then one per --topk-paths path on the bench
    library (the same call), then path 13 and 14 with each of `hints` (label, int32 order keys a row:
    opslot_topk_set_hint)."""
    run.row(model, L, what, fn, nbytes=nbytes, reps=run.topk_reps)
    if copy and "mask" not in what and (not run.only or any(o in what for o in run.only)):
        half = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEV)
        dst = torch.empty_like(half)
        run.row(model, L, f"{what.split(' (')[0]}: a copy of its bytes", lambda: dst.copy_(half), nbytes=nbytes)
        del half, dst
    runs = [(path, TOPK_PATHS[path], None) for path in run.topk_paths]
    runs += [(path, f"from {label}", hint) for (label, hint), path in itertools.product(hints, (13, 14))]
    if not runs:
        return
    with K.bench_library("topk") as lib:
        if lib is None:
            return
        set_path = K.knob(lib, "opslot_topk_set_tuning", 1)
        set_hint = lib.opslot_topk_set_hint
        set_hint.argtypes, set_hint.restype = [ctypes.c_void_p], ctypes.c_int
        for path, label, hint in runs:
            if set_hint(None if hint is None else hint.data_ptr()) != 0 or set_path(path) != 0:
                raise SystemExit(f"top-k path {path}: the bench library refused it")
            try:
                run.row(model, L, f"{what} [path {path}: {label}]", fn, nbytes=nbytes, reps=run.topk_reps)
            finally:
                set_path(0)
                set_hint(None)


def trend_ramp(scores):
    """A ramp over the scores' columns, 0 to four times the last row's standard deviation (trend_rows,
    bench/topk_ncu.py's TREND)."""
    return torch.linspace(0, 4 * float(scores[0, -1].std()), scores.shape[-1], device=scores.device)


def trend_rows(run, L, scores, top_k, limit, nbytes):
    """--topk-trends: GLM-5's top-k (no mask) of its scores plus trend_ramp, rising (the latest keys chosen most: a
    threshold from the first round too low) and falling (the earliest: one sampled from the first round too high,
    the one-read pass's fallback)."""
    ramp = trend_ramp(scores)
    for label, sign in (("rising", 1.0), ("falling", -1.0)):
        trended = scores + sign * ramp
        what = f"topk_indices k={top_k} of the scores {label} with the column (ours)"
        topk_rows(run, "GLM", L, what, functools.partial(DI.topk_indices, trended, top_k, limit), nbytes, copy=False)
        del trended


def scores_rows(run, model, L, fn, flops):
    """The production scores row, then (--scores-kernels) each of the bench library's scores kernels where
    production runs the warpgroup-MMA one (opslot_dsa_scores_set_tuning), in the same call."""
    run.row(model, L, "scores (ours)", fn, flops)
    if not run.scores_kernels or (run.only and not any(o in "scores (ours)" for o in run.only)):
        return
    with K.bench_library("scores") as lib:
        if lib is None:
            return
        set_kernel = K.knob(lib, "opslot_dsa_scores_set_tuning", 1)
        for kernel in run.scores_kernels:
            if set_kernel(kernel) != 0:
                raise SystemExit(f"--scores-kernels {kernel}: the bench library refused it")
            try:
                run.row(model, L, f"scores (ours) [bench library: {SCORES_KERNELS[kernel]}]", fn, flops)
            finally:
                set_kernel(0)


def glm_inputs(L, H=32, D=128):
    """GLM-5's indexer inputs at L tokens: bf16 q [1, L, H, D] and k [1, L, D], fp32 head weights, the scale and
    the causal limits."""
    g = torch.Generator(device=DEV).manual_seed(L)
    q = torch.randn(1, L, H, D, device=DEV, generator=g).to(BF)
    k = torch.randn(1, L, D, device=DEV, generator=g).to(BF)
    w = torch.randn(1, L, H, device=DEV, generator=g) * H**-0.5
    limit = (torch.arange(L, device=DEV, dtype=torch.int32) + 1).view(1, L)
    return q, k, w, D**-0.5, limit


def glm_rows(run, L, compiled=None):
    """GLM-5: 32 heads of 128, causal, top-2048 (`compiled`: only the compiled upstream tail)."""
    H, D, top_k = 32, 128, min(2048, L)
    q, k, w, scale, limit = glm_inputs(L, H, D)
    mask = torch.ones(L, L, dtype=torch.bool, device=DEV).tril_().unsqueeze(0)
    fl = causal_flops(L, L, H, D, limit)
    if compiled is not None:
        tail = lambda: compiled(q, k, w, scale, mask, top_k)  # noqa: E731
        run.row("GLM", L, "compiled upstream tail", tail, fl, graph=False, reps=3, min_left=45.0)
        return
    scores_rows(run, "GLM", L, lambda: DI.dsa_index_scores(q, k, w, scale, limit), fl)
    scores = DI.dsa_index_scores(q, k, w, scale, limit)
    nb = topk_bytes(limit, L, top_k)
    hints = topk_hints(scores, top_k) if run.topk_hints and L > 16384 else ()
    topk_rows(
        run,
        "GLM",
        L,
        f"topk_indices k={top_k} (ours)",
        functools.partial(DI.topk_indices, scores, top_k, limit),
        nb,
        hints,
    )
    run.row(
        "GLM", L, f"torch.topk k={top_k} of the scores", functools.partial(torch.topk, scores, top_k, dim=-1), nbytes=nb
    )
    topk_rows(
        run,
        "GLM",
        L,
        f"topk_indices k={top_k} with the bool mask (ours)",
        functools.partial(DI.topk_indices, scores, top_k, limit, mask),
        nb + int(limit.sum()),
        hints,
    )
    if run.topk_trends and L > 16384:
        trend_rows(run, L, scores, top_k, limit, nb)
    del scores, hints
    run.row(
        "GLM",
        L,
        "mask_limit of the causal mask (ours)",
        functools.partial(DI.visible_limit, mask),
        nbytes=L * L // 2 + 4 * L,
    )
    tail = lambda: ours_glm_tail(q, k, w, scale, mask, top_k)  # noqa: E731
    run.row("GLM", L, "indexer tail (ours: limits, scores, topk with the mask)", tail, fl, graph=False)
    tail = lambda: upstream_glm_tail(q, k, w, scale, mask, top_k)  # noqa: E731
    run.row("GLM", L, "upstream tail (dense fp32 scores)", tail, fl, graph=False, reps=3)


def v4_inputs(L, H=64, D=128):
    """DeepSeek-V4's indexer inputs at L tokens: bf16 q [1, L, H, D] and the L / 4 compressed keys [1, L / 4, D],
    fp32 head weights, the scale, the int32 limits (pos + 1) // 4 and the same as int64 (upstream's threshold)."""
    T = L // 4
    g = torch.Generator(device=DEV).manual_seed(L + 1)
    q = torch.randn(1, L, H, D, device=DEV, generator=g).to(BF)
    k = torch.randn(1, T, D, device=DEV, generator=g).to(BF)
    w = torch.randn(1, L, H, device=DEV, generator=g) * H**-0.5
    threshold = ((torch.arange(L, device=DEV) + 1) // 4).view(1, L)
    return q, k, w, D**-0.5, threshold.to(torch.int32), threshold


def v4_rows(run, L):
    """DeepSeek-V4: 64 heads of 128 over the S / 4 compressed keys, causal threshold, top-512."""
    H, D, T = 64, 128, L // 4
    top_k = min(512, T)
    q, k, w, scale, lim, threshold = v4_inputs(L, H, D)
    fl = causal_flops(L, T, H, D, lim)
    scores_rows(run, "V4", L, lambda: DI.dsa_index_scores(q, k, w, scale, lim), fl)
    scores = DI.dsa_index_scores(q, k, w, scale, lim)
    nb = topk_bytes(lim, T, top_k)
    topk_rows(
        run, "V4", L, f"topk_indices k={top_k} (ours)", functools.partial(DI.topk_indices, scores, top_k, lim), nb
    )
    run.row(
        "V4", L, f"torch.topk k={top_k} of the scores", functools.partial(torch.topk, scores, top_k, dim=-1), nbytes=nb
    )
    del scores
    run.row("V4", L, "indexer tail (ours)", lambda: ours_v4_tail(q, k, w, scale, threshold, top_k), fl, graph=False)
    tail = lambda: upstream_v4_tail(q, k, w, scale, threshold, top_k)  # noqa: E731
    run.row("V4", L, "upstream tail (dense fp32 scores)", tail, fl, graph=False, reps=3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--lengths", default="4096,16384,65536")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds; later rows are skipped past it")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated: run only the rows whose name holds one (e.g. topk)")
    ap.add_argument(
        "--topk-paths",
        default="",
        help="comma-separated opslot_topk_set_tuning paths (0-16 but 13 and 14: TOPK_PATHS) timed beside each "
        "production top-k row, on the bench library",
    )
    ap.add_argument("--topk-reps", type=int, default=5, help="timed calls per top-k row (median)")
    ap.add_argument(
        "--topk-hints",
        action="store_true",
        help="time the bench library's paths 13 and 14 (the one-read pass from a given threshold, 512- and 256-thread "
        "blocks) beside GLM-5's top-k rows longer than 16k, from topk_hints' two thresholds",
    )
    ap.add_argument(
        "--topk-trends",
        action="store_true",
        help="also time GLM-5's top-k rows longer than 16k (and --topk-paths) on its scores plus a ramp over the "
        "columns, rising and falling (trend_rows)",
    )
    ap.add_argument(
        "--scores-kernels",
        default="",
        help="comma-separated opslot_dsa_scores_set_tuning kernels (1-4: SCORES_KERNELS) timed beside each "
        "production scores row, on the bench library",
    )
    ap.add_argument("--scores-mma-sync", action="store_true", help="the same as --scores-kernels 1")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    topk_paths = [int(x) for x in args.topk_paths.split(",") if x]
    unknown = [p for p in topk_paths if p not in TOPK_PATHS or p in (13, 14)]
    if unknown:
        ap.error(f"--topk-paths {unknown}: known {sorted(TOPK_PATHS)} (13 and 14 by --topk-hints)")
    scores_kernels = [int(x) for x in args.scores_kernels.split(",") if x]
    if args.scores_mma_sync and 1 not in scores_kernels:
        scores_kernels.insert(0, 1)
    unknown = [k for k in scores_kernels if k not in SCORES_KERNELS]
    if unknown:
        ap.error(f"--scores-kernels {unknown}: known {sorted(SCORES_KERNELS)}")
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    rate, bandwidth = gemm_rate(), K.copy_bandwidth()
    print(f"{props.name}: bf16 GEMM 8192^3 {rate / 1e12:.0f} TFLOP/s, copy {bandwidth / 1e12:.2f} TB/s", flush=True)
    only = tuple(x for x in args.only.split(",") if x)
    run = Runner(
        args.budget,
        rate,
        bandwidth,
        only,
        topk_paths,
        args.topk_reps,
        scores_kernels,
        args.topk_hints,
        args.topk_trends,
    )
    compiled_glm = None if args.no_compile else torch.compile(upstream_glm_tail, dynamic=False)

    for L in lengths:
        glm_rows(run, L)
        v4_rows(run, L)
    # torch.compile of upstream's tail last (its compile times would otherwise eat the budget)
    if compiled_glm is not None:
        for L in [x for x in lengths if x <= 16384]:
            glm_rows(run, L, compiled_glm)

    head = [
        f"GPU: {props.name}; bf16 GEMM (8192^3, same run): {rate / 1e12:.0f} TFLOP/s; device-to-device copy "
        f"{bandwidth / 1e12:.2f} TB/s (read + written); torch {torch.__version__}; code: {describe()}",
        "",
        "| row | device ms (CUDA graph) | user path ms (events) | TFLOP/s | of the tensor-core bound "
        "| of copy BW | peak +GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    lines = head + [f"| {' | '.join(r)} |" for r in run.rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
