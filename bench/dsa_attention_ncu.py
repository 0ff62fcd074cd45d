#!/usr/bin/env python3
"""Two forward + backward calls of opslot's sparse attention at GLM-5's shape (4096 tokens, 64 heads, Dqk 576,
dv 512, the top-2048 index lists of bench/dsa_attention.py), bf16, for Nsight Compute to profile the forward
and one backward chunk of the second call. docs/results/dsa_attention_h200.md's ncu table:

    ncu --clock-control none -k regex:"fwd_wgmma|bwd_" --launch-skip 6 --launch-count 2 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        python3 bench/dsa_attention_ncu.py

(with OPSLOT_KERNELS_LIB and OPSLOT_TORCH_LIB set as for bench/dsa_attention.py; a call launches the forward
and five backward chunks, so the skip of 6 passes the first call).
"""

import os
import sys

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(BENCH), "runtime"))
sys.path.insert(0, BENCH)

import dsa_attention as DA  # noqa: E402
from opslot.kernels.cuda import sparse_attention as SA  # noqa: E402

S, H, D, DV, K = 4096, 64, 576, 512, 2048
torch.manual_seed(0)
q = torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
kv = torch.randn(1, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
idx = DA.glm_topk(S, K)
for _ in range(2):
    out, _ = SA.sparse_mqa_attention(q, kv, idx, None, D**-0.5, DV)
    out.backward(torch.ones_like(out))
torch.cuda.synchronize()
