"""SwiGLU MLP: the gate/up/down projections stay cuBLAS GEMMs through torch (the module's own
Linear layers, so hooks and adapters keep working); silu(gate) * up is one fused kernel forward
(`opslot::silu_mul`) and one backward (`opslot::silu_mul_bwd`: reads gate, up, grad; writes both
gradients), torch ops registered from C++ (kernels/torch/swiglu.cc). DeepSeek-V4's clamped variant
(`swiglu_mlp/clamped`: silu(gate.clamp(max=L)) * up.clamp(-L, L)) is the same kernels with the
clamps (`opslot::silu_mul_clamped`, `_bwd`)."""

from __future__ import annotations

from typing import Any

import torch

from ..torch_ops import _check_silu
from . import _ops_common as C

C.require_library_on_cuda_machines()
_SILU_MUL = C.torch_op("silu_mul")  # the Autograd kernel's backward calls opslot::silu_mul_bwd
_SILU_MUL_CLAMPED = C.torch_op("silu_mul_clamped")  # backward: opslot::silu_mul_clamped_bwd


def swiglu_mlp(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`down(silu(gate(x)) * up(x))`; refuses models whose activation is not SiLU."""
    _check_silu(module, "swiglu_mlp")
    return module.down_proj(_SILU_MUL(module.gate_proj(x), module.up_proj(x)))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (fp32 arithmetic, one rounding), differentiable; contiguous output."""
    return _SILU_MUL(gate, up)


def _limit(module: Any, op: str) -> float:
    limit = getattr(module, "limit", None)
    if limit is None:
        raise ValueError(f"{op} (cuda) needs the module's clamp limit (`limit`, config.swiglu_limit); it has none")
    return float(limit)


def swiglu_mlp_clamped(module: Any, x: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4's MLP: `down(silu(gate(x).clamp(max=L)) * up(x).clamp(-L, L))`, L = `module.limit`;
    refuses models whose activation is not SiLU."""
    _check_silu(module, "swiglu_mlp")
    limit = _limit(module, "swiglu_mlp/clamped")
    return module.down_proj(_SILU_MUL_CLAMPED(module.gate_proj(x), module.up_proj(x), limit))


def silu_mul_clamped(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(gate.clamp(max=limit)) * up.clamp(-limit, limit) (fp32 arithmetic, one rounding; the limit
    rounded to the inputs' dtype as torch.clamp rounds it), differentiable; contiguous output."""
    return _SILU_MUL_CLAMPED(gate, up, float(limit))
