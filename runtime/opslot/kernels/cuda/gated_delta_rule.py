"""The chunked gated delta rule (Qwen3.5's Gated DeltaNet) on libopslot_kernels, forward and backward,
dense batches and packed sequences (`cu_seqlens`).

Custom ops `opslot::gdr_fwd` (returns the output, the final states and the two tensors the backward
reads: the state entering each 64-token chunk and the chunk's corrected values) and `opslot::gdr_bwd`.
q, k, v are read through their (batch, token, head) strides (HF passes views of the conv output:
nothing is copied); the last dimension must be contiguous. The kernel math is in
kernels/include/opslot_kernels/gated_delta_rule.h and docs/kernels.md.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch

from . import _lib, _ops_common as C

C.require_library_on_cuda_machines()

CHUNK = 64
MAX_HEAD_DIM = 128


class _Problem(ctypes.Structure):
    """opslot_gdr_problem (kernels/include/opslot_kernels/gated_delta_rule.h), field for field."""

    _fields_ = [
        ("dtype", ctypes.c_int),
        ("g_dtype", ctypes.c_int),
        ("beta_dtype", ctypes.c_int),
        ("use_l2norm", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("batch", ctypes.c_int64),
        ("seqlen", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("dk", ctypes.c_int64),
        ("dv", ctypes.c_int64),
        ("nseq", ctypes.c_int64),
        ("cu_seqlens", ctypes.c_void_p),
        ("max_chunks", ctypes.c_int64),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("g", ctypes.c_void_p),
        ("beta", ctypes.c_void_p),
        ("q_stride", ctypes.c_int64 * 3),
        ("k_stride", ctypes.c_int64 * 3),
        ("v_stride", ctypes.c_int64 * 3),
        ("g_stride", ctypes.c_int64 * 3),
        ("beta_stride", ctypes.c_int64 * 3),
    ]


_PP = ctypes.POINTER(_Problem)
_FWD_ARGS = [_PP] + [_lib.PTR] * 9
_BWD_ARGS = [_PP] + [_lib.PTR] * 14


def max_chunks(batch: int, seqlen: int, nseq: int, packed: bool) -> int:
    """opslot_gdr_max_chunks: chunks of a dense batch, or an upper bound for packed sequences."""
    per = (seqlen + CHUNK - 1) // CHUNK
    return per + nseq if packed else batch * per


def _nseq(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _check(q, k, v, g, beta, initial_state, cu_seqlens) -> None:
    for t, what in ((q, "query"), (k, "key"), (v, "value")):
        C.check_float(t, f"chunk_gated_delta_rule: {what}")
        if t.dim() != 4:
            raise ValueError(f"chunk_gated_delta_rule: {what} must be [batch, seq, heads, dim], got {tuple(t.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            f"chunk_gated_delta_rule: query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    B, T, H, Dk = q.shape
    if tuple(k.shape) != (B, T, H, Dk) or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(
            f"chunk_gated_delta_rule: query {tuple(q.shape)}, key {tuple(k.shape)} and value "
            f"{tuple(v.shape)} must agree in batch, sequence and heads (repeat query/key heads to the "
            "value heads first)"
        )
    Dv = v.shape[3]
    if not (1 <= Dk <= MAX_HEAD_DIM and 1 <= Dv <= MAX_HEAD_DIM):
        raise ValueError(
            f"chunk_gated_delta_rule: the cuda kernel takes head dims 1..{MAX_HEAD_DIM}, got key {Dk} and value {Dv}"
        )
    for t, what in ((g, "g"), (beta, "beta")):
        C.check_float(t, f"chunk_gated_delta_rule: {what}")
        if tuple(t.shape) != (B, T, H):
            raise ValueError(
                f"chunk_gated_delta_rule: {what} must be [batch, seq, heads] = {(B, T, H)}, got {tuple(t.shape)}"
            )
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                "chunk_gated_delta_rule: cu_seqlens must be a 1-D int32/int64 tensor [num_seqs + 1], got "
                f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
            )
        if B != 1:
            raise ValueError(f"chunk_gated_delta_rule: packed sequences (cu_seqlens) need batch 1, got {B}")
    nseq = _nseq(q, cu_seqlens)
    if initial_state is not None and tuple(initial_state.shape) != (nseq, H, Dk, Dv):
        raise ValueError(
            f"chunk_gated_delta_rule: initial_state must be {(nseq, H, Dk, Dv)} (one per sequence), got "
            f"{tuple(initial_state.shape)}"
        )


def _inner(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _problem(q, k, v, g, beta, cu32, use_l2norm: bool, scale: float) -> _Problem:
    B, T, H, Dk = q.shape
    nseq = _nseq(q, cu32)
    p = _Problem(
        _lib.DTYPE_CODES[q.dtype],
        _lib.DTYPE_CODES[g.dtype],
        _lib.DTYPE_CODES[beta.dtype],
        int(use_l2norm),
        float(scale),
        B,
        T,
        H,
        Dk,
        v.shape[3],
        nseq,
        C.ptr(cu32),
        max_chunks(B, T, nseq, cu32 is not None),
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        g.data_ptr(),
        beta.data_ptr(),
    )
    for name, t in (("q_stride", q), ("k_stride", k), ("v_stride", v), ("g_stride", g), ("beta_stride", beta)):
        getattr(p, name)[:] = list(t.stride()[:3])
    return p


def _workspace(p: _Problem, backward: int, device) -> torch.Tensor:
    """The kernels' scratch memory. With head dims below 128 the kernels read zero padding past Dv that
    only part of the scratch gets written with: then it starts zeroed."""
    size = C.raw("opslot_gdr_workspace_bytes", ctypes.c_int64, [_PP, ctypes.c_int])(ctypes.byref(p), backward)
    if size < 0:
        raise RuntimeError(f"chunk_gated_delta_rule: {C.last_error()}")
    alloc = torch.empty if p.dk == MAX_HEAD_DIM and p.dv == MAX_HEAD_DIM else torch.zeros
    return alloc(size, dtype=torch.uint8, device=device)


def _saved_shapes(q, cu_seqlens):
    """Shapes of what gdr_fwd keeps for gdr_bwd: h, v_new / w, gamma (docs/kernels.md)."""
    B, T, H, _ = q.shape
    mc = max_chunks(B, T, _nseq(q, cu_seqlens), cu_seqlens is not None)
    return (mc, H, MAX_HEAD_DIM, MAX_HEAD_DIM), (mc, H, CHUNK, MAX_HEAD_DIM), (mc, H, CHUNK)


def _cu32(cu_seqlens: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if cu_seqlens is None else cu_seqlens.to(torch.int32).contiguous()


@torch.library.custom_op("opslot::gdr_fwd", mutates_args=())
def gdr_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    use_l2norm: bool,
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [B, T, H, Dv] in q's dtype, final states fp32 [nseq, H, Dk, Dv], h, v_new, w, gamma) — the
    last four are what gdr_bwd reads."""
    _check(q, k, v, g, beta, initial_state, cu_seqlens)
    C.prepare(q)
    q, k, v, g, beta = (_inner(t) for t in (q, k, v, g, beta))
    cu = _cu32(cu_seqlens)
    p = _problem(q, k, v, g, beta, cu, use_l2norm, scale)
    B, T, H, Dk = q.shape
    out = torch.empty(B, T, H, v.shape[3], dtype=q.dtype, device=q.device)
    final = torch.empty(p.nseq, H, Dk, v.shape[3], dtype=torch.float32, device=q.device)
    hs_shape, tile_shape, gamma_shape = _saved_shapes(q, cu)
    # Every element of the saved tensors is written only when the problem fills whole tiles:
    # otherwise they start zeroed, so that the op's outputs are fully defined.
    full = cu is None and Dk == MAX_HEAD_DIM and v.shape[3] == MAX_HEAD_DIM
    alloc = torch.empty if full else torch.zeros
    hs = alloc(hs_shape, dtype=q.dtype, device=q.device)
    vnew = alloc(tile_shape, dtype=q.dtype, device=q.device)
    w = alloc(tile_shape, dtype=q.dtype, device=q.device)
    gamma = alloc(gamma_shape, dtype=torch.float32, device=q.device)
    s0 = None if initial_state is None else initial_state.float().contiguous()
    ws = _workspace(p, 0, q.device)
    C.fn("opslot_gdr_fwd", _FWD_ARGS)(
        ctypes.byref(p),
        C.ptr(s0),
        C.ptr(out),
        C.ptr(final),
        C.ptr(hs),
        C.ptr(vnew),
        C.ptr(w),
        C.ptr(gamma),
        C.ptr(ws),
        C.stream(q),
    )
    return out, final, hs, vnew, w, gamma


@gdr_fwd.register_fake
def _gdr_fwd_fake(q, k, v, g, beta, initial_state, cu_seqlens, use_l2norm, scale):
    _check(q, k, v, g, beta, initial_state, cu_seqlens)
    B, T, H, Dk = q.shape
    hs_shape, tile_shape, gamma_shape = _saved_shapes(q, cu_seqlens)
    return (
        q.new_empty(B, T, H, v.shape[3]),
        q.new_empty(_nseq(q, cu_seqlens), H, Dk, v.shape[3], dtype=torch.float32),
        q.new_empty(hs_shape),
        q.new_empty(tile_shape),
        q.new_empty(tile_shape),
        q.new_empty(gamma_shape, dtype=torch.float32),
    )


@torch.library.custom_op("opslot::gdr_bwd", mutates_args=())
def gdr_bwd(
    dout: torch.Tensor,
    dfinal: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    hs: torch.Tensor,
    vnew: torch.Tensor,
    w: torch.Tensor,
    gamma: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor],
    use_l2norm: bool,
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dbeta, d initial state fp32)."""
    C.prepare(q)
    q, k, v, g, beta = (_inner(t) for t in (q, k, v, g, beta))
    cu = _cu32(cu_seqlens)
    p = _problem(q, k, v, g, beta, cu, use_l2norm, scale)
    B, T, H, Dk = q.shape
    dout = dout.to(q.dtype).contiguous()
    df = None if dfinal is None else dfinal.float().contiguous()
    dq, dk, dv = (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty(B, T, H, Dk, dtype=q.dtype, device=q.device),
        torch.empty(B, T, H, v.shape[3], dtype=q.dtype, device=q.device),
    )
    dg = torch.empty(B, T, H, dtype=g.dtype, device=q.device)
    dbeta = torch.empty(B, T, H, dtype=beta.dtype, device=q.device)
    dinit = torch.empty(p.nseq, H, Dk, v.shape[3], dtype=torch.float32, device=q.device)
    ws = _workspace(p, 1, q.device)
    C.fn("opslot_gdr_bwd", _BWD_ARGS)(
        ctypes.byref(p),
        C.ptr(dout),
        C.ptr(df),
        C.ptr(hs),
        C.ptr(vnew),
        C.ptr(w),
        C.ptr(gamma),
        C.ptr(dq),
        C.ptr(dk),
        C.ptr(dv),
        C.ptr(dg),
        C.ptr(dbeta),
        C.ptr(dinit),
        C.ptr(ws),
        C.stream(q),
    )
    return dq, dk, dv, dg, dbeta, dinit


@gdr_bwd.register_fake
def _gdr_bwd_fake(dout, dfinal, q, k, v, g, beta, hs, vnew, w, gamma, cu_seqlens, use_l2norm, scale):
    B, T, H, Dk = q.shape
    return (
        q.new_empty(B, T, H, Dk),
        q.new_empty(B, T, H, Dk),
        q.new_empty(B, T, H, v.shape[3]),
        g.new_empty(B, T, H),
        beta.new_empty(B, T, H),
        q.new_empty(_nseq(q, cu_seqlens), H, Dk, v.shape[3], dtype=torch.float32),
    )


def _setup_context(ctx, inputs, output):
    q, k, v, g, beta, initial_state, cu_seqlens, use_l2norm, scale = inputs
    _, _, hs, vnew, w, gamma = output
    ctx.save_for_backward(q, k, v, g, beta, hs, vnew, w, gamma, cu_seqlens)
    ctx.use_l2norm, ctx.scale = use_l2norm, scale
    ctx.has_initial = initial_state is not None
    ctx.mark_non_differentiable(hs, vnew, w, gamma)


def _backward(ctx, dout, dfinal, *_saved_grads):
    q, k, v, g, beta, hs, vnew, w, gamma, cu_seqlens = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros(*q.shape[:3], v.shape[3], dtype=q.dtype, device=q.device)
    dq, dk, dv, dg, dbeta, dinit = torch.ops.opslot.gdr_bwd(
        dout, dfinal, q, k, v, g, beta, hs, vnew, w, gamma, cu_seqlens, ctx.use_l2norm, ctx.scale
    )
    return dq, dk, dv, dg, dbeta, (dinit if ctx.has_initial else None), None, None, None


gdr_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check_cu_seqlens_async(cu_seqlens: torch.Tensor, seqlen: int) -> None:
    """Device-side checks (no host synchronisation): starts at 0, never decreases, ends at seqlen."""
    cu = cu_seqlens
    ok = (cu[0] == 0) & (cu[-1] == seqlen)
    if cu.shape[0] > 1:
        ok = ok & (cu[1:] >= cu[:-1]).all()
    torch._assert_async(
        ok, "chunk_gated_delta_rule: cu_seqlens must start at 0, never decrease and end at the sequence length"
    )


def chunk_gated_delta_rule(
    query,
    key,
    value,
    g,
    beta,
    chunk_size: int = 64,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens=None,
    **kwargs,
):
    """The upstream `torch_chunk_gated_delta_rule` contract (docs/ops.md) on the CUDA kernels; `chunk_size`
    does not change the result (the kernels use 64-token chunks). With cu_seqlens (batch 1) each segment
    is its own sequence, initial_state and the final state are [num_seqs, H, Dk, Dv]."""
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            cu_seqlens = torch.as_tensor(cu_seqlens, device=query.device)
        cu_seqlens = cu_seqlens.to(query.device)
        if cu_seqlens.dim() == 1 and cu_seqlens.numel() > 0:
            _check_cu_seqlens_async(cu_seqlens, query.shape[1])
    out, final, *_ = torch.ops.opslot.gdr_fwd(
        query,
        key,
        value,
        g,
        beta,
        initial_state,
        cu_seqlens,
        bool(use_qk_l2norm_in_kernel),
        float(query.shape[-1] ** -0.5),
    )
    return out, (final if output_final_state else None)
