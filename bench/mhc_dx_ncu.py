#!/usr/bin/env python3
"""One mhc/pre and one mhc/head forward + backward (16384 tokens x 4 streams x 4096, bf16) for Nsight
Compute to profile the dx kernels; DX_VERSION=n runs the bench library's dx configuration n
(opslot_mhc_set_tuning; 1, the default, is production). docs/results/mhc_h200.md's ncu table:

    DX_VERSION=11 ncu --kernel-name regex:dx_kernel --launch-count 2 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy python3 bench/mhc_dx_ncu.py

(with OPSLOT_KERNELS_LIB, OPSLOT_KERNELS_BENCH_LIB, OPSLOT_TORCH_LIB and PYTHONPATH=runtime set as for
bench/mhc.py). FORMS=C:B runs the bench library's forms of the token kernels
(opslot_mhc_forms_set_tuning; bench/mhc.py's COLLAPSE_FORMS and COMB_FORMS), e.g. for collapse_fwd:

    FORMS=2:2 ncu --kernel-name regex:collapse_fwd --launch-count 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy python3 bench/mhc_dx_ncu.py
"""

import contextlib
import ctypes
import os

import torch
from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead

from opslot.kernels.cuda import _lib, mhc

cfg = DeepseekV4Config(hidden_size=4096, hc_mult=4, hc_sinkhorn_iters=20, rms_norm_eps=1e-6)
m, h = DeepseekV4HyperConnection(cfg).cuda(), DeepseekV4HyperHead(cfg).cuda()
with torch.no_grad():
    for mod in (m, h):
        for p in mod.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
x = (torch.randn(1, 16384, 4, 4096, device="cuda") * 2).to(torch.bfloat16).requires_grad_(True)
v = int(os.environ.get("DX_VERSION", "1"))
forms = [int(i) for i in os.environ.get("FORMS", "0:0").split(":")]
bench = v != 1 or forms != [0, 0]
ctx = _lib.using_library(_lib.bench_library_path()) if bench else contextlib.nullcontext()
with ctx as lib:
    if lib is not None:
        f = lib.opslot_mhc_set_tuning
        f.argtypes = [ctypes.c_int, ctypes.c_int]
        assert f(0, v) == 0
        f = lib.opslot_mhc_forms_set_tuning
        f.argtypes = [ctypes.c_int, ctypes.c_int]
        assert f(*forms) == 0
    for fn in (lambda t: mhc.mhc_pre(m, t)[2], lambda t: mhc.mhc_head(h, t)):
        out = fn(x)
        torch.autograd.grad(out, [x], torch.randn_like(out))
    torch.cuda.synchronize()
