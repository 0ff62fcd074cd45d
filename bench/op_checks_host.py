#!/usr/bin/env python3
"""Host time of the torch ops' argument checks, without a GPU: per-call wall time of a few ops on
meta tensors (their Meta kernels run the same check functions as their CUDA kernels, then allocate
meta outputs; no device work), for each libopslot_torch.so given, each in its own process, the
libraries alternated --alternations times.

    python3 bench/op_checks_host.py --lib OLD=/path/old/libopslot_torch.so --lib NEW=build/kernels/libopslot_torch.so

What it isolates: two libraries built from commits that differ in their checks give the checks'
cost per call as the difference of the rows (the dispatcher and the meta allocations cost the same in
both). The user path on a GPU is bench/host_cost.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child(calls: int, rounds: int) -> None:
    sys.path.insert(0, str(ROOT / "runtime"))
    import torch

    from opslot.kernels.cuda import _lib

    _lib.torch_ops()
    O = torch.ops.opslot  # noqa: E741
    bf, f32, i32 = torch.bfloat16, torch.float32, torch.int32

    def m(*shape, dtype=bf):
        return torch.empty(shape, dtype=dtype, device="meta")

    x, w, rstd = m(16, 64), m(64), m(16, dtype=f32)
    gate = m(16, 64)
    B, S, N, D = 2, 8, 4, 64
    M = (2 + N) * N
    xs, fn, base, scale = m(B, S, N, D), m(M, N * D, dtype=f32), m(M, dtype=f32), m(3, dtype=f32)
    mix, rs = m(B * S, M, dtype=f32), m(B * S, dtype=f32)
    a, wg, offs = m(32, 64), m(4, 128, 64), m(4, dtype=i32)
    cases = {
        "rms_norm_bwd": lambda: O.rms_norm_bwd(x, x, None, w, rstd, 0),
        "silu_mul_bwd": lambda: O.silu_mul_bwd(gate, gate, gate),
        "mhc_pre_bwd": lambda: O.mhc_pre_bwd(None, None, m(B, S, D), xs, fn, base, scale, mix, rs, 20, 1e-6, 1e-6),
        "moe_grouped_mm": lambda: O.moe_grouped_mm(a, wg, offs, True),
    }
    out = {}
    for name, call in cases.items():
        for _ in range(200):
            call()
        per = []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(calls):
                call()
            per.append((time.perf_counter() - t) / calls * 1e6)
        out[name] = statistics.median(per)
    print(json.dumps(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", action="append", default=[], help="NAME=path of a libopslot_torch.so (two or more)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--alternations", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.calls, args.rounds)
        return 0
    if len(args.lib) < 2:
        ap.error("give two or more --lib NAME=PATH")
    libs = [spec.split("=", 1) for spec in args.lib]
    results = {name: [] for name, _ in libs}
    for _ in range(args.alternations):
        for name, path in libs:
            env = dict(os.environ, OPSLOT_TORCH_LIB=str(Path(path).resolve()))
            cmd = [sys.executable, __file__, "--child", "--calls", str(args.calls), "--rounds", str(args.rounds)]
            line = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.strip()
            results[name].append(json.loads(line.splitlines()[-1]))
    ops = list(results[libs[0][0]][0])
    print("| library | " + " | ".join(f"{op} µs/call" for op in ops) + " |")
    print("|---|" + "---:|" * len(ops))
    for name, runs in results.items():
        cells = [", ".join(f"{run[op]:.2f}" for run in runs) for op in ops]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
