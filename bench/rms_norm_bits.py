"""SHA-256 (first 16 hex digits) of the rms_norm ops' outputs and gradients for fixed inputs, one line per
mode, dtype and shape: run it once per kernel library and diff the outputs to show a change left a
mode's bits alone.

    OPSLOT_KERNELS_LIB=old.so python3 bench/rms_norm_bits.py > old.txt
    OPSLOT_KERNELS_LIB=new.so python3 bench/rms_norm_bits.py > new.txt && diff old.txt new.txt
"""

import hashlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
from opslot.kernels.cuda import norms as N  # noqa: E402


def digest(t):
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def main():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, width in ((4099, 4096), (333, 7), (65, 16384), (1000, 512)):
            x = torch.randn(rows, width, device="cuda", dtype=dtype)
            g = torch.randn(rows, width, device="cuda", dtype=dtype)
            w = (1 + 0.3 * torch.randn(width, device="cuda")).to(dtype)
            dy = torch.randn(rows, width, device="cuda", dtype=dtype)
            for name in ("standard", "offset", "unweighted", "gated"):
                xs = x.clone().requires_grad_(True)
                ws = w.clone().requires_grad_(True)
                if name == "gated":
                    gs = g.clone().requires_grad_(True)
                    y = N.rms_norm_gated(xs, gs, ws, 1e-6)
                    wrt = (xs, gs, ws)
                elif name == "unweighted":
                    y = N.rms_norm_unweighted(xs, None, 1e-6)
                    wrt = (xs,)
                else:
                    y = getattr(N, f"rms_norm_{name}")(xs, ws, 1e-6)
                    wrt = (xs, ws)
                grads = torch.autograd.grad(y, wrt, dy)
                print(name, str(dtype)[6:], rows, width, digest(y), *[digest(t) for t in grads])


if __name__ == "__main__":
    main()
