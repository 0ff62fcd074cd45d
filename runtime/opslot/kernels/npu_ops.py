"""Ascend NPU kernels (impl name "npu"): thin adapters onto `torch_npu` operators.

UNVERIFIED ON HARDWARE: no Ascend machine is available to this project. These adapters are tested
against a fake `torch_npu` that records calls, checks the argument contracts we rely on (shapes,
dtypes, keyword names) and computes the documented math on CPU. `torch_npu` is looked up at call
time, so importing this module needs no NPU stack.

Contracts used (torch_npu 2.x): `npu_rms_norm(x, gamma, epsilon=) -> (y, rstd)`;
`npu_rotary_mul(x, r1, r2) -> x * r1 + rotate_half(x) * r2` on 4-D tensors;
`npu_swiglu(x, dim=-1) -> silu(a) * b` for `a, b = x.chunk(2, dim)`;
`npu_grouped_matmul([x], [w_0 .. w_E-1], group_list=cumsum, split_item=2, group_type=0,
group_list_type=0) -> [y]` with `y[rows of group i] = x[rows of group i] @ w_i`.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch

from . import torch_ops


def _npu() -> Any:
    return importlib.import_module("torch_npu")


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """npu_rms_norm with gamma = w (in the input dtype)."""
    return _npu().npu_rms_norm(hidden_states, weight.to(hidden_states.dtype), epsilon=eps)[0]


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """npu_rms_norm with gamma = 1 + w."""
    gamma = (1.0 + weight.float()).to(hidden_states.dtype)
    return _npu().npu_rms_norm(hidden_states, gamma, epsilon=eps)[0]


def rms_norm_unweighted(hidden_states: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """npu_rms_norm with gamma = 1."""
    if weight is not None:
        raise ValueError("rms_norm/unweighted takes weight=None")
    gamma = torch.ones(hidden_states.shape[-1], dtype=hidden_states.dtype, device=hidden_states.device)
    return _npu().npu_rms_norm(hidden_states, gamma, epsilon=eps)[0]


def _rotary_4d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if x.dim() != 4 or cos.dim() != 4:
        raise ValueError(
            f"npu rotary_pos_emb needs 4-D q/k and cos/sin after unsqueeze, got {x.dim()}-D and {cos.dim()}-D"
        )
    return _npu().npu_rotary_mul(x, cos.to(x.dtype), sin.to(x.dtype))


def rotary_pos_emb_full(q, k, cos, sin, unsqueeze_dim: int = 1):
    """npu_rotary_mul on q and k."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return _rotary_4d(q, cos, sin), _rotary_4d(k, cos, sin)


def rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim: int = 1):
    """npu_rotary_mul on the first `cos.shape[-1]` features; the rest pass through."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    d = cos.shape[-1]
    return (
        torch.cat((_rotary_4d(q[..., :d], cos, sin), q[..., d:]), dim=-1),
        torch.cat((_rotary_4d(k[..., :d], cos, sin), k[..., d:]), dim=-1),
    )


def rotary_pos_emb_interleaved(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """DeepSeek-V3's interleaved pairs: q/k de-interleaved (`(x0, x1, x2, x3, ...)` -> `(x0, x2, ...,
    x1, x3, ...)`, a copy), then npu_rotary_mul with the first half of cos/sin (the pairs' angles)
    repeated: `x1 * c - x2 * s`, `x2 * c + x1 * s`, as upstream. `position_ids` is unused."""
    half = cos.shape[-1] // 2
    cos = torch.cat((cos[..., :half], cos[..., :half]), dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat((sin[..., :half], sin[..., :half]), dim=-1).unsqueeze(unsqueeze_dim)

    def deinterleave(x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)

    return _rotary_4d(deinterleave(q), cos, sin), _rotary_4d(deinterleave(k), cos, sin)


def rotary_pos_emb_vision(q, k, cos, sin):
    """The vision towers' RoPE: npu_rotary_mul in fp32 on q/k `[seq, heads, dim]` as `[1, seq, heads,
    dim]` with cos/sin `[seq, dim]` as `[1, seq, 1, dim]`, cast back to q's and k's dtypes."""
    if q.dim() != 3 or k.dim() != 3 or cos.dim() != 2:
        raise ValueError(
            f"npu rotary_pos_emb_vision needs q/k [seq, heads, dim] and cos/sin [seq, dim], got "
            f"{q.dim()}-D, {k.dim()}-D and {cos.dim()}-D"
        )
    cos, sin = cos.float()[None, :, None, :], sin.float()[None, :, None, :]
    npu = _npu()
    q_embed = npu.npu_rotary_mul(q.float().unsqueeze(0), cos, sin)[0]
    k_embed = npu.npu_rotary_mul(k.float().unsqueeze(0), cos, sin)[0]
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


def swiglu_mlp(module: Any, x: torch.Tensor) -> torch.Tensor:
    """down(npu_swiglu(cat(gate(x), up(x))))."""
    torch_ops._check_silu(module, "swiglu_mlp")
    gate_up = torch.cat((module.gate_proj(x), module.up_proj(x)), dim=-1)
    return module.down_proj(_npu().npu_swiglu(gate_up, dim=-1))


def moe_standard(module: Any, hidden_states, top_k_index, top_k_weights):
    """Sorted tokens through two npu_grouped_matmul calls with npu_swiglu between them.
    Requires a SiLU expert activation (`config.hidden_act`)."""
    torch_ops._check_silu(module, "moe")
    npu = _npu()
    order, token_idx, counts = torch_ops._sort_by_expert(top_k_index, module.num_experts)
    final = torch.zeros_like(hidden_states)
    if not token_idx.numel():
        return final
    group_list = torch.tensor(counts, dtype=torch.int64, device=hidden_states.device).cumsum(0)
    x = hidden_states[token_idx]
    gate_up = npu.npu_grouped_matmul(
        [x], [w.t() for w in module.gate_up_proj], group_list=group_list, split_item=2, group_type=0, group_list_type=0
    )[0]
    inter = npu.npu_swiglu(gate_up, dim=-1)
    out = npu.npu_grouped_matmul(
        [inter], [w.t() for w in module.down_proj], group_list=group_list, split_item=2, group_type=0, group_list_type=0
    )[0]
    out = out * top_k_weights.reshape(-1)[order, None]
    return final.index_add(0, token_idx, out.to(final.dtype))
