"""SwiGLU MLP: the gate/up/down projections stay cuBLAS GEMMs through torch (the module's own
Linear layers, so hooks and adapters keep working); silu(gate) * up is one fused kernel forward
(`opslot::silu_mul`) and one backward (`opslot::silu_mul_bwd`: reads gate, up, grad; writes both
gradients)."""

from __future__ import annotations

from typing import Any, Tuple

import torch

from ..torch_ops import _check_silu
from . import _lib, _ops_common as C

C.require_library_on_cuda_machines()

_FWD_ARGS = [_lib.I32, _lib.I64, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR]
_BWD_ARGS = [_lib.I32, _lib.I64, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR]


def _check(gate: torch.Tensor, up: torch.Tensor) -> None:
    C.check_float(gate, "silu_mul")
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"silu_mul: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} "
            "must match in shape and dtype"
        )


@torch.library.custom_op("opslot::silu_mul", mutates_args=())
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (fp32 arithmetic, one rounding); contiguous output."""
    _check(gate, up)
    C.prepare(gate)
    g, u = gate.contiguous(), up.contiguous()
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    C.fn("opslot_silu_mul_fwd", _FWD_ARGS)(
        _lib.DTYPE_CODES[g.dtype], g.numel(), C.ptr(g), C.ptr(u), C.ptr(out), C.stream(g)
    )
    return out


@silu_mul.register_fake
def _silu_mul_fake(gate, up):
    _check(gate, up)
    return gate.new_empty(gate.shape)


@torch.library.custom_op("opslot::silu_mul_bwd", mutates_args=())
def silu_mul_bwd(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(grad_gate, grad_up) of silu(gate) * up."""
    _check(gate, up)
    C.prepare(gate)
    g, u, d = gate.contiguous(), up.contiguous(), grad.to(gate.dtype).contiguous()
    dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    C.fn("opslot_silu_mul_bwd", _BWD_ARGS)(
        _lib.DTYPE_CODES[g.dtype], g.numel(), C.ptr(g), C.ptr(u), C.ptr(d), C.ptr(dg), C.ptr(du), C.stream(g)
    )
    return dg, du


@silu_mul_bwd.register_fake
def _silu_mul_bwd_fake(grad, gate, up):
    _check(gate, up)
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _setup_context(ctx, inputs, output):
    gate, up = inputs
    ctx.save_for_backward(gate, up)


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    dg, du = torch.ops.opslot.silu_mul_bwd(grad, gate, up)
    return dg, du


silu_mul.register_autograd(_backward, setup_context=_setup_context)


def swiglu_mlp(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`down(silu(gate(x)) * up(x))`; refuses models whose activation is not SiLU."""
    _check_silu(module, "swiglu_mlp")
    return module.down_proj(torch.ops.opslot.silu_mul(module.gate_proj(x), module.up_proj(x)))
