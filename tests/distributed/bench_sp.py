#!/usr/bin/env python3
"""Sequence parallelism on 2 GPUs: training-step time and peak memory of one long row, unsharded on
each GPU against sequence-parallel over both (opslot.distributed.parallelize(sp=2)).

    python3 tests/distributed/bench_sp.py --module-dir GEN [--seqs 16384,32768,65536] [--out table.md]
    python3 tests/distributed/bench_sp.py --module-dir GEN --tiny        # the code path on the CPU (gloo)

GEN holds patched_modeling_qwen3_gpu.py and patched_modeling_qwen3_5_gpu.py (patchgen on
specs/qwen3/qwen3_gpu.yaml and specs/qwen3_5/qwen3_5_gpu.yaml). Models: a 4-layer Qwen3 (hidden
2048, 16 heads of 128, 8 KV heads, vocab 151936) and a 4-layer Qwen3.5 (three Gated DeltaNet layers
and one attention layer, 16 key / 32 value heads of 128), bf16 weights, every slot on opslot's `cuda`
kernels, attention `opslot_varlen` (FlashAttention-2) and `sdpa`. One spawn of 2 processes (NCCL):

- "1 GPU": every rank runs the unsharded model on its own row of S tokens (no communication);
- "SP = 2": the two ranks run one row of S tokens, S/2 each (the Ulysses all-to-alls).

Per configuration and S: forward + backward time (median of --steps after a warm-up), tokens/s per
GPU, peak memory per GPU, or OOM. Random tokens, labels = inputs, no optimizer step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402  (puts runtime/ on sys.path)

MODELS = {
    "qwen3": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
    ),
    "qwen3_5": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=131072,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    ),
}
TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)


def build(key: str, attn: str, opts: Dict[str, Any]):
    import importlib

    import torch
    import transformers

    sys.path.insert(0, str(harness.ROOT / "tests" / "models"))
    import e2e
    import opslot

    case = next(c for c in e2e.CASES if c.key == key)
    cls = getattr(transformers, case.config_class)
    fields = getattr(cls, "__dataclass_fields__", None)
    kw = {k: v for k, v in e2e.BASE.items() if fields is None or k in fields}
    kw.update(case.config_kwargs)
    shape = dict(MODELS[key])
    if opts["tiny"]:
        shape.update({k: v for k, v in TINY.items() if k in shape})
        if "layer_types" in shape:
            shape["layer_types"] = ["linear_attention", "full_attention"]
    kw.update(shape)
    config = cls(**kw)
    if str(opts["module_dir"]) not in sys.path:
        sys.path.insert(0, str(opts["module_dir"]))
    module = f"patched_modeling_{key}_gpu"
    family = "torch" if opts["tiny"] else "cuda"
    ops = e2e.ops_for(e2e.causal_lm_slots(opslot.module_slots(importlib.import_module(module))), family)
    ops["attn_implementation"] = attn
    model = opslot.build_model(config, ops=ops, module=module, model_class=case.causal_lm, allow_unreached=True)
    e2e.randomize_(model, case.offset_norm)
    dtype = torch.float32 if opts["tiny"] else torch.bfloat16
    return model.to(device=opts["device"], dtype=dtype).train()


def measure(model, batch: Dict[str, Any], steps: int, device: str) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    times: List[float] = []
    for step in range(steps + 1):
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        model(**batch).loss.backward()
        if cuda:
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return {
        "seconds": statistics.median(times),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def run(opts: Dict[str, Any]) -> List[Dict[str, Any]]:
    import torch
    import torch.distributed as dist

    import opslot.distributed as od

    rows: List[Dict[str, Any]] = []
    for key in opts["models"]:
        for attn in opts["attns"]:
            for seq in opts["seqs"]:
                for mode in ("1 GPU", "SP = 2"):
                    row = {"model": key, "attention": attn, "seq": seq, "mode": mode}
                    model = None
                    try:
                        if opts["device"].startswith("cuda"):
                            torch.cuda.empty_cache()
                            torch.cuda.reset_peak_memory_stats()
                        model = build(key, attn, opts)
                        g = torch.Generator().manual_seed(seq)
                        ids = torch.randint(0, model.config.vocab_size, (1, seq), generator=g).to(opts["device"])
                        batch = {"input_ids": ids, "labels": ids}
                        if mode == "SP = 2":
                            par = od.parallelize(model, sp=2, fsdp=False)
                            batch = od.shard_batch(batch, par.sp)
                        got = measure(model, batch, opts["steps"], opts["device"])
                        tokens = batch["input_ids"].shape[1]
                        row.update(got, tokens_per_gpu=tokens, tokens_per_s_per_gpu=tokens / got["seconds"])
                    except torch.OutOfMemoryError:
                        row["oom"] = True
                    oom = torch.tensor([int(row.get("oom", False))], device=opts["device"])
                    dist.all_reduce(oom)  # the ranks go on together (an OOM on one rank skips the pair)
                    if int(oom) and not row.get("oom"):
                        row["oom"] = "other rank"
                    del model
                    rows.append(row)
    return rows


def table(rows: List[Dict[str, Any]]) -> str:
    out = [
        "| model | attention | S | mode | tokens per GPU | step (s) | tokens/s per GPU | peak GiB per GPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("oom"):
            out.append(f"| {r['model']} | {r['attention']} | {r['seq']} | {r['mode']} | — | OOM | — | — |")
            continue
        peak = "—" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        out.append(
            f"| {r['model']} | {r['attention']} | {r['seq']} | {r['mode']} | {r['tokens_per_gpu']} | "
            f"{r['seconds']:.3f} | {r['tokens_per_s_per_gpu']:,.0f} | {peak} |"
        )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module-dir", required=True)
    p.add_argument("--seqs", default="16384,32768,65536")
    p.add_argument("--models", default="qwen3,qwen3_5")
    p.add_argument("--attns", default="opslot_varlen,sdpa")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="tiny shapes, CPU, gloo, torch kernels, fp32 (a smoke test)")
    p.add_argument("--out", default=None, help="write the table (markdown) here, and the rows as JSON beside it")
    args = p.parse_args(argv)
    device = "cpu" if args.tiny else "cuda"
    opts = {
        "module_dir": args.module_dir,
        "device": device,
        "tiny": args.tiny,
        "steps": args.steps,
        "seqs": [int(s) for s in args.seqs.split(",")],
        "models": args.models.split(","),
        "attns": args.attns.split(","),
    }
    rows = harness.spawn(run, opts, world=2, device=device)[0]
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
