"""One `opslot::topk_indices` call on the lightning indexer's causal scores, for Nsight Compute to profile
(docs/results/dsa_indexer_h200.md, "What bounds the top-k"): bench/dsa_indexer.py's inputs at L tokens
(GLM-5: 32 heads of 128, top-2048; MODEL=v4: DeepSeek-V4, 64 heads of 128 over L / 4 compressed keys,
limits (pos + 1) // 4, top-512), the scores by `dsa_index_scores`, then the top-k twice (profile the
second); prints how many top-digit buckets the last row's scores fill. TOPK_PATH=n runs the bench library's
opslot_topk_set_tuning(n) (0, the default, is production); PHASES=1 prints where the second call's
long-row one-read pass spends its time (the bench library's opslot_topk_probe_phases, production's choice
unless TOPK_PATH says otherwise). TOPK_PATH=13 or 14 (the pass from a given threshold) takes HINT=kth (each row's k-th
largest) or HINT=groups8 (the k-th largest of its 8-column maxima): bench/dsa_indexer.py's topk_hints.
TREND=rising or falling adds bench/dsa_indexer.py's ramp (trend_rows) to the scores; MASK=1 passes the causal
bool mask too (the slot's form).

    L=65536 ncu --kernel-name regex:topk_kernel --launch-count 1 --launch-skip 1 --set full \\
        --import-source yes -o $OUT/topk python3 bench/topk_ncu.py
    L=16384 MODEL=v4 ncu --kernel-name regex:topk_reg_kernel --launch-count 1 --launch-skip 1 \\
        --set full -o $OUT/topk_v4 python3 bench/topk_ncu.py
    L=8192 MODEL=v4 ncu --kernel-name regex:topk_warp_kernel --launch-count 1 --launch-skip 1 \\
        --set full -o $OUT/topk_v4_warp python3 bench/topk_ncu.py   # rows of up to 2048 keys
    L=65536 PHASES=1 python3 bench/topk_ncu.py   # with OPSLOT_KERNELS_BENCH_LIB set
    L=65536 PHASES=1 TOPK_PATH=13 HINT=groups8 python3 bench/topk_ncu.py
    L=65536 PHASES=1 TREND=falling MASK=1 python3 bench/topk_ncu.py   # a ramp added; the bool mask"""

import contextlib
import ctypes
import os
import sys

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(BENCH), "runtime"))
sys.path.insert(0, BENCH)
from opslot.kernels.cuda import _lib, dsa_indexer as DI  # noqa: E402

PHASES = ("the first round's threshold", "the rounds", "the cuts", "the select", "the write")


def print_phases(lib, what):
    """opslot_topk_probe_phases's counters: thread 0's clock by phase, summed over the rows."""
    c = (ctypes.c_ulonglong * 10)()
    assert lib.opslot_topk_probe_phases(c, 0) == 0
    total, rows = sum(c[:5]), max(c[5], 1)
    split = ", ".join(f"{name} {100 * x / max(total, 1):.1f} %" for name, x in zip(PHASES, c[:5]))
    print(
        f"{what}: {c[5]} rows through the one-read pass, {c[6]} cuts, {c[7]} rounds (retries and re-reads "
        f"counted), {c[8]} thresholds lowered, {c[9]} rows handed to the two-read path; "
        f"{total / rows:.0f} cycles a row: {split}"
    )


def main():
    L, D = int(os.environ.get("L", "65536")), 128
    v4 = os.environ.get("MODEL", "glm") == "v4"
    H, T, top_k = (64, L // 4, 512) if v4 else (32, L, 2048)
    g = torch.Generator(device="cuda").manual_seed(L + 1 if v4 else L)  # the bench's inputs
    q = torch.randn(1, L, H, D, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(1, T, D, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(1, L, H, device="cuda", generator=g) * H**-0.5
    pos = torch.arange(L, device="cuda", dtype=torch.int32) + 1
    limit = (pos // 4 if v4 else pos).view(1, L)
    scores = DI.dsa_index_scores(q, k, w, D**-0.5, limit)
    trend = os.environ.get("TREND", "")
    if trend:  # bench/dsa_indexer.py's trend_rows
        import dsa_indexer as DX

        scores += {"rising": 1.0, "falling": -1.0}[trend] * DX.trend_ramp(scores)
    mask = None
    if os.environ.get("MASK") == "1":  # the slot's form: the causal bool mask too (GLM-5's)
        assert not v4, "MASK=1: GLM-5's rows only"
        mask = torch.ones(L, L, dtype=torch.bool, device="cuda").tril_().unsqueeze(0)
    path, phases = int(os.environ.get("TOPK_PATH", "0")), os.environ.get("PHASES") == "1"
    bench = path != 0 or phases
    with _lib.using_library(_lib.bench_library_path()) if bench else contextlib.nullcontext() as lib:
        if lib is not None:
            lib.opslot_topk_set_tuning.argtypes = [ctypes.c_int]
            assert lib.opslot_topk_set_tuning(path) == 0
        if path in (13, 14):
            import dsa_indexer as DX  # bench/dsa_indexer.py: the thresholds

            hint = dict(zip(("kth", "groups8"), (h for _, h in DX.topk_hints(scores, top_k))))[os.environ["HINT"]]
            lib.opslot_topk_set_hint.argtypes = [ctypes.c_void_p]
            assert lib.opslot_topk_set_hint(hint.data_ptr()) == 0
        for i in range(2):
            if phases and i == 1:
                assert lib.opslot_topk_probe_phases(None, 1) == 0  # reset
            DI.topk_indices(scores, top_k, limit, mask)
        torch.cuda.synchronize()
        if phases:
            what = f" from {os.environ['HINT']}" if path in (13, 14) else ""
            what += f", scores {trend} with the column" if trend else ""
            what += ", the bool mask" if mask is not None else ""
            print_phases(lib, f"{'V4' if v4 else 'GLM'} {L}, path {path}{what}")
    bits = scores[0, L - 1, : int(limit[0, -1])].view(torch.int32).long() & 0xFFFFFFFF  # the order keys
    keys = torch.where(bits >= 2**31, bits ^ 0xFFFFFFFF, bits ^ 0x80000000)
    _, counts = torch.unique(keys >> 21, return_counts=True)
    print(f"last row: {counts.numel()} top-digit buckets, the largest {counts.max().item()} of {keys.numel()}")


if __name__ == "__main__":
    main()
