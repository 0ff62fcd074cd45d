"""Rotary position embedding on libopslot_kernels, reading q/k through their strides (HF passes
transposed views of the projections: nothing is copied).

Torch ops (registered from C++: kernels/torch/rope.cc), q and k in one launch each way:
- `opslot::rope_fwd` / `rope_bwd`: HF's `apply_rotary_pos_emb`, full and partial;
- `opslot::rope_interleaved_fwd` / `_bwd`: DeepSeek-V3's `apply_rotary_pos_emb_interleave`
  (interleaved pairs in, de-interleaved out);
- `opslot::rope_vision_fwd` / `_bwd`: the VL vision towers' `apply_rotary_pos_emb_vision`, in fp32
  with upstream's rounding;
- `opslot::rope_deepseek_v4_fwd` / `_bwd`: DeepSeek-V4's `apply_rotary_pos_emb` (one tensor, the
  trailing slice's interleaved pairs turned in place), with upstream's rounding.
cos/sin get no gradient: when they require one the op raises (HF computes them under no_grad).
docs/kernels.md describes the kernel.
"""

from __future__ import annotations

from typing import Tuple

import torch

from . import _ops_common as C

C.require_library_on_cuda_machines()
_ROPE = C.torch_op("rope_fwd")  # refuses cos/sin that require grad; its backward calls rope_bwd
_INTERLEAVED = C.torch_op("rope_interleaved_fwd")  # its backward calls rope_interleaved_bwd
_VISION = C.torch_op("rope_vision_fwd")  # its backward calls rope_vision_bwd
_V4 = C.torch_op("rope_deepseek_v4_fwd")  # its backward calls rope_deepseek_v4_bwd


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


def rotary_pos_emb_interleaved(
    q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1
) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3: the interleaved pairs of q/k turned by the first half of cos/sin, returned in the
    de-interleaved order, in q's dtype (`position_ids` is unused, as upstream)."""
    return _INTERLEAVED(q, k, cos, sin, unsqueeze_dim)


def rotary_pos_emb_vision(q, k, cos, sin) -> Tuple[torch.Tensor, torch.Tensor]:
    """The vision towers' RoPE: q/k `[seq, heads, dim]`, cos/sin `[seq, dim]`, computed in fp32 with
    upstream's rounding and returned in q's and k's dtypes."""
    return _VISION(q, k, cos, sin)


def rotary_pos_emb_deepseek_v4(x, cos, sin, unsqueeze_dim: int = 1) -> torch.Tensor:
    """DeepSeek-V4: the last `2 * cos.shape[-1]` features of x, interleaved pairs turned in place by the
    half-width cos/sin (one entry per pair), the others passed through; x's dtype and layout."""
    return _V4(x, cos, sin, unsqueeze_dim)
