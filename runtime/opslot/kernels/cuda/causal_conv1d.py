"""Qwen3.5 Gated DeltaNet's depthwise causal conv1d on libopslot_kernels: forward, backward, packed
sequences (`cu_seqlens`) and the one-step decode update (`conv_state`).

Custom ops:
- `opslot::causal_conv1d_fwd(x, weight, bias?, cu_seqlens?, silu) -> out`, differentiable through
  `opslot::causal_conv1d_bwd(grad, x, weight, bias?, cu_seqlens?, silu) -> (dx, dweight, dbias)`
  (the pre-activation is recomputed from x: nothing but the inputs is saved).
- `opslot::causal_conv1d_update(x, conv_state!, weight, bias?, silu) -> out`: decode, conv_state
  updated in place; inference only (no autograd).

Layout: x is read through its strides, nothing is copied. Upstream passes `mixed_qkv.transpose(1, 2)`
(channel stride 1); the output then has the same layout, the transpose of a contiguous [B, T, C], so
the caller's `.transpose(1, 2)` back is free. In general the output (and dx) is channels-last
(`empty(B, T, C).transpose(1, 2)`) when x's channel stride is smaller than its time stride, else a
contiguous [B, C, T]. A gradient in another layout than x (e.g. a contiguous [B, C, T] against
upstream's view) is first put into x's layout by the library's tiled relayout (2 N bytes more).
dweight is contiguous [C, W] in weight's dtype, dbias [C] in bias's dtype; both are deterministic
(fixed-order reductions, no atomics). kernels/include/opslot_kernels/
causal_conv1d.h describes the kernels and the bytes they move.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence, Tuple

import torch

from . import _lib, _ops_common as C

C.require_library_on_cuda_machines()

_SILU_NAMES = ("silu", "swish")
_STRIDES = ctypes.c_int64 * 3
_COMMON = [_lib.I32, _lib.I64, _lib.I64, _lib.I64, _lib.I32]  # dtype, batch, channels, seqlen, width
_FWD_ARGS = _COMMON + [
    _lib.PTR,
    _lib.PTR,
    _lib.I32,
    _lib.PTR,
    _lib.I32,
    _lib.PTR,
    _lib.PTR,
    _lib.I32,
    _lib.I64,
    _lib.I32,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
]
_SCRATCH_ARGS = [_lib.I32, _lib.I64, _lib.I64, _lib.I64, _lib.I32]
_BWD_ARGS = _COMMON + [
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.I32,
    _lib.PTR,
    _lib.I32,
    _lib.PTR,
    _lib.PTR,
    _lib.I32,
    _lib.I64,
    _lib.I32,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
]
_RELAYOUT_ARGS = [_lib.I32, _lib.I64, _lib.I64, _lib.I64, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR]
_UPDATE_ARGS = _COMMON + [
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.I64,
    _lib.PTR,
    _lib.I32,
    _lib.PTR,
    _lib.I32,
    _lib.PTR,
    _lib.I32,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
]


def _silu(activation) -> bool:
    """True for SiLU, False for none; anything else is refused as the `torch` kernel does."""
    if activation is not None and activation not in _SILU_NAMES:
        raise ValueError(f"causal_conv1d supports activation None, 'silu' or 'swish', got {activation!r}")
    return activation is not None


def _check(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor] = None
) -> None:
    C.check_float(x, "causal_conv1d")
    if x.dim() != 3:
        raise ValueError(f"causal_conv1d: hidden_states must be [batch, channels, seq], got shape {tuple(x.shape)}")
    channels = x.shape[1]
    if weight.dim() != 2 or weight.shape[0] != channels:
        raise ValueError(
            f"causal_conv1d: weight must be [channels, width] = [{channels}, width], got {tuple(weight.shape)}"
        )
    if not 2 <= weight.shape[1] <= 4:
        raise ValueError(
            f"causal_conv1d: kernel width {weight.shape[1]}; the cuda kernel takes widths 2 to 4 "
            "(use 'torch' or 'eager')"
        )
    if weight.dtype not in (x.dtype, torch.float32):
        raise TypeError(
            f"causal_conv1d: weight dtype {weight.dtype} with input dtype {x.dtype} (the cuda kernel "
            "takes a weight in the input's dtype or float32); use 'torch' or 'eager'"
        )
    if bias is not None:
        if bias.shape != (channels,):
            raise ValueError(f"causal_conv1d: bias must be [{channels}], got {tuple(bias.shape)}")
        if bias.dtype not in (x.dtype, torch.float32):
            raise TypeError(
                f"causal_conv1d: bias dtype {bias.dtype} with input dtype {x.dtype} (the cuda kernel "
                "takes the input's dtype or float32)"
            )
    for name, t in (("weight", weight), ("bias", bias), ("cu_seqlens", cu_seqlens)):
        if t is not None and t.device != x.device:
            raise ValueError(f"causal_conv1d: {name} is on {t.device}, hidden_states on {x.device}")
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 2:
            raise ValueError(
                "causal_conv1d: cu_seqlens must be a 1-D int32 or int64 tensor [num_sequences + 1] "
                f"(at least 2 entries), got a {cu_seqlens.dim()}-D {cu_seqlens.dtype} tensor of "
                f"{cu_seqlens.numel()} entries"
            )
        if x.shape[0] != 1:
            raise ValueError(f"causal_conv1d: cu_seqlens (packed sequences) needs batch size 1, got {x.shape[0]}")


def _check_state(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> None:
    if conv_state.dim() != 3 or tuple(conv_state.shape[:2]) != tuple(x.shape[:2]):
        raise ValueError(
            f"causal_conv1d: conv_state must be [batch, channels, S] = [{x.shape[0]}, {x.shape[1]}, S], "
            f"got {tuple(conv_state.shape)}"
        )
    if conv_state.shape[2] < weight.shape[1] - 1:
        raise ValueError(
            f"causal_conv1d: conv_state holds {conv_state.shape[2]} columns, the kernel width "
            f"{weight.shape[1]} needs at least {weight.shape[1] - 1}"
        )
    if conv_state.dtype != x.dtype or conv_state.device != x.device:
        raise ValueError(
            f"causal_conv1d: conv_state ({conv_state.dtype} on {conv_state.device}) must have the "
            f"input's dtype and device ({x.dtype} on {x.device})"
        )


def _check_grad(grad: torch.Tensor, x: torch.Tensor) -> None:
    if grad.shape != x.shape or grad.device != x.device:
        raise ValueError(
            f"causal_conv1d backward: gradient {tuple(grad.shape)} on {grad.device} for an input "
            f"{tuple(x.shape)} on {x.device}"
        )


def _channels_last(x: torch.Tensor) -> bool:
    return x.stride(1) < x.stride(2)


def _new_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised [B, C, T] tensor in x's dtype with x's layout (see the module docstring)."""
    b, c, t = x.shape
    if _channels_last(x):
        return x.new_empty((b, t, c)).transpose(1, 2)
    return x.new_empty((b, c, t))


def _strides(t: torch.Tensor) -> _STRIDES:
    return _STRIDES(*t.stride())


def _relayout(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """g (x's shape and dtype, any strides) copied into x's layout by the library's tiled pass, coalesced
    on both sides (torch's copy_ of a transposed view is not); call on x's device."""
    out = _new_like(x)
    C.fn("opslot_causal_conv1d_relayout", _RELAYOUT_ARGS)(
        _lib.DTYPE_CODES[x.dtype],
        x.shape[0],
        x.shape[1],
        x.shape[2],
        C.ptr(g),
        _strides(g),
        C.ptr(out),
        _strides(out),
        C.stream(x),
    )
    return out


def _params(weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """(weight, bias): contiguous; bias None stays None."""
    return weight.contiguous(), (bias.contiguous() if bias is not None else None)


def _codes(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Tuple[int, int]:
    return _lib.DTYPE_CODES[weight.dtype], _lib.DTYPE_CODES[(bias if bias is not None else weight).dtype]


def _cu(cu_seqlens: Optional[torch.Tensor]):
    """(cu_seqlens contiguous, 1 if int64 else 0, number of segments), or (None, 0, 0)."""
    if cu_seqlens is None:
        return None, 0, 0
    cu = cu_seqlens.contiguous()
    return cu, int(cu.dtype == torch.int64), cu.numel() - 1


@torch.library.custom_op("opslot::causal_conv1d_fwd", mutates_args=())
def causal_conv1d_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], silu: bool
) -> torch.Tensor:
    """The conv (and SiLU), in x's dtype and layout."""
    _check(x, weight, bias, cu_seqlens)
    out = _new_like(x)
    if out.numel() == 0:
        return out
    C.prepare(x)
    w, b = _params(weight, bias)
    wc, bc = _codes(w, b)
    cu, cu64, nseg = _cu(cu_seqlens)
    with torch.cuda.device(x.device):  # the library launches on the current device
        C.fn("opslot_causal_conv1d_fwd", _FWD_ARGS)(
            _lib.DTYPE_CODES[x.dtype],
            x.shape[0],
            x.shape[1],
            x.shape[2],
            w.shape[1],
            C.ptr(x),
            _strides(x),
            wc,
            C.ptr(w),
            bc,
            C.ptr(b),
            C.ptr(cu),
            cu64,
            nseg,
            int(silu),
            C.ptr(out),
            _strides(out),
            C.stream(x),
        )
    return out


@causal_conv1d_fwd.register_fake
def _causal_conv1d_fwd_fake(x, weight, bias, cu_seqlens, silu):
    _check(x, weight, bias, cu_seqlens)
    return _new_like(x)


def _bwd_outputs(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    dx = _new_like(x)
    dw = weight.new_empty(weight.shape)
    db = (bias if bias is not None else weight).new_empty((weight.shape[0],))
    return dx, dw, db


@torch.library.custom_op("opslot::causal_conv1d_bwd", mutates_args=())
def causal_conv1d_bwd(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    silu: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias); dbias has bias's dtype (weight's without a bias: then it is unused)."""
    _check(x, weight, bias, cu_seqlens)
    _check_grad(grad, x)
    dx, dw, db = _bwd_outputs(x, weight, bias)
    if x.numel() == 0:
        dw.zero_()
        db.zero_()
        return dx, dw, db
    C.prepare(x)
    g = grad.to(x.dtype)
    w, b = _params(weight, bias)
    wc, bc = _codes(w, b)
    cu, cu64, nseg = _cu(cu_seqlens)
    code, (B, Ch, T), width = _lib.DTYPE_CODES[x.dtype], x.shape, w.shape[1]
    with torch.cuda.device(x.device):  # the library launches on the current device
        if g.stride() != dx.stride():  # e.g. contiguous or expanded: into x's layout (keeps the vector path)
            g = _relayout(g, x)
        n = C.raw("opslot_causal_conv1d_bwd_scratch_floats", _lib.I64, _SCRATCH_ARGS)(code, B, Ch, T, width)
        if n < 0:
            raise RuntimeError(f"opslot cuda kernel causal_conv1d backward: {C.last_error()}")
        scratch = torch.empty((max(n, 1),), dtype=torch.float32, device=x.device)
        C.fn("opslot_causal_conv1d_bwd", _BWD_ARGS)(
            code,
            B,
            Ch,
            T,
            width,
            C.ptr(x),
            _strides(x),
            C.ptr(g),
            _strides(g),
            wc,
            C.ptr(w),
            bc,
            C.ptr(b),
            C.ptr(cu),
            cu64,
            nseg,
            int(silu),
            C.ptr(dx),
            _strides(dx),
            C.ptr(dw),
            C.ptr(db),
            scratch.data_ptr(),
            scratch.numel(),
            C.stream(x),
        )
    return dx, dw, db


@causal_conv1d_bwd.register_fake
def _causal_conv1d_bwd_fake(grad, x, weight, bias, cu_seqlens, silu):
    _check(x, weight, bias, cu_seqlens)
    _check_grad(grad, x)
    return _bwd_outputs(x, weight, bias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, cu_seqlens, silu = inputs
    ctx.save_for_backward(x, weight, bias, cu_seqlens)
    ctx.silu = silu


def _backward(ctx, grad):
    x, weight, bias, cu_seqlens = ctx.saved_tensors
    dx, dw, db = torch.ops.opslot.causal_conv1d_bwd(grad, x, weight, bias, cu_seqlens, ctx.silu)
    return dx, dw, (db if bias is not None else None), None, None


causal_conv1d_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("opslot::causal_conv1d_update", mutates_args=("conv_state",))
def causal_conv1d_update(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], silu: bool
) -> torch.Tensor:
    """Decode: the conv over cat(conv_state, x), its last T positions; conv_state <- the last S
    columns of cat(conv_state, x), in place."""
    _check(x, weight, bias)
    _check_state(x, conv_state, weight)
    out = _new_like(x)
    if out.numel() == 0:
        return out
    C.prepare(x)
    w, b = _params(weight, bias)
    wc, bc = _codes(w, b)
    with torch.cuda.device(x.device):  # the library launches on the current device
        C.fn("opslot_causal_conv1d_update", _UPDATE_ARGS)(
            _lib.DTYPE_CODES[x.dtype],
            x.shape[0],
            x.shape[1],
            x.shape[2],
            w.shape[1],
            C.ptr(x),
            _strides(x),
            C.ptr(conv_state),
            conv_state.shape[2],
            _strides(conv_state),
            wc,
            C.ptr(w),
            bc,
            C.ptr(b),
            int(silu),
            C.ptr(out),
            _strides(out),
            C.stream(x),
        )
    return out


@causal_conv1d_update.register_fake
def _causal_conv1d_update_fake(x, conv_state, weight, bias, silu):
    _check(x, weight, bias)
    _check_state(x, conv_state, weight)
    return _new_like(x)


def _requires_grad(tensors: Sequence[Optional[torch.Tensor]]) -> bool:
    return any(t is not None and t.requires_grad for t in tensors)


def causal_conv1d(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    conv_state: Optional[torch.Tensor] = None,
    **kwargs,
) -> torch.Tensor:
    """Upstream `causal_conv1d_fn` (`conv_state` None) or `causal_conv1d_update` (decode).

    hidden_states [B, C, T] (any strides; upstream's transposed view is read in place and the output
    keeps its layout), weight [C, W] (2 <= W <= 4), bias [C] or None, activation None / 'silu' /
    'swish'. cu_seqlens [N + 1] (int32/int64, on the device, batch 1): each segment is its own
    sequence; it is never read on the host. conv_state [B, C, S]: decode, updated in place; the
    decode computes no gradients, so with autograd recording and an input that requires grad it is
    refused (generation runs under no_grad)."""
    silu = _silu(activation)
    if conv_state is not None:
        if cu_seqlens is not None:
            raise ValueError("causal_conv1d: conv_state (decode) and cu_seqlens (packed) cannot be combined")
        if torch.is_grad_enabled() and _requires_grad((hidden_states, weight, bias, conv_state)):
            raise ValueError(
                "causal_conv1d (cuda): the decode update (conv_state) computes no gradients; call it "
                "under torch.no_grad() (as generation does) or use 'torch'/'eager'"
            )
        return torch.ops.opslot.causal_conv1d_update(hidden_states, conv_state, weight, bias, silu)
    return torch.ops.opslot.causal_conv1d_fwd(hidden_states, weight, bias, cu_seqlens, silu)
