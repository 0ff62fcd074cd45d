"""RMSNorm (standard, offset, unweighted) and Qwen3.5's gated RMSNorm on libopslot_kernels.

Custom ops `opslot::rms_norm_fwd` / `opslot::rms_norm_bwd`: one kernel pass each way (the backward
adds a small fixed-order reduction for the weight gradient). The public functions follow the slot
contracts of docs/ops.md; docs/kernels.md describes the kernels.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _lib, _ops_common as C

STANDARD, OFFSET, UNWEIGHTED, GATED = 0, 1, 2, 3
_NAMES = {
    STANDARD: "rms_norm/standard",
    OFFSET: "rms_norm/offset",
    UNWEIGHTED: "rms_norm/unweighted",
    GATED: "rms_norm_gated/standard",
}

C.require_library_on_cuda_machines()

_FWD_ARGS = [
    _lib.I32,
    _lib.I32,
    _lib.I32,
    _lib.I64,
    _lib.I64,
    _lib.F32,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
]
_QUERY_ARGS = [
    _lib.I32,
    _lib.I32,
    _lib.I32,
    _lib.I64,
    _lib.I64,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.I64,
]
_BWD_ARGS = [
    _lib.I32,
    _lib.I32,
    _lib.I32,
    _lib.I64,
    _lib.I64,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
]


def _out_dtype(x: torch.Tensor, weight: Optional[torch.Tensor], mode: int) -> torch.dtype:
    if mode == STANDARD and weight is not None:
        return torch.promote_types(weight.dtype, x.dtype)
    return x.dtype


def _check(x: torch.Tensor, gate: Optional[torch.Tensor], weight: Optional[torch.Tensor], mode: int) -> None:
    name = _NAMES.get(mode)
    if name is None:
        raise ValueError(f"rms_norm: unknown mode {mode}")
    C.check_float(x, name)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name}: the input needs a non-empty last dimension, got shape {tuple(x.shape)}")
    if mode == UNWEIGHTED:
        if weight is not None:
            raise ValueError(f"{name} takes weight=None")
    else:
        if weight is None:
            raise ValueError(f"{name} needs a weight")
        if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            raise ValueError(f"{name}: weight of shape {tuple(weight.shape)} for rows of {x.shape[-1]}")
        if weight.dtype not in (x.dtype, torch.float32):
            raise TypeError(
                f"{name}: weight dtype {weight.dtype} with input dtype {x.dtype} (the cuda kernel takes a "
                "weight in the input's dtype or float32); use 'torch' or 'eager'"
            )
    if mode == GATED:
        if gate is None or gate.shape != x.shape or gate.dtype != x.dtype:
            raise ValueError(f"{name}: gate must have the input's shape and dtype")
    elif gate is not None:
        raise ValueError(f"{name} takes no gate")


def _aligned(weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The weight, contiguous and 32-byte aligned (the kernels read it in 16/32-byte vectors and
    size the backward's scratch from the alignment of the row tensors alone)."""
    if weight is None:
        return None
    w = weight.contiguous()
    return w if w.data_ptr() % 32 == 0 else w.clone()


@torch.library.custom_op("opslot::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(
    x: torch.Tensor, gate: Optional[torch.Tensor], weight: Optional[torch.Tensor], eps: float, mode: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): the normalised rows and the fp32 reciprocal RMS of each row (for the backward)."""
    _check(x, gate, weight, mode)
    C.prepare(x)
    xv = C.rows_view(x)
    gv = C.rows_view(gate) if gate is not None else None
    wv = _aligned(weight)
    y = torch.empty(x.shape, dtype=_out_dtype(x, weight, mode), device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    C.fn("opslot_rms_norm_fwd", _FWD_ARGS)(
        mode,
        _lib.DTYPE_CODES[x.dtype],
        _lib.DTYPE_CODES[(wv if wv is not None else x).dtype],
        xv.shape[0],
        xv.shape[1],
        float(eps),
        C.ptr(xv),
        C.row_stride(xv),
        C.ptr(gv),
        C.row_stride(gv) if gv is not None else 0,
        C.ptr(wv),
        C.ptr(y),
        C.ptr(rstd),
        C.stream(x),
    )
    return y, rstd


@rms_norm_fwd.register_fake
def _rms_norm_fwd_fake(x, gate, weight, eps, mode):
    _check(x, gate, weight, mode)
    return x.new_empty(x.shape, dtype=_out_dtype(x, weight, mode)), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("opslot::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    gate: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    mode: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dgate, dweight); dgate / dweight are empty tensors for the variants without them."""
    C.prepare(x)
    xv = C.rows_view(x)
    gv = C.rows_view(gate) if gate is not None else None
    dyv = C.rows_view(dy.to(_out_dtype(x, weight, mode)))
    wv = _aligned(weight)
    rows, cols = xv.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dgate = torch.empty(x.shape if gate is not None else (0,), dtype=x.dtype, device=x.device)
    dw = torch.empty(
        weight.shape if weight is not None else (0,),
        dtype=weight.dtype if weight is not None else x.dtype,
        device=x.device,
    )
    w_code = _lib.DTYPE_CODES[(wv if wv is not None else x).dtype]
    gs = C.row_stride(gv) if gv is not None else 0
    partial = None
    if weight is not None:
        prow = C.raw("opslot_rms_norm_bwd_partial_rows", _lib.I64, _QUERY_ARGS)(
            mode,
            _lib.DTYPE_CODES[x.dtype],
            w_code,
            rows,
            cols,
            C.ptr(xv),
            C.row_stride(xv),
            C.ptr(gv),
            gs,
            C.ptr(dyv),
            C.row_stride(dyv),
        )
        if prow < 0:
            raise RuntimeError(f"opslot cuda kernel rms_norm backward: {C.last_error()}")
        partial = torch.empty((max(prow, 1), cols), dtype=torch.float32, device=x.device)
    C.fn("opslot_rms_norm_bwd", _BWD_ARGS)(
        mode,
        _lib.DTYPE_CODES[x.dtype],
        w_code,
        rows,
        cols,
        C.ptr(xv),
        C.row_stride(xv),
        C.ptr(gv),
        gs,
        C.ptr(wv),
        C.ptr(rstd),
        C.ptr(dyv),
        C.row_stride(dyv),
        C.ptr(dx),
        C.ptr(dgate),
        partial.data_ptr() if partial is not None else None,
        C.ptr(dw),
        C.stream(x),
    )
    return dx, dgate, dw


@rms_norm_bwd.register_fake
def _rms_norm_bwd_fake(dy, x, gate, weight, rstd, mode):
    dx = x.new_empty(x.shape)
    dgate = x.new_empty(x.shape if gate is not None else (0,))
    dw = weight.new_empty(weight.shape) if weight is not None else x.new_empty((0,))
    return dx, dgate, dw


def _setup_context(ctx, inputs, output):
    x, gate, weight, eps, mode = inputs
    _, rstd = output
    ctx.save_for_backward(x, gate, weight, rstd)
    ctx.mode = mode
    ctx.mark_non_differentiable(rstd)
    # rstd never has a gradient: without this, autograd fills a zero tensor for it on every backward
    # (a 0.8 µs kernel at 16384 rows); a missing dy is handled in _backward.
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, _drstd):
    x, gate, weight, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros(x.shape, dtype=_out_dtype(x, weight, ctx.mode), device=x.device)
    dx, dgate, dw = torch.ops.opslot.rms_norm_bwd(dy, x, gate, weight, rstd, ctx.mode)
    return dx, (dgate if gate is not None else None), (dw if weight is not None else None), None, None


rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def _norm(x, gate, weight, eps, mode):
    return torch.ops.opslot.rms_norm_fwd(x, gate, weight, float(eps), mode)[0]


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
