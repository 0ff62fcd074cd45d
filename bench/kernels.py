"""Benchmark of opslot's CUDA kernels against upstream eager, torch.compile of eager, native torch
ops, Liger 0.8.5 and opslot's portable `torch` kernels, in one run on one GPU (bf16, forward +
backward). Prints and writes (to --out) one markdown table per op: median time (CUDA events,
triton.testing.do_bench), the fraction of the device-to-device copy bandwidth measured in the same
run (bytes as issue #12 counts them), peak extra memory of one call, and the host time of one
forward+backward call on a tiny tensor.

    python3 bench/kernels.py --out $OUT/kernels_h200.md [--no-compile] [--quick] [--tune]

Every default-configuration row runs on the production library (libopslot_kernels.so, as opslot
loads it). --tune also times the kernel variants behind the benchmark-only knobs
(kernels/include/opslot_kernels/bench.h): those rows, marked [in brackets], run on the bench library
libopslot_kernels_bench.so (`cmake --build build --target opslot_kernels_bench`; found beside the
production library, in build/kernels/, or at $OPSLOT_KERNELS_BENCH_LIB); without it each sweep is
skipped with a message and the rest runs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "runtime"))

# (cuda's swiglu is imported for torch.ops.opslot.silu_mul, which its import registers: the SwiGLU benchmark calls it)
from opslot import reference as R  # noqa: E402
from opslot.kernels import torch_ops as T  # noqa: E402
from opslot.kernels.cuda import _lib, load_balancing as CLB, norms as CN, rope as CR, swiglu as CS  # noqa: E402, F401

try:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    LIGER = True
except Exception as exc:  # noqa: BLE001
    print(f"liger unavailable: {exc}")
    LIGER = False

from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

BF = torch.bfloat16
DEV = "cuda"


def bench_ms(fn):
    """Median GPU time of one call: replayed from a CUDA graph (the device machine's host is too slow
    to keep the GPU busy from Python, so stream timing would measure the host); where the call cannot
    be captured, stream timing, marked with a '*'."""
    try:
        return do_bench_cudagraph(fn, rep=100, return_mode="median"), ""
    except Exception as exc:  # noqa: BLE001
        torch.cuda.synchronize()
        print(f"    (no CUDA graph: {type(exc).__name__}: {str(exc)[:120]})", flush=True)
        return do_bench(fn, warmup=25, rep=100, return_mode="median"), "*"


def copy_bandwidth():
    n = 1 << 30  # 2 GiB of bf16
    a = torch.empty(n, dtype=BF, device=DEV).normal_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")  # noqa: F821  (4 GiB per call: no host bound)
    bw = 2 * a.numel() * 2 / (ms * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return bw


def peak_extra(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def host_us(fn, iters=100, repeats=7):
    """Host wall time of one call on a tiny tensor: the best of `repeats` rounds of `iters` calls
    (the minimum: a round that another process interrupted says nothing about the call)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / iters * 1e6)
    return best


def fwd_bwd(f, inputs, grad_seed=0):
    """A callable running f(*inputs) and the gradient of all differentiable inputs."""
    diff = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    for t in inputs:
        if isinstance(t, tuple):
            diff += [x for x in t if x.requires_grad]
    state = {}

    def run():
        out = f(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        if "g" not in state:
            gen = torch.Generator(device=DEV).manual_seed(grad_seed)
            state["g"] = [
                torch.randn(o.shape, dtype=o.dtype, device=DEV, generator=gen)
                if o.dim()
                else torch.ones((), device=DEV)
                for o in outs
            ]
        torch.autograd.grad(outs, diff, state["g"])

    return run


def kernel_breakdown(title, run, out, reps=10):
    """--profile: the GPU kernels one call of `run` launches, with their mean device time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    lines = [
        f"#### kernels of one call: {title} (torch.profiler, mean of {reps})",
        "",
        "| kernel | calls/iter | µs/call |",
        "|---|---:|---:|",
    ]
    for ev in sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0)):
        dev = getattr(ev, "self_device_time_total", 0)
        if dev <= 0:
            continue
        lines.append(f"| {ev.key[:90]} | {ev.count / reps:g} | {dev / max(ev.count, 1):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    out.append(text)


def table(title, bytes_moved, copy_bw, rows, target_ms=None):
    lines = [f"### {title}", ""]
    lines.append("| implementation | ms (GPU, CUDA graph) | % of copy BW | peak extra MiB | host µs/call (tiny) |")
    lines.append("|---|---:|---:|---:|---:|")
    for row in rows:
        name, ms, peak, host, mark = row[:5]
        nbytes = row[5] if len(row) > 5 and row[5] else bytes_moved
        frac = f"{100 * nbytes / (ms * 1e-3) / copy_bw:.1f}" if (nbytes and ms == ms) else "-"
        lines.append(f"| {name} | {ms:.4f}{mark} | {frac} | {peak:.1f} | {host:.1f} |")
    if target_ms:
        lines.append("")
        lines.append(f"target: {target_ms}")
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text


def measure(name, make, tiny, nbytes=None):
    """make(): a callable (fwd+bwd on the big shape); tiny(): the same on a tiny shape (host time)."""
    try:
        run = make()
        run()
        peak = peak_extra(run)
        ms, mark = bench_ms(run)
        host = host_us(tiny()) if tiny else float("nan")
        return (name, ms, peak, host, mark, nbytes)
    except Exception as exc:  # noqa: BLE001
        print(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        return (name + " (failed)", float("nan"), float("nan"), float("nan"), "", nbytes)


@contextlib.contextmanager
def bench_library(sweep):
    """For a --tune sweep: the bench library (libopslot_kernels_bench.so, the knobs), which every
    opslot cuda op calls inside the block; None, with a message saying the sweep is skipped, when it
    is not built (the default-configuration rows still run, on the production library)."""
    try:
        path = _lib.bench_library_path()
    except _lib.KernelLibraryError as exc:
        print(f"note: {sweep} sweep skipped: {exc}", file=sys.stderr, flush=True)
        yield None
        return
    with _lib.using_library(path) as lib:
        yield lib


def knob(lib, name, nargs):
    f = getattr(lib, name)
    f.argtypes = [ctypes.c_int] * nargs
    f.restype = ctypes.c_int
    return f


def libraries_line():
    """Which libraries the rows ran on."""
    prod = _lib.library()
    line = f"production library: {prod._opslot_path} ({prod.opslot_build_info().decode()})"
    try:
        bench = _lib.bench_library_path()
        with _lib.using_library(bench) as lib:
            line += f"; bench library ([bracketed] --tune rows): {bench} ({lib.opslot_build_info().decode()})"
    except _lib.KernelLibraryError:
        line += "; bench library: not built (--tune sweeps skipped)"
    return line


def leaf(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(dtype).requires_grad_(True)


def bench_rms(copy_bw, args, out):
    N, D = (16384, 4096) if not args.quick else (4096, 4096)
    x, w = leaf(N, D), (1 + 0.1 * torch.randn(D, device=DEV)).to(BF).requires_grad_(True)
    tx, tw = leaf(2, 64), (torch.ones(64, device=DEV, dtype=BF)).requires_grad_(True)
    eps = 1e-6
    impls = [
        ("upstream eager", lambda x, w: R.rms_norm_standard(x, w, eps)),
        ("native F.rms_norm", lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps)),
        ("opslot torch", lambda x, w: T.rms_norm_standard(x, w, eps)),
        ("opslot cuda", lambda x, w: CN.rms_norm_standard(x, w, eps)),
    ]
    if LIGER:
        impls.insert(2, ("Liger 0.8.5", lambda x, w: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)))
    if not args.no_compile:
        impls.insert(1, ("torch.compile(eager)", torch.compile(lambda x, w: R.rms_norm_standard(x, w, eps))))
    rows = [measure(n, lambda f=f: fwd_bwd(f, (x, w)), lambda f=f: fwd_bwd(f, (tx, tw))) for n, f in impls]
    if args.tune:  # kernel variants of the cuda op, each with its forward alone
        fwd_bytes = 4 * N * D
        f = lambda x, w: CN.rms_norm_standard(x, w, eps)  # noqa: E731
        fwd_only = lambda: lambda: CN.rms_norm_standard(x.detach(), w.detach(), eps)  # noqa: E731
        rows.append(measure("opslot cuda, forward only (4 B/element)", fwd_only, None, fwd_bytes))
        variants = [  # (name, (vectors/thread, bwd waves, version), (version 3's blocks/SM, skip row sums, bwd from row 0))
            ("version 2 (registers, next row prefetched)", (2, 1, 2), (0, 0, 0)),
            ("version 3, backward from the first row", (2, 1, 3), (0, 0, 1)),
            ("version 3, forward one row per block (not persistent)", (2, 1, 3), (-1, 0, 0)),
            ("version 3, 2 blocks/SM", (2, 1, 3), (2, 0, 0)),
            ("version 3, 3 blocks/SM", (2, 1, 3), (3, 0, 0)),
            ("version 3, 4 blocks/SM (the backward fits 3)", (2, 1, 3), (4, 0, 0)),
            ("version 3, 5 blocks/SM (the backward fits 3)", (2, 1, 3), (5, 0, 0)),
            ("DIAGNOSTIC: version 3 without its row sums (wrong results)", (2, 1, 3), (0, 1, 0)),
        ]
        with bench_library("RMSNorm --tune") as lib:
            if lib is not None:
                set_tuning = knob(lib, "opslot_rms_norm_set_tuning", 3)
                set_exp = knob(lib, "opslot_rms_norm_set_experiment", 3)
                try:
                    for name, tun, exp in variants:
                        set_tuning(*tun)
                        if set_exp(*exp) != 0:  # the diagnostic: only in an OPSLOT_KERNELS_DIAGNOSTICS=ON build
                            print(
                                f"note: RMSNorm [{name}] skipped: {lib.opslot_last_error().decode()}", file=sys.stderr
                            )
                            continue
                        rows.append(measure(f"opslot cuda [{name}]", lambda: fwd_bwd(f, (x, w)), None))
                        rows.append(measure("  its forward only", fwd_only, None, fwd_bytes))
                        if args.profile:
                            kernel_breakdown(f"RMSNorm opslot cuda [{name}]", fwd_bwd(f, (x, w)), out)
                finally:
                    set_tuning(2, 1, 0)
                    set_exp(0, 0, 0)
    out.append(
        table(
            f"RMSNorm (standard) {N}x{D} bf16 — 10 B/element", 10 * N * D, copy_bw, rows, "≤ 0.19 ms, ≥ 83% of copy BW"
        )
    )
    if args.profile:
        kernel_breakdown("RMSNorm opslot cuda", fwd_bwd(lambda x, w: CN.rms_norm_standard(x, w, eps), (x, w)), out)
        if not args.no_compile:
            kernel_breakdown("RMSNorm torch.compile", fwd_bwd(dict(impls)["torch.compile(eager)"], (x, w)), out)

    g = leaf(N, D, scale=2.0)
    tg = leaf(2, 64)
    impls = [
        ("upstream eager", lambda x, g, w: R.rms_norm_gated(x, g, w, eps)),
        ("opslot torch", lambda x, g, w: T.rms_norm_gated(x, g, w, eps)),
        ("opslot cuda", lambda x, g, w: CN.rms_norm_gated(x, g, w, eps)),
    ]
    if not args.no_compile:
        impls.insert(1, ("torch.compile(eager)", torch.compile(lambda x, g, w: R.rms_norm_gated(x, g, w, eps))))
    rows = [measure(n, lambda f=f: fwd_bwd(f, (x, g, w)), lambda f=f: fwd_bwd(f, (tx, tg, tw))) for n, f in impls]
    if args.tune:
        with bench_library("gated RMSNorm --tune") as lib:
            if lib is not None:
                set_tuning = knob(lib, "opslot_rms_norm_set_tuning", 3)
                try:
                    for vpt, waves, variant in ((2, 1, 1), (2, 1, 2), (2, 1, 3)):
                        set_tuning(vpt, waves, variant)
                        f = lambda x, g, w: CN.rms_norm_gated(x, g, w, eps)  # noqa: E731
                        rows.append(
                            measure(
                                f"opslot cuda [version {variant}, vectors/thread {vpt}, bwd waves {waves}]",
                                lambda f=f: fwd_bwd(f, (x, g, w)),
                                None,
                            )
                        )
                finally:
                    set_tuning(2, 1, 0)
    out.append(
        table(
            f"Gated RMSNorm (Qwen3.5) {N}x{D} bf16 — 16 B/element (fwd: x, gate, y; bwd: x, gate, dy, dx, dgate)",
            16 * N * D,
            copy_bw,
            rows,
            "≥ 75% of copy BW",
        )
    )


def _rope_inputs(B, S, HQ, HK, D, RD, grad=True):
    q = torch.randn(B, S, HQ, D, device=DEV, dtype=BF).transpose(1, 2).requires_grad_(grad)
    k = torch.randn(B, S, HK, D, device=DEV, dtype=BF).transpose(1, 2).requires_grad_(grad)
    inv = 1.0 / (10000 ** (torch.arange(0, RD, 2, device=DEV).float() / RD))
    freqs = torch.arange(S, device=DEV).float()[:, None] * inv
    emb = torch.cat((freqs, freqs), -1)[None].expand(B, S, RD)
    return q, k, emb.cos().to(BF).contiguous(), emb.sin().to(BF).contiguous()


def bench_rope(copy_bw, args, out):
    S = 8192 if not args.quick else 2048
    for label, RD, target in (
        ("full", 128, "≤ 0.20 ms, ≥ 80% of copy BW"),
        ("partial (rotary dim 64 of 128)", 64, "≥ 75% of copy BW"),
    ):
        q, k, cos, sin = _rope_inputs(2, S, 32, 8, 128, RD)
        tq, tk, tcos, tsin = _rope_inputs(1, 4, 2, 1, 128, RD)
        full = RD == 128
        ref = R.rotary_pos_emb_full if full else R.rotary_pos_emb_partial
        tor = T.rotary_pos_emb_full if full else T.rotary_pos_emb_partial
        cud = CR.rotary_pos_emb_full if full else CR.rotary_pos_emb_partial
        impls = [("upstream eager", ref), ("opslot torch", tor), ("opslot cuda", cud)]
        if LIGER:
            impls.insert(1, ("Liger 0.8.5", lambda q, k, c, s, rd=RD: liger_rotary_pos_emb(q, k, c, s, rotary_dim=rd)))
        if not args.no_compile:
            impls.insert(1, ("torch.compile(eager)", torch.compile(ref)))
        rows = [
            measure(n, lambda f=f: fwd_bwd(f, (q, k, cos, sin)), lambda f=f: fwd_bwd(f, (tq, tk, tcos, tsin)))  # noqa: F821
            for n, f in impls
        ]
        rows.append(
            measure(
                "opslot cuda, forward only (4 B/element)",
                lambda: lambda: cud(q.detach(), k.detach(), cos, sin),  # noqa: F821
                None,
                4 * (q.numel() + k.numel()),
            )
        )
        if args.tune:  # the other layouts, side by side
            with bench_library(f"RoPE {label} --tune") as lib:
                if lib is not None:
                    set_tuning = knob(lib, "opslot_rope_set_tuning", 2)
                    try:
                        set_tuning(1, 1)
                        rows.append(
                            measure(
                                "opslot cuda [head loop: a thread rotates 8 heads per cos/sin load]",
                                lambda: fwd_bwd(cud, (q, k, cos, sin)),  # noqa: F821
                                None,
                            )
                        )
                        if not full:
                            set_tuning(0, 0)
                            rows.append(
                                measure(
                                    "opslot cuda [pass-through: one thread per vector]",
                                    lambda: fwd_bwd(cud, (q, k, cos, sin)),  # noqa: F821
                                    None,
                                )
                            )
                    finally:
                        set_tuning(1, 0)
        out.append(
            table(
                f"RoPE {label}: q [2,32,{S},128], k [2,8,{S},128] (transposed views), bf16 — 8 B per q/k element",
                8 * (q.numel() + k.numel()),
                copy_bw,
                rows,
                target,
            )
        )
        if args.profile:
            for n, f in impls:
                if n in ("opslot cuda", "torch.compile(eager)"):
                    kernel_breakdown(f"RoPE {label} {n}", fwd_bwd(f, (q, k, cos, sin)), out)
        del q, k
        torch.cuda.empty_cache()


def _deepseek_rope_inputs(B, S, H, D, nope=128, grad=True):
    """DeepSeek-V3's attention: q_rot the last D features of q_states [B, S, H, nope + D] (transposed
    view), k_rot [B, 1, S, D] from compressed_kv [B, S, 512 + D]; cos/sin [B, S, D] in bf16."""
    q = torch.randn(B, S, H, nope + D, device=DEV, dtype=BF).transpose(1, 2)[..., nope:].requires_grad_(grad)
    k = torch.randn(B, S, 512 + D, device=DEV, dtype=BF)[..., 512:].view(B, 1, S, D).requires_grad_(grad)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    freqs = torch.arange(S, device=DEV).float()[:, None] * inv
    emb = torch.cat((freqs, freqs), -1)[None].expand(B, S, D)
    return q, k, emb.cos().to(BF).contiguous(), emb.sin().to(BF).contiguous()


def _vision_rope_inputs(N, H, D, grad=True):
    """The vision attention: q/k unbound views of qkv [N, 3, H, D] (bf16), cos/sin [N, D] fp32."""
    qkv = torch.randn(N, 3 * H * D, device=DEV, dtype=BF)
    q, k, _ = qkv.reshape(N, 3, H, D).permute(1, 0, 2, 3).unbind(0)
    freqs = torch.randn(N, D // 2, device=DEV) * 8
    emb = torch.cat((freqs, freqs), -1)
    return q.requires_grad_(grad), k.requires_grad_(grad), emb.cos(), emb.sin()


def bench_rope_variants(copy_bw, args, out, which):
    """RoPE interleaved (DeepSeek-V3) or the vision RoPE: fwd+bwd of upstream eager (opslot.reference
    is its code), torch.compile of it, opslot's torch and cuda kernels, and the cuda forward alone."""
    if which == "interleaved":
        S = 4096 if not args.quick else 1024
        make = lambda: _deepseek_rope_inputs(2, S, 128, 64)  # noqa: E731
        tiny = _deepseek_rope_inputs(1, 4, 2, 64)
        ref, tor, cud = R.rotary_pos_emb_interleaved, T.rotary_pos_emb_interleaved, CR.rotary_pos_emb_interleaved
        title = (
            f"RoPE interleaved (DeepSeek-V3): q_rot [2,128,{S},64] (a slice of q_states [2,{S},128,192]), "
            f"k_rot [2,1,{S},64], bf16 — 8 B per q/k element"
        )
        target = "≥ 80% of copy BW"
    else:
        N = 16384 if not args.quick else 4096
        make = lambda: _vision_rope_inputs(N, 16, 80)  # noqa: E731
        tiny = _vision_rope_inputs(8, 2, 80)
        ref, tor, cud = R.rotary_pos_emb_vision, T.rotary_pos_emb_vision, CR.rotary_pos_emb_vision
        title = (
            f"RoPE vision (Qwen2-VL .. Qwen3-VL-MoE): q/k [{N},16,80] (views of qkv [{N},3,16,80]) bf16, "
            "cos/sin fp32 — 8 B per q/k element (cos/sin, 4% more, not counted)"
        )
        target = "≥ 80% of copy BW"
    q, k, cos, sin = make()
    impls = [("upstream eager", ref), ("opslot torch", tor), ("opslot cuda", cud)]
    if not args.no_compile:
        impls.insert(1, ("torch.compile(eager)", torch.compile(ref)))
    rows = [
        measure(n, lambda f=f: fwd_bwd(f, (q, k, cos, sin)), lambda f=f: fwd_bwd(f, tiny))  # noqa: F821
        for n, f in impls
    ]
    rows.append(
        measure(
            "opslot cuda, forward only (4 B/element)",
            lambda: lambda: cud(q.detach(), k.detach(), cos, sin),  # noqa: F821
            None,
            4 * (q.numel() + k.numel()),
        )
    )
    out.append(table(title, 8 * (q.numel() + k.numel()), copy_bw, rows, target))
    if args.profile:
        for n, f in impls:
            if n in ("opslot cuda", "torch.compile(eager)"):
                kernel_breakdown(f"RoPE {which} {n}", fwd_bwd(f, (q, k, cos, sin)), out)
    del q, k
    torch.cuda.empty_cache()


def bench_silu(copy_bw, args, out):
    N, D = (16384, 12288) if not args.quick else (4096, 12288)
    a, b = leaf(N, D, scale=2.0), leaf(N, D)
    ta, tb = leaf(2, 64), leaf(2, 64)
    impls = [
        ("upstream eager (F.silu(a) * b)", lambda a, b: F.silu(a) * b),
        ("opslot cuda", lambda a, b: torch.ops.opslot.silu_mul(a, b)),
    ]
    if LIGER:
        impls.insert(1, ("Liger 0.8.5", lambda a, b: LigerSiLUMulFunction.apply(a, b)))
    if not args.no_compile:
        impls.insert(1, ("torch.compile(eager)", torch.compile(lambda a, b: F.silu(a) * b)))
    rows = [measure(n, lambda f=f: fwd_bwd(f, (a, b)), lambda f=f: fwd_bwd(f, (ta, tb))) for n, f in impls]
    rows.append(
        measure(
            "opslot cuda, forward only (6 B/element)",
            lambda: lambda: torch.ops.opslot.silu_mul(a.detach(), b.detach()),
            None,
            6 * N * D,
        )
    )
    if args.tune:  # 16-byte vectors per thread and tensor (default 1), the backward's order (default: from the end)
        with bench_library("SiLU-mul --tune") as lib:
            if lib is not None:
                set_tuning = knob(lib, "opslot_silu_mul_set_tuning", 2)
                try:
                    for vpt, from_start in ((1, 1), (2, 0), (4, 0)):
                        set_tuning(vpt, from_start)
                        name = f"vectors/thread {vpt}" + (", backward from the start" if from_start else "")
                        rows.append(
                            measure(
                                f"opslot cuda [{name}]",
                                lambda: fwd_bwd(lambda a, b: torch.ops.opslot.silu_mul(a, b), (a, b)),
                                None,
                            )
                        )
                finally:
                    set_tuning(1, 0)
    out.append(
        table(
            f"SiLU·mul {N}x{D} bf16 — 16 B/element (opslot torch = upstream eager here)",
            16 * N * D,
            copy_bw,
            rows,
            "≤ 0.82 ms, ≥ 92% of copy BW",
        )
    )


def bench_lb(copy_bw, args, out):
    L, N, E, K = 48, 16384 if not args.quick else 4096, 128, 8
    base = [torch.randn(N, E, device=DEV, dtype=BF) for _ in range(L)]
    tiny = tuple(torch.randn(4, E, device=DEV, dtype=BF).requires_grad_(True) for _ in range(L))

    def fresh():  # new leaves per implementation (a leaf's gradient accumulator remembers its stream)
        return tuple(t.detach().requires_grad_(True) for t in base)

    impls = [
        ("opslot cuda", lambda *ls: CLB.load_balancing_loss(tuple(ls), E, K)),
        ("opslot torch", lambda *ls: T.load_balancing_loss(tuple(ls), E, K)),
        ("upstream eager", lambda *ls: R.load_balancing_loss(tuple(ls), E, K)),
    ]
    if not args.no_compile:
        impls.append(("torch.compile(eager)", torch.compile(lambda *ls: R.load_balancing_loss(tuple(ls), E, K))))
    rows = [measure(n, lambda f=f: fwd_bwd(f, fresh()), lambda f=f: fwd_bwd(f, tiny)) for n, f in impls]
    det = tuple(base)
    rows.append(
        measure(
            "opslot cuda, forward only (logits read once)",
            lambda: lambda: CLB.load_balancing_loss(det, E, K),
            None,
            L * N * E * 2,
        )
    )
    if args.tune:  # the previous kernels and register budgets, side by side
        names = {
            (1, 1): "tile forward + general backward (the previous kernels)",
            (2, 1): "general forward + general backward",
            (0, 1): "warp forward + general backward",
        }
        with bench_library("load-balancing --tune") as lib:
            if lib is not None:
                set_tuning = knob(lib, "opslot_load_balancing_set_tuning", 2)
                try:
                    for (fp, bp), name in names.items():
                        set_tuning(fp, bp)
                        rows.append(
                            measure(
                                f"opslot cuda [{name}]",
                                lambda: fwd_bwd(lambda *ls: CLB.load_balancing_loss(tuple(ls), E, K), fresh()),
                                None,
                            )
                        )
                        rows.append(
                            measure(
                                "  its forward only",
                                lambda: lambda: CLB.load_balancing_loss(det, E, K),
                                None,
                                L * N * E * 2,
                            )
                        )
                finally:
                    set_tuning(0, 0)
    # bytes: logits read twice (forward, backward), gradient written once
    out.append(
        table(
            f"Load-balancing loss: {L} layers x {N} x {E} bf16, top-8 — bytes: logits read fwd + bwd, grads written",
            3 * L * N * E * 2,
            copy_bw,
            rows,
            "≤ 0.30 ms",
        )
    )
    if args.profile:
        kernel_breakdown(
            "load-balancing loss opslot cuda",
            fwd_bwd(lambda *ls: CLB.load_balancing_loss(tuple(ls), E, K), fresh()),
            out,
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="rms,rope,rope_interleaved,rope_vision,silu,lb")
    ap.add_argument(
        "--profile", action="store_true", help="also list the kernels of one call of each opslot op (torch.profiler)"
    )
    ap.add_argument(
        "--tune",
        action="store_true",
        help="also time the kernel variants behind the knobs (RMSNorm, RoPE, SiLU-mul, load-balancing; "
        "needs libopslot_kernels_bench.so, else those sweeps are skipped)",
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    out = []
    bw = copy_bandwidth()
    head = (
        f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; device-to-device copy "
        f"{bw / 1e12:.2f} TB/s (bytes read + written, 2 GiB bf16 copy, median)\n\n{libraries_line()}\n"
    )
    print(head, flush=True)
    out.append(head)
    steps = {
        "rms": bench_rms,
        "rope": bench_rope,
        "rope_interleaved": lambda bw, a, o: bench_rope_variants(bw, a, o, "interleaved"),
        "rope_vision": lambda bw, a, o: bench_rope_variants(bw, a, o, "vision"),
        "silu": bench_silu,
        "lb": bench_lb,
    }
    for key in args.only.split(","):
        steps[key](bw, args, out)
        torch.cuda.empty_cache()
        if args.out:
            with open(args.out, "w") as fh:
                fh.write("\n".join(out))


if __name__ == "__main__":
    main()
