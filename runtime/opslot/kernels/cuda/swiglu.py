"""SwiGLU MLP: the gate/up/down projections stay cuBLAS GEMMs through torch (the module's own
Linear layers, so hooks and adapters keep working); silu(gate) * up is one fused kernel forward
(`opslot::silu_mul`) and one backward (`opslot::silu_mul_bwd`: reads gate, up, grad; writes both
gradients), torch ops registered from C++ (kernels/torch/swiglu.cc)."""

from __future__ import annotations

from typing import Any

import torch

from ..torch_ops import _check_silu
from . import _ops_common as C

C.require_library_on_cuda_machines()
_SILU_MUL = C.torch_op("silu_mul")  # the Autograd kernel's backward calls opslot::silu_mul_bwd


def swiglu_mlp(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`down(silu(gate(x)) * up(x))`; refuses models whose activation is not SiLU."""
    _check_silu(module, "swiglu_mlp")
    return module.down_proj(_SILU_MUL(module.gate_proj(x), module.up_proj(x)))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (fp32 arithmetic, one rounding), differentiable; contiguous output."""
    return _SILU_MUL(gate, up)
