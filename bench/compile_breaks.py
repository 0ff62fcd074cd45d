#!/usr/bin/env python3
"""Why `torch.compile(model)` of a generated model is slower or faster than the same model eager:
graph breaks (torch._dynamo.explain) and the CUDA kernels of one eager and one compiled training step
(torch.profiler), side by side (issue 30, item 4).

    OPSLOT_KERNELS_LIB=.../libopslot_kernels.so python3 bench/compile_breaks.py --models qwen3 --out $OUT

Model shapes, weights and batch are bench/train_step.py's (`--tiny` for a CPU check); the model is the
generated one built by `opslot.build_model` with opslot's defaults (attention sdpa). Writes
compile_breaks.md: the graph and break counts with each distinct break reason, then per step the
CUDA time and launches per kernel (top --top by total time) and the totals, eager beside compiled,
and the arguments of the attention ops (dims, strides, scalars) each way.
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

# bench/train_step.py (model definitions, generation, batches), loaded by path: bench/ itself must not
# be on sys.path (bench/kernels.py would shadow the `kernels` package transformers probes for).
_spec = importlib.util.spec_from_file_location("train_step", Path(__file__).resolve().parent / "train_step.py")
ts = importlib.util.module_from_spec(_spec)
sys.modules["train_step"] = ts
_spec.loader.exec_module(ts)

import torch  # noqa: E402


def step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach()


def kernel_times(model, batch, device: torch.device) -> Tuple[Dict[str, float], Dict[str, int], List[str], float]:
    """(CUDA µs per kernel name, launches per kernel name, the attention ops' arguments, wall ms) of one
    step under the profiler. The arguments (dims, strides, scalars) of every aten op whose name holds
    "attention" come from the profiler's trace (record_shapes), one line per distinct argument set."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    ts.sync(device)
    t = time.perf_counter()
    with profile(activities=activities, record_shapes=True) as prof:
        step(model, batch)
        ts.sync(device)
    wall = (time.perf_counter() - t) * 1e3
    per: Dict[str, float] = collections.defaultdict(float)
    count: Dict[str, int] = collections.defaultdict(int)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name] += e.device_time
            count[e.name] += 1
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text(encoding="utf-8")).get("traceEvents", [])
    calls: Dict[str, int] = collections.Counter()
    for ev in events:
        name = str(ev.get("name", ""))
        if ev.get("cat") == "cpu_op" and "attention" in name and name.startswith("aten::"):
            a = ev.get("args", {})
            key = (
                f"{name} dims={a.get('Input Dims')} strides={a.get('Input Strides')} "
                f"types={a.get('Input type')} concrete={a.get('Concrete Inputs')}"
            )
            calls[key] += 1
    return dict(per), dict(count), [f"- {n}x {k}" for k, n in calls.items()], wall


def attention_matrix(device: torch.device, b: int, s: int, hq: int, hkv: int, d: int) -> List[str]:
    """fwd+bwd ms (CUDA events, median of 10) of SDPA alone at the model's shape, in the two forms
    Transformers calls it (eager: no mask, is_causal, enable_gqa; under torch.compile: a full causal
    mask, repeated K/V), each eager and compiled: which of mask, K/V repeat and compilation costs."""
    import torch.nn.functional as F

    g = torch.Generator(device=device).manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g).requires_grad_()

    # q/k/v as the projections give them: [B, S, H, D] memory, transposed views.
    q = leaf(b, s, hq, d).transpose(1, 2)
    k = leaf(b, s, hkv, d).transpose(1, 2)
    v = leaf(b, s, hkv, d).transpose(1, 2)
    mask = torch.ones(s, s, device=device, dtype=torch.bool).tril()[None, None]

    def causal_gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def repeat(t):  # Transformers' repeat_kv: every K/V head once per query head of its group
        return t[:, :, None].expand(b, hkv, hq // hkv, s, d).reshape(b, hq, s, d)

    def masked_repeat(q, k, v):
        return F.scaled_dot_product_attention(q, repeat(k), repeat(v), attn_mask=mask)

    def causal_repeat(q, k, v):
        return F.scaled_dot_product_attention(q, repeat(k), repeat(v), is_causal=True)

    def masked_gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    lines = [
        "",
        f"### SDPA alone, [{b}, {hq}/{hkv} heads, {s}, {d}] bf16, fwd+bwd ms (CUDA events, median of 10)",
        "",
        "| form | eager | torch.compile |",
        "|---|---|---|",
    ]
    dout = torch.randn(b, hq, s, d, device=device, dtype=torch.bfloat16, generator=g)
    for name, fn in [
        ("is_causal, enable_gqa (eager Transformers)", causal_gqa),
        ("bool mask, repeated K/V (compiled Transformers)", masked_repeat),
        ("is_causal, repeated K/V", causal_repeat),
        ("bool mask, enable_gqa", masked_gqa),
    ]:
        row = []
        for f in (fn, torch.compile(fn)):
            times = []
            for i in range(13):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = f(q, k, v)
                torch.autograd.grad(out, (q, k, v), dout)
                end.record()
                torch.cuda.synchronize()
                if i >= 3:
                    times.append(start.elapsed_time(end))
            row.append(f"{sorted(times)[len(times) // 2]:.3f}")
        lines.append(f"| {name} | {row[0]} | {row[1]} |")
    return lines


def embedding_backward_fallback() -> None:
    """Measurement switch (--embedding-fallback): inductor runs aten's embedding_dense_backward kernel
    instead of its decomposition (an fp32 zero-fill, an index_put with atomics, a cast back), as it
    does on XPU. Process-global and torch-internal: for this script only."""
    from torch._inductor import decomposition, lowering

    aten = torch.ops.aten
    for op in (aten.embedding_dense_backward, aten.embedding_dense_backward.default):
        decomposition.decompositions.pop(op, None)
    lowering.make_fallback(aten.embedding_dense_backward, warn=False)


def explain(model, batch) -> List[str]:
    import torch._dynamo

    torch._dynamo.reset()
    out = torch._dynamo.explain(model)(**batch)
    lines = [f"- graphs: {out.graph_count}, graph breaks: {out.graph_break_count}, ops in graphs: {out.op_count}"]
    reasons = collections.Counter(f"{b.reason}" for b in out.break_reasons)
    for reason, n in reasons.most_common():
        lines.append(f"  - {n}x {reason.splitlines()[0][:300]}")
    torch._dynamo.reset()
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--patchgen", default=ts.default_patchgen())
    ap.add_argument("--out", default=".")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation of the model (sdpa, opslot_sdpa, ...)")
    ap.add_argument("--no-attention-matrix", action="store_true", help="skip the SDPA-alone table (CUDA)")
    ap.add_argument(
        "--embedding-fallback",
        action="store_true",
        help="inductor calls aten's embedding_dense_backward instead of decomposing it (a measurement)",
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.embedding_fallback:
        embedding_backward_fallback()
    from opslot import build_model

    lines = ["# torch.compile of generated models: graph breaks and kernels (bench/compile_breaks.py)", ""]
    lines.append(f"- command: {' '.join(sys.argv)}; torch {torch.__version__}")
    for key in args.models.split(","):
        mdef = ts.MODELS[key]
        config = ts.make_config(mdef, args.tiny)
        module = ts.generate_and_import(mdef, args.patchgen, ts.site_packages(), Path(tempfile.mkdtemp()))
        torch.manual_seed(0)
        model = ts.construct(
            lambda: build_model(
                copy.deepcopy(config), ops={"attn_implementation": args.attn}, module=module, model_class=mdef.causal_lm
            ),
            device,
            torch.bfloat16,
        )
        b, s = (1, 128) if args.tiny else (args.batch, args.seq)
        batch = ts.make_batch(config.vocab_size, b, s, device, 1)
        lines += ["", f"## {key} ({b} x {s} tokens)", ""]
        lines += explain(model, batch)
        for _ in range(2):
            step(model, batch)
        eager, eager_n, eager_attn, eager_wall = kernel_times(model, batch, device)
        compiled_model = torch.compile(model)
        for _ in range(3):
            step(compiled_model, batch)
        comp, comp_n, comp_attn, comp_wall = kernel_times(compiled_model, batch, device)
        lines += [
            "",
            f"- profiled step wall ms: eager {eager_wall:.1f}, compiled {comp_wall:.1f}; CUDA ms: eager "
            f"{sum(eager.values()) / 1e3:.2f} ({len(eager)} kernels), compiled {sum(comp.values()) / 1e3:.2f} "
            f"({len(comp)} kernels)",
            "",
            "| kernel | eager µs (launches) | compiled µs (launches) |",
            "|---|---|---|",
        ]
        names = sorted(set(eager) | set(comp), key=lambda n: -max(eager.get(n, 0), comp.get(n, 0)))
        for n in names[: args.top]:
            lines.append(
                f"| {n[:110]} | {eager.get(n, 0):.0f} ({eager_n.get(n, 0)}) | {comp.get(n, 0):.0f} ({comp_n.get(n, 0)}) |"
            )
        lines += ["", "Largest differences, compiled minus eager (µs):", ""]
        diffs = sorted(set(eager) | set(comp), key=lambda n: -abs(comp.get(n, 0) - eager.get(n, 0)))
        for n in diffs[: args.top]:
            lines.append(f"- {comp.get(n, 0) - eager.get(n, 0):+.0f} {n[:140]}")
        lines += ["", "Attention ops, eager:", ""] + eager_attn + ["", "Attention ops, compiled:", ""] + comp_attn
        if device.type == "cuda" and not args.no_attention_matrix:
            c = config
            lines += attention_matrix(device, b, s, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        print("\n".join(lines), flush=True)
        del model, compiled_model
        ts.free(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_breaks.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
