"""Shared pieces of the distributed tests, the training script and the benchmark: the generated
Qwen3-MoE (patchgen on specs/qwen3_moe/qwen3_moe_gpu.yaml), tiny configs, deterministic weights,
process-group setup and a 2-process launcher (torch.multiprocessing spawn)."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "runtime") not in sys.path:
    sys.path.insert(0, str(ROOT / "runtime"))

SPEC = ROOT / "specs" / "qwen3_moe" / "qwen3_moe_gpu.yaml"
MODULE = "patched_modeling_qwen3_moe_gpu"
#: A collective that waits longer than this fails the rank (a hang shows up as an error, not a stall).
TIMEOUT_S = int(os.environ.get("OPSLOT_DIST_TIMEOUT", "120"))


#: Other MoE models whose experts the EP layer test shards too (specs/<key>/<key>_gpu.yaml).
OTHER_MOE = ("gpt_oss", "deepseek_v3")


def generate(patchgen: str, source_root: str, out_dir: Path, keys=("qwen3_moe",) + OTHER_MOE) -> Path:
    """patchgen's modules of `keys` (GPU specs) in out_dir (the folder --module-dir / sys.path needs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [str((ROOT / "specs" / key / f"{key}_gpu.yaml").relative_to(ROOT)) for key in keys]
    cmd = [patchgen, *specs, "--source-root", source_root, "-o", str(out_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    found = sorted(out_dir.rglob(f"{MODULE}.py"))
    if proc.returncode != 0 or len(found) != 1:
        raise RuntimeError(f"patchgen exit {proc.returncode}: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return found[0].parent


def tiny_config(**overrides: Any) -> Any:
    """A small Qwen3-MoE: 2 layers (one dense, one MoE), 8 experts, top-2; no router aux loss (it is a
    product of batch means, so a 2-rank mean of it is not the 1-rank value)."""
    import transformers

    kw: Dict[str, Any] = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        use_cache=False,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        norm_topk_prob=True,
        output_router_logits=False,
    )
    kw.update(overrides)
    config = transformers.Qwen3MoeConfig(**kw)
    config._attn_implementation = "eager"
    return config


def randomize_(model: Any, seed: int = 0, std: float = 0.05) -> None:
    """Deterministic weights, the same on every rank: matrices N(0, std), RMSNorm weights 1 + N(0, std)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    centre = {f"{n}.weight" for n, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(((1.0 if name in centre else 0.0) + std * noise).to(p.dtype))


def init_from_env(device: str) -> None:
    """Initialise the default process group from torchrun's environment (nccl on cuda, gloo on cpu)."""
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world: int, port: int, device: str, fn: Callable, arg: Any, results: Any, timeout_s: int = TIMEOUT_S
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.manual_seed(0)
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if device.startswith("cuda") else "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        out = fn(arg)
        results.put((rank, "ok", out))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def _wait(procs: Any, deadline_s: Optional[float]) -> None:
    """Join the ranks; past `deadline_s` (a hang outside a collective's timeout) kill them and raise."""
    end = None if deadline_s is None else time.monotonic() + deadline_s
    while not procs.join(timeout=1.0):
        if end is not None and time.monotonic() > end:
            for proc in procs.processes:
                if proc.is_alive():
                    proc.kill()
            raise TimeoutError(f"the ranks did not finish within {deadline_s} s (killed)")


def spawn(
    fn: Callable,
    arg: Any,
    world: int = 2,
    device: str = "cpu",
    timeout_s: int = TIMEOUT_S,
    deadline_s: Optional[float] = None,
) -> List[Any]:
    """Run fn(arg) on `world` processes of one process group; returns every rank's result, rank order.
    A rank that raises, dies (an abort) or outlives `deadline_s` fails the call with what each rank
    reported; `timeout_s` bounds every collective (the process group's timeout)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    try:
        procs = mp.start_processes(
            _entry,
            args=(world, port, device, fn, arg, results, timeout_s),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        _wait(procs, deadline_s)
    except Exception as exc:
        errors = []
        while not results.empty():
            rank, status, payload = results.get()
            if status == "error":
                errors.append(f"rank {rank}:\n{payload}")
        raise RuntimeError("\n".join(errors + [f"{type(exc).__name__}: {exc}"])) from exc
    got: Dict[int, Any] = {}
    while not results.empty():
        rank, status, payload = results.get()
        got[rank] = payload
    return [got[r] for r in range(world)]
