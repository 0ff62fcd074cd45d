"""Rotary position embedding (full and partial) on libopslot_kernels, reading q/k through their
strides (HF passes transposed views of the projections: nothing is copied).

Custom ops `opslot::rope_fwd` / `opslot::rope_bwd` handle q and k in one launch each way. cos/sin
get no gradient: when they require one the public functions raise (HF computes them under
no_grad). docs/kernels.md describes the kernel.
"""

from __future__ import annotations

import ctypes
from typing import Tuple

import torch

from . import _lib, _ops_common as C

C.require_library_on_cuda_machines()


def _check(q, k, cos, sin, unsqueeze_dim):
    C.check_float(q, "rotary_pos_emb")
    if k.dtype != q.dtype:
        raise TypeError(f"rotary_pos_emb: q is {q.dtype} but k is {k.dtype}")
    if cos.dtype != sin.dtype or cos.dtype not in (q.dtype, torch.float32):
        raise TypeError(
            f"rotary_pos_emb: cos/sin of dtype {cos.dtype}/{sin.dtype} with q of dtype {q.dtype} (the cuda "
            "kernel takes cos/sin in q's dtype or float32)"
        )
    if cos.shape != sin.shape:
        raise ValueError("rotary_pos_emb: cos and sin differ in shape")
    rd = cos.shape[-1]
    if rd % 2 or rd > q.shape[-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"rotary_pos_emb: rotary dim {rd} must be even and at most the head dim (q {q.shape[-1]}, k {k.shape[-1]})"
        )


def _outer(shape, strides, what: str):
    """The three outer (size, stride) pairs of a tensor of at most 4 dims, left-padded with size 1;
    a dimension of size 1 gets stride 0 (it is never stepped; keeps the vector path aligned)."""
    if len(shape) > 4 or len(shape) < 1:
        raise ValueError(f"rotary_pos_emb: {what} has {len(shape)} dimensions; the cuda kernel takes 1 to 4")
    pad = 4 - len(shape)
    sizes = [1] * pad + list(shape[:-1])
    st = [0] * pad + list(strides[:-1])
    return sizes, [s if n > 1 else 0 for n, s in zip(sizes, st)]


def _cs_outer(cos: torch.Tensor, unsqueeze_dim: int, lead):
    """Strides of cos.unsqueeze(unsqueeze_dim) broadcast over the outer dims `lead` (no tensor made)."""
    shape, strides = list(cos.shape), list(cos.stride())
    pos = unsqueeze_dim if unsqueeze_dim >= 0 else unsqueeze_dim + len(shape) + 1
    if not 0 <= pos <= len(shape):
        raise IndexError(f"rotary_pos_emb: unsqueeze_dim {unsqueeze_dim} out of range for cos of {len(shape)} dims")
    shape.insert(pos, 1)
    strides.insert(pos, 0)
    sizes, st = _outer(shape, strides, "cos/sin (unsqueezed)")
    for n, m in zip(sizes, lead):
        if n != 1 and n != m:
            raise ValueError(
                f"rotary_pos_emb: cos/sin of shape {tuple(cos.shape)} (unsqueeze_dim {unsqueeze_dim}) do "
                f"not broadcast to q/k of outer shape {tuple(lead)}"
            )
    return st


_META_CACHE: dict = {}


def _meta(q, qo, k, ko, cos, sin, unsqueeze_dim: int):
    """The kernel's int64 meta array (shape, in/out/cos/sin strides of the three outer dims of q
    then k, largest input stride first); cached by layout."""
    key = (
        q.shape,
        q.stride(),
        qo.stride(),
        k.shape,
        k.stride(),
        ko.stride(),
        cos.shape,
        cos.stride(),
        sin.stride(),
        unsqueeze_dim,
    )
    arr = _META_CACHE.get(key)
    if arr is None:
        meta = []
        for t, o in ((q, qo), (k, ko)):
            sizes, ts = _outer(t.shape, t.stride(), "q/k")
            _, os_ = _outer(o.shape, o.stride(), "output")
            cs = _cs_outer(cos, unsqueeze_dim, sizes)
            ss = _cs_outer(sin, unsqueeze_dim, sizes)
            perm = sorted(range(3), key=lambda i: -ts[i])
            meta += [sizes[i] for i in perm]
            for src in (ts, os_, cs, ss):
                meta += [src[i] for i in perm]
        arr = (ctypes.c_int64 * 30)(*meta)
        if len(_META_CACHE) > 256:
            _META_CACHE.clear()
        _META_CACHE[key] = arr
    return arr


_ARGS = [
    _lib.I32,
    _lib.I32,
    _lib.I32,
    _lib.I64,
    _lib.I64,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    _lib.PTR,
    ctypes.c_void_p,
    _lib.PTR,
]


def _launch(backward: bool, q_in, k_in, q_out, k_out, cos, sin, unsqueeze_dim: int) -> None:
    C.prepare(q_in)
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    arr = _meta(q_in, q_out, k_in, k_out, cos, sin, unsqueeze_dim)
    C.fn("opslot_rope", _ARGS)(
        1 if backward else 0,
        _lib.DTYPE_CODES[q_in.dtype],
        _lib.DTYPE_CODES[cos.dtype],
        q_in.shape[-1],
        cos.shape[-1],
        C.ptr(cos),
        C.ptr(sin),
        C.ptr(q_in),
        C.ptr(q_out),
        C.ptr(k_in),
        C.ptr(k_out),
        ctypes.addressof(arr),
        C.stream(q_in),
    )


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("opslot::rope_fwd", mutates_args=())
def rope_fwd(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
) -> Tuple[torch.Tensor, torch.Tensor]:
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
def rope_bwd(
    grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
) -> Tuple[torch.Tensor, torch.Tensor]:
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
        raise ValueError(
            f"rotary_pos_emb/full: cos/sin have {cos.shape[-1]} features for a head dim of {q.shape[-1]} "
            "(use the partial variant)"
        )
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError(
            "rotary_pos_emb (cuda): cos/sin require grad, but this kernel computes no gradient for "
            "them; compute cos/sin under torch.no_grad() (as HF does) or use 'torch'/'eager'"
        )
    return torch.ops.opslot.rope_fwd(q, k, cos, sin, int(unsqueeze_dim))


def rotary_pos_emb_full(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the whole head dimension."""
    return _apply(q, k, cos, sin, unsqueeze_dim, True)


def rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the first `cos.shape[-1]` features; the rest pass through."""
    return _apply(q, k, cos, sin, unsqueeze_dim, False)
