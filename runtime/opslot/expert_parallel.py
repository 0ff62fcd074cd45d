"""Expert parallelism for the `moe` slot, and FSDP2 (the public names: opslot.distributed).

    import opslot.distributed as od
    meshes = od.init_meshes("cuda", ep=2)                  # dp (all ranks), ep, expert_dp
    model = opslot.build_model(config, ops, module=..., model_class=...)
    od.shard_experts(model, meshes.ep)                     # each rank keeps num_experts / ep experts
    od.fully_shard_model(model, meshes)                    # FSDP2 per decoder layer, experts apart

`shard_experts` turns every experts module of the model (the module a `moe` slot guards: a
`num_experts` attribute and parameters whose first dimension is that number) into an expert-parallel
one: its parameters keep only this rank's contiguous block of experts, and its forward

1. sorts the (token, k) assignments by global expert and counts them per expert, on the device;
2. exchanges the counts with `all_to_all_single` (device tensors);
3. exchanges the token rows with `all_to_all_single` (autograd: the backward is the reverse exchange);
4. runs the received rows through the experts module's own forward with the local experts (the
   bound moe kernel: `torch`, `cuda`, ...; or upstream's code when the slot is eager), one expert
   per row and weight 1;
5. sends the results back the same way and combines them per token, weighted by the routing
   weights, as a sum over k in fp32 (deterministic: no atomics).

Host syncs. `all_to_all_single` with variable split sizes needs the sizes on the host, so the default
mode (`mode="splits"`) reads them once per layer forward (one `.tolist()` of 2·ep integers, which
waits for the GPU work queued before it); the backward reuses them and reads nothing. `mode="padded"`
reads no device data on the host: every rank sends `tokens·top_k` rows (or a given capacity) to every
rank (the most that can go to one rank), padded with upstream's masking index (rows the kernels skip),
so the exchanges carry ep times the rows; every rank must send the same number of rows (a fixed batch
shape, or `capacity`), and it needs a moe kernel that honours the masking index (`torch`, `cuda`).

Preconditions are agreed before a collective, never checked on one rank alone (a rank that refuses
alone leaves the others hanging in the exchange, and unequal exchange sizes abort gloo): `init_meshes`
gathers every rank's `ep`, `shard_experts` every rank's refusal and plan (mode, capacity, experts), and
padded mode, per layer forward, every rank's tokens and top_k (host integers: an all_gather of a CPU
tensor where the EP group has a CPU backend, gloo or "cpu:gloo,cuda:nccl", which waits for no GPU
work; on an NCCL-only group a device all_gather and a host read of 2·ep integers). A bad input on any
rank is then the same ValueError, naming every rank's values, on every rank.

Gradients. Each expert receives rows from every rank, so its gradient is the sum over every rank's
loss. Under data parallelism each rank's loss is a mean over its own batch and FSDP averages the other
gradients over the ranks; `fully_shard_model` therefore shards each experts module over the
`expert_dp` mesh (ranks that hold the same experts) and divides its gradient by the whole data-parallel
size (`set_gradient_divide_factor`), so that every parameter gets the gradient of the mean loss.

torch.compile: the expert-parallel forward is excluded from compilation (`torch.compiler.disable`:
collectives with split sizes read on the host), so a compiled decoder layer breaks its graph there and
runs the exchange and the local experts eagerly; the rest of the layer is compiled.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .collectives import _all_to_all, _gather_ints, _group_of, all_to_all, forward_subclass
from .slot import OpSlot

MODES = ("splits", "padded")


# -- meshes ------------------------------------------------------------------------------------------
class Meshes(NamedTuple):
    """`dp`: every rank (FSDP of the dense parameters); `ep`: ranks that split one layer's experts;
    `expert_dp`: ranks that hold the same experts (FSDP of the expert parameters; size world // ep)."""

    dp: Any
    ep: Any
    expert_dp: Any


def init_meshes(device_type: str, ep: int = 1) -> Meshes:
    """The meshes for FSDP2 with expert parallelism of degree `ep` over all ranks of the default group.
    EP groups are consecutive ranks (the fast dimension), so on one host experts are exchanged over
    NVLink. `ep` must divide the world size and be the same on every rank (agreed with one all_gather
    before the EP groups are made: a ValueError on every rank otherwise)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    dp = init_device_mesh(device_type, (world,), mesh_dim_names=("dp",))  # the default group: no new group
    asked = [e for (e,) in _gather_ints([ep], dist.group.WORLD, torch.device(device_type))]
    if len(set(asked)) > 1:
        raise ValueError(
            "init_meshes: every rank must ask for the same expert-parallel size, got "
            + ", ".join(f"rank {r}: {e}" for r, e in enumerate(asked))
        )
    if ep < 1 or world % ep:
        raise ValueError(f"expert-parallel size {ep} must divide the world size {world}")
    two = init_device_mesh(device_type, (world // ep, ep), mesh_dim_names=("expert_dp", "ep"))
    return Meshes(dp, two["ep"], two["expert_dp"])


# -- expert parallelism ------------------------------------------------------------------------------
class EPState(NamedTuple):
    group: Any
    size: int  # ep
    rank: int  # this rank's index in the EP group
    num_experts: int  # global
    first: int  # first global expert held here
    local: int  # experts held here
    mode: str
    sharded: tuple  # names of the parameters cut to the local experts
    capacity: Optional[int] = None  # padded mode: rows sent to each rank (None: this rank's tokens·top_k)


def moe_slot_of(module: nn.Module) -> Optional[OpSlot]:
    """The `moe` slot that guards `module`'s forward: an instance-scoped one on the module, else a
    module-level one of the module that defines its class; None when there is none."""
    for value in vars(module).values():
        if isinstance(value, OpSlot) and value.op == "moe":
            return value
    cls = getattr(module, "_opslot_ep_base", type(module))
    for klass in cls.__mro__:
        mod = sys.modules.get(klass.__module__)
        for value in vars(mod).values() if mod is not None else ():
            if isinstance(value, OpSlot) and value.op == "moe":
                return value
    return None


def is_experts_module(module: nn.Module) -> bool:
    """An experts module opslot can shard: guarded by a `moe` slot, an int `num_experts`, and at
    least one direct 3-D parameter [num_experts, ., .] (the stacked expert weights; a router's
    [num_experts, hidden] weight is not one)."""
    n = getattr(module, "num_experts", None)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return False
    if not any(p.dim() == 3 and p.shape[0] == n for p in module.parameters(recurse=False)):
        return False
    return moe_slot_of(module) is not None


def experts_modules(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if is_experts_module(m) or hasattr(m, "_opslot_ep")]


def _ep_class(cls: type) -> type:
    return forward_subclass(cls, "ExpertParallel", _ep_forward, "_opslot_ep_base")


def shard_experts(
    model: nn.Module,
    ep_group: Any,
    *,
    mode: str = "splits",
    capacity: Optional[int] = None,
    modules: Optional[Iterable[nn.Module]] = None,
) -> List[nn.Module]:
    """Make every experts module of `model` (or `modules`) expert-parallel over `ep_group` (a process
    group or a 1-D DeviceMesh; None: the default group). Call it on every rank of the group, after
    the model is built (same weights on every rank, e.g. the same seed or a loaded checkpoint) and
    before FSDP / the optimizer. Rank r of the group keeps experts [r·E/ep, (r+1)·E/ep). Returns the
    modules changed. `mode`: "splits" (one host read of the split sizes per layer) or "padded" (none;
    ep times the traffic): see the module docstring. In padded mode every rank of the group must send
    the same number of rows: `capacity` (rows per destination rank, at least tokens·top_k of every
    call), or, when None, tokens·top_k, which must then be equal on every rank (a fixed batch shape).

    A collective over the group: the ranks agree before anything is sharded, so a refusal on any rank
    (or ranks that would shard differently: mode, capacity, experts) is the same ValueError on every rank."""
    if not dist.is_initialized():
        raise RuntimeError("shard_experts needs torch.distributed initialised (dist.init_process_group)")
    group = _group_of(ep_group)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    targets = list(modules) if modules is not None else [m for m in model.modules() if is_experts_module(m)]
    _agree_to_shard(group, _refusal(model, targets, mode, size), _plan(mode, capacity, targets))
    for m in targets:
        total = m.num_experts
        local = total // size
        first = rank * local
        names = []
        for name, p in _stacked(m):
            setattr(m, name, nn.Parameter(p.detach()[first : first + local].clone(), requires_grad=p.requires_grad))
            names.append(name)
        m.num_experts = local
        m._opslot_ep = EPState(group, size, rank, total, first, local, mode, tuple(names), capacity)
        m.__class__ = _ep_class(type(m))
    return targets


def _stacked(m: nn.Module) -> List[tuple]:
    """(name, parameter) of the parameters that hold one entry per expert (first dimension num_experts)."""
    n = getattr(m, "num_experts", None)
    return [(k, p) for k, p in m.named_parameters(recurse=False) if p.dim() >= 1 and p.shape[0] == n]


def _refusal(model: nn.Module, targets: List[nn.Module], mode: str, size: int) -> Optional[str]:
    """Why this rank cannot shard `targets` over `size` ranks in `mode` (the first reason), or None."""
    if mode not in MODES:
        return f"shard_experts mode must be one of {MODES}, got {mode!r}"
    if not targets:
        return (
            f"shard_experts: {type(model).__name__} has no experts module guarded by a moe slot "
            f"(a module with num_experts and [num_experts, ...] parameters)"
        )
    for m in targets:
        if hasattr(m, "_opslot_ep"):
            return f"shard_experts: {type(m).__name__} is already expert-parallel"
        if not is_experts_module(m):
            return f"shard_experts: {type(m).__name__} is not an experts module guarded by a moe slot"
        if m.num_experts % size:
            return f"shard_experts: {m.num_experts} experts of {type(m).__name__} do not split over {size} ranks"
        if mode == "padded" and moe_slot_of(m).impl == "eager":
            return (
                "shard_experts mode='padded' pads with the masking index, which upstream's eager experts code "
                "does not skip; bind a moe kernel (moe_implementation: fused_torch or fused_cuda) or use "
                "mode='splits'"
            )
    return None


def _plan(mode: str, capacity: Optional[int], targets: List[nn.Module]) -> str:
    """What this rank is about to do, in words: every rank of the group must say the same."""
    kinds: Dict[str, int] = {}
    for m in targets:
        shapes = ", ".join("x".join(map(str, p.shape)) for _, p in _stacked(m))
        kind = f"{type(m).__name__}({shapes})"
        kinds[kind] = kinds.get(kind, 0) + 1
    return f"mode={mode!r}, capacity={capacity}, " + ", ".join(f"{n} x {k}" for k, n in kinds.items())


def _agree_to_shard(group: Any, refusal: Optional[str], plan: str) -> None:
    """Every rank's refusal and plan, gathered (one all_gather_object): the same ValueError on every rank
    when any rank refuses (its own message when all refuse alike) or when the plans differ."""
    got: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, (refusal, plan), group=group)
    refusals = [r for r, _ in got]
    bad = [i for i, r in enumerate(refusals) if r]
    if bad and len(set(refusals)) == 1:
        raise ValueError(refusals[0])
    if bad:
        raise ValueError(
            f"shard_experts refused on {len(bad)} of {len(got)} ranks of the EP group: "
            + "; ".join(f"rank {i}: {refusals[i]}" for i in bad)
        )
    if len({p for _, p in got}) > 1:
        raise ValueError(
            "shard_experts: every rank of the EP group must shard the same way, got "
            + "; ".join(f"rank {i}: {p}" for i, (_, p) in enumerate(got))
        )


def _ranks(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _padded_capacity(st: EPState, tokens: int, top_k: int, device: torch.device) -> int:
    """The rows padded mode sends to each rank, agreed by the EP group before the exchanges (which would
    abort or hang on unequal sizes): the same ValueError on every rank when a rank's tokens·top_k differ
    from the others' (no capacity) or exceed the capacity, naming every rank's counts."""
    got = _gather_ints([tokens, top_k], st.group, device)
    rows = [t * k for t, k in got]
    counts = ", ".join(f"rank {r}: {t} tokens x top-{k} = {t * k} rows" for r, (t, k) in enumerate(got))
    if st.capacity is None and len(set(rows)) > 1:
        raise ValueError(
            f"expert parallelism (padded): without a capacity every rank of the EP group must send "
            f"the same number of rows ({counts}); use a fixed batch shape, or give shard_experts a "
            f"capacity of at least {max(rows)}"
        )
    over = [r for r, n in enumerate(rows) if st.capacity is not None and n > st.capacity]
    if over:
        raise ValueError(
            f"expert parallelism (padded): more rows than the capacity {st.capacity} given to "
            f"shard_experts on {_ranks(over)} ({counts})"
        )
    return rows[0] if st.capacity is None else st.capacity


def _local_experts(module: nn.Module, rows: Tensor, local_ids: Tensor) -> Tensor:
    """The module's own forward (moe slot -> bound kernel, or upstream's code) on rows that each go to
    one local expert with weight 1."""
    ones = torch.ones(rows.shape[0], 1, device=rows.device, dtype=rows.dtype)
    return module._opslot_ep_base.forward(module, rows, local_ids.unsqueeze(1), ones)


def _connected(y: Tensor, x: Tensor, module: nn.Module) -> Tensor:
    """y, made part of the autograd graph (an empty sum of x or of a parameter added) when it is not but
    x or the experts' parameters are: a rank whose experts got no rows may get fresh zeros from the
    kernel. Every rank must run the backward exchanges, in the same order, or the collectives hang."""
    if y.requires_grad or not torch.is_grad_enabled():
        return y
    for dep in [x, *module.parameters(recurse=False)]:
        if dep.requires_grad:
            return y + dep.narrow(0, 0, 0).sum()
    return y


@torch.compiler.disable
def _ep_forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    st: EPState = self._opslot_ep
    shape = hidden_states.shape
    hidden = shape[-1]
    x = hidden_states.reshape(-1, hidden)
    tokens = x.shape[0]
    top_k = top_k_index.shape[-1]
    n = tokens * top_k
    dev = x.device
    total, ep, local = st.num_experts, st.size, st.local
    flat = top_k_index.reshape(n).long()
    key = torch.where((flat >= 0) & (flat < total), flat, torch.full_like(flat, total))  # total = dropped
    order = torch.sort(key, stable=True).indices  # assignments by global expert
    counts = torch.zeros(total + 1, device=dev, dtype=torch.int64).scatter_add_(0, key, torch.ones_like(key))[
        :total
    ]  # per expert, on the device
    # token rows in assignment order (a copy whose backward is a plain sum over k: deterministic)
    x_rep = x.unsqueeze(1).expand(tokens, top_k, hidden).reshape(n, hidden)
    if st.mode == "splits":
        recv_counts = _all_to_all(counts, None, None, st.group).view(ep, local)  # [source rank, local expert]
        sizes = torch.cat([counts.view(ep, local).sum(1), recv_counts.sum(1)]).tolist()  # the one host read
        in_splits, out_splits = sizes[:ep], sizes[ep:]
        kept = sum(in_splits)
        order = order[:kept]
        received = sum(out_splits)
        x_recv = all_to_all(x_rep[order], out_splits, in_splits, st.group)
        ids = (
            torch.arange(local, device=dev).repeat(ep).repeat_interleave(recv_counts.reshape(-1), output_size=received)
        )
        y_recv = _connected(_local_experts(self, x_recv, ids), x_recv, self)
        y_sorted = all_to_all(y_recv, in_splits, out_splits, st.group)  # [kept, H], in `order`
    else:  # padded: capacity n rows per destination, masking index `local` on the padding
        cap = _padded_capacity(st, tokens, top_k, dev)  # agreed by every rank, or ValueError
        skey = key[order]
        dest = torch.div(skey, local, rounding_mode="floor")  # ep for dropped rows
        per_rank = counts.view(ep, local).sum(1)
        start = torch.cumsum(per_rank, 0) - per_rank
        pos = torch.arange(n, device=dev) - start[dest.clamp(max=ep - 1)]
        # dropped rows go to n trash rows past the end (unique indices: index_copy stays deterministic)
        row = torch.arange(n, device=dev)
        slot = torch.where(skey < total, dest * cap + pos, ep * cap + row)
        send = x.new_zeros(ep * cap + n, hidden).index_copy(0, slot, x_rep[order])[: ep * cap]
        send_ids = torch.full((ep * cap + n,), local, device=dev, dtype=torch.int64).index_copy(
            0, slot, skey - dest * local
        )[: ep * cap]
        x_recv = all_to_all(send, None, None, st.group)
        ids = _all_to_all(send_ids, None, None, st.group)
        y_recv = _connected(_local_experts(self, x_recv, ids), x_recv, self)
        y_back = all_to_all(y_recv, None, None, st.group)
        y_back = torch.cat([y_back, y_back.new_zeros(n, hidden)])
        y_sorted = y_back[slot]  # [n, H], dropped rows zero
    y = x.new_zeros(n, hidden).index_copy(0, order, y_sorted.to(x.dtype))
    w = top_k_weights.reshape(tokens, top_k, 1).float()
    out = (y.view(tokens, top_k, hidden).float() * w).sum(1)
    return out.to(hidden_states.dtype).reshape(shape)


# -- FSDP2 -------------------------------------------------------------------------------------------
def decoder_layers(model: nn.Module) -> List[nn.Module]:
    """The decoder layers of a Transformers model: the entries of its `layers` ModuleList(s)."""
    found: List[nn.Module] = []
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and name.split(".")[-1] == "layers":
            found.extend(m)
    if not found:
        raise ValueError(f"{type(model).__name__} has no `layers` ModuleList; pass layers= to fully_shard_model")
    return found


def fully_shard_model(
    model: nn.Module, meshes: Union[Meshes, Any], *, layers: Optional[Iterable[nn.Module]] = None, **fsdp_kwargs: Any
) -> nn.Module:
    """FSDP2 (`fully_shard`) per decoder layer and at the root, over `meshes.dp` (or a 1-D mesh).

    Expert-parallel experts modules (`shard_experts`) are sharded first, each on its own, over
    `meshes.expert_dp` (ranks holding the same experts), with their gradients divided by the whole
    data-parallel size: see the module docstring. `fsdp_kwargs` go to every `fully_shard` call
    (`mp_policy`, `reshard_after_forward`, `offload_policy`, ...). Apply activation checkpointing and
    torch.compile to the layers before this."""
    from torch.distributed.fsdp import fully_shard

    if isinstance(meshes, Meshes):
        dp, expert_dp = meshes.dp, meshes.expert_dp
    else:
        dp, expert_dp = meshes, None
    world = dp.size()
    for m in model.modules():
        st = getattr(m, "_opslot_ep", None)
        if st is None:
            continue
        if expert_dp is None:
            raise ValueError(
                "fully_shard_model: the model has expert-parallel experts; pass the Meshes of "
                "opslot.distributed.init_meshes(device, ep) (their expert_dp mesh shards them)"
            )
        if expert_dp.size() * st.size != world:
            raise ValueError(f"fully_shard_model: expert_dp ({expert_dp.size()}) x ep ({st.size}) != dp ({world})")
        fully_shard(m, mesh=expert_dp, **fsdp_kwargs)
        m.set_gradient_divide_factor(float(world))
    for layer in list(layers) if layers is not None else decoder_layers(model):
        fully_shard(layer, mesh=dp, **fsdp_kwargs)
    fully_shard(model, mesh=dp, **fsdp_kwargs)
    return model


def full_state_dict(model: nn.Module, *, grads: bool = False) -> Dict[str, Tensor]:
    """The model's whole state dict on every rank, in upstream's shapes: FSDP's DTensors gathered
    (`full_tensor`) and expert-parallel parameters concatenated over the EP group. `grads=True`: the
    parameters' gradients instead (zeros where a gradient is None). A collective: call it on every rank."""
    ep_params: Dict[str, EPState] = {}
    for name, m in model.named_modules():
        st = getattr(m, "_opslot_ep", None)
        if st is not None:
            for p in st.sharded:
                ep_params[f"{name}.{p}" if name else p] = st
    out: Dict[str, Tensor] = {}
    items = (
        model.state_dict().items()
        if not grads
        else [(k, p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in model.named_parameters()]
    )
    for key, value in items:
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        st = ep_params.get(key)
        if st is not None:
            value = value.contiguous()
            parts = [torch.empty_like(value) for _ in range(st.size)]
            dist.all_gather(parts, value, group=st.group)
            value = torch.cat(parts, 0)
        out[key] = value.detach()
    return out


__all__ = [
    "Meshes",
    "init_meshes",
    "shard_experts",
    "all_to_all",
    "fully_shard_model",
    "full_state_dict",
    "decoder_layers",
    "experts_modules",
    "is_experts_module",
    "moe_slot_of",
    "EPState",
    "MODES",
]
