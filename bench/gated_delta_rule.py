"""Benchmark of the chunked gated delta rule (Qwen3.5's Gated DeltaNet core), bf16, forward + backward,
in one run on one GPU: opslot's `cuda` kernels, opslot's `torch` implementation (the chunk-parallel
PyTorch form; upstream's torch_chunk_gated_delta_rule has the same structure) and flash-linear-attention
(`fla`, when importable: carry its wheels; its Hopper refusal of the gated backward with Triton < 3.7.1
is switched off here FOR TIMING ONLY, with --fla-unsafe). Each row gives two timings: the device time
(a CUDA graph of the call, replayed) and the user path (CUDA events around the eager Python call, as a
training step sees it), the tensor-core bound of the FLOPs our algorithm does (at the bf16 matrix rate
measured in the same run) and the fraction of it reached, and peak extra memory.

    python3 bench/gated_delta_rule.py --out $OUT/gdr_h200.md [--fla-unsafe] [--shapes step,32k]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "runtime"))

from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

from opslot.kernels import torch_ops as T  # noqa: E402
from opslot.kernels.cuda import gated_delta_rule as G  # noqa: E402

BF = torch.bfloat16
SHAPES = {"step": (2, 4096, 32, 128, 128), "32k": (1, 32768, 32, 128, 128)}


def flops(B, T, H, D):
    """FLOPs of opslot's chunked algorithm, forward and backward (C = 64; D = Dk = Dv): per chunk and head
    the forward does 10 C^2 D + 6 C D^2, the backward 32 C^2 D + 12 C D^2 + 4 C^3 (it recomputes the
    UT transform and the per-chunk q k^T)."""
    C = 64
    chunks = B * ((T + C - 1) // C) * H
    fwd = chunks * (10 * C * C * D + 6 * C * D * D)
    bwd = chunks * (32 * C * C * D + 12 * C * D * D + 4 * C**3)
    return fwd, bwd


def gemm_rate():
    n = 8192
    a = torch.randn(n, n, dtype=BF, device="cuda")
    b = torch.randn(n, n, dtype=BF, device="cuda")
    ms = do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def inputs(B, T, H, D, grad=True):
    torch.manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=BF)  # noqa: E731
    q, k, v = mk(B, T, H, D), mk(B, T, H, D), mk(B, T, H, D)
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda") + 3.0)
    beta = torch.rand(B, T, H, device="cuda", dtype=BF)
    xs = [q, k, v, g, beta]
    return [x.requires_grad_(grad) for x in xs]


def ours(q, k, v, g, beta):
    return G.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]


def torch_impl(q, k, v, g, beta):
    return T.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]


def fla_impl(unsafe: bool):
    try:
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    except Exception as exc:  # noqa: BLE001
        print(f"flash-linear-attention unavailable: {type(exc).__name__}: {exc}")
        return None
    if unsafe:  # its refusal: "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results ..."
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True

    def run(q, k, v, g, beta):
        return fla_chunk(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]

    return run


def timings(fn, xs, dout, mode):
    """(device ms, user-path ms) of one forward (mode 'fwd') or forward + backward ('fwdbwd')."""

    def call():
        for x in xs:
            x.grad = None
        out = fn(*xs)
        if mode == "fwdbwd":
            out.backward(dout)

    call()
    torch.cuda.synchronize()
    try:
        dev = do_bench_cudagraph(call, rep=50, return_mode="median")
    except Exception as exc:  # noqa: BLE001
        print(f"    (no CUDA graph: {type(exc).__name__}: {str(exc)[:160]})")
        dev = float("nan")
    user = do_bench(call, warmup=5, rep=50, return_mode="median")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return dev, user, peak


def profile(shape):
    """Per-kernel CUDA time of one opslot forward + backward (torch.profiler), the first shape."""
    B, Tn, H, Dk, Dv = shape
    xs = inputs(B, Tn, H, Dk)
    dout = torch.randn(B, Tn, H, Dv, device="cuda", dtype=BF)
    for _ in range(3):
        ours(*xs).backward(dout)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            ours(*xs).backward(dout)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))


def copy_bandwidth():
    a = torch.empty(1 << 30, dtype=BF, device="cuda").normal_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=10, rep=100, return_mode="median")  # noqa: F821  (called before the del)
    del a, b
    torch.cuda.empty_cache()
    return 2 * (1 << 30) * 2 / (ms * 1e-3)


def conv_rows(bw):
    """Causal conv1d (width 4, SiLU, no bias: Qwen3.5) at its step shape, on upstream's transposed view
    (channels contiguous). Bytes: forward reads x and writes out (2 N), backward reads x and dout and
    writes dx (3 N); the weight is negligible."""
    from opslot.kernels.cuda import causal_conv1d as CC

    B, Tn, Ch, W = 2, 4096, 8192, 4
    x0 = torch.randn(B, Tn, Ch, device="cuda", dtype=BF)
    w0 = torch.randn(Ch, W, device="cuda", dtype=BF) * 0.5
    n = B * Tn * Ch * 2
    lines = []
    for label, fn in (
        ("opslot cuda", lambda x, w: CC.causal_conv1d(x, w, None, activation="silu")),
        ("opslot torch", lambda x, w: T.causal_conv1d(x, w, None, activation="silu")),
    ):
        for mode, nbytes in (("fwd", 2 * n), ("fwdbwd", 5 * n)):
            x = x0.clone().transpose(1, 2).requires_grad_(True)
            w = w0.clone().requires_grad_(True)
            dout = torch.randn(B, Tn, Ch, device="cuda", dtype=BF).transpose(1, 2)  # the model's layout
            dev, user, peak = timings(lambda xx, ww: fn(xx, ww), [x, w], dout, mode)
            frac = f"{100 * nbytes / (dev * 1e-3) / bw:.0f} % of copy" if dev == dev else ""
            lines.append(
                f"| conv1d {(B, Tn, Ch, W)} | {label} | {mode} | {dev:.3f} | {user:.3f} | {frac} | {peak:.2f} |"
            )
            print(lines[-1], flush=True)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="step,32k")
    ap.add_argument(
        "--fla-unsafe",
        action="store_true",
        help="switch off flash-linear-attention's Hopper refusal of its gated backward (timing only)",
    )
    ap.add_argument("--no-torch", action="store_true", help="skip opslot's torch implementation")
    ap.add_argument("--profile", action="store_true", help="print the time of each kernel of opslot's fwd+bwd")
    ap.add_argument("--no-conv", action="store_true", help="skip the causal conv1d rows")
    ap.add_argument("--no-fla", action="store_true", help="skip flash-linear-attention even when importable")
    args = ap.parse_args()
    if args.profile:
        profile(SHAPES[args.shapes.split(",")[0]])
        return
    rate = gemm_rate()
    bw = copy_bandwidth()
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; bf16 GEMM 8192^3 measured {rate / 1e12:.0f} TFLOP/s (the delta rule's "
        f"bound); device-to-device copy {bw / 1e12:.2f} TB/s (the conv's)",
        "",
        "| shape | impl | pass | device ms (graph) | user ms (events) | % of bound | peak extra GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    if not args.no_conv:
        lines += conv_rows(bw)
    impls = [("opslot cuda", ours)]
    if not args.no_torch:
        impls.append(("opslot torch", torch_impl))
    fla = None if args.no_fla else fla_impl(args.fla_unsafe)
    if fla is not None:
        impls.append(("fla 0.6.0" + (" (Hopper check off)" if args.fla_unsafe else ""), fla))
    for name in args.shapes.split(","):
        B, Tn, H, Dk, Dv = SHAPES[name]
        fw, bw = flops(B, Tn, H, Dk)
        for label, fn in impls:
            for mode in ("fwd", "fwdbwd"):
                xs = inputs(B, Tn, H, Dk)
                dout = torch.randn(B, Tn, H, Dv, device="cuda", dtype=BF)
                try:
                    dev, user, peak = timings(fn, xs, dout, mode)
                except Exception as exc:  # noqa: BLE001
                    lines.append(
                        f"| {name} {(B, Tn, H, Dk)} | {label} | {mode} | failed: {type(exc).__name__}: "
                        f"{str(exc)[:100]} | | | |"
                    )
                    torch.cuda.synchronize()
                    continue
                bound = (fw if mode == "fwd" else fw + bw) / rate * 1e3
                frac = f"{100 * bound / dev:.0f} %" if label == "opslot cuda" and dev == dev else ""
                lines.append(
                    f"| {name} {(B, Tn, H, Dk)} | {label} | {mode} | {dev:.3f} | {user:.3f} | {frac} | {peak:.2f} |"
                )
                print(lines[-1], flush=True)
                del xs, dout
                torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
