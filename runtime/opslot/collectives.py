"""The collectives and the class helper that expert parallelism (expert_parallel.py) and sequence
parallelism (sequence_parallel.py) share: a differentiable all_to_all, an all_gather of host integers,
and the cached subclass a module made parallel gets as its class."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor


def _group_of(group: Any) -> dist.ProcessGroup:
    if hasattr(group, "get_group"):  # a 1-D DeviceMesh
        if group.ndim != 1:
            raise ValueError(f"expert parallelism needs a 1-D mesh or a process group, got a {group.ndim}-D mesh")
        return group.get_group()
    if group is None:
        return dist.group.WORLD
    return group


# -- the exchange ------------------------------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    """all_to_all_single with autograd: the backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, x: Tensor, out_splits: Optional[List[int]], in_splits: Optional[List[int]], group) -> Tensor:
        ctx.meta = (out_splits, in_splits, group)
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        out_splits, in_splits, group = ctx.meta
        return _all_to_all(grad, in_splits, out_splits, group), None, None, None


def _all_to_all(x: Tensor, out_splits: Optional[List[int]], in_splits: Optional[List[int]], group) -> Tensor:
    x = x.contiguous()
    rows = sum(out_splits) if out_splits is not None else x.shape[0]
    out = x.new_empty((rows,) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    return out


def all_to_all(x: Tensor, out_splits: Optional[List[int]], in_splits: Optional[List[int]], group=None) -> Tensor:
    """Differentiable `dist.all_to_all_single` along dim 0 (None splits: equal parts)."""
    return _AllToAll.apply(x, out_splits, in_splits, _group_of(group))


def _gather_ints(values: List[int], group: Any, device: torch.device) -> List[List[int]]:
    """Every rank's `values` (host ints) on every rank: one all_gather over the group, of a CPU tensor when
    the group has a CPU backend (gloo; "cpu:gloo,cuda:nccl"), which waits for no device work; else on
    `device` (its host read waits for the work queued before it)."""
    if "cpu:" in dist.get_backend_config(group):
        device = torch.device("cpu")
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return torch.stack(parts).tolist()


_SUBCLASSES: Dict[tuple, type] = {}


def forward_subclass(cls: type, prefix: str, forward: Any, base_attr: str) -> type:
    """`<prefix><cls>`: a subclass of `cls` (one per class and prefix, cached) whose forward is
    `forward`, with the original class in `base_attr`; a module made parallel gets it as `__class__`
    (expert parallelism: `ExpertParallel*`; sequence parallelism: `SequenceParallel*`)."""
    sub = _SUBCLASSES.get((cls, prefix))
    if sub is None:
        sub = type(
            f"{prefix}{cls.__name__}",
            (cls,),
            {
                "forward": forward,
                base_attr: cls,
                "__module__": cls.__module__,
                "__qualname__": f"{prefix}{cls.__qualname__}",
            },
        )
        _SUBCLASSES[(cls, prefix)] = sub
    return sub
