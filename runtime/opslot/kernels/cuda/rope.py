"""Rotary position embedding (full and partial) on libopslot_kernels, reading q/k through their
strides (HF passes transposed views of the projections: nothing is copied).

Custom ops `opslot::rope_fwd` / `opslot::rope_bwd` handle q and k in one launch each way. cos/sin
get no gradient: when they require one the public functions raise (HF computes them under
no_grad). docs/kernels.md describes the kernel.
"""

from __future__ import annotations

import ctypes
from typing import List, Tuple

import torch

from . import _lib
from . import _ops_common as C

C.require_library_on_cuda_machines()


def _as4d(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dim() > 4:
        raise ValueError(f"rotary_pos_emb: {what} has {t.dim()} dimensions; the cuda kernel takes at most 4")
    if t.dim() < 1:
        raise ValueError(f"rotary_pos_emb: {what} is a scalar")
    return t.view((1,) * (4 - t.dim()) + tuple(t.shape))


def _check(q, k, cos, sin, unsqueeze_dim):
    C.check_float(q, "rotary_pos_emb")
    if k.dtype != q.dtype:
        raise TypeError(f"rotary_pos_emb: q is {q.dtype} but k is {k.dtype}")
    if cos.dtype != sin.dtype or cos.dtype not in (q.dtype, torch.float32):
        raise TypeError(f"rotary_pos_emb: cos/sin of dtype {cos.dtype}/{sin.dtype} with q of dtype {q.dtype} (the cuda "
                        "kernel takes cos/sin in q's dtype or float32)")
    if cos.shape != sin.shape:
        raise ValueError("rotary_pos_emb: cos and sin differ in shape")
    rd = cos.shape[-1]
    if rd % 2 or rd > q.shape[-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"rotary_pos_emb: rotary dim {rd} must be even and at most the head dim "
                         f"(q {q.shape[-1]}, k {k.shape[-1]})")


def _meta(t: torch.Tensor, out: torch.Tensor, cos_u: torch.Tensor, sin_u: torch.Tensor) -> List[int]:
    """shape, in/out/cos/sin strides of the three outer dims, largest input stride first."""
    t4, o4 = _as4d(t, "q/k"), _as4d(out, "output")
    lead = tuple(t4.shape[:-1]) + (cos_u.shape[-1],)
    c4 = cos_u.expand(lead)
    s4 = sin_u.expand(lead)
    perm = sorted(range(3), key=lambda i: -abs(t4.stride(i)))
    meta = [t4.shape[i] for i in perm]
    for src in (t4, o4, c4, s4):  # a dimension of size 1 is never stepped: stride 0 (keeps vectors aligned)
        meta += [src.stride(i) if t4.shape[i] > 1 else 0 for i in perm]
    return meta


def _launch(backward: bool, q_in, k_in, q_out, k_out, cos, sin, unsqueeze_dim: int) -> None:
    C.prepare(q_in)
    if q_in.shape[-1] > 1 and q_in.stride(-1) != 1 or k_in.shape[-1] > 1 and k_in.stride(-1) != 1:
        raise AssertionError("rope: inputs must have a contiguous last dimension here")
    cos_u = cos.unsqueeze(unsqueeze_dim)
    sin_u = sin.unsqueeze(unsqueeze_dim)
    if cos_u.dim() > 4:
        raise ValueError("rotary_pos_emb: cos/sin have too many dimensions for the cuda kernel")
    if cos_u.stride(-1) != 1:
        cos_u = cos_u.contiguous()
    if sin_u.stride(-1) != 1:
        sin_u = sin_u.contiguous()
    meta = _meta(q_in, q_out, cos_u, sin_u) + _meta(k_in, k_out, cos_u, sin_u)
    arr = (ctypes.c_int64 * 30)(*meta)
    C.fn("opslot_rope", [_lib.I32, _lib.I32, _lib.I32, _lib.I64, _lib.I64, _lib.PTR, _lib.PTR, _lib.PTR, _lib.PTR,
                         _lib.PTR, _lib.PTR, ctypes.POINTER(ctypes.c_int64), _lib.PTR])(
        1 if backward else 0, _lib.DTYPE_CODES[q_in.dtype], _lib.DTYPE_CODES[cos.dtype], q_in.shape[-1],
        cos.shape[-1], C.ptr(cos_u), C.ptr(sin_u), C.ptr(q_in), C.ptr(q_out), C.ptr(k_in), C.ptr(k_out), arr,
        C.stream(q_in))


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("opslot::rope_fwd", mutates_args=())
def rope_fwd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             unsqueeze_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q_embed, k_embed), each with the memory layout of its input (torch.empty_like)."""
    _check(q, k, cos, sin, unsqueeze_dim)
    q, k = _last_contiguous(q), _last_contiguous(k)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    _launch(False, q, k, qo, ko, cos, sin, unsqueeze_dim)
    return qo, ko


@rope_fwd.register_fake
def _rope_fwd_fake(q, k, cos, sin, unsqueeze_dim):
    _check(q, k, cos, sin, unsqueeze_dim)
    return torch.empty_like(_last_contiguous(q)), torch.empty_like(_last_contiguous(k))


@torch.library.custom_op("opslot::rope_bwd", mutates_args=())
def rope_bwd(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             unsqueeze_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of q and k from those of q_embed and k_embed."""
    _check(grad_q, grad_k, cos, sin, unsqueeze_dim)
    gq, gk = _last_contiguous(grad_q), _last_contiguous(grad_k)
    dq, dk = torch.empty_like(gq), torch.empty_like(gk)
    _launch(True, gq, gk, dq, dk, cos, sin, unsqueeze_dim)
    return dq, dk


@rope_bwd.register_fake
def _rope_bwd_fake(grad_q, grad_k, cos, sin, unsqueeze_dim):
    _check(grad_q, grad_k, cos, sin, unsqueeze_dim)
    return torch.empty_like(_last_contiguous(grad_q)), torch.empty_like(_last_contiguous(grad_k))


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, unsqueeze_dim = inputs
    ctx.save_for_backward(cos, sin)
    ctx.unsqueeze_dim = unsqueeze_dim
    ctx.shapes = (q.shape, k.shape, q.dtype)


def _backward(ctx, gq, gk):
    cos, sin = ctx.saved_tensors
    qs, ks, dtype = ctx.shapes
    if gq is None:
        gq = torch.zeros(qs, dtype=dtype, device=cos.device)
    if gk is None:
        gk = torch.zeros(ks, dtype=dtype, device=cos.device)
    dq, dk = torch.ops.opslot.rope_bwd(gq, gk, cos, sin, ctx.unsqueeze_dim)
    return dq, dk, None, None, None


rope_fwd.register_autograd(_backward, setup_context=_setup_context)


def _apply(q, k, cos, sin, unsqueeze_dim, full: bool):
    if full and cos.shape[-1] != q.shape[-1]:
        raise ValueError(f"rotary_pos_emb/full: cos/sin have {cos.shape[-1]} features for a head dim of {q.shape[-1]} "
                         "(use the partial variant)")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("rotary_pos_emb (cuda): cos/sin require grad, but this kernel computes no gradient for "
                         "them; compute cos/sin under torch.no_grad() (as HF does) or use 'torch'/'eager'")
    return torch.ops.opslot.rope_fwd(q, k, cos, sin, int(unsqueeze_dim))


def rotary_pos_emb_full(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the whole head dimension."""
    return _apply(q, k, cos, sin, unsqueeze_dim, True)


def rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the first `cos.shape[-1]` features; the rest pass through."""
    return _apply(q, k, cos, sin, unsqueeze_dim, False)
