#!/usr/bin/env python3
"""The kernel boundary's cost, as a user's eager step sees it (issue 30): per-call host cost of a
forward + backward on tiny tensors (the GPU waits for the host), and the user path at full size
(CUDA events around the Python call) beside the device-only time (the same call in a CUDA graph).

    OPSLOT_KERNELS_LIB=.../libopslot_kernels.so python3 bench/host_cost.py --out $OUT

Rows, each measured side by side in one process:
- host cost, fwd+bwd, tiny tensors: wall time per call, median of --rounds rounds of --calls calls
  (synchronised before and after each round): opslot `cuda`, torch's native op (F.rms_norm; for
  SiLU-mul `F.silu(g) * u`), the eager math upstream runs (Qwen3RMSNorm's body; rotate_half RoPE;
  Qwen3-MoE's load_balancing_loss_func), and Liger when `liger_kernel` imports;
- user path at full size: RMSNorm 16384 x 4096 bf16 and the load-balancing loss over 48 layers of
  [16384, 128] router logits (bf16 and fp32), fwd+bwd (gradients returned by autograd.grad, not
  accumulated into .grad), CUDA events around the Python call (median), and the same call
  captured in a CUDA graph (device only); beside the loss, the same 48 leaves through an
  autograd.Function that launches no kernel (what the autograd engine alone costs for 48 gradient
  edges) and through torch.cat + sum;
- the engine's cost per gradient edge: host time of `torch.autograd.grad` alone (forward outside the
  timing) over 1 and 48 tiny leaves, through that no-kernel Function (CUDA and CPU leaves) and
  through the load-balancing loss.
The target of issue 30 (host cost <= 1.5x F.rms_norm's) is printed against the measured ratio.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT / "runtime"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def host_cost(step: Callable[[], None], calls: int, rounds: int) -> float:
    """Microseconds of wall time per call (median over rounds)."""
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(per)


def backward_host(fwd: Callable[[], torch.Tensor], inputs: List[torch.Tensor], calls: int) -> float:
    """Microseconds of host time in `torch.autograd.grad` alone (the forward outside the timing),
    median over `calls` calls; the GPU is synchronised every 20 calls so it never backs up."""
    for _ in range(20):
        torch.autograd.grad(fwd(), inputs)
    torch.cuda.synchronize()
    per = []
    for i in range(calls):
        out = fwd()
        t = time.perf_counter()
        torch.autograd.grad(out, inputs)
        per.append((time.perf_counter() - t) * 1e6)
        if i % 20 == 19:
            torch.cuda.synchronize()
    return statistics.median(per)


def user_path(step: Callable[[], None], reps: int) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_time(step: Callable[[], None], reps: int) -> Optional[float]:
    """The step replayed from a CUDA graph; None when it cannot be captured (a host sync inside)."""
    try:
        return _graph_time(step, reps)
    except RuntimeError:
        torch.cuda.synchronize()
        return None


def _graph_time(step: Callable[[], None], reps: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return user_path(g.replay, reps)


def fwd_bwd(fn: Callable[..., Any], inputs: List[torch.Tensor], grads: Optional[List[torch.Tensor]] = None):
    def step():
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        # autograd.grad, not backward(): the gradients are returned, not added into .grad (which would
        # time an extra read-modify-write of every input per call, as no training step does after
        # zero_grad(set_to_none=True)).
        torch.autograd.grad(outs, inputs, grads if grads is not None else [torch.ones_like(o) for o in outs])

    return step


class _NoKernels(torch.autograd.Function):
    """n inputs, a scalar output, no kernel either way: what the engine alone costs per gradient edge."""

    @staticmethod
    def forward(ctx, grads, *xs):
        ctx.grads = grads
        return torch.empty((), device=xs[0].device)

    @staticmethod
    def backward(ctx, _):
        return (None,) + ctx.grads


def eager_rms(x, w, eps=1e-6):  # Qwen3RMSNorm.forward
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def eager_rope(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def liger():
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return LigerRMSNormFunction, LigerSiLUMulFunction
    except Exception:  # noqa: BLE001
        return None, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from opslot.kernels.cuda import load_balancing as lb_cuda, norms, rope, swiglu
    from opslot.reference import load_balancing_loss as eager_lb

    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    rn = lambda *s, dtype=dt: torch.randn(*s, device=dev, dtype=dtype, generator=g).requires_grad_()  # noqa: E731
    rows: List[Dict[str, Any]] = []
    lrms, lsilu = liger()

    x, w = rn(8, 256), rn(256)
    cases = {
        "RMSNorm [8, 256]": {
            "opslot cuda": fwd_bwd(lambda a, b: norms.rms_norm_standard(a, b, 1e-6), [x, w]),
            "torch native": fwd_bwd(lambda a, b: F.rms_norm(a, (256,), b, 1e-6), [x, w]),
            "eager math": fwd_bwd(eager_rms, [x, w]),
            "Liger": fwd_bwd(lambda a, b: lrms.apply(a, b, 1e-6), [x, w]) if lrms else None,
        },
    }
    gt, up = rn(8, 512), rn(8, 512)
    cases["SiLU·mul [8, 512]"] = {
        "opslot cuda": fwd_bwd(swiglu.silu_mul, [gt, up]),
        "torch native": fwd_bwd(lambda a, b: F.silu(a) * b, [gt, up]),
        "eager math": None,
        "Liger": fwd_bwd(lambda a, b: lsilu.apply(a, b), [gt, up]) if lsilu else None,
    }
    q, k = rn(1, 4, 8, 64), rn(1, 2, 8, 64)
    cos = torch.randn(1, 8, 64, device=dev, dtype=dt, generator=g)
    sin = torch.randn(1, 8, 64, device=dev, dtype=dt, generator=g)
    cases["RoPE q [1, 4, 8, 64]"] = {
        "opslot cuda": fwd_bwd(lambda a, b: rope.rotary_pos_emb_full(a, b, cos, sin), [q, k]),
        "torch native": None,
        "eager math": fwd_bwd(lambda a, b: eager_rope(a, b, cos, sin), [q, k]),
        "Liger": None,
    }
    logits = [rn(16, 8, dtype=torch.float32) for _ in range(4)]
    cases["load-balancing loss, 4 layers [16, 8]"] = {
        "opslot cuda": fwd_bwd(lambda *ls: lb_cuda.load_balancing_loss(tuple(ls), 8, 2), logits),
        "torch native": None,
        "eager math": fwd_bwd(lambda *ls: eager_lb(tuple(ls), 8, 2), logits),
        "Liger": None,
    }

    for name, impls in cases.items():
        row: Dict[str, Any] = {"case": name}
        for impl, step in impls.items():
            row[impl] = None if step is None else host_cost(step, args.calls, args.rounds)
        rows.append(row)
        print(json.dumps(row), flush=True)

    # The engine's cost per gradient edge: `torch.autograd.grad` alone over 1 and 48 tiny leaves,
    # through the no-kernel Function (CUDA and CPU leaves) and through the loss.
    edges: List[Dict[str, Any]] = []
    for n in (1, 48):
        for d in ("cuda", "cpu"):
            leaves = [torch.randn(16, 128, device=d, dtype=dt).requires_grad_() for _ in range(n)]
            grads0 = tuple(torch.zeros_like(t) for t in leaves)
            cases_e = [("autograd.Function, no kernel", lambda: _NoKernels.apply(grads0, *leaves))]
            if d == "cuda":
                cases_e.append(
                    ("opslot load-balancing loss", lambda: lb_cuda.load_balancing_loss(tuple(leaves), 128, 8))
                )
            for what, fwd_e in cases_e:
                edges.append(
                    {"edges": n, "device": d, "what": what, "us": backward_host(fwd_e, leaves, 5 * args.calls // 2)}
                )
                print(json.dumps(edges[-1]), flush=True)

    full: List[Dict[str, Any]] = []
    xb, wb = rn(16384, 4096), rn(4096)
    gy = torch.randn(16384, 4096, device=dev, dtype=dt, generator=g)
    for impl, fn in (
        ("opslot cuda", lambda a, b: norms.rms_norm_standard(a, b, 1e-6)),
        ("torch native", lambda a, b: F.rms_norm(a, (4096,), b, 1e-6)),
    ):
        step = fwd_bwd(fn, [xb, wb], [gy])
        full.append(
            {
                "case": "RMSNorm 16384x4096 bf16 fwd+bwd",
                "impl": impl,
                "user_ms": user_path(step, args.reps),
                "graph_ms": graph_time(step, args.reps),
            }
        )
        print(json.dumps(full[-1]), flush=True)
    del xb, gy
    # Router logits in the model's dtype (bf16: Qwen3-MoE's gate, bench/kernels.py's shape) and in fp32
    # (models whose router runs in fp32).
    for ldt, lname in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        big = [rn(16384, 128, dtype=ldt) for _ in range(48)]
        for impl, fn in (
            ("opslot cuda", lambda *ls: lb_cuda.load_balancing_loss(tuple(ls), 128, 8)),
            ("eager math", lambda *ls: eager_lb(tuple(ls), 128, 8)),
        ):
            step = fwd_bwd(fn, big)
            full.append(
                {
                    "case": f"load-balancing loss, 48 layers [16384, 128] {lname}, top 8",
                    "impl": impl,
                    "user_ms": user_path(step, args.reps),
                    "graph_ms": graph_time(step, args.reps),
                }
            )
            print(json.dumps(full[-1]), flush=True)
            if impl == "opslot cuda":  # where the host time goes: the forward alone (graph built)
                fwd = functools.partial(fn, *big)
                full.append(
                    {
                        "case": f"load-balancing loss, 48 layers [16384, 128] {lname}, top 8, forward only",
                        "impl": impl,
                        "user_ms": user_path(fwd, args.reps),
                        "graph_ms": graph_time(fwd, args.reps),
                    }
                )
                print(json.dumps(full[-1]), flush=True)
        # What the autograd engine alone costs for 48 gradient edges: the same leaves through an
        # autograd.Function that launches no kernel either way (its forward allocates the scalar
        # output, its backward returns gradients made before the timing). Then plain torch ops over
        # the same leaves (torch.cat + sum: their own kernels included).
        grads = tuple(torch.zeros_like(t) for t in big)
        floors = (
            (
                "48 leaves [16384, 128] {} through an autograd.Function that launches nothing (the engine's floor)",
                lambda *ls, g=grads: _NoKernels.apply(g, *ls),
            ),
            ("48 leaves [16384, 128] {} through torch.cat + sum", lambda *ls: torch.cat(ls).float().sum()),
        )
        for case, fn in floors:
            floor = fwd_bwd(fn, big)
            full.append(
                {
                    "case": case.format(lname),
                    "impl": "torch native",
                    "user_ms": user_path(floor, args.reps),
                    "graph_ms": graph_time(floor, args.reps),
                }
            )
            print(json.dumps(full[-1]), flush=True)
        del grads, floor
        del big

    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    impls = ["opslot cuda", "torch native", "eager math", "Liger"]
    lines = [
        "# Kernel boundary: host cost and user path (bench/host_cost.py)",
        "",
        f"- command: {' '.join(sys.argv)}",
        f"- commit {commit or '?'}; torch {torch.__version__}; "
        f"{torch.cuda.get_device_name(dev)}; {args.rounds} rounds x {args.calls} calls",
        "",
        "| per-call host cost, fwd+bwd (µs) | " + " | ".join(impls) + " | opslot / torch native |",
        "|---|" + "---|" * (len(impls) + 1),
    ]
    for r in rows:
        ratio = f"{r['opslot cuda'] / r['torch native']:.2f}x (target <= 1.5x)" if r.get("torch native") else "n/a"
        lines.append(
            f"| {r['case']} | " + " | ".join("n/a" if r[i] is None else f"{r[i]:.0f}" for i in impls) + f" | {ratio} |"
        )
    lines += [
        "",
        "| host µs in `torch.autograd.grad` alone, tiny [16, 128] leaves | 1 edge | 48 edges |",
        "|---|---|---|",
    ]
    for d, what in (
        ("cuda", "autograd.Function, no kernel"),
        ("cpu", "autograd.Function, no kernel"),
        ("cuda", "opslot load-balancing loss"),
    ):
        us = {e["edges"]: e["us"] for e in edges if e["device"] == d and e["what"] == what}
        lines.append(f"| {what}, {d} leaves | {us[1]:.0f} | {us[48]:.0f} |")
    lines += [
        "",
        "| full size | impl | user path ms (CUDA events) | device only ms (CUDA graph) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {f['case']} | {f['impl']} | {f['user_ms']:.3f} | "
        + ("not capturable (host sync)" if f["graph_ms"] is None else f"{f['graph_ms']:.3f}")
        + " |"
        for f in full
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_cost.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "host_cost.json").write_text(
        json.dumps({"host": rows, "edges": edges, "full": full}, indent=1), encoding="utf-8"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
