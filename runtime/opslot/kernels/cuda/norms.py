"""RMSNorm (standard, offset, unweighted) and Qwen3.5's gated RMSNorm on libopslot_kernels.

Torch ops `opslot::rms_norm_fwd` / `opslot::rms_norm_bwd`, registered from C++ with their Autograd
and Meta kernels (kernels/torch/rms_norm.cc): one kernel pass each way (the backward adds a small
fixed-order reduction for the weight gradient). The public functions follow the slot contracts of
docs/ops.md; docs/kernels.md describes the kernels and the boundary.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _ops_common as C

STANDARD, OFFSET, UNWEIGHTED, GATED = 0, 1, 2, 3  # OPSLOT_RMS_* of kernels/include/opslot_kernels/rms_norm.h

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


def rms_norm_gated(hidden_states: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`(w * norm(x).to(dtype)) * silu(gate.float())`, cast back (Qwen3.5 RMSNormGated)."""
    return _norm(hidden_states, gate, weight, eps, GATED)
