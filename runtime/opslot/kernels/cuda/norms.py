"""RMSNorm (standard, offset, unweighted, unweighted_cast) and Qwen3.5's gated RMSNorm on libopslot_kernels.

Torch ops `opslot::rms_norm_fwd` / `opslot::rms_norm_bwd`, registered from C++ with their Autograd
and Meta kernels (kernels/torch/rms_norm.cc): one kernel pass each way (the backward adds a small
fixed-order reduction for the weight gradient). The public functions follow the slot contracts of
docs/ops.md; docs/kernels.md describes the kernels and the boundary.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _ops_common as C

# OPSLOT_RMS_* of kernels/include/opslot_kernels/rms_norm.h
STANDARD, OFFSET, UNWEIGHTED, GATED, UNWEIGHTED_CAST = 0, 1, 2, 3, 4

C.require_library_on_cuda_machines()
_FWD = C.torch_op("rms_norm_fwd")  # (y, rstd); the Autograd kernel's backward calls rms_norm_bwd


def _norm(x, gate, weight, eps, mode):
    return _FWD(x, gate, weight, eps, mode)[0]


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`w * norm(x).to(dtype)` (Llama/Qwen)."""
    return _norm(hidden_states, None, weight, eps, STANDARD)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`(norm(x) * (1 + w)).to(dtype)` in fp32 (Gemma3/Qwen3.5)."""
    return _norm(hidden_states, None, weight, eps, OFFSET)


def rms_norm_unweighted(hidden_states: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """`norm(x).to(dtype)`; `weight` must be None."""
    if weight is not None:
        raise ValueError("rms_norm/unweighted takes weight=None")
    return _norm(hidden_states, None, None, eps, UNWEIGHTED)


def rows_order(x: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """A permutation `perm` of x's dimensions that keeps the last one last and makes `x.permute(perm)`
    contiguous, when x is not contiguous but such a permutation exists (DeepSeek-V4's q `[B, H, S, D]`,
    the transpose(1, 2) of a contiguous `[B, S, H, D]`: `(0, 2, 1, 3)`); else None (x contiguous, or
    no permutation of its leading dimensions makes it so: a slice of wider rows, a broadcast).

    The op flattens its input with `reshape(-1, D)`, which copies such a view; a row-wise norm gives
    the same rows in any order of them, so the op can run on the contiguous permutation instead."""
    if x.dim() < 3 or x.is_contiguous():
        return None
    lead = sorted(range(x.dim() - 1), key=lambda d: -x.stride(d))  # stable: ties keep their order
    perm = (*lead, x.dim() - 1)
    return perm if x.permute(perm).is_contiguous() else None


def _norm_rowwise(x: torch.Tensor, eps: float, mode: int) -> torch.Tensor:
    """An unweighted norm of x's rows, run on the contiguous permutation of x when there is one
    (`rows_order`) and permuted back: the result has x's strides, as upstream's elementwise ops give,
    and neither x nor the result is copied."""
    perm = rows_order(x)
    if perm is None:
        return _norm(x, None, None, eps, mode)
    inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return _norm(x.permute(perm), None, None, eps, mode).permute(inverse)


def rms_norm_unweighted_cast(hidden_states: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """`x * to_x(rsqrt(mean(x^2) + eps))` (DeepSeek-V4's `DeepseekV4UnweightedRMSNorm`: the fp32 rsqrt
    rounded to x's dtype before the product); `weight` must be None. A transposed view such as V4's q
    is normed where it lies in memory (`rows_order`), not copied; the result has x's strides then."""
    if weight is not None:
        raise ValueError("rms_norm/unweighted_cast takes weight=None")
    return _norm_rowwise(hidden_states, eps, UNWEIGHTED_CAST)


def rms_norm_gated(hidden_states: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`(w * norm(x).to(dtype)) * silu(gate.float())`, cast back (Qwen3.5 RMSNormGated)."""
    return _norm(hidden_states, gate, weight, eps, GATED)
