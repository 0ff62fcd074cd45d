#!/usr/bin/env python3
"""Training throughput of a generated Qwen3-MoE on 2 GPUs: FSDP2 alone and FSDP2 + expert
parallelism, each with every slot on `eager` (upstream code; Transformers' own experts
implementation) and on opslot's `cuda` kernels. One spawn of 2 processes (NCCL) runs every
configuration in turn; tokens/s per GPU and peak memory per GPU are printed as a table (and written
with --out). Ceilings measured in the same run: a bf16 GEMM and the NCCL all-to-all bandwidth.

    python3 bench/distributed.py --module-dir GEN [--layers 6] [--steps 5] [--out table.md]

GEN holds patched_modeling_qwen3_moe_gpu.py (tests/distributed/harness.py `generate`, or patchgen on
specs/qwen3_moe/qwen3_moe_gpu.yaml). Model (Qwen3-30B-A3B's shapes, fewer layers and experts):
hidden 2048, 32 heads (4 KV) of 128, 64 experts of 768, top-8, vocab 151936. bf16 compute with fp32
master weights and fp32 gradient reduction (FSDP2 MixedPrecisionPolicy), AdamW, sdpa attention, no
activation checkpointing, not compiled; batch x seq tokens per GPU per step, random tokens.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
# bench/ holds kernels.py, moe.py, ...: not importable names here (Transformers imports a `kernels` package)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT / "tests" / "distributed"))
import harness  # noqa: E402  (puts runtime/ on sys.path)

CONFIGS = [  # (name, ops family, ep, ep mode)
    ("FSDP2", "eager", 1, "splits"),
    ("FSDP2", "cuda", 1, "splits"),
    ("FSDP2 + EP", "eager", 2, "splits"),
    ("FSDP2 + EP", "cuda", 2, "splits"),
    ("FSDP2 + EP (padded, no host sync)", "cuda", 2, "padded"),
]


def model_config(layers: int, tiny: bool = False) -> Any:
    if tiny:  # the code path on the CPU (a smoke test of this script), not a measurement
        return harness.tiny_config(num_hidden_layers=layers, mlp_only_layers=[], vocab_size=151936)
    return harness.tiny_config(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=8192,
        num_experts=64,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        mlp_only_layers=[],
        rope_theta=1e6,
    )


def ceilings() -> Dict[str, float]:
    import torch
    import torch.distributed as dist

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for _ in range(10):
        ev[0].record()
        a @ b
        ev[1].record()
        torch.cuda.synchronize()
        times.append(ev[0].elapsed_time(ev[1]) / 1e3)
    tflops = 2 * 8192**3 / sorted(times)[len(times) // 2] / 1e12
    x = torch.randn(256 << 20, device="cuda", dtype=torch.bfloat16)  # 512 MiB, half of it to the peer
    y = torch.empty_like(x)
    for _ in range(3):
        dist.all_to_all_single(y, x)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        ev[0].record()
        dist.all_to_all_single(y, x)
        ev[1].record()
        torch.cuda.synchronize()
        times.append(ev[0].elapsed_time(ev[1]) / 1e3)
    moved = x.numel() * x.element_size() / 2  # bytes that cross to the other GPU, each direction
    return {"bf16_gemm_tflops": tflops, "all_to_all_gbps": moved / sorted(times)[len(times) // 2] / 1e9}


def one(opts: Dict[str, Any], name: str, ops: str, ep: int, mode: str) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import opslot
    import opslot.distributed as od
    import train

    rank = dist.get_rank()
    gpu = opts["device"] == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if opts["module_dir"] not in sys.path:
        sys.path.insert(0, opts["module_dir"])
    torch.manual_seed(0)
    with dev:
        model = opslot.build_model(
            model_config(opts["layers"], not gpu),
            ops=dict(train.OPS[ops], attn_implementation=opts["attn"]),
            module=harness.MODULE,
            model_class="Qwen3MoeForCausalLM",
        )
    experts_impl = getattr(model.config, "_experts_implementation", None)
    meshes = od.init_meshes(dev.type, ep=ep)
    if ep > 1:
        od.shard_experts(model, meshes.ep, mode=mode)
    od.fully_shard_model(
        model, meshes, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    tokens = opts["batch"] * opts["seq"]
    g = torch.Generator(device=dev).manual_seed(rank)
    times, losses = [], []
    for step in range(opts["warmup"] + opts["steps"]):
        ids = torch.randint(0, 151936, (opts["batch"], opts["seq"]), device=dev, generator=g)
        if gpu:
            torch.cuda.synchronize()
            if step == opts["warmup"]:
                torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize()
        if step >= opts["warmup"]:
            times.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
    step_s = torch.tensor(sorted(times)[len(times) // 2], device=dev)
    dist.all_reduce(step_s, op=dist.ReduceOp.MAX)
    peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")
    params = sum(p.numel() for p in model.parameters())  # this rank's shards
    del model, opt
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    return {
        "config": name,
        "ops": ops,
        "ep": ep,
        "mode": mode,
        "experts_impl": experts_impl,
        "step_ms": float(step_s) * 1e3,
        "tokens_per_s_per_gpu": tokens / float(step_s),
        "peak_gib": peak,
        "losses": losses,
        "local_params": params,
        "step_times": times,
    }


def worker(opts: Dict[str, Any]) -> Dict[str, Any]:
    import traceback

    out: Dict[str, Any] = {
        "ceilings": ceilings()
        if opts["device"] == "cuda"
        else {"bf16_gemm_tflops": float("nan"), "all_to_all_gbps": float("nan")},
        "runs": [],
    }
    for name, ops, ep, mode in CONFIGS:
        if opts["only"] and ops not in opts["only"]:
            continue
        try:
            out["runs"].append(one(opts, name, ops, ep, mode))
        except Exception:
            out["runs"].append({"config": name, "ops": ops, "ep": ep, "mode": mode, "error": traceback.format_exc()})
    return out


def table(ranks: List[Dict[str, Any]], opts: Dict[str, Any]) -> str:
    c = ranks[0]["ceilings"]
    lines = [
        f"2 GPUs, {opts['layers']} layers, {opts['batch']}x{opts['seq']} tokens per GPU per step, attention "
        f"{opts['attn']}, median of "
        f"{opts['steps']} steps after {opts['warmup']}; ceilings: bf16 GEMM {c['bf16_gemm_tflops']:.0f} TFLOP/s, "
        f"NCCL all-to-all {c['all_to_all_gbps']:.0f} GB/s per direction",
        "",
        "| configuration | slots | experts run by | step ms | tokens/s per GPU | peak GiB GPU0 | peak GiB GPU1 | "
        "loss (last) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r0, r1 in zip(ranks[0]["runs"], ranks[1]["runs"]):
        if "error" in r0 or "error" in r1:
            err = (r0.get("error") or r1.get("error")).strip().splitlines()[-1]
            lines.append(f"| {r0['config']} | {r0['ops']} | — | error: {err} | | | | |")
            continue
        experts = "opslot fused_cuda" if r0["ops"] == "cuda" else f"Transformers `{r0['experts_impl']}`"
        lines.append(
            f"| {r0['config']} | {r0['ops']} | {experts} | {r0['step_ms']:.1f} | "
            f"{r0['tokens_per_s_per_gpu']:,.0f} | {r0['peak_gib']:.1f} | {r1['peak_gib']:.1f} | "
            f"{r0['losses'][-1]:.3f} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module-dir", required=True)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--attn", default="sdpa", help="attn_implementation (Transformers' attention)")
    p.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke test, tiny model)")
    p.add_argument("--only", default="", help="comma-separated ops families to run (default: all)")
    p.add_argument("--out", default=None, help="write the table (markdown) here, and the raw numbers beside it (.json)")
    a = p.parse_args()
    opts = dict(
        module_dir=str(Path(a.module_dir).resolve()),
        layers=a.layers,
        batch=a.batch,
        seq=a.seq,
        warmup=a.warmup,
        steps=a.steps,
        only=[x for x in a.only.split(",") if x],
        device=a.device,
        attn=a.attn,
    )
    t0 = time.time()
    ranks = harness.spawn(worker, opts, world=2, device=a.device)
    text = table(ranks, opts)
    print(text)
    print(f"({time.time() - t0:.0f} s)")
    if a.out:
        Path(a.out).write_text(text + "\n")
        Path(a.out).with_suffix(".json").write_text(json.dumps(ranks, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
