"""What the sequence-parallel tests run inside every rank (tests/distributed/test_sequence_parallel.py).

- `parity`: a generated Qwen3 / Qwen3-MoE / Qwen3.5 (tests/models/e2e.py's tiny configs, random weights),
  made sequence-parallel with `opslot.distributed.parallelize` (optionally with FSDP2, expert
  parallelism, activation checkpointing), takes its slice of a global batch (`shard_batch`) and is
  compared with the unsharded model on the same batch (computed on rank 0): the loss, the MoE aux loss,
  the gradients (averaged over the ranks, or FSDP's), and with FSDP the loss after an SGD step. With
  dp > 1 the reference is the mean over the data-parallel replicas' batches.
- `preconditions`: inputs that are bad on one rank only (or differ between the ranks): the same
  ValueError on every rank, and a good forward afterwards.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402  (puts runtime/ on sys.path)

sys.path.insert(0, str(harness.ROOT / "tests" / "models"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import e2e  # noqa: E402
import opslot  # noqa: E402
import opslot.distributed as od  # noqa: E402

#: Models of the tests (specs/<key>/<key>_gpu.yaml).
KEYS = ("qwen3", "qwen3_moe", "qwen3_5")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _case(key: str):
    return next(c for c in e2e.CASES if c.key == key)


def build(opts: Dict[str, Any], overrides: Optional[Dict[str, Any]] = None, ops_override=None):
    """The generated model of opts["model"], every slot on opts["ops"] (torch / cuda), attention
    opts["attn"], randomised (the same weights on every rank), on opts["device"]."""
    case = _case(opts["model"])
    config = e2e.make_config(case)
    for k, v in (overrides or {}).items():
        setattr(config, k, v)
    module_name = f"patched_modeling_{case.key}_gpu"
    if str(opts["module_dir"]) not in sys.path:
        sys.path.insert(0, str(opts["module_dir"]))
    module = importlib.import_module(module_name)
    ops = e2e.ops_for(e2e.causal_lm_slots(opslot.module_slots(module)), opts.get("ops", "torch"))
    ops.update(ops_override or {})
    ops["attn_implementation"] = opts.get("attn", "sdpa")
    model = opslot.build_model(config, ops=ops, module=module_name, model_class=case.causal_lm, allow_unreached=True)
    e2e.randomize_(model, case.offset_norm)
    model = model.to(device=opts["device"], dtype=DTYPES[opts.get("dtype", "fp32")])
    model.train()
    return model


def global_batch(opts: Dict[str, Any], vocab: int, seed: int = 5) -> Dict[str, torch.Tensor]:
    """opts: batch (rows per data-parallel replica), seq, dp; packed: document lengths (one row, position
    ids restarting); left_pad: leading padding of the last row (an attention_mask given)."""
    g = torch.Generator().manual_seed(seed)
    rows = opts.get("batch", 2) * opts.get("dp", 1)
    packed = opts.get("packed")
    seq = sum(packed) if packed else opts.get("seq", 16)
    ids = torch.randint(0, vocab, (rows, seq), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if packed:
        batch["position_ids"] = torch.cat([torch.arange(n) for n in packed])[None].expand(rows, seq).contiguous()
    if opts.get("left_pad"):
        mask = torch.ones(rows, seq, dtype=torch.long)
        mask[-1, : opts["left_pad"]] = 0
        batch["attention_mask"] = mask
        batch["labels"] = ids.masked_fill(mask == 0, -100)
    return {k: v.to(opts["device"]) for k, v in batch.items()}


def _replica(batch: Dict[str, torch.Tensor], d: int, dp: int) -> Dict[str, torch.Tensor]:
    rows = batch["input_ids"].shape[0] // dp
    return {k: v[d * rows : (d + 1) * rows] for k, v in batch.items()}


def _grads(model) -> Dict[str, torch.Tensor]:
    return {
        n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().clone()
        for n, p in model.named_parameters()
    }


def _extra(opts: Dict[str, Any], model) -> Dict[str, Any]:
    return {"output_router_logits": True} if hasattr(model, "router_aux_loss_coef") else {}


def _ops(opts: Dict[str, Any]) -> Dict[str, str]:
    """opts["loss"]: another cross-entropy kernel (e.g. torch_chunked, the fused linear + cross-entropy)."""
    return {"cross_entropy_loss_implementation": opts["loss"]} if opts.get("loss") else {}


def reference(opts: Dict[str, Any], batch: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """The unsharded model: per-replica losses and aux losses, the mean gradient over the replicas,
    and (steps == 2) the replicas' losses after one SGD step on that gradient."""
    dp = opts.get("dp", 1)
    model = build(opts, ops_override=_ops(opts))
    out: Dict[str, Any] = {"losses": [], "aux": []}
    for d in range(dp):
        res = model(**_replica(batch, d, dp), **_extra(opts, model))
        (res.loss / dp).backward()
        out["losses"].append(float(res.loss.detach()))
        out["aux"].append(None if res.get("aux_loss") is None else float(res.aux_loss.detach()))
    out["grads"] = _grads(model)
    if opts.get("steps", 1) > 1:
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= opts.get("lr", 0.1) * p.grad
        model.zero_grad(set_to_none=True)
        out["losses2"] = [
            float(model(**_replica(batch, d, dp), **_extra(opts, model)).loss.detach()) for d in range(dp)
        ]
    return out


def parity(opts: Dict[str, Any]) -> Dict[str, Any]:
    """One sequence-parallel run against the unsharded model (see the module docstring)."""
    t0 = time.time()
    world, rank = dist.get_world_size(), dist.get_rank()
    dp, sp = opts.get("dp", 1), opts["sp"]
    assert dp * sp == world, (dp, sp, world)
    batch = global_batch(opts, e2e.make_config(_case(opts["model"])).vocab_size)
    ref = reference(opts, batch) if rank == 0 else None
    model = build(opts, ops_override=_ops(opts))
    if opts.get("ac"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    par = od.parallelize(model, sp=sp, ep=opts.get("ep", 1), fsdp=opts.get("fsdp", False))
    d = dist.get_rank() // sp  # this rank's data-parallel replica
    local = od.shard_batch(_replica(batch, d, dp), par.sp)
    out = model(**local, **_extra(opts, model))
    out.loss.backward()
    if opts.get("fsdp"):
        grads = {k: v.float() for k, v in od.full_state_dict(model, grads=True).items()}
    else:
        od.average_gradients(model, dist.group.WORLD)
        grads = _grads(model)
    result: Dict[str, Any] = {
        "loss": float(out.loss.detach()),
        "replica": d,
        "tokens": int(local["input_ids"].shape[1]),
        "attention": model.config._attn_implementation,
        "inner": model._opslot_sp.inner,
        "kv_rep": model._opslot_sp.kv_rep,
        "gdn_wrapped": len(model._opslot_sp.gdn_slots),
        "aux": None if out.get("aux_loss") is None else float(out.aux_loss.detach()),
        "router_rows": None if out.get("router_logits") is None else int(out.router_logits[0].shape[0]),
        "slots": opslot.binding_plan(model).as_dict(),
    }
    if opts.get("steps", 1) > 1:
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= opts.get("lr", 0.1) * p.grad
        model.zero_grad(set_to_none=True)
        result["loss2"] = float(model(**local, **_extra(opts, model)).loss.detach())
    if ref is not None:
        missing = sorted(set(ref["grads"]) ^ set(grads))
        rel = {
            k: float((grads[k] - ref["grads"][k]).abs().max()) / max(float(ref["grads"][k].abs().max()), 1e-12)
            for k in ref["grads"]
            if k in grads
        }
        worst = max(rel, key=rel.get)
        result.update(
            ref_losses=ref["losses"],
            ref_aux=ref["aux"],
            ref_losses2=ref.get("losses2"),
            max_grad_rel_diff=rel[worst],
            worst_grad=worst,
            missing=missing,
            grad_scale=max(float(g.abs().max()) for g in ref["grads"].values()),
        )
    result["seconds"] = round(time.time() - t0, 2)
    return result


# -- bad inputs on one rank ----------------------------------------------------------------------------
def _recorder(found: Dict[str, str]):
    def attempt(name, fn):
        try:
            fn()
            found[name] = "no error"
        except (ValueError, RuntimeError, TypeError) as exc:
            found[name] = f"{type(exc).__name__}: {exc}"

    return attempt


def preconditions(opts: Dict[str, Any]) -> Dict[str, str]:
    """Each case as this rank's message; every rank must say the same (tests/distributed/test_sequence_parallel.py)."""
    rank = dist.get_rank()
    found: Dict[str, str] = {}
    attempt = _recorder(found)
    base = dict(opts, model="qwen3", attn="sdpa")
    model = build(base)
    od.sequence_parallel(model, dist.group.WORLD)
    dev = opts["device"]

    def ids(n: int):
        return torch.arange(n, device=dev)[None] % 50

    attempt("tokens_differ", lambda: model(input_ids=ids([8, 7][rank])))
    attempt("labels_on_one_rank", lambda: model(input_ids=ids(8), labels=ids(8) if rank == 0 else None))
    attempt("positions_on_one_rank", lambda: model(input_ids=ids(8), position_ids=ids(8) if rank == 1 else None))
    attempt("cache_on_one_rank", lambda: model(input_ids=ids(8), past_key_values=_cache(model) if rank else None))
    mask = torch.ones(1, 8, dtype=torch.long, device=dev)
    mask[0, 2] = 0  # a hole in the global row, on rank 0's slice
    packed_pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]], device=dev)
    attempt(
        "packed_with_padding_inside",
        lambda: model(
            input_ids=ids(8), position_ids=packed_pos, attention_mask=mask if rank == 0 else torch.ones_like(mask)
        ),
    )
    attempt("labels_shape_on_one_rank", lambda: model(input_ids=ids(8), labels=ids([8, 7][rank])))
    attempt(
        "attention_changed_on_one_rank",
        lambda: model(input_ids=ids(8)) if rank == 0 else _call_with_attention(model, "sdpa", input_ids=ids(8)),
    )
    attempt("fine_after_bad_inputs", lambda: model(input_ids=ids(8), labels=ids(8)).loss.backward())
    attempt("sp_size_differs", lambda: od.parallelize(build(base), sp=[2, 1][rank], fsdp=False))
    attempt(
        "heads_do_not_split",
        lambda: od.sequence_parallel(
            build(base, {"num_attention_heads": 3, "num_key_value_heads": 1}), dist.group.WORLD
        ),
    )
    attempt(
        "attention_differs",
        lambda: od.sequence_parallel(_with_attention(build(base), ["sdpa", "flex_attention"][rank]), dist.group.WORLD),
    )
    attempt(
        "config_differs",
        lambda: od.sequence_parallel(build(base, {"rms_norm_eps": [1e-6, 1e-5][rank]}), dist.group.WORLD),
    )
    attempt(
        "delta_rule_on_eager",
        lambda: od.sequence_parallel(
            build(dict(base, model="qwen3_5"), ops_override={"chunk_gated_delta_rule_implementation": "eager"}),
            dist.group.WORLD,
        ),
    )
    attempt("twice", lambda: od.sequence_parallel(model, dist.group.WORLD))
    attempt("fine_at_the_end", lambda: model(input_ids=ids(8), labels=ids(8)).loss.backward())
    return found


def _call_with_attention(model, impl: str, **inputs):
    """A forward with config._attn_implementation changed to `impl` (restored afterwards)."""
    saved = model.config._attn_implementation
    model.config._attn_implementation = impl
    try:
        return model(**inputs)
    finally:
        model.config._attn_implementation = saved


def _with_attention(model, impl: str):
    model.config._attn_implementation = impl
    return model


def _cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def all_scenarios(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Every scenario of cfg["scenarios"] ([(name, kind, options)]) in this rank; failures are results too."""
    out: Dict[str, Any] = {}
    for name, kind, options in cfg["scenarios"]:
        opts = dict(
            options,
            module_dir=cfg["module_dir"],
            device=cfg["device"],
            ops=cfg.get("ops", "torch"),
            dtype=cfg.get("dtype", "fp32"),
        )
        try:
            out[name] = preconditions(opts) if kind == "preconditions" else parity(opts)
        except Exception:
            out[name] = {"exception": traceback.format_exc()}
            dist.barrier()
    return out
