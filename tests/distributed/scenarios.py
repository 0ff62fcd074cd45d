"""What the distributed tests run inside every rank (one process group, all scenarios in turn; the
test file asserts on the returned measurements).

- `ep_layer`: one experts module of the generated Qwen3-MoE, expert-parallel over the group, against
  the same module unsharded on every rank's tokens together: outputs, the gradients of the hidden
  states, of the routing weights and of every expert parameter; twice, bitwise.
- `train.run`: FSDP2 (+ EP, activation checkpointing, compile) against the 1-rank reference.
- `errors`: the refusals of opslot.distributed; `preconditions` (its own spawn): inputs bad on one
  rank only, which every rank must refuse with the same ValueError.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import harness  # noqa: E402
import opslot.distributed as od  # noqa: E402
import train  # noqa: E402


def _inputs(total_tokens: int, hidden: int, experts: int, top_k: int, dtype, device, drop: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(total_tokens, hidden, generator=g)
    idx = (
        torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(total_tokens)])
        if total_tokens
        else torch.empty(0, top_k, dtype=torch.int64)
    )
    if drop and total_tokens > 2:
        idx[1, 0] = experts  # upstream's masking index: dropped
        idx[2, 1] = experts
    w = torch.rand(total_tokens, top_k, generator=g)
    gout = torch.randn(total_tokens, hidden, generator=g)
    return [t.to(device) for t in (x.to(dtype), idx, w.to(dtype), gout.to(dtype))]


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return float((a.detach().float() - b.detach().float()).abs().max())


def _other_model(args, key: str):
    sys.path.insert(0, str(harness.ROOT / "tests" / "models"))
    import e2e
    import opslot

    case = next(c for c in e2e.CASES if c.key == key)
    config = e2e.make_config(case)
    impl = {"torch": "fused_torch", "cuda": "fused_cuda", "eager": "eager"}[args.ops]
    if str(args.module_dir) not in sys.path:
        sys.path.insert(0, str(args.module_dir))
    model = opslot.build_model(
        config, ops={"moe_implementation": impl}, module=f"patched_modeling_{key}_gpu", model_class=case.causal_lm
    )
    harness.randomize_(model, seed=0, std=0.1)
    return config, model.to(args.device)


def ep_layer(opts: Dict[str, Any]) -> Dict[str, Any]:
    """EP layer vs the unsharded layer, for one (ops, dtype, mode, token split) case."""
    args = train.resolve(
        train.opts_from(module_dir=opts["module_dir"], device=opts["device"], ops=opts["ops"], dtype=opts["dtype"])
    )
    dtype = train.DTYPES[args.dtype]
    rank = dist.get_rank()
    if opts.get("model"):  # another generated MoE model (tests/models/e2e.py's tiny config of it)
        config, model = _other_model(args, opts["model"])
    else:
        config = harness.tiny_config(**opts.get("config", {}))
        model = train.build(args, config)
    experts = [m for m in model.modules() if od.is_experts_module(m)][-1].to(dtype)
    ref = copy.deepcopy(experts)
    split: List[int] = opts["tokens"]  # tokens per rank
    top_k = config.num_experts_per_tok
    x, idx, w, gout = _inputs(
        sum(split), config.hidden_size, experts.num_experts, top_k, dtype, args.device, opts.get("drop", False), seed=7
    )
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    out_ref = ref(xr, idx, wr)
    (out_ref.float() * gout.float()).sum().backward()

    od.shard_experts(model, dist.group.WORLD, mode=opts["mode"], capacity=opts.get("capacity"), modules=[experts])
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    runs = []
    for _ in range(2):
        for p in experts.parameters():
            p.grad = None
        xe, we = x[lo:hi].clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
        out = experts(xe, idx[lo:hi], we)
        (out.float() * gout[lo:hi].float()).sum().backward()
        runs.append([out.detach(), xe.grad, we.grad] + [p.grad for p in experts.parameters()])
    st = experts._opslot_ep
    first, local = st.first, st.local
    errs = {
        "out": _err(runs[0][0], out_ref[lo:hi]),
        "grad_x": _err(runs[0][1], xr.grad[lo:hi]),
        "grad_w": _err(runs[0][2], wr.grad[lo:hi]),
    }
    for (name, p_ref), g in zip(ref.named_parameters(), runs[0][3:]):
        expect = p_ref.grad[first : first + local]
        errs[f"grad_{name}"] = _err(g if g is not None else torch.zeros_like(expect), expect)
    scale = max(
        float(out_ref.detach().float().abs().max()) if out_ref.numel() else 0.0,
        max(float(p.grad.float().abs().max()) for p in ref.parameters()),
        1.0,
    )
    bitwise = all(torch.equal(a, b) if a is not None else b is None for a, b in zip(runs[0], runs[1]))
    return {
        "errors": errs,
        "max_error": max(errs.values()),
        "scale": scale,
        "bitwise": bitwise,
        "impl": type(experts).__name__,
        "local": local,
        "received_tokens": hi - lo,
        "sharded": list(st.sharded),
    }


def _recorder(found: Dict[str, str]):
    """attempt(name, fn): runs fn and records its refusal's message (or "no error") under name."""

    def attempt(name, fn):
        try:
            fn()
            found[name] = "no error"
        except (ValueError, RuntimeError, TypeError) as exc:
            found[name] = f"{type(exc).__name__}: {exc}"

    return attempt


def errors(opts: Dict[str, Any]) -> Dict[str, str]:
    """The refusals of opslot.distributed, each as its message (or "no error")."""
    args = train.resolve(train.opts_from(module_dir=opts["module_dir"], device=opts["device"], ops=opts["ops"]))
    found: Dict[str, str] = {}
    attempt = _recorder(found)
    group = dist.group.WORLD
    odd = train.build(args, harness.tiny_config(num_experts=3))
    attempt("indivisible", lambda: od.shard_experts(odd, group))
    model = train.build(args, harness.tiny_config())
    attempt("bad_mode", lambda: od.shard_experts(model, group, mode="bogus"))
    dense = train.build(args, harness.tiny_config(mlp_only_layers=[0, 1]))
    attempt("no_experts", lambda: od.shard_experts(dense, group))
    eager = train.build(
        train.resolve(train.opts_from(module_dir=opts["module_dir"], device=opts["device"], ops="eager")),
        harness.tiny_config(),
    )
    attempt("padded_eager", lambda: od.shard_experts(eager, group, mode="padded"))
    od.shard_experts(model, group)
    attempt("twice", lambda: od.shard_experts(model, group, modules=[model.model.layers[1].mlp.experts]))
    attempt("plain_mesh", lambda: od.fully_shard_model(model, od.init_meshes(args.device.split(":")[0]).dp))
    capped = train.build(args, harness.tiny_config())
    od.shard_experts(capped, group, mode="padded", capacity=4)
    ids = torch.zeros(1, 8, dtype=torch.long, device=args.device)
    attempt("over_capacity", lambda: capped(input_ids=ids))
    return found


def preconditions(opts: Dict[str, Any]) -> Dict[str, str]:
    """Inputs that are bad on one rank only (or differ between the ranks), each as this rank's message:
    every rank must refuse with the same ValueError, before any exchange (no hang, no abort)."""
    args = train.resolve(train.opts_from(module_dir=opts["module_dir"], device=opts["device"], ops=opts["ops"]))
    rank, group = dist.get_rank(), dist.group.WORLD
    found: Dict[str, str] = {}
    attempt = _recorder(found)

    def forward(model, tokens: List[int]):  # this rank's share: tokens[rank] tokens
        model(input_ids=torch.zeros(1, tokens[rank], dtype=torch.long, device=args.device))

    def sharded(ops: str = args.ops, **kw):
        model = train.build(
            train.resolve(train.opts_from(module_dir=opts["module_dir"], device=opts["device"], ops=ops)),
            harness.tiny_config(),
        )
        od.shard_experts(model, group, **kw)
        return model

    padded = sharded(mode="padded")
    attempt("padded_unequal_tokens", lambda: forward(padded, [8, 6]))
    capped = sharded(mode="padded", capacity=12)
    attempt("over_capacity_on_one_rank", lambda: forward(capped, [8, 4]))
    attempt("padded_eager_on_one_rank", lambda: forward(sharded([args.ops, "eager"][rank], mode="padded"), [6, 6]))
    attempt("capacity_differs", lambda: forward(sharded(mode="padded", capacity=[16, 20][rank]), [6, 6]))
    attempt("mode_differs", lambda: forward(sharded(mode=["splits", "padded"][rank]), [6, 6]))
    attempt("fine_after_refusals", lambda: forward(capped, [6, 2]))
    attempt("ep_size_differs", lambda: od.init_meshes(args.device.split(":")[0], ep=[2, 3][rank]))
    return found


def all_scenarios(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Every scenario of cfg["scenarios"] ([(name, kind, options)]) in this rank; failures are results too."""
    import traceback

    out: Dict[str, Any] = {}
    for name, kind, options in cfg["scenarios"]:
        try:
            if kind == "ep_layer":
                out[name] = ep_layer(dict(options, module_dir=cfg["module_dir"], device=cfg["device"]))
            elif kind == "errors":
                out[name] = errors(dict(options, module_dir=cfg["module_dir"], device=cfg["device"]))
            else:
                options = dict(options)
                config = harness.tiny_config(**options.pop("config", {}))
                args = train.opts_from(module_dir=cfg["module_dir"], device=cfg["device"], **options)
                args.config = config
                out[name] = train.run(args)
        except Exception:
            out[name] = {"exception": traceback.format_exc()}
            dist.barrier()
        if cfg.get("progress") and dist.get_rank() == 0:  # what finished, should a time limit stop the rest
            import json

            with open(cfg["progress"], "a") as fh:
                fh.write(json.dumps({name: out[name]}, default=str) + "\n")
    return out
