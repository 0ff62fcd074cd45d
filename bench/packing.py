#!/usr/bin/env python3
"""Packed (padding-free) training against padded batches, on a fixed, recorded length distribution:
real (non-pad) tokens per second and peak memory of a training step, per model, in one process.

    OPSLOT_KERNELS_LIB=.../libopslot_kernels.so python3 bench/packing.py --patchgen .device-bin/patchgen \
        --models qwen3,qwen3_5 --out $OUT
    .venv/bin/python bench/packing.py --device cpu --tiny --models qwen3 --out /tmp/pk     # CPU check

Models: bench/train_step.py's (the 4-layer Qwen3 / Qwen3.5 of docs/benchmarks.md), bf16, generated
with opslot's defaults (every slot on its `cuda` kernel), train mode, use_cache=False.

Length distribution (`--seed`, recorded in the output): document lengths drawn log-uniformly from
[--min-len, --max-len] (128-8192), filled into steps of exactly --tokens (16384) real tokens (the
last document of a step is cut to fit); --steps distinct steps, cycled.

Rows per model (the same documents and weights in each):
- padded, sdpa: each step's documents as one batch padded to its longest document (right padding,
  attention_mask, labels -100 on pads): what training without packing does;
- packed, sdpa: one row of --tokens tokens, position ids restarting per document, no mask: Transformers
  turns the restarts into a dense block-diagonal mask (the row squared);
- packed, opslot_varlen: the same row through `attn_implementation="opslot_varlen"` (PyTorch's
  variable-length FlashAttention; document boundaries found once per step by opslot.packing).
A step is `loss = model(**batch).loss; loss.backward()` timed with CUDA events around the Python call
(the user path; the packed rows synchronise once per step to find the documents, so there is no
CUDA-graph timing of the step). tokens/s counts real tokens only.

Attention alone (the part packing changes), at the first step's documents with the full-attention
layer's heads: `varlen_attn` forward + backward, against the tensor-core bound of the FLOPs the
documents need (causal: 2 * 2 * L^2/2 * H * D per document forward, x 2.5 for forward + backward),
taken at the bf16 GEMM rate measured in the same run; timed in a CUDA graph (device only) and with
CUDA events around the call (user path); beside it sdpa over the block-diagonal mask and over the
padded batch.
"""

from __future__ import annotations

import os

os.environ.setdefault("USE_HUB_KERNELS", "0")

import argparse  # noqa: E402
import copy  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("train_step", ROOT / "bench" / "train_step.py")
ts = importlib.util.module_from_spec(_spec)
sys.modules["train_step"] = ts  # its dataclasses look their module up
_spec.loader.exec_module(ts)  # sets sys.path (runtime/ first, bench/ out) and USE_HUB_KERNELS

import torch  # noqa: E402

GiB = float(1 << 30)


def draw_steps(seed: int, steps: int, tokens: int, lo: int, hi: int) -> List[List[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        lengths: List[int] = []
        while sum(lengths) < tokens:
            n = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
            lengths.append(min(n, tokens - sum(lengths)))
        out.append(lengths)
    return out


def batches(lengths: List[int], vocab: int, device, seed: int) -> Dict[str, Dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    ids = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    labels = ids.clone()
    labels[pos == 0] = -100  # the collator's labels: no target across a boundary
    width = max(lengths)
    padded = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(padded)
    plabels = torch.full_like(padded, -100)
    for i, d in enumerate(docs):
        padded[i, : len(d)] = d
        mask[i, : len(d)] = 1
        plabels[i, 1 : len(d)] = d[1:]
    dev = lambda t: t.to(device)  # noqa: E731
    return {
        "packed": dict(input_ids=dev(ids), position_ids=dev(pos), labels=dev(labels), use_cache=False),
        "padded": dict(input_ids=dev(padded), attention_mask=dev(mask), labels=dev(plabels), use_cache=False),
    }


ROWS = [
    ("padded, sdpa", "padded", "sdpa"),
    ("packed, sdpa", "packed", "sdpa"),
    ("packed, opslot_varlen", "packed", "opslot_varlen"),
]


def measure(model, steps: List[Dict[str, Any]], device, warmup: int, iters: int) -> Dict[str, Any]:
    def step(batch):
        loss = model(**batch).loss
        loss.backward()
        return loss.detach()

    for i in range(warmup):
        model.zero_grad(set_to_none=True)
        step(steps[i % len(steps)])
    ts.sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for i in range(iters):
        model.zero_grad(set_to_none=True)
        batch = steps[i % len(steps)]
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            loss = step(batch)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            loss = step(batch)
            times.append((time.perf_counter() - t) * 1e3)
        losses.append(float(loss))
    peak = torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else None
    model.zero_grad(set_to_none=True)
    return dict(
        ms=statistics.median(times), ms_min=min(times), ms_max=max(times), peak_gib=peak, loss=statistics.mean(losses)
    )


def attention_alone(lengths: List[int], heads: int, kv_heads: int, dim: int, device, reps: int) -> Dict[str, Any]:
    """varlen_attn fwd+bwd (CUDA graph and user path) vs its tensor-core bound; sdpa block mask and padded."""
    from torch.nn.attention.varlen import varlen_attn

    dt = torch.bfloat16
    total = sum(lengths)
    flops = sum(2 * 2 * n * n / 2 * heads * dim for n in lengths) * 3.5  # fwd 1 + bwd 2.5
    a = torch.randn(8192, 8192, device=device, dtype=dt)
    gemm = time_it(lambda: a @ a, reps) / 1e3
    rate = 2 * 8192**3 / gemm
    q = torch.randn(total, heads, dim, device=device, dtype=dt, requires_grad=True)
    k = torch.randn(total, kv_heads, dim, device=device, dtype=dt, requires_grad=True)
    v = torch.randn(total, kv_heads, dim, device=device, dtype=dt, requires_grad=True)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=device, dtype=torch.int32)
    grad = torch.randn(total, heads, dim, device=device, dtype=dt)

    def varlen():
        out = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), window_size=(-1, 0))
        torch.autograd.grad(out, (q, k, v), grad)

    user = time_it(varlen, reps)
    graph = time_graph(varlen, reps)
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    block = (seg[:, None] == seg[None, :]) & torch.ones(total, total, device=device, dtype=torch.bool).tril()
    qb, kb, vb = (t.detach().transpose(0, 1)[None].requires_grad_() for t in (q, k, v))
    gb = grad.transpose(0, 1)[None]

    def masked():
        out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=block, enable_gqa=True)  # noqa: F821
        torch.autograd.grad(out, (qb, kb, vb), gb)

    sdpa_block = time_it(masked, max(3, reps // 4))
    del block
    width = max(lengths)
    qp = torch.randn(len(lengths), heads, width, dim, device=device, dtype=dt, requires_grad=True)
    kp = torch.randn(len(lengths), kv_heads, width, dim, device=device, dtype=dt, requires_grad=True)
    vp = torch.randn_like(kp, requires_grad=True)
    pad = torch.zeros(len(lengths), 1, 1, width, device=device, dtype=torch.bool)
    for i, n in enumerate(lengths):
        pad[i, ..., :n] = True
    pmask = pad & torch.ones(width, width, device=device, dtype=torch.bool).tril()

    def padded():
        out = torch.nn.functional.scaled_dot_product_attention(qp, kp, vp, attn_mask=pmask, enable_gqa=True)
        torch.autograd.grad(out, (qp, kp, vp), torch.ones_like(out))

    sdpa_pad = time_it(padded, max(3, reps // 4))
    bound = flops / rate * 1e3
    return dict(
        flops=flops,
        gemm_tflops=rate / 1e12,
        bound_ms=bound,
        varlen_graph_ms=graph,
        varlen_user_ms=user,
        varlen_fraction=bound / graph,
        sdpa_block_ms=sdpa_block,
        sdpa_padded_ms=sdpa_pad,
    )


def time_it(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_graph(fn, reps: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_it(graph.replay, reps)


def run_model(mdef, args, device, dtype, steps: List[List[int]], out: Dict[str, Any]) -> None:
    from opslot import build_model

    config = ts.make_config(mdef, args.tiny)
    gen = ts.generate_and_import(mdef, args.patchgen, args.source_root, Path(args.gen_dir))
    torch.manual_seed(args.seed)
    ref = ts.construct(
        lambda: build_model(
            copy.deepcopy(config), ops={"attn_implementation": "sdpa"}, module=gen, model_class=mdef.causal_lm
        ),
        device,
        dtype,
    )
    state = {k: v.detach().to("cpu", copy=True) for k, v in ref.state_dict().items()}
    del ref
    ts.free(device)
    data = [batches(lengths, config.vocab_size, device, args.seed + i) for i, lengths in enumerate(steps)]
    entry: Dict[str, Any] = dict(model=mdef.key, config=ts.recorded_config(config), rows=[])
    out["models"].append(entry)
    for name, layout, attn in ROWS:
        row: Dict[str, Any] = dict(name=name)
        model = None
        try:
            model = ts.construct(
                lambda: build_model(
                    copy.deepcopy(config), ops={"attn_implementation": attn}, module=gen, model_class=mdef.causal_lm
                ),
                device,
                dtype,
            )
            model.load_state_dict(state, strict=True)
            row["kernels"] = ts.plan_summary(model)[0]
            ts.free(device)
            row.update(measure(model, [d[layout] for d in data], device, args.warmup, args.iters))
            row["real_tokens_per_s"] = args.tokens / (row["ms"] * 1e-3)
        except Exception as exc:  # noqa: BLE001
            row["error"] = ts.row_error(exc, device)
            traceback.print_exc()
        del model
        ts.free(device)
        entry["rows"].append(row)
        print(json.dumps(row), flush=True)
    by = {r["name"]: r for r in entry["rows"]}
    if all("ms" in by.get(n, {}) for n, _, _ in ROWS):
        v = by["packed, opslot_varlen"]["real_tokens_per_s"]
        entry["speedup_vs_packed_sdpa"] = v / by["packed, sdpa"]["real_tokens_per_s"]
        entry["speedup_vs_padded"] = v / by["padded, sdpa"]["real_tokens_per_s"]
    if device.type == "cuda" and not args.tiny:
        try:
            entry["attention_alone"] = attention_alone(
                steps[0],
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                device,
                args.attn_reps,
            )
        except Exception as exc:  # noqa: BLE001
            entry["attention_alone"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(json.dumps(entry["attention_alone"]), flush=True)


def write(out: Dict[str, Any], path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "packing.json").write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    lines = [
        f"# {out['title']}",
        "",
        *[f"- {h}" for h in out["header"]],
        "",
        "| model | rows | step ms (median, min-max) | real tokens/s | peak GiB | loss |",
        "|---|---|---|---|---|---|",
    ]
    for m in out["models"]:
        for r in m["rows"]:
            if "error" in r:
                lines.append(f"| {m['model']} | {r['name']} | FAILED: {r['error']} | | | |")
            else:
                peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
                lines.append(
                    f"| {m['model']} | {r['name']} | {r['ms']:.1f} ({r['ms_min']:.1f}-{r['ms_max']:.1f}) | "
                    f"{r['real_tokens_per_s']:,.0f} | {peak} | {r['loss']:.4f} |"
                )
    for m in out["models"]:
        if "speedup_vs_packed_sdpa" in m:
            lines.append(
                f"\n{m['model']}: opslot_varlen real tokens/s = {m['speedup_vs_packed_sdpa']:.2f}x packed sdpa, "
                f"{m['speedup_vs_padded']:.2f}x padded sdpa"
            )
        if "attention_alone" in m:
            lines.append(f"{m['model']} attention alone: " + json.dumps(m["attention_alone"]))
    (path / "packing.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3,qwen3_5")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="bench/train_step.py's tiny configs, 512 tokens per step")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--min-len", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=4, help="distinct steps of documents, cycled")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=4, help="steps before timing (default: one per distinct step)")
    ap.add_argument("--attn-reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--patchgen", default=ts.default_patchgen())
    ap.add_argument("--source-root", default=None)
    ap.add_argument("--gen-dir", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.tiny:
        args.tokens, args.min_len, args.max_len = 512, 8, 256
    args.source_root = args.source_root or ts.site_packages()
    args.gen_dir = args.gen_dir or tempfile.mkdtemp(prefix="bench-packing-")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    steps = draw_steps(args.seed, args.steps, args.tokens, args.min_len, args.max_len)
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    out: Dict[str, Any] = dict(
        title="Packed vs padded training steps (bench/packing.py)",
        models=[],
        header=[
            f"command: {' '.join(sys.argv)}",
            f"commit {commit or '?'}; torch {torch.__version__}; "
            f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}",
            f"{args.tokens} real tokens per step; lengths log-uniform in [{args.min_len}, {args.max_len}], seed {args.seed}; "
            f"steps (documents): {steps}",
        ],
    )
    for key in args.models.split(","):
        try:
            run_model(ts.MODELS[key], args, device, dtype, steps, out)
        except Exception as exc:  # noqa: BLE001
            out["models"].append(dict(model=key, rows=[], error=f"{type(exc).__name__}: {exc}"))
            traceback.print_exc()
        write(out, Path(args.out))
    print((Path(args.out) / "packing.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
