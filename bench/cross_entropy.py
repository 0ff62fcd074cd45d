"""lm_head + causal-LM loss, forward + backward, on one GPU: upstream eager, opslot torch,
opslot torch_chunked, Liger's LigerFusedLinearCrossEntropyLoss, opslot cuda; with the GEMM-only
floor (the three cuBLAS GEMMs of the same shapes) timed in the same run.

    OPSLOT_KERNELS_LIB=.../libopslot_kernels.so python3 bench/cross_entropy.py --out DIR

Definitions (also written into the tables):
- time: median of --iters fwd+bwd steps (`loss = f(...)`, `torch.autograd.grad(loss, [h, W])`),
  CUDA events around each step, after --warmup steps and one memory-measuring step.
- extra peak: `torch.cuda.max_memory_allocated()` during one step minus `memory_allocated()`
  before it (inputs and weights excluded). The step ends holding the gradients of the hidden
  states and of the weight, so this INCLUDES them; "extra excl. grads" subtracts their size
  ((N + V) * H * 2 bytes in bf16), the memory every implementation must hand back.
- GEMM floor: logits = h @ W^T, dh = dlogits @ W, dW = dlogits^T @ h, bf16 cuBLAS (torch.mm),
  full size, no loss math: 3 * 2 * N * H * V FLOP.
Upstream keeps its bf16 logits alive until after backward (HF returns them in the model output).
"""

import argparse
import json
import os
import statistics
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))

from opslot import reference  # noqa: E402
from opslot.kernels import fused_ce, torch_ops  # noqa: E402
from opslot.kernels.cuda import cross_entropy as ce  # noqa: E402

try:
    from transformers.loss.loss_utils import ForCausalLMLoss as _UPSTREAM_LOSS

    UPSTREAM_NAME = "upstream (transformers ForCausalLMLoss)"
except Exception:  # noqa: BLE001
    _UPSTREAM_LOSS = reference.for_causal_lm_loss
    UPSTREAM_NAME = "upstream (reference.for_causal_lm_loss)"

GiB = float(1 << 30)


def make_module(weight, vocab):
    head = nn.Linear(weight.shape[1], vocab, bias=False, device="meta", dtype=weight.dtype)
    head.weight = weight
    return types.SimpleNamespace(
        lm_head=head, config=types.SimpleNamespace(vocab_size=vocab, final_logit_softcapping=None)
    )


def impls(vocab):
    out = {}

    def upstream(module, h, labels):
        logits = module.lm_head(h)
        return _UPSTREAM_LOSS(logits, labels, vocab_size=vocab), logits

    out["upstream"] = upstream
    out["opslot torch"] = lambda m, h, lab: torch_ops.cross_entropy_causal(m, h, lab)[::-1]
    out["opslot torch_chunked"] = lambda m, h, lab: (fused_ce.cross_entropy_causal_chunked(m, h, lab)[1], None)
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()

        def liger_fn(module, h, labels):
            shift = F.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
            return liger(module.lm_head.weight, h.reshape(-1, h.shape[-1]), shift), None

        out["Liger FLCE"] = liger_fn
    except Exception as exc:  # noqa: BLE001
        print(f"Liger not available: {exc}")
    out["opslot cuda"] = lambda m, h, lab: (ce.cross_entropy_causal(m, h, lab)[1], None)
    return out


def step(fn, module, h, labels):
    loss, keep = fn(module, h, labels)
    gh, gw = torch.autograd.grad(loss, [h, module.lm_head.weight])
    del keep
    return loss, gh, gw


def measure(fn, module, h, labels, iters, warmup):
    for _ in range(warmup):
        out = step(fn, module, h, labels)
        del out
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = step(fn, module, h, labels)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = step(fn, module, h, labels)
        b.record()
        del out
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), peak


def gemm_floor(h, weight, iters):
    n, v = h.shape[0], weight.shape[0]
    logits = torch.empty(n, v, dtype=h.dtype, device=h.device)
    gh = torch.empty_like(h)
    gw = torch.empty_like(weight)
    per = [[], [], [], []]
    for i in range(iters + 1):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        ev[0].record()
        torch.mm(h, weight.t(), out=logits)
        ev[1].record()
        torch.mm(logits, weight, out=gh)
        ev[2].record()
        torch.mm(logits.t(), h, out=gw)
        ev[3].record()
        ev[3].synchronize()
        if i:
            for k in range(3):
                per[k].append(ev[k].elapsed_time(ev[k + 1]))
            per[3].append(ev[0].elapsed_time(ev[3]))
    del logits, gh, gw
    return [statistics.median(p) for p in per]


def rows_kernel_bandwidth(chunk, vocab, iters=10):
    """The fused softmax/loss/gradient kernel alone on one [chunk, V] bf16 tile (2 reads + 1 write)."""
    tile = torch.randn(chunk, vocab, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, vocab, (chunk,), device="cuda")
    scale = torch.ones((), device="cuda")
    loss = torch.empty(chunk, device="cuda")
    ts = []
    for i in range(iters + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        ce._backend.rows(tile, tile, targets, -100, scale, loss)
        b.record()
        b.synchronize()
        if i:
            ts.append(a.elapsed_time(b))
    ms = statistics.median(ts)
    return ms, 3 * tile.numel() * 2 / (ms * 1e-3) / 1e12


def accuracy(module, h, labels, names_fns, vocab):
    """Relative Frobenius errors of grad_hidden / grad_weight and the loss error vs an fp32 reference."""
    w32 = module.lm_head.weight.detach().float().requires_grad_(True)
    h32 = h.detach().float().requires_grad_(True)
    logits = F.linear(h32, w32)
    ref = reference.for_causal_lm_loss(logits, labels, vocab_size=vocab)
    rgh, rgw = torch.autograd.grad(ref, [h32, w32])
    del logits, w32, h32
    torch.cuda.empty_cache()
    rows = []
    for name, fn in names_fns:
        try:
            loss, gh, gw = step(fn, module, h, labels)
            err = lambda a, b: ((a.float() - b).norm() / b.norm()).item()  # noqa: E731
            rows.append((name, abs(loss.item() - ref.item()), err(gh, rgh), err(gw, rgw)))
            del loss, gh, gw
        except torch.cuda.OutOfMemoryError:
            rows.append((name, None, None, None))
        torch.cuda.empty_cache()
    return ref.item(), rows


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="16384,4096,65536")
    ap.add_argument("--vocab", default="151936,262208")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--sweep", default="1024,2048,2816,3072,4096", help="cuda chunk sizes at 16k x first vocab")
    ap.add_argument(
        "--full-tokens",
        default=None,
        help="token counts at which every implementation runs (default: all); others: floor + opslot cuda",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.get_device_name()
    H = args.hidden
    results = {
        "device": dev,
        "torch": torch.__version__,
        "hidden": H,
        "runs": [],
        "sweep": [],
        "accuracy": None,
        "rows_kernel": None,
        "command": " ".join(sys.argv),
    }
    md_path = os.path.join(args.out, "cross_entropy_bench.md")

    def write():
        with open(os.path.join(args.out, "cross_entropy_bench.json"), "w") as f:
            json.dump(results, f, indent=1)
        lines = [
            f"# lm_head + causal-LM loss, fwd+bwd ({dev}, torch {torch.__version__}, bf16, hidden {H})",
            "",
            "time: median of %d steps (CUDA events); extra peak = max_memory_allocated during one step - "
            "memory_allocated before (includes the returned grad_hidden + grad_weight); excl. grads = minus "
            "their (N+V)*H*2 bytes. Floor = the three full-size bf16 cuBLAS GEMMs alone." % args.iters,
            "",
            "| tokens | vocab | implementation | time ms | vs floor | extra peak GiB | extra excl. grads GiB |",
            "|---:|---:|---|---:|---:|---:|---:|",
        ]
        for r in results["runs"]:
            lines.append(
                f"| {r['tokens']} | {r['vocab']} | {r['impl']} | {fmt(r['ms'], '.1f')} | "
                f"{fmt(r.get('x_floor'), '.2f')} | {fmt(r['peak_gib'], '.2f')} | {fmt(r['excl_gib'], '.2f')} |"
                + (f" {r['note']}" if r.get("note") else "")
            )
        if results["sweep"]:
            lines += [
                "",
                "## opslot cuda: chunk size (16k tokens)",
                "",
                "| chunk | time ms | extra excl. grads GiB |",
                "|---:|---:|---:|",
            ]
            for s in results["sweep"]:
                lines.append(f"| {s['chunk']} | {fmt(s['ms'], '.1f')} | {fmt(s['excl_gib'], '.2f')} |")
        if results["rows_kernel"]:
            rk = results["rows_kernel"]
            lines += [
                "",
                f"fused rows kernel alone on a [{rk['chunk']}, {rk['vocab']}] bf16 tile: {rk['ms']:.3f} ms, "
                f"{rk['tbs']:.2f} TB/s effective (2 reads + 1 write)",
            ]
        if results["accuracy"]:
            acc = results["accuracy"]
            lines += [
                "",
                f"## Accuracy vs fp32 reference ({acc['tokens']} tokens, vocab {acc['vocab']}, "
                f"ref loss {acc['ref_loss']:.6f})",
                "",
                "| implementation | abs loss err | rel err grad_hidden | rel err grad_weight |",
                "|---|---:|---:|---:|",
            ]
            for name, le, eh, ew in acc["rows"]:
                lines.append(f"| {name} | {fmt(le, '.2e')} | {fmt(eh, '.3e')} | {fmt(ew, '.3e')} |")
        with open(md_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)

    tokens_list = [int(x) for x in args.tokens.split(",")]
    vocab_list = [int(x) for x in args.vocab.split(",")]
    for n in tokens_list:
        for v in vocab_list:
            t0 = time.time()
            g = torch.Generator(device="cuda").manual_seed(0)
            weight = nn.Parameter((torch.randn(v, H, device="cuda", generator=g) * 0.02).to(torch.bfloat16))
            module = make_module(weight, v)
            h = torch.randn(1, n, H, device="cuda", generator=g).to(torch.bfloat16).requires_grad_(True)
            labels = torch.randint(0, v, (1, n), device="cuda", generator=g)
            grads = (n + v) * H * 2
            try:
                fl = gemm_floor(h.detach().reshape(n, H), weight.detach(), args.iters)
                floor = fl[3]
                results["runs"].append(
                    {
                        "tokens": n,
                        "vocab": v,
                        "impl": "GEMM floor (3 cuBLAS GEMMs)",
                        "ms": floor,
                        "peak_gib": None,
                        "excl_gib": None,
                        "gemm_ms": fl[:3],
                        "note": "(%.1f + %.1f + %.1f ms; %.0f TFLOP/s)"
                        % (fl[0], fl[1], fl[2], 6 * n * H * v / (floor * 1e-3) / 1e12),
                    }
                )
            except torch.cuda.OutOfMemoryError:
                floor = None
            torch.cuda.empty_cache()
            full = args.full_tokens is None or n in [int(x) for x in args.full_tokens.split(",")]
            for name, fn in impls(v).items():
                if not full and name != "opslot cuda":
                    continue
                try:
                    ms, peak = measure(fn, module, h, labels, args.iters, args.warmup)
                    row = {
                        "tokens": n,
                        "vocab": v,
                        "impl": name,
                        "ms": ms,
                        "peak_gib": peak / GiB,
                        "excl_gib": (peak - grads) / GiB,
                        "x_floor": ms / floor if floor else None,
                    }
                except torch.cuda.OutOfMemoryError:
                    row = {
                        "tokens": n,
                        "vocab": v,
                        "impl": name,
                        "ms": None,
                        "peak_gib": None,
                        "excl_gib": None,
                        "note": "OOM (does not fit in GPU memory)",
                    }
                except Exception as exc:  # noqa: BLE001
                    row = {
                        "tokens": n,
                        "vocab": v,
                        "impl": name,
                        "ms": None,
                        "peak_gib": None,
                        "excl_gib": None,
                        "note": f"failed: {type(exc).__name__}: {str(exc)[:120]}",
                    }
                results["runs"].append(row)
                torch.cuda.empty_cache()
            if n == 16384 and v == vocab_list[0]:
                if args.sweep:
                    for c in [int(x) for x in args.sweep.split(",")]:
                        fn = lambda m, hh, lab, c=c: (ce.cross_entropy_causal(m, hh, lab, chunk_size=c)[1], None)  # noqa: E731
                        try:
                            ms, peak = measure(fn, module, h, labels, args.iters, args.warmup)
                            results["sweep"].append({"chunk": c, "ms": ms, "excl_gib": (peak - grads) / GiB})
                        except Exception as exc:  # noqa: BLE001
                            results["sweep"].append({"chunk": c, "ms": None, "excl_gib": None, "err": str(exc)[:100]})
                        torch.cuda.empty_cache()
                    # forward only (no autograd): one GEMM + the statistics pass per chunk
                    with torch.no_grad():
                        ts = []
                        for i in range(args.iters + 1):
                            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            a.record()
                            ce.cross_entropy_causal(module, h, labels)
                            b.record()
                            b.synchronize()
                            if i:
                                ts.append(a.elapsed_time(b))
                    results["runs"].append(
                        {
                            "tokens": n,
                            "vocab": v,
                            "impl": "opslot cuda, forward only (no_grad)",
                            "ms": statistics.median(ts),
                            "peak_gib": None,
                            "excl_gib": None,
                        }
                    )
                    chunk = ce.default_chunk_size(n, v, 2)
                    ms, tbs = rows_kernel_bandwidth(chunk, v)
                    results["rows_kernel"] = {"chunk": chunk, "vocab": v, "ms": ms, "tbs": tbs}
                    torch.cuda.empty_cache()
                try:
                    ref_loss, rows = accuracy(module, h, labels, list(impls(v).items()), v)
                    results["accuracy"] = {"tokens": n, "vocab": v, "ref_loss": ref_loss, "rows": rows}
                except torch.cuda.OutOfMemoryError:
                    pass
                torch.cuda.empty_cache()
            del weight, module, h, labels
            torch.cuda.empty_cache()
            print(f"[{n} x {v}] done in {time.time() - t0:.1f} s", flush=True)
            write()
    write()


if __name__ == "__main__":
    main()
