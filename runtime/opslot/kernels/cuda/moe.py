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
4. `opslot::moe_act`: SiLU(gate) * up (Qwen/Mixtral layout), DeepSeek-V4's clamped SwiGLU on the same
   layout, or GPT-OSS's clamped alpha-SwiGLU over interleaved gate/up with the gate-up bias added on
   the fly.
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
the portable one, for tests and comparisons: the functions here then call the ops' `.portable`
overloads (`torch.ops.opslot.moe_grouped_mm.default` itself follows `$OPSLOT_MOE_GEMM` only).

The ops are registered from C++ with their Meta and Autograd kernels (kernels/torch/moe.cc). Kept in
Python: `route` (the kernel for CUDA tensors, `route_torch` for others), the GEMM_BACKEND switch, and
the CPU kernels of the launches: on CUDA tensors the C++ ops call the C entry points directly; on
other tensors they call `opslot::moe_k_<name>`, whose CPU kernel runs `_check` and `_k_<name>` below
(CPU tests replace them with torch emulations to run the C++ ops' composition and autograd without a
GPU; on CPU tensors the real `_check` raises KernelLibraryError), and ask `_use_cutlass` for the GEMM.

Expert parallelism: `grouped_experts(x_sorted, offs, row_expert, ...)` is the expert computation on
tokens that are already in expert order (what an all-to-all dispatch delivers), without routing or
combine; `route`, `gather`, `combine` are the pieces around it.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor

from . import _lib, _ops_common as C

#: "auto" (torch._grouped_mm for bf16 on sm90/sm100, else portable) or "portable".
GEMM_BACKEND = os.environ.get("OPSLOT_MOE_GEMM", "auto")

KIND_SILU = 0  # act(gate) * up, gate = h[:, :I], up = h[:, I:]
KIND_GPT_OSS = 1  # clamped alpha-SwiGLU, gate = h[:, 0::2], up = h[:, 1::2], optional bias
KIND_CLAMPED = 2  # DeepSeek-V4: silu(gate.clamp(max=limit)) * up.clamp(-limit, limit), halves as KIND_SILU

C.require_library_on_cuda_machines()
moe_route = C.torch_op("moe_route")  # (offs, row_expert, src_token, inv)
moe_gather = C.torch_op("moe_gather")  # each op differentiable through its _backward op
moe_gather_backward = C.torch_op("moe_gather_backward")
moe_combine = C.torch_op("moe_combine")
moe_combine_backward = C.torch_op("moe_combine_backward")
moe_act = C.torch_op("moe_act")
moe_act_backward = C.torch_op("moe_act_backward")


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


# -- the launches' CPU kernels ------------------------------------------------------------------
# On CUDA tensors the C++ ops call the C entry points themselves; on others they call the ops
# opslot::moe_k_<name>, whose CPU kernel is `_check` then `_k_<name>` (CPU tests emulate both).
def _check(t: Tensor) -> None:
    _lib.check_device(t.device)


def _k_scatter_rows(src, dst, inv, weights, rows, bias, row_expert, dot, offs, top_k) -> None:
    torch.ops.opslot.moe_k_scatter_rows(src, dst, inv, weights, rows, bias, row_expert, dot, offs, top_k)


def _k_gather_sum(rows, out, inv, weights, bias, row_expert, offs, top_k) -> None:
    torch.ops.opslot.moe_k_gather_sum(rows, out, inv, weights, bias, row_expert, offs, top_k)


def _k_act_forward(h, a, bias, row_expert, offs, kind, alpha, limit) -> None:
    torch.ops.opslot.moe_k_act_forward(h, a, bias, row_expert, offs, kind, alpha, limit)


def _k_act_backward(da, h, dh, bias, row_expert, offs, kind, alpha, limit) -> None:
    torch.ops.opslot.moe_k_act_backward(da, h, dh, bias, row_expert, offs, kind, alpha, limit)


def _k_segment_sum(g, out, offs) -> None:
    torch.ops.opslot.moe_k_segment_sum(g, out, offs)


def _k_gmm_rows(a, b, c, offs) -> None:
    torch.ops.opslot.moe_k_gmm_rows(a, b, c, offs)


def _k_gmm_wgrad(x, g, c, offs) -> None:
    torch.ops.opslot.moe_k_gmm_wgrad(x, g, c, offs)


def _k_zero_tail(c, offs) -> None:
    torch.ops.opslot.moe_k_zero_tail(c, offs)


def _use_cutlass(a: Tensor, w: Tensor) -> bool:
    """The GEMM choice for tensors that are not on CUDA (for CUDA tensors moe.cc decides): the
    portable kernel. Tests make it True to run torch._grouped_mm's CPU kernel."""
    return False


def _cpu_kernel(name: str):
    def kernel(*args):
        _check(args[0])
        return globals()[name](*args)

    return kernel


_LAUNCHES = (
    "scatter_rows",
    "gather_sum",
    "act_forward",
    "act_backward",
    "segment_sum",
    "gmm_rows",
    "gmm_wgrad",
    "zero_tail",
)
for _name in _LAUNCHES:
    C.cpu_kernel(f"moe_k_{_name}", _cpu_kernel(f"_k_{_name}"))
C.cpu_kernel("moe_k_use_grouped_mm", _cpu_kernel("_use_cutlass"))


# -- grouped GEMM: the GEMM_BACKEND switch chooses the overload ------------------------------------
def _overload() -> str:
    if GEMM_BACKEND == "portable":
        return "portable"
    if GEMM_BACKEND != "auto":
        raise ValueError(f"opslot moe GEMM_BACKEND must be 'auto' or 'portable', got {GEMM_BACKEND!r}")
    return "default"


_GMM = {o: C.torch_op("moe_grouped_mm", o) for o in ("default", "portable")}
_GMM_BACKWARD = {o: C.torch_op("moe_grouped_mm_backward", o) for o in ("default", "portable")}


def moe_grouped_mm(a: Tensor, w: Tensor, offs: Tensor, w_transposed: bool) -> Tensor:
    """Per expert segment of rows: a_e @ w[e].T (w_transposed, w [E, N, K]) or a_e @ w[e] (w [E, K, N]).
    Rows past offs[-1] are zero. Differentiable (opslot::moe_grouped_mm_backward)."""
    return _GMM[_overload()](a, w, offs, w_transposed)


def moe_grouped_mm_backward(grad: Tensor, a: Tensor, w: Tensor, offs: Tensor, w_transposed: bool):
    """(d a, d w) of moe_grouped_mm."""
    return _GMM_BACKWARD[_overload()](grad, a, w, offs, w_transposed)


# -- composition -------------------------------------------------------------------------------
def _check_dispatched_async(offs: Tensor, row_expert: Tensor, rows: int, experts: int, biased: bool) -> None:
    """Device-side checks of grouped_experts' routing (no host synchronisation): offs never decreases,
    from >= 0 to at most the rows (the kernels process rows up to offs[-1]); with biases, every counted
    row's row_expert names an expert (the kernels index the biases with it)."""
    if offs.numel() == 0:
        return
    ok = (offs[0] >= 0) & (offs[-1] <= rows)
    if offs.numel() > 1:
        ok = ok & (offs[1:] >= offs[:-1]).all()
    if biased:
        counted = torch.arange(rows, device=offs.device) < offs[-1]
        ok = ok & (((row_expert >= 0) & (row_expert < experts)) | ~counted).all()
    torch._assert_async(
        ok,
        "grouped_experts: offs must be cumulative row counts (never decreasing, from 0 up to the rows of "
        "x_sorted) and, with biases, row_expert must be an expert index on every counted row",
    )


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
    biased = gate_up_bias is not None or down_bias is not None
    _check_dispatched_async(offs, row_expert, x_sorted.shape[0], gate_up_proj.shape[0], biased)
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


def moe_clamped(module: Any, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    """DeepSeek-V4 experts (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`): `silu(gate.clamp(max=L)) *
    up.clamp(-L, L)`, L = `module.limit` (docs/ops.md)."""
    if not _is_silu(module.act_fn):
        raise ValueError(
            f"opslot cuda moe/clamped implements act_fn SiLU only, this module has "
            f"{type(module.act_fn).__name__}; use moe_implementation 'fused_torch' or 'eager'"
        )
    limit = getattr(module, "limit", None)
    if limit is None:
        raise ValueError("opslot cuda moe/clamped needs the module's clamp limit (`limit`, config.swiglu_limit)")
    return _experts(
        hidden_states,
        top_k_index,
        top_k_weights,
        module.num_experts,
        module.gate_up_proj,
        module.down_proj,
        kind=KIND_CLAMPED,
        transposed=True,
        limit=float(limit),
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
    "moe_clamped",
    "moe_gpt_oss",
    "moe_gather",
    "moe_combine",
    "moe_act",
    "moe_grouped_mm",
    "GEMM_BACKEND",
]
