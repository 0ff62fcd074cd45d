#!/usr/bin/env python3
"""Two calls of the DSA indexer's scores (`opslot::dsa_index_scores`) at GLM-5's shape (16384 tokens, 32 heads
of 128, causal limits; bench/dsa_indexer.py's glm_inputs), bf16, for Nsight Compute to profile the second (what
bounds the scores kernels; the profiles: docs/results/dsa_indexer_h200.md and dsa_indexer_h100.md):

    ncu --clock-control none -k regex:scores_ --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --section InstructionStats python3 bench/dsa_scores_ncu.py [--kernel 1] [--v4]

(with the variables of scripts/device-env.sh). Production runs the warpgroup-MMA kernel on Hopper; `--kernel N`
runs the bench library's opslot_dsa_scores_set_tuning(N) instead (1 the mma.sync kernel, 2 to 4 warpgroups a CTA;
`--mma-sync`: 1). `--v4`: DeepSeek-V4's shape (64 heads, 4096 compressed keys) instead.
"""

import argparse
import contextlib
import os
import sys

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(BENCH), "runtime"))
sys.path.insert(0, BENCH)

import dsa_indexer as DX  # noqa: E402  (bench/dsa_indexer.py: the inputs)
import kernels as K  # noqa: E402
from opslot.kernels.cuda import dsa_indexer as DI  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--kernel", type=int, default=0, help="opslot_dsa_scores_set_tuning's kernel (the bench library)")
ap.add_argument("--mma-sync", action="store_true", help="the mma.sync kernel: --kernel 1")
ap.add_argument("--v4", action="store_true", help="DeepSeek-V4's shape")
args = ap.parse_args()
kernel = 1 if args.mma_sync else args.kernel

inputs = DX.v4_inputs(16384)[:5] if args.v4 else DX.glm_inputs(16384)
with contextlib.ExitStack() as stack:
    if kernel:
        lib = stack.enter_context(K.bench_library("scores"))
        if lib is None or K.knob(lib, "opslot_dsa_scores_set_tuning", 1)(kernel) != 0:
            raise SystemExit(f"--kernel {kernel} needs the bench library")
    for _ in range(2):
        DI.dsa_index_scores(*inputs)
    torch.cuda.synchronize()
