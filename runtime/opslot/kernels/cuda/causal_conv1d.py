"""Qwen3.5 Gated DeltaNet's depthwise causal conv1d on libopslot_kernels: forward, backward, packed
sequences (`cu_seqlens`) and the one-step decode update (`conv_state`).

Torch ops registered from C++ (kernels/torch/causal_conv1d.cc), with their Meta and Autograd kernels:
- `opslot::causal_conv1d_fwd(x, weight, bias?, cu_seqlens?, silu) -> out`, differentiable through
  `opslot::causal_conv1d_bwd(grad, x, weight, bias?, cu_seqlens?, silu) -> (dx, dweight, dbias)`
  (the pre-activation is recomputed from x: nothing but the inputs is saved).
- `opslot::causal_conv1d_update(x, conv_state!, weight, bias?, silu) -> out`: decode, conv_state
  updated in place; inference only (no autograd).
The activation's name and the decode's refusals (autograd, packing) stay here, in `causal_conv1d`.

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

from typing import Optional, Sequence

import torch

from . import _lib, _ops_common as C

C.require_library_on_cuda_machines()
_FWD = C.torch_op("causal_conv1d_fwd")  # its Autograd kernel's backward calls causal_conv1d_bwd
_UPDATE = C.torch_op("causal_conv1d_update")

_SILU_NAMES = ("silu", "swish")

# ctypes argument types of the C entry points, for the GPU tests that call the C ABI directly
# (tests/gpu/kernels/test_causal_conv1d.py); the ops call them from C++.
_COMMON = [_lib.I32, _lib.I64, _lib.I64, _lib.I64, _lib.I32]  # dtype, batch, channels, seqlen, width
_FWD_ARGS = _COMMON + [_lib.PTR, _lib.PTR, _lib.I32, _lib.PTR, _lib.I32, _lib.PTR, _lib.PTR, _lib.I32, _lib.I64]
_FWD_ARGS += [_lib.I32, _lib.PTR, _lib.PTR, _lib.PTR]
_SCRATCH_ARGS = [_lib.I32, _lib.I64, _lib.I64, _lib.I64, _lib.I32]
_BWD_ARGS = _COMMON + [_lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR, _lib.I32, _lib.PTR, _lib.I32, _lib.PTR, _lib.PTR]
_BWD_ARGS += [_lib.I32, _lib.I64, _lib.I32, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR, _lib.I64, _lib.PTR]


def _silu(activation) -> bool:
    """True for SiLU, False for none; anything else is refused as the `torch` kernel does."""
    if activation is not None and activation not in _SILU_NAMES:
        raise ValueError(f"causal_conv1d supports activation None, 'silu' or 'swish', got {activation!r}")
    return activation is not None


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
        return _UPDATE(hidden_states, conv_state, weight, bias, silu)
    return _FWD(hidden_states, weight, bias, cu_seqlens, silu)
