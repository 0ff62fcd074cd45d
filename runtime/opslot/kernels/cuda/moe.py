"""MoE experts (`moe/standard`, `moe/gpt_oss`, impl `cuda`): device routing + grouped GEMMs, no host sync.

One layer is, for T tokens routed to top_k of E experts (N = T * top_k assignments):

1. `route` (`opslot::moe_route`, three small kernels: per-chunk histograms, a scan, a stable
   scatter): the permutation of the (token, k) assignments into expert order, `offs[E]` (int32,
   cumulative segment ends, torch._grouped_mm's `offs`), `inv[N]` the row of each assignment,
   `row_expert`, `src_token`. The masking index `E` (and anything outside [0, E]) forms a last
   segment: those rows (>= offs[-1], "dropped") are skipped everywhere. `route_torch` is the same in
   torch ops (stable sort + searchsorted), used for CPU tensors and as the tests' reference.
2. `opslot::moe_gather`: token-major copy of each token into its k rows (zero dropped rows).
3. `opslot::moe_grouped_mm`: x_sorted @ gate_up per expert segment.
4. `opslot::moe_act`: SiLU(gate) * up (Qwen/Mixtral layout), or GPT-OSS's clamped alpha-SwiGLU over
   interleaved gate/up with the gate-up bias added on the fly.
5. `opslot::moe_grouped_mm`: @ down per expert segment.
6. `opslot::moe_combine`: out[t] = sum_k w[t,k] * (y[row] + down_bias[e]) as a gather-sum per token
   in fp32 (deterministic, no atomics).

Backward mirrors it: combine -> scatter with the routing-weight gradient as a per-row dot product
(and the down-bias gradient as a per-expert segment sum), grouped GEMMs for the data and weight
gradients, the activation's derivative (+ gate-up bias gradient), and the gather's backward as the
unweighted gather-sum. Nothing reads device data on the host, so the layer is CUDA-graph capturable.

GEMM backends: bf16 on sm90/sm100 with widths that are multiples of 8 uses `torch._grouped_mm`
(CUTLASS); everything else (fp16, fp32, other GPUs, odd widths) uses the library's portable grouped
GEMM (SIMT, fp32 accumulation). `GEMM_BACKEND = "portable"` (or `$OPSLOT_MOE_GEMM=portable`) forces
the portable one, for tests and comparisons.

Expert parallelism: `grouped_experts(x_sorted, offs, row_expert, ...)` is the expert computation on
tokens that are already in expert order (what an all-to-all dispatch delivers), without routing or
combine; `route`, `gather`, `combine` are the pieces around it.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import _lib
from ._lib import F32, I32, I64, PTR

#: "auto" (torch._grouped_mm for bf16 on sm90/sm100, else portable) or "portable".
GEMM_BACKEND = os.environ.get("OPSLOT_MOE_GEMM", "auto")

KIND_SILU = 0  # act(gate) * up, gate = h[:, :I], up = h[:, I:]
KIND_GPT_OSS = 1  # clamped alpha-SwiGLU, gate = h[:, 0::2], up = h[:, 1::2], optional bias

_fns: dict = {}


def _fn(name: str, argtypes) -> Any:
    fn = _fns.get(name)
    if fn is None:
        fn = _fns[name] = _lib.function(name, argtypes)
    return fn


def _p(t: Optional[Tensor]) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def _stream(t: Tensor) -> ctypes.c_void_p:
    return _lib.stream_of(t)


# -- routing -----------------------------------------------------------------------------------
class Routing(NamedTuple):
    """Device-side routing metadata of N = tokens * top_k assignments (all int32, no host values)."""

    offs: Tensor  # [E] cumulative row count at the end of each expert's segment
    row_expert: Tensor  # [N] expert of each row (E for dropped rows, which sit past offs[-1])
    src_token: Tensor  # [N] token of each row
    inv: Tensor  # [N] row of each (token, k) assignment, token-major


def route_torch(top_k_index: Tensor, num_experts: int) -> Routing:
    """`route` in torch ops (any device; the executable statement of its contract, and what CPU
    tensors use): stable sort, searchsorted, inverse permutation."""
    if top_k_index.dim() != 2:
        raise ValueError(f"top_k_index must be [tokens, top_k], got shape {tuple(top_k_index.shape)}")
    tokens, top_k = top_k_index.shape
    n = tokens * top_k
    dev = top_k_index.device
    flat = top_k_index.reshape(-1).to(torch.int32)
    flat = torch.where((flat < 0) | (flat > num_experts), torch.full_like(flat, num_experts), flat)
    keys, perm = torch.sort(flat, stable=True)
    bounds = torch.arange(1, num_experts + 1, device=dev, dtype=torch.int32)
    offs = torch.searchsorted(keys, bounds, out_int32=True)
    src_token = torch.div(perm, top_k, rounding_mode="floor").to(torch.int32)
    inv = torch.empty(n, device=dev, dtype=torch.int32)
    inv.scatter_(0, perm, torch.arange(n, device=dev, dtype=torch.int32))
    return Routing(offs, keys, src_token, inv)


@torch.library.custom_op("opslot::moe_route", mutates_args=())
def moe_route(top_k_index: Tensor, num_experts: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The routing kernel (a stable counting sort on the device): (offs, row_expert, src_token, inv)."""
    _check(top_k_index)
    tokens, top_k = top_k_index.shape
    n = tokens * top_k
    idx = top_k_index.reshape(-1)
    if idx.dtype not in (torch.int64, torch.int32):
        idx = idx.to(torch.int64)
    idx = idx.contiguous()
    dev = top_k_index.device
    offs = torch.empty(num_experts, device=dev, dtype=torch.int32)
    row_expert = torch.empty(n, device=dev, dtype=torch.int32)
    src_token = torch.empty(n, device=dev, dtype=torch.int32)
    inv = torch.empty(n, device=dev, dtype=torch.int32)
    lib = _lib.library()
    size_fn = lib.opslot_moe_route_scratch
    size_fn.argtypes, size_fn.restype = [ctypes.c_int64, ctypes.c_int64], ctypes.c_int64
    scratch = torch.empty(int(size_fn(n, num_experts)), device=dev, dtype=torch.int32)
    _fn("opslot_moe_route", [PTR, I32, I64, I64, I64, PTR, PTR, PTR, PTR, PTR, PTR])(
        _p(idx),
        int(idx.dtype == torch.int64),
        n,
        top_k,
        num_experts,
        _p(offs),
        _p(row_expert),
        _p(src_token),
        _p(inv),
        _p(scratch),
        _stream(idx),
    )
    return offs, row_expert, src_token, inv


@moe_route.register_fake
def _(top_k_index, num_experts):
    n = top_k_index.shape[0] * top_k_index.shape[1]
    new = top_k_index.new_empty
    return (
        new(num_experts, dtype=torch.int32),
        new(n, dtype=torch.int32),
        new(n, dtype=torch.int32),
        new(n, dtype=torch.int32),
    )


def route(top_k_index: Tensor, num_experts: int) -> Routing:
    """Sort the (token, k) assignments by expert on the device. `top_k_index` [T, K] holds expert
    ids in [0, E]; E (upstream's masking index) and values outside [0, E] are dropped. Stable: the
    rows of one expert keep token order, so results do not depend on tie-breaking. CUDA tensors use
    the routing kernel (opslot::moe_route, E <= 1024), others `route_torch`; both give identical
    metadata."""
    if top_k_index.dim() != 2:
        raise ValueError(f"top_k_index must be [tokens, top_k], got shape {tuple(top_k_index.shape)}")
    if top_k_index.is_cuda and num_experts <= 1024:
        return Routing(*moe_route(top_k_index, num_experts))
    return route_torch(top_k_index, num_experts)


# -- kernel calls (one Python function per C entry point; outputs are preallocated tensors) --------
def _check(t: Tensor) -> None:
    _lib.check_device(t.device)


def _c(t: Optional[Tensor]) -> Optional[Tensor]:
    """Contiguous and 16-byte aligned (the kernels load 16-byte vectors), copying only if needed."""
    if t is None:
        return None
    t = t.contiguous()
    return t.clone() if t.data_ptr() % 16 else t


def _k_scatter_rows(src, dst, inv, weights, rows, bias, row_expert, dot, offs, top_k) -> None:
    tokens, hidden = src.shape
    _fn("opslot_moe_scatter_rows", [PTR, PTR, PTR, PTR, PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I64, I32, PTR])(
        _p(src),
        _p(dst),
        _p(inv),
        _p(weights),
        _p(rows),
        _p(bias),
        _p(row_expert),
        _p(dot),
        _p(offs),
        offs.shape[0],
        tokens,
        top_k,
        hidden,
        _lib.dtype_code(src),
        _stream(src),
    )


def _k_gather_sum(rows, out, inv, weights, bias, row_expert, offs, top_k) -> None:
    _fn("opslot_moe_gather_sum", [PTR, PTR, PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I64, I32, PTR])(
        _p(rows),
        _p(out),
        _p(inv),
        _p(weights),
        _p(bias),
        _p(row_expert),
        _p(offs),
        offs.shape[0],
        out.shape[0],
        top_k,
        rows.shape[1],
        _lib.dtype_code(rows),
        _stream(rows),
    )


def _k_act_forward(h, a, bias, row_expert, offs, kind, alpha, limit) -> None:
    _fn("opslot_moe_act_forward", [PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I32, F32, F32, I32, PTR])(
        _p(h),
        _p(a),
        _p(bias),
        _p(row_expert),
        _p(offs),
        offs.shape[0],
        h.shape[0],
        a.shape[1],
        kind,
        alpha,
        limit,
        _lib.dtype_code(h),
        _stream(h),
    )


def _k_act_backward(da, h, dh, bias, row_expert, offs, kind, alpha, limit) -> None:
    _fn("opslot_moe_act_backward", [PTR, PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I32, F32, F32, I32, PTR])(
        _p(da),
        _p(h),
        _p(dh),
        _p(bias),
        _p(row_expert),
        _p(offs),
        offs.shape[0],
        h.shape[0],
        da.shape[1],
        kind,
        alpha,
        limit,
        _lib.dtype_code(h),
        _stream(h),
    )


def _k_segment_sum(g, out, offs) -> None:
    experts, cols = out.shape
    lib = _lib.library()
    size_fn = lib.opslot_moe_segment_sum_scratch
    size_fn.argtypes, size_fn.restype = [ctypes.c_int64, ctypes.c_int64], ctypes.c_int64
    scratch = torch.empty(int(size_fn(experts, cols)), device=g.device, dtype=torch.float32)
    _fn("opslot_moe_segment_sum", [PTR, PTR, PTR, PTR, I64, I64, I32, PTR])(
        _p(g), _p(out), _p(scratch), _p(offs), experts, cols, _lib.dtype_code(g), _stream(g)
    )


def _k_gmm_rows(a, b, c, offs) -> None:
    _fn("opslot_moe_gmm_rows", [PTR, PTR, I64, I64, I64, PTR, PTR, I64, I64, I64, I64, I32, PTR])(
        _p(a),
        _p(b),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        _p(c),
        _p(offs),
        offs.shape[0],
        a.shape[0],
        a.shape[1],
        b.shape[2],
        _lib.dtype_code(a),
        _stream(a),
    )


def _k_gmm_wgrad(x, g, c, offs) -> None:
    _fn("opslot_moe_gmm_wgrad", [PTR, PTR, PTR, I64, I64, I64, PTR, I64, I64, I64, I64, I32, PTR])(
        _p(x),
        _p(g),
        _p(c),
        c.stride(0),
        c.stride(1),
        c.stride(2),
        _p(offs),
        offs.shape[0],
        x.shape[0],
        x.shape[1],
        g.shape[1],
        _lib.dtype_code(x),
        _stream(x),
    )


def _k_zero_tail(c, offs) -> None:
    _fn("opslot_moe_zero_tail_rows", [PTR, PTR, I64, I64, I64, I32, PTR])(
        _p(c), _p(offs), offs.shape[0], c.shape[0], c.shape[1], _lib.dtype_code(c), _stream(c)
    )


def _scatter_rows(
    src: Tensor,
    inv: Tensor,
    offs: Tensor,
    top_k: int,
    weights: Optional[Tensor] = None,
    rows: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    row_expert: Optional[Tensor] = None,
    want_dot: bool = False,
) -> Tuple[Tensor, Optional[Tensor]]:
    tokens, hidden = src.shape
    dst = torch.empty(tokens * top_k, hidden, device=src.device, dtype=src.dtype)
    dot = torch.empty(tokens * top_k, device=src.device, dtype=torch.float32) if want_dot else None
    _k_scatter_rows(src, dst, inv, weights, rows, bias, row_expert, dot, offs, top_k)
    return dst, dot


def _gather_sum(
    rows: Tensor,
    inv: Tensor,
    offs: Tensor,
    tokens: int,
    top_k: int,
    weights: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    row_expert: Optional[Tensor] = None,
) -> Tensor:
    out = torch.empty(tokens, rows.shape[1], device=rows.device, dtype=rows.dtype)
    _k_gather_sum(rows, out, inv, weights, bias, row_expert, offs, top_k)
    return out


def _segment_sum(g: Tensor, offs: Tensor) -> Tensor:
    """out[e] = sum of g's rows of expert e (fp32, fixed order), in g's dtype."""
    out = torch.empty(offs.shape[0], g.shape[1], device=g.device, dtype=g.dtype)
    _k_segment_sum(g, out, offs)
    return out


# gather ---------------------------------------------------------------------------------------
@torch.library.custom_op("opslot::moe_gather", mutates_args=())
def moe_gather(x: Tensor, inv: Tensor, offs: Tensor, top_k: int) -> Tensor:
    """x [T, H] -> rows [T*top_k, H] in expert order (row inv[t*K+k] = x[t]; dropped rows zero)."""
    _check(x)
    return _scatter_rows(_c(x), inv, offs, top_k)[0]


@moe_gather.register_fake
def _(x, inv, offs, top_k):
    return x.new_empty(x.shape[0] * top_k, x.shape[1])


@torch.library.custom_op("opslot::moe_gather_backward", mutates_args=())
def moe_gather_backward(grad: Tensor, inv: Tensor, offs: Tensor, top_k: int) -> Tensor:
    _check(grad)
    return _gather_sum(_c(grad), inv, offs, grad.shape[0] // top_k, top_k)


@moe_gather_backward.register_fake
def _(grad, inv, offs, top_k):
    return grad.new_empty(grad.shape[0] // top_k, grad.shape[1])


def _gather_setup(ctx, inputs, output):
    _, inv, offs, top_k = inputs
    ctx.save_for_backward(inv, offs)
    ctx.top_k = top_k


def _gather_bwd(ctx, grad):
    inv, offs = ctx.saved_tensors
    return moe_gather_backward(grad, inv, offs, ctx.top_k), None, None, None


moe_gather.register_autograd(_gather_bwd, setup_context=_gather_setup)


# combine --------------------------------------------------------------------------------------
@torch.library.custom_op("opslot::moe_combine", mutates_args=())
def moe_combine(
    rows: Tensor, inv: Tensor, offs: Tensor, weights: Tensor, row_expert: Tensor, bias: Optional[Tensor]
) -> Tensor:
    """out[t] = sum_k weights[t,k] * (rows[inv[t,k]] + bias[expert]) (fp32 sum, k order); weights fp32 [T, K]."""
    _check(rows)
    tokens, top_k = weights.shape
    return _gather_sum(_c(rows), inv, offs, tokens, top_k, weights.contiguous(), _c(bias), row_expert)


@moe_combine.register_fake
def _(rows, inv, offs, weights, row_expert, bias):
    return rows.new_empty(weights.shape[0], rows.shape[1])


@torch.library.custom_op("opslot::moe_combine_backward", mutates_args=())
def moe_combine_backward(
    grad: Tensor, rows: Tensor, inv: Tensor, offs: Tensor, weights: Tensor, row_expert: Tensor, bias: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Tensor]:
    """(d rows, d weights [T, K] fp32, d bias [E, H] or empty)."""
    _check(grad)
    tokens, top_k = weights.shape
    d_rows, d_w = _scatter_rows(
        _c(grad), inv, offs, top_k, weights.contiguous(), _c(rows), _c(bias), row_expert, want_dot=True
    )
    d_bias = _segment_sum(d_rows, offs) if bias is not None else grad.new_empty(0)
    return d_rows, d_w.view(tokens, top_k), d_bias


@moe_combine_backward.register_fake
def _(grad, rows, inv, offs, weights, row_expert, bias):
    d_bias = grad.new_empty(bias.shape) if bias is not None else grad.new_empty(0)
    return grad.new_empty(rows.shape), weights.new_empty(weights.shape), d_bias


def _combine_setup(ctx, inputs, output):
    rows, inv, offs, weights, row_expert, bias = inputs
    ctx.save_for_backward(rows, inv, offs, weights, row_expert, bias)


def _combine_bwd(ctx, grad):
    rows, inv, offs, weights, row_expert, bias = ctx.saved_tensors
    d_rows, d_w, d_bias = moe_combine_backward(grad, rows, inv, offs, weights, row_expert, bias)
    return d_rows, None, None, d_w, None, (d_bias if bias is not None else None)


moe_combine.register_autograd(_combine_bwd, setup_context=_combine_setup)


# activation -----------------------------------------------------------------------------------
@torch.library.custom_op("opslot::moe_act", mutates_args=())
def moe_act(
    h: Tensor, offs: Tensor, row_expert: Tensor, bias: Optional[Tensor], kind: int, alpha: float, limit: float
) -> Tensor:
    """h [N, 2I] -> a [N, I]; kind 0: silu(gate) * up; kind 1: GPT-OSS (interleaved, + bias)."""
    _check(h)
    h = _c(h)
    a = torch.empty(h.shape[0], h.shape[1] // 2, device=h.device, dtype=h.dtype)
    _k_act_forward(h, a, _c(bias), row_expert, offs, kind, alpha, limit)
    return a


@moe_act.register_fake
def _(h, offs, row_expert, bias, kind, alpha, limit):
    return h.new_empty(h.shape[0], h.shape[1] // 2)


@torch.library.custom_op("opslot::moe_act_backward", mutates_args=())
def moe_act_backward(
    grad: Tensor,
    h: Tensor,
    offs: Tensor,
    row_expert: Tensor,
    bias: Optional[Tensor],
    kind: int,
    alpha: float,
    limit: float,
) -> Tuple[Tensor, Tensor]:
    """(d h [N, 2I], d bias [E, 2I] or empty)."""
    _check(grad)
    h = _c(h)
    dh = torch.empty_like(h)
    _k_act_backward(_c(grad), h, dh, _c(bias), row_expert, offs, kind, alpha, limit)
    d_bias = _segment_sum(dh, offs) if bias is not None else h.new_empty(0)
    return dh, d_bias


@moe_act_backward.register_fake
def _(grad, h, offs, row_expert, bias, kind, alpha, limit):
    return h.new_empty(h.shape), (h.new_empty(bias.shape) if bias is not None else h.new_empty(0))


def _act_setup(ctx, inputs, output):
    h, offs, row_expert, bias, kind, alpha, limit = inputs
    ctx.save_for_backward(h, offs, row_expert, bias)
    ctx.params = (kind, alpha, limit)


def _act_bwd(ctx, grad):
    h, offs, row_expert, bias = ctx.saved_tensors
    dh, d_bias = moe_act_backward(grad, h, offs, row_expert, bias, *ctx.params)
    return dh, None, None, (d_bias if bias is not None else None), None, None, None


moe_act.register_autograd(_act_bwd, setup_context=_act_setup)


# grouped GEMM ---------------------------------------------------------------------------------
def _use_cutlass(a: Tensor, w: Tensor) -> bool:
    if GEMM_BACKEND == "portable":
        return False
    if GEMM_BACKEND != "auto":
        raise ValueError(f"opslot moe GEMM_BACKEND must be 'auto' or 'portable', got {GEMM_BACKEND!r}")
    return (
        a.dtype == torch.bfloat16
        and w.dtype == torch.bfloat16
        and a.is_cuda
        and hasattr(torch, "_grouped_mm")
        and torch.cuda.get_device_capability(a.device)[0] in (9, 10)
        and a.shape[0] > 0
        and a.shape[1] % 8 == 0
        and w.shape[1] % 8 == 0
        and w.shape[2] % 8 == 0
        and w.shape[0] < 1024
        and w.is_contiguous()
        and a.is_contiguous()
        and a.data_ptr() % 16 == 0
        and w.data_ptr() % 16 == 0
    )


def _zero_tail(c: Tensor, offs: Tensor) -> Tensor:
    _k_zero_tail(c, offs)
    return c


def _b_view(w: Tensor, w_transposed: bool) -> Tensor:
    """The [E, K, N] operand of a @ b per expert: w itself, or w [E, N, K] transposed."""
    return w.transpose(-2, -1) if w_transposed else w


def _gmm_rows(a: Tensor, b: Tensor, offs: Tensor, use_cutlass: bool) -> Tensor:
    """c[r] = a[r] @ b[e(r)] over row segments; b is [E, K, N] (any strides); rows past offs[-1] zero."""
    if use_cutlass:
        c = torch._grouped_mm(a, b, offs=offs)
        return _zero_tail(c, offs)
    c = torch.zeros(a.shape[0], b.shape[2], device=a.device, dtype=a.dtype)
    _k_gmm_rows(a, b, c, offs)
    return c


def _gmm_wgrad(x: Tensor, g: Tensor, offs: Tensor, use_cutlass: bool) -> Tensor:
    """c[e] = x_e^T @ g_e over row segments: [E, P, Q] from x [N, P], g [N, Q]."""
    if use_cutlass:
        return torch._grouped_mm(x.t(), g, offs=offs)
    c = torch.empty(offs.shape[0], x.shape[1], g.shape[1], device=x.device, dtype=x.dtype)
    _k_gmm_wgrad(x, g, c, offs)
    return c


@torch.library.custom_op("opslot::moe_grouped_mm", mutates_args=())
def moe_grouped_mm(a: Tensor, w: Tensor, offs: Tensor, w_transposed: bool) -> Tensor:
    """Per expert segment of rows: a_e @ w[e].T (w_transposed, w [E, N, K]) or a_e @ w[e] (w [E, K, N]).
    Rows past offs[-1] are zero."""
    _check(a)
    a = a.contiguous()
    return _gmm_rows(a, _b_view(w, w_transposed), offs, _use_cutlass(a, w))


@moe_grouped_mm.register_fake
def _(a, w, offs, w_transposed):
    return a.new_empty(a.shape[0], w.shape[1] if w_transposed else w.shape[2])


@torch.library.custom_op("opslot::moe_grouped_mm_backward", mutates_args=())
def moe_grouped_mm_backward(
    grad: Tensor, a: Tensor, w: Tensor, offs: Tensor, w_transposed: bool
) -> Tuple[Tensor, Tensor]:
    """(d a, d w) of moe_grouped_mm."""
    _check(grad)
    grad, a = grad.contiguous(), a.contiguous()
    cut = _use_cutlass(a, w) and _use_cutlass(grad, w)
    b = _b_view(w, w_transposed)  # [E, K, N]
    d_a = _gmm_rows(grad, b.transpose(-2, -1), offs, cut)
    if w_transposed:
        d_w = _gmm_wgrad(grad, a, offs, cut)  # [E, N, K], like w
    else:
        d_w = _gmm_wgrad(a, grad, offs, cut)  # [E, K, N], like w
    return d_a, d_w


@moe_grouped_mm_backward.register_fake
def _(grad, a, w, offs, w_transposed):
    return a.new_empty(a.shape), w.new_empty(w.shape)


def _gmm_setup(ctx, inputs, output):
    a, w, offs, w_transposed = inputs
    ctx.save_for_backward(a, w, offs)
    ctx.w_transposed = w_transposed


def _gmm_bwd(ctx, grad):
    a, w, offs = ctx.saved_tensors
    d_a, d_w = moe_grouped_mm_backward(grad, a, w, offs, ctx.w_transposed)
    return d_a, d_w, None, None


moe_grouped_mm.register_autograd(_gmm_bwd, setup_context=_gmm_setup)


# -- composition -------------------------------------------------------------------------------
def grouped_experts(
    x_sorted: Tensor,
    offs: Tensor,
    row_expert: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    *,
    kind: int = KIND_SILU,
    transposed: bool = True,
    gate_up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> Tensor:
    """The experts on already-dispatched tokens (the piece an expert-parallel all-to-all sits in front of).

    x_sorted [S, H]: rows grouped by local expert; offs [E] int32: cumulative row counts (rows past
    offs[-1] are padding and come back zero, plus the down bias when given); row_expert [S] int32: the
    expert of each row (needed for biases; rows past offs[-1] may hold anything). Weights: Qwen layout
    (`transposed=True`: gate_up [E, 2I, H], down [E, H, I]) or GPT-OSS layout (`transposed=False`:
    gate_up [E, H, 2I], down [E, I, H]). Returns y [S, H] = down(act(gate_up(x))) per row, no routing
    weight applied. Differentiable in x_sorted, the weights and the biases."""
    offs = offs.to(torch.int32).contiguous()
    row_expert = row_expert.to(torch.int32).contiguous()
    h = moe_grouped_mm(x_sorted, gate_up_proj, offs, transposed)
    a = moe_act(h, offs, row_expert, gate_up_bias, kind, float(alpha), float(limit))
    y = moe_grouped_mm(a, down_proj, offs, transposed)
    if down_bias is not None:
        y = y + down_bias[row_expert.clamp(max=down_bias.shape[0] - 1).long()]
    return y


def _experts(
    hidden_states: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    num_experts: int,
    gate_up: Tensor,
    down: Tensor,
    *,
    kind: int,
    transposed: bool,
    gate_up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
    alpha: float = 0.0,
    limit: float = 0.0,
) -> Tensor:
    if not torch.compiler.is_compiling():  # the custom ops check again when they run
        _lib.check_device(hidden_states.device)
    shape = hidden_states.shape
    hidden = shape[-1]
    x = hidden_states.reshape(-1, hidden)
    tokens = x.shape[0]
    top_k = top_k_index.shape[-1]
    idx = top_k_index.reshape(tokens, top_k)
    weights = top_k_weights.reshape(tokens, top_k).float()
    x = x.to(gate_up.dtype)
    r = route(idx, num_experts)
    xs = moe_gather(x, r.inv, r.offs, top_k)
    h = moe_grouped_mm(xs, gate_up, r.offs, transposed)
    a = moe_act(h, r.offs, r.row_expert, gate_up_bias, kind, float(alpha), float(limit))
    y = moe_grouped_mm(a, down, r.offs, transposed)
    out = moe_combine(y, r.inv, r.offs, weights, r.row_expert, down_bias)
    return out.to(hidden_states.dtype).reshape(shape)


def _is_silu(act: Any) -> bool:
    return (
        isinstance(act, torch.nn.SiLU)
        or type(act).__name__ in ("SiLUActivation", "SiLU")
        or act is torch.nn.functional.silu
    )


def moe_standard(module: Any, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    """Qwen3-MoE-style experts (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`, SiLU), docs/ops.md."""
    if not _is_silu(module.act_fn):
        raise ValueError(
            f"opslot cuda moe/standard implements act_fn SiLU only, this module has "
            f"{type(module.act_fn).__name__}; use moe_implementation 'fused_torch' or 'eager'"
        )
    return _experts(
        hidden_states,
        top_k_index,
        top_k_weights,
        module.num_experts,
        module.gate_up_proj,
        module.down_proj,
        kind=KIND_SILU,
        transposed=True,
    )


def moe_gpt_oss(module: Any, hidden_states: Tensor, router_indices: Tensor, routing_weights: Tensor) -> Tensor:
    """GPT-OSS experts (`gate_up_proj [E, H, 2I]` interleaved, biases, clamped alpha-SwiGLU), docs/ops.md."""
    return _experts(
        hidden_states,
        router_indices,
        routing_weights,
        module.num_experts,
        module.gate_up_proj,
        module.down_proj,
        kind=KIND_GPT_OSS,
        transposed=False,
        gate_up_bias=module.gate_up_proj_bias,
        down_bias=module.down_proj_bias,
        alpha=float(module.alpha),
        limit=float(module.limit),
    )


__all__ = [
    "Routing",
    "route",
    "route_torch",
    "moe_route",
    "grouped_experts",
    "moe_standard",
    "moe_gpt_oss",
    "moe_gather",
    "moe_combine",
    "moe_act",
    "moe_grouped_mm",
    "GEMM_BACKEND",
]
