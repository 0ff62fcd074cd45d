#!/usr/bin/env python3
"""Peak extra GPU memory and time of the chunked fused linear + cross-entropy vs eager.

eager:   logits = hidden @ W.T (bf16) -> .float() -> F.cross_entropy -> backward  (what HF does)
chunked: opslot's torch_chunked kernel (fused_ce.chunked_linear_cross_entropy), never materialising logits

Both run forward + backward on CUDA at M tokens, hidden size H, vocabulary V (default: M 16384,
H 4096, V 151936, bf16). "Peak extra" is the peak allocated memory during one forward+backward
minus what was allocated before it (inputs and weights); it includes the gradients of the hidden
states and of the weight, which both methods must produce. Time is the median of --repeats timed
runs after one warm-up. Usage:

    python3 bench/fused_ce_memory.py --csv fused_ce.csv
"""

import argparse
import csv
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
from opslot.kernels.fused_ce import chunked_linear_cross_entropy, tokens_per_chunk  # noqa: E402

GIB = 1024**3


def eager(hidden, weight, labels):
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float(), labels, ignore_index=-100)


def chunked(chunk_size=None, fp32_weight_grad=True):
    def run(hidden, weight, labels):
        return chunked_linear_cross_entropy(
            hidden, weight, None, labels, ignore_index=-100, chunk_size=chunk_size, fp32_weight_grad=fp32_weight_grad
        )

    return run


def measure(name, fn, hidden, weight, labels, repeats):
    times, peak, loss = [], None, None
    for i in range(repeats + 1):
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(hidden, weight, labels)
        out.backward()
        end.record()
        torch.cuda.synchronize()
        if i == 0:  # warm-up: record memory, not time
            peak = (torch.cuda.max_memory_allocated() - base) / GIB
            loss = float(out.detach())
        else:
            times.append(start.elapsed_time(end))
        del out
    grads = (hidden.grad.detach().clone(), weight.grad.detach().clone())
    return {"impl": name, "peak_extra_gib": peak, "time_ms": statistics.median(times), "loss": loss}, grads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ignore-fraction", type=float, default=0.1, help="share of labels set to -100")
    ap.add_argument("--csv", help="write the table here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fused_ce_memory.py needs a CUDA GPU")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    torch.manual_seed(0)
    dev = "cuda"
    hidden = (torch.randn(args.tokens, args.hidden, device=dev) * 0.5).to(dtype).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, device=dev) * args.hidden**-0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), device=dev)
    labels[torch.rand(args.tokens, device=dev) < args.ignore_fraction] = -100

    chunk = tokens_per_chunk(args.tokens, args.hidden, args.vocab)
    variants = [
        ("eager", eager, ""),
        ("torch_chunked", chunked(), chunk),  # what the registered kernel runs
        ("chunked_4x_chunk", chunked(chunk_size=4 * chunk), 4 * chunk),
        ("chunked_bf16_wgrad", chunked(fp32_weight_grad=False), chunk),
    ]
    rows, ref = [], None
    for name, fn, chunk_tokens in variants:
        row, grads = measure(name, fn, hidden, weight, labels, args.repeats)
        if ref is None:
            ref = grads
        row["grad_hidden_maxdiff"] = float((grads[0].float() - ref[0].float()).abs().max())
        row["grad_weight_maxdiff"] = float((grads[1].float() - ref[1].float()).abs().max())
        row["chunk_tokens"] = chunk_tokens
        rows.append(row)
        del grads
    grad_bytes = (hidden.numel() + weight.numel()) * hidden.element_size() / GIB
    for row in rows:
        row.update(
            tokens=args.tokens,
            hidden=args.hidden,
            vocab=args.vocab,
            dtype=args.dtype,
            grads_gib=round(grad_bytes, 3),
            device=torch.cuda.get_device_name(),
            torch=torch.__version__,
        )

    print(
        f"M={args.tokens} H={args.hidden} V={args.vocab} {args.dtype} on {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}; gradients themselves: {grad_bytes:.2f} GiB; diffs are against eager"
    )
    print(f"{'impl':<20}{'chunk':>7}{'peak extra GiB':>16}{'fwd+bwd ms':>12}{'loss':>12}{'dgrad_h':>10}{'dgrad_w':>10}")
    for r in rows:
        print(
            f"{r['impl']:<20}{r['chunk_tokens']!s:>7}{r['peak_extra_gib']:>16.2f}{r['time_ms']:>12.1f}"
            f"{r['loss']:>12.5f}{r['grad_hidden_maxdiff']:>10.1e}{r['grad_weight_maxdiff']:>10.1e}"
        )
    if args.csv:
        fields = [
            "impl",
            "tokens",
            "hidden",
            "vocab",
            "dtype",
            "chunk_tokens",
            "peak_extra_gib",
            "grads_gib",
            "time_ms",
            "loss",
            "grad_hidden_maxdiff",
            "grad_weight_maxdiff",
            "device",
            "torch",
        ]
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for r in rows:
                w.writerow({k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in r.items() if k in fields})


if __name__ == "__main__":
    main()
