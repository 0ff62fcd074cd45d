#!/usr/bin/env python3
"""Train a generated Qwen3-MoE under FSDP2 (optionally with expert parallelism, activation
checkpointing, torch.compile) and compare every step with a 1-rank run of the same global batch.

    torchrun --nproc-per-node 2 tests/distributed/train.py --module-dir GEN [--ep 2] [--ac] \\
        [--compile aot_eager|inductor] [--steps 3] [--dtype bf16] [--ops torch|cuda|eager]

GEN holds patched_modeling_qwen3_moe_gpu.py (patchgen's output of specs/qwen3_moe/qwen3_moe_gpu.yaml;
tests/distributed/harness.py's `generate` makes it). Every rank builds the model with
`opslot.build_model` from the same seed, makes the experts expert-parallel when --ep > 1
(`opslot.distributed.shard_experts`), enables activation checkpointing (Transformers'
`gradient_checkpointing_enable`, non-reentrant), compiles every decoder layer, shards the model with
`opslot.distributed.fully_shard_model` (FSDP2 per decoder layer over a device mesh) and runs N AdamW
steps on its slice of the global batch. The reference, on every rank, is the unsharded model (no EP,
no FSDP, no checkpointing; its layers compiled with the same backend when --compile names one that
generates code, e.g. inductor, whose fused bf16 code rounds differently from eager) stepping on the whole global batch, with
FSDP's mixed precision reproduced for bf16 (fp32 master weights, bf16 compute, fp32 gradients). Prints (rank 0)
and returns the per-step losses of both and the largest final-weight difference.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import harness  # noqa: E402  (puts runtime/ on sys.path)
import opslot  # noqa: E402
import opslot.distributed as od  # noqa: E402

OPS = {  # every slot of the Qwen3-MoE spec, per implementation family
    "torch": {
        "rms_norm_implementation": "torch",
        "rotary_pos_emb_implementation": "torch",
        "swiglu_mlp_implementation": "torch",
        "moe_implementation": "fused_torch",
        "load_balancing_loss_implementation": "torch",
        "cross_entropy_loss_implementation": "torch",
    },
    "cuda": {
        "rms_norm_implementation": "cuda",
        "rotary_pos_emb_implementation": "cuda",
        "swiglu_mlp_implementation": "cuda",
        "moe_implementation": "fused_cuda",
        "load_balancing_loss_implementation": "cuda",
        "cross_entropy_loss_implementation": "cuda",
    },
    "eager": {
        "rms_norm_implementation": "eager",
        "rotary_pos_emb_implementation": "eager",
        "swiglu_mlp_implementation": "eager",
        "moe_implementation": "eager",
        "load_balancing_loss_implementation": "eager",
        "cross_entropy_loss_implementation": "eager",
    },
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module-dir", required=True, help="folder holding patched_modeling_qwen3_moe_gpu.py")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ops", default=None, choices=sorted(OPS), help="default: cuda on a GPU, torch on the CPU")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (1: FSDP only)")
    p.add_argument("--ep-mode", default="splits", choices=od.MODES)
    p.add_argument("--ac", action="store_true", help="activation checkpointing")
    p.add_argument("--compile", default=None, help="torch.compile backend for every decoder layer")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--optim",
        default="adamw",
        choices=("adamw", "sgd"),
        help="sgd (momentum 0.9): the weights' difference follows the gradients' (AdamW's first steps are "
        "about lr * sign(grad), so in bf16 a sign flip of a near-zero gradient moves a weight by 2 lr)",
    )
    p.add_argument("--lr", type=float, default=None, help="default: 1e-3 (adamw), 0.1 (sgd)")
    p.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--json", default=None, help="write the result here (rank 0)")
    return p.parse_args(argv)


def opts_from(**kw: Any) -> argparse.Namespace:
    """The options of one run as a namespace (what the tests call `run` with)."""
    args = parse_args(["--module-dir", kw.pop("module_dir")])
    for k, v in kw.items():
        if not hasattr(args, k):
            raise TypeError(f"unknown option {k}")
        setattr(args, k, v)
    return args


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    gpu = args.device.startswith("cuda")
    args.ops = args.ops or ("cuda" if gpu else "torch")
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    return args


def build(args: argparse.Namespace, config: Any) -> torch.nn.Module:
    """The generated model, every slot bound to the chosen family, randomised from seed 0, fp32 on the device."""
    if str(args.module_dir) not in sys.path:
        sys.path.insert(0, str(args.module_dir))
    # The harness trains without router logits (output_router_logits=False): the load-balancing
    # loss is never computed, so its bound kernel is never reached — expected here, not an error.
    model = opslot.build_model(
        config,
        ops=OPS[args.ops],
        module=harness.MODULE,
        model_class="Qwen3MoeForCausalLM",
        allow_unreached=["load_balancing_loss"],
    )
    harness.randomize_(model, seed=0)
    return model.to(args.device)


def batch(args: argparse.Namespace, vocab: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(args.device)


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def optimizer(args: argparse.Namespace, params) -> torch.optim.Optimizer:
    if args.optim == "sgd":
        return torch.optim.SGD(params, lr=args.lr or 0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=args.lr or 1e-3, weight_decay=0.01)


class Reference:
    """The 1-rank run: fp32 master weights stepped by AdamW; for bf16, forward and backward of a bf16
    copy of the parameters (buffers stay fp32, as under FSDP's mixed precision), gradients cast to fp32."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, args: argparse.Namespace):
        self.master = model
        self.dtype = dtype
        self.work = model if dtype == torch.float32 else copy.deepcopy(model)
        if args.compile not in (None, "eager", "aot_eager"):  # inductor's fused bf16 code rounds unlike eager's
            for layer in od.decoder_layers(self.work):
                layer.compile(backend=args.compile)
        self.opt = optimizer(args, self.master.parameters())

    def step(self, ids: torch.Tensor, grads: Optional[Dict[str, torch.Tensor]] = None) -> float:
        """One step on the whole batch; fills `grads` (when given) with the fp32 gradients it steps with."""
        if self.work is not self.master:
            with torch.no_grad():
                for w, m in zip(self.work.parameters(), self.master.parameters()):
                    w.data = m.data.to(self.dtype)
                    w.grad = None
        loss = _loss(self.work, ids)
        loss.backward()
        if self.work is not self.master:
            for w, m in zip(self.work.parameters(), self.master.parameters()):
                m.grad = None if w.grad is None else w.grad.float()
        if grads is not None:
            grads.update(
                {
                    k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                    for k, p in self.master.named_parameters()
                }
            )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """One training run on every rank of the initialised default group; returns the comparison (all ranks)."""
    args = resolve(args)
    world, rank = dist.get_world_size(), dist.get_rank()
    config = getattr(args, "config", None) or harness.tiny_config()
    dtype = DTYPES[args.dtype]
    t0 = time.time()
    model = build(args, config)
    ref = None
    if not args.no_reference:
        ref_model = build(args, config)
        ref_model.load_state_dict(model.state_dict())
        ref = Reference(ref_model, dtype, args)
        initial = {k: v.detach().clone() for k, v in ref_model.state_dict().items()}

    meshes = od.init_meshes(args.device.split(":")[0], ep=args.ep)
    if args.ep > 1:
        od.shard_experts(model, meshes.ep, mode=args.ep_mode)
    if args.ac:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.compile:
        for layer in od.decoder_layers(model):
            layer.compile(backend=args.compile)
    fsdp_kwargs: Dict[str, Any] = {}
    if dtype != torch.float32:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        fsdp_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    od.fully_shard_model(model, meshes, **fsdp_kwargs)
    opt = optimizer(args, model.parameters())

    per_rank = args.batch // world
    if per_rank * world != args.batch:
        raise ValueError(f"global batch {args.batch} does not split over {world} ranks")
    losses, ref_losses = [], []
    ref_grads: Dict[str, torch.Tensor] = {}
    for step in range(args.steps):
        ids = batch(args, config.vocab_size, step)
        loss = _loss(model, ids[rank * per_rank : (rank + 1) * per_rank])
        loss.backward()
        if step == 0 and ref is not None:
            first_grads = od.full_state_dict(model, grads=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
        if ref is not None:
            ref_losses.append(ref.step(ids, ref_grads if step == 0 else None))
    result: Dict[str, Any] = {
        "world": world,
        "ep": args.ep,
        "ep_mode": args.ep_mode,
        "ac": args.ac,
        "compile": args.compile,
        "ops": args.ops,
        "dtype": args.dtype,
        "steps": args.steps,
        "optim": args.optim,
        "losses": losses,
        "plan": opslot.binding_plan(model).as_dict(),
    }
    final = od.full_state_dict(model)
    if ref is not None:
        ref_state = ref.master.state_dict()
        assert set(final) == set(ref_state), sorted(set(final) ^ set(ref_state))
        diffs = {k: float((final[k].float() - ref_state[k].float()).abs().max()) for k in final}
        worst = max(diffs, key=diffs.get)
        # AdamW hides a wrong gradient scale (its step is scale-invariant): the first step's gradients
        # are compared too, relative to the largest gradient of the same parameter
        grad_rel = {
            k: float((first_grads[k].float() - ref_grads[k].float()).abs().max())
            / max(float(ref_grads[k].float().abs().max()), 1e-12)
            for k in ref_grads
        }
        worst_grad = max(grad_rel, key=grad_rel.get)
        # the weights' difference relative to the update (Frobenius norms, per parameter)
        weight_rel = {}
        for k in ref_state:
            update = float((ref_state[k].float() - initial[k].float()).norm())
            if update > 0:
                weight_rel[k] = float((final[k].float() - ref_state[k].float()).norm()) / update
        worst_rel = max(weight_rel, key=weight_rel.get)
        result.update(
            ref_losses=ref_losses,
            max_loss_diff=max(abs(a - b) for a, b in zip(losses, ref_losses)),
            max_weight_diff=diffs[worst],
            worst_weight=worst,
            max_grad_rel_diff=grad_rel[worst_grad],
            worst_grad=worst_grad,
            max_weight_rel_diff=weight_rel[worst_rel],
            worst_weight_rel=worst_rel,
            max_weight_update=max(float((ref_state[k].float() - initial[k].float()).abs().max()) for k in ref_state),
        )
    result["seconds"] = time.time() - t0
    return result


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    harness.init_from_env(args.device)
    try:
        result = run(args)
        if dist.get_rank() == 0:
            print(json.dumps(result, indent=1))
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
