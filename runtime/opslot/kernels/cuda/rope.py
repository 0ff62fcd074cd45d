"""Rotary position embedding (full and partial) on libopslot_kernels, reading q/k through their
strides (HF passes transposed views of the projections: nothing is copied).

Torch ops `opslot::rope_fwd` / `opslot::rope_bwd` (registered from C++: kernels/torch/rope.cc)
handle q and k in one launch each way. cos/sin get no gradient: when they require one the op
raises (HF computes them under no_grad). docs/kernels.md describes the kernel.
"""

from __future__ import annotations

from typing import Tuple

import torch

from . import _ops_common as C

C.require_library_on_cuda_machines()
_ROPE = C.torch_op("rope_fwd")  # refuses cos/sin that require grad; its backward calls rope_bwd


def _apply(q, k, cos, sin, unsqueeze_dim, full: bool):
    if full and cos.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"rotary_pos_emb/full: cos/sin have {cos.shape[-1]} features for a head dim of {q.shape[-1]} "
            "(use the partial variant)"
        )
    return _ROPE(q, k, cos, sin, unsqueeze_dim)


def rotary_pos_emb_full(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the whole head dimension."""
    return _apply(q, k, cos, sin, unsqueeze_dim, True)


def rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the first `cos.shape[-1]` features; the rest pass through."""
    return _apply(q, k, cos, sin, unsqueeze_dim, False)
