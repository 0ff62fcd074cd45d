"""Sparse multi-query attention (DeepSeek sparse attention) on libopslot_kernels, and the `cuda` kernels of
the `dsa_attention` slots of GLM-MoE-DSA (`glm`) and DeepSeek-V4 (`deepseek_v4`).

Torch ops registered from C++ (kernels/torch/sparse_attention.cc), with Meta, CPU (the fp32 reference
math) and Autograd kernels:
- `opslot::sparse_mqa_attention(q [B, S, H, Dqk], kv [B, T, Dqk], indices int32 [B, S, K], sinks fp32 [H]?,
  scale, dv) -> (out [B, S, H, dv], lse fp32 [B, S, H])`: one shared key/value head, V = kv[..., :dv], each
  query attends to its listed keys (an index outside [0, T), e.g. -1, is skipped); `sinks` joins the
  softmax's denominator only (gpt-oss / DeepSeek-V4). Differentiable in q, kv and sinks through
  `opslot::sparse_mqa_attention_bwd` (deterministic: no float atomics).
- `opslot::sparse_mqa_mask_indices(mask [B, S, T], topk) -> (indices, status)`: the valid columns of each
  mask row (0 / True; masked: <= -65504 / False) in order, padded with -1.
- `opslot::sparse_mha_attention(q [B, S, H, dk], k [B, Hkv, T, dk], v [B, Hkv, T, dv], indices int32
  [B, S, K], scale) -> (out [B, S, H, dv], lse)` (kernels/torch/sparse_mha.cc): per-head keys and values, one
  index list a query for all of its heads; forward only (its Autograd kernel refuses a call needing grad).
kernels/include/opslot_kernels/sparse_attention.h, sparse_mha.h and docs/kernels.md describe the kernels.

The slot kernels run the same mathematics as upstream with other rounding (bf16 tolerance); what they
cannot serve they refuse with a message (never another implementation silently):
- `dsa_attention_glm`: the absorbed (latent, MQA) form. q_lat[h] = W_uk[h]^T q_pass[h], q = [q_lat, q_rot],
  kv = [k_pass, k_rot] (one head), o_lat = sparse_mqa_attention(q, kv, indices), out[h] = W_uv[h] o_lat[h],
  with W_uk, W_uv kv_b_proj's weight split per head. A selected index is kept when the attention mask lets the
  query see it (causal and padding: 0 / True in upstream's mask; without a mask, causal). With a cache
  (Transformers 5.17: upstream caches the expanded per-head keys and values, not the latents), upstream's
  cache update runs: while the layer's cache is empty it stores the expanded keys and values (computed
  without autograd) and the kernel attends over the latents as above; once it holds tokens, attention runs
  over the cached keys and values (qk_head_dim + v_head_dim <= 576, each <= 512): without autograd (a
  decoding step of generate()) `sparse_mha_attention` reads the selected rows of every head from the cache;
  with autograd the differentiable kernel takes one (batch, head) pair a row, kv = [v | k] (the S * K
  selected rows gathered where fewer than the cache's T, else a copy of the layer's cache), q = [0 | q],
  dv = v_head_dim.
- `dsa_attention_deepseek_v4`: each query's keys are the valid entries of upstream's mask (the sliding
  window's causal mask with the compressor's block bias concatenated), at most `sliding_window` + the
  compressor's entries (CSA: its indexer's top-k); `s_aux` are the sinks. Without a mask (sdpa/flash skipped
  it: plain causal attention within the window) only kv of the query length is accepted.
Both refuse attention dropout in training and `output_attentions` (the kernel returns no weights).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _ops_common as C

C.require_library_on_cuda_machines()
_FWD = C.torch_op("sparse_mqa_attention")  # its Autograd kernel's backward calls sparse_mqa_attention_bwd
_MASK = C.torch_op("sparse_mqa_mask_indices")
_MHA = C.torch_op("sparse_mha_attention")  # forward only (kernels/torch/sparse_mha.cc)

#: Additive-mask entries at or below this (every float dtype's finfo.min, and -inf) are masked.
MASKED_BELOW = -65504.0
#: The kernel's largest head size Dqk (kernels/include/opslot_kernels/sparse_attention.h, "Limits").
MAX_DQK = 576
#: sparse_mha_attention's largest dk and dv (kernels/include/opslot_kernels/sparse_mha.h, "Limits").
MAX_MHA_DIM = 512


def sparse_mqa_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    dv: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out [B, S, H, dv], lse fp32 [B, S, H]); scale defaults to Dqk^-0.5, dv to Dqk."""
    d = q.shape[-1]
    return _FWD(q, kv, indices, sinks, float(d**-0.5 if scale is None else scale), int(d if dv is None else dv))


def _refuse_unservable(module, slot: str, dropout: float, kwargs) -> None:
    if dropout and float(dropout) > 0.0:
        raise ValueError(
            f"{slot}: the cuda kernel has no attention dropout (got dropout={float(dropout)} in training); set "
            "the config's attention_dropout to 0 or use dsa_attention_implementation 'torch' or 'eager'"
        )
    config = getattr(module, "config", None)
    if kwargs.get("output_attentions") or getattr(config, "output_attentions", False):
        raise ValueError(
            f"{slot}: the cuda kernel does not compute attention weights (output_attentions was requested); "
            "use dsa_attention_implementation 'torch' or 'eager' to get them"
        )


def _mask_rows(mask: torch.Tensor, B: int, S: int, T: int, slot: str) -> torch.Tensor:
    """Upstream's [B or 1, 1, S, T] (or [B, S, T]) mask as [B, S, T] (a view)."""
    m = mask
    if m.dim() == 4:
        if m.shape[1] != 1:
            raise ValueError(
                f"{slot}: the cuda kernel shares one key list by all heads; a per-head attention mask of shape "
                f"{tuple(mask.shape)} cannot be served (use dsa_attention_implementation 'torch')"
            )
        m = m[:, 0]
    if m.dim() != 3 or m.shape[-2:] != (S, T) or m.shape[0] not in (1, B):
        raise ValueError(
            f"{slot}: attention_mask of shape {tuple(mask.shape)} does not match [batch, 1, {S}, {T}] "
            f"(batch {B}, {S} queries, {T} keys)"
        )
    return m.expand(B, S, T)


def _glm_indices(topk_indices: torch.Tensor, attention_mask, S: int, T: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(the indexer's selection with every index the query may not see (causal, padding) set to -1, int32;
    the selection clamped into [0, T), int64: a row to read for every slot, seen or not)."""
    slot = "dsa_attention/glm"
    idx = topk_indices
    m = None if attention_mask is None else _mask_rows(attention_mask, idx.shape[0], S, T, slot)
    if T == 0:
        return torch.full_like(idx, -1, dtype=torch.int32), torch.zeros_like(idx, dtype=torch.long)
    safe = idx.clamp(0, T - 1).long()
    in_range = safe == idx  # clamping changed nothing
    if m is None:
        ok = in_range & (safe <= torch.arange(T - S, T, device=idx.device).view(1, S, 1))
    else:
        g = m.gather(-1, safe)
        if g.dtype == torch.bool:
            ok = in_range & g
        else:
            visible = g == 0
            ok = in_range & visible
            torch._assert_async(
                (visible | (g <= MASKED_BELOW)).all(),
                f"{slot}: the attention mask holds values other than 0 and the dtype's minimum at selected keys "
                "(an additive bias): the cuda kernel cannot apply it; use dsa_attention_implementation 'torch'",
            )
    return torch.where(ok, idx, -1).to(torch.int32), safe


def _glm_from_cache(module, q_pass, q_rot, k_pass, k_rot, topk_indices, attention_mask, past_key_values):
    """Transformers 5.17 once the layer's cache holds tokens: upstream's cache update (the expanded keys and
    values of the new tokens, with autograd), then attention over the cached keys and values. Without
    autograd (generate()), `sparse_mha_attention` reads each query's selected rows of every head straight from
    the cache. With autograd, the differentiable kernel with every (batch, head) pair as one row of one head:
    kv = [v | k], q = [0 | q] (the zeros meet v: the scores are q . k), dv = v_head_dim; kv holds the selected
    rows (S * K of them, gathered) where that is fewer than the cache's T, else all T. Returns
    [B, S, H, v_head_dim]."""
    B, H, S, _ = q_pass.shape
    dk, dv = module.qk_head_dim, module.v_head_dim
    if dk + dv > MAX_DQK or max(dk, dv) > MAX_MHA_DIM:
        raise ValueError(
            f"dsa_attention/glm: attending over Transformers 5.17's cache (the expanded keys and values) needs "
            f"qk_head_dim + v_head_dim <= {MAX_DQK} and each <= {MAX_MHA_DIM}, got {dk} + {dv}; use "
            "dsa_attention_implementation 'torch' or 'eager'"
        )
    keys, values = past_key_values.update(*module.expand_kv(k_pass, k_rot), module.layer_idx)
    T = keys.shape[2]
    indices, safe = _glm_indices(topk_indices, attention_mask, S, T)  # [B, S, K], -1 where not seen
    K = indices.shape[-1]
    keys = keys.to(values.dtype)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q_pass, q_rot, keys, values))
    if not grad:  # generation: no gather, no copy of the cache
        q = torch.cat([q_pass.to(values.dtype), q_rot.to(values.dtype)], dim=-1).transpose(1, 2)
        return _MHA(q, keys, values, indices, float(module.scaling))[0]
    if S * K < T:  # gather the selected rows; query s then attends to rows s * K ... s * K + K - 1
        pairs = torch.arange(0, B * H * T, T, device=indices.device).view(B, H, 1)  # (batch, head)'s first row
        rows = (pairs + safe.view(B, 1, S * K)).view(-1)  # a slot not seen reads a row the kernel skips
        values, keys = values.reshape(B * H * T, dv), keys.reshape(B * H * T, dk)
        kv = torch.cat([values.index_select(0, rows), keys.index_select(0, rows)], dim=-1)
        kv = kv.view(B * H, S * K, dv + dk)
        slots = torch.arange(S * K, device=indices.device, dtype=torch.int32).view(1, S, K)
        indices = torch.where(indices >= 0, slots, -1)
    else:
        kv = torch.cat([values, keys], dim=-1).reshape(B * H, T, dv + dk)
    q = torch.cat([kv.new_zeros(B, H, S, dv), q_pass.to(kv.dtype), q_rot.to(kv.dtype)], dim=-1)
    q = q.reshape(B * H, S, 1, dv + dk)
    out, _ = _FWD(q, kv, indices.repeat_interleave(H, dim=0), None, float(module.scaling), int(dv))
    return out.view(B, H, S, dv).transpose(1, 2)


def dsa_attention_glm(self, q_pass, q_rot, k_pass, k_rot, topk_indices, attention_mask, past_key_values=None, **kwargs):
    """`dsa_attention/glm` (GlmMoeDsaAttention's core from the latents on) in the absorbed form: returns
    (attn_output [B, S, H, v_head_dim], None)."""
    _refuse_unservable(self, "dsa_attention/glm", self.attention_dropout if self.training else 0.0, kwargs)
    if past_key_values is not None:
        if past_key_values.get_seq_length(self.layer_idx) > 0:
            return _glm_from_cache(
                self, q_pass, q_rot, k_pass, k_rot, topk_indices, attention_mask, past_key_values
            ), None
        with torch.no_grad():
            past_key_values.update(*self.expand_kv(k_pass, k_rot), self.layer_idx)
    B, H, S, nope = q_pass.shape
    T = k_pass.shape[2]
    lora, vdim = k_pass.shape[-1], self.v_head_dim
    w = self.kv_b_proj.weight.view(H, nope + vdim, lora)  # expand_kv's per-head split of its output
    w_uk, w_uv = w[:, :nope], w[:, nope:]
    q_lat = torch.einsum("bhsn,hnl->bshl", q_pass, w_uk)
    q = torch.cat([q_lat, q_rot.transpose(1, 2).to(q_lat.dtype)], dim=-1)
    kv = torch.cat([k_pass[:, 0], k_rot[:, 0].to(k_pass.dtype)], dim=-1)
    indices, _ = _glm_indices(topk_indices, attention_mask, S, T)
    o_lat, _ = _FWD(q, kv, indices, None, float(self.scaling), int(lora))
    return torch.einsum("bshl,hvl->bshv", o_lat, w_uv), None


def _v4_max_keys(module, S: int, T: int, sliding_window) -> int:
    """An upper bound of the valid keys per query in upstream's mask: the window plus the compressed entries
    (CSA: at most the indexer's top-k)."""
    compressed = max(T - S, 0)  # the sliding part holds at least the S new tokens
    compressor = getattr(module, "compressor", None)
    if compressor is None:
        compressed = 0
    elif getattr(compressor, "indexer", None) is not None:
        compressed = min(compressed, int(compressor.indexer.index_topk))
    window = T if sliding_window is None else int(sliding_window)
    return min(T, window + compressed)


def _v4_causal_indices(B: int, S: int, window, device) -> torch.Tensor:
    K = S if window is None else min(int(window), S)
    s = torch.arange(S, device=device).view(S, 1)
    j = s - (K - 1) + torch.arange(K, device=device).view(1, K)
    return torch.where(j >= 0, j, torch.full_like(j, -1)).to(torch.int32).expand(B, S, K)


def dsa_attention_deepseek_v4(
    self, q, kv, attention_mask, dropout=0.0, scaling=None, sliding_window=None, s_aux=None, **kwargs
):
    """`dsa_attention/deepseek_v4` (the attention_interface call of DeepseekV4Attention): returns
    (attn_output [B, S, H, D], None)."""
    slot = "dsa_attention/deepseek_v4"
    _refuse_unservable(self, slot, dropout, kwargs)
    B, H, S, D = q.shape
    T = kv.shape[2]
    if kv.dim() != 4 or kv.shape[1] != 1:
        raise ValueError(f"{slot}: kv must be [batch, 1, kv_len, head_dim] (one shared head), got {tuple(kv.shape)}")
    if attention_mask is None:
        if T != S:
            raise ValueError(
                f"{slot}: without an attention mask the keys each query sees are not known ({T} keys for {S} "
                "queries: a cache or compressed entries); use attn_implementation 'eager' (which always builds "
                "the mask) or dsa_attention_implementation 'torch'"
            )
        indices = _v4_causal_indices(B, S, sliding_window, q.device)
    else:
        m = _mask_rows(attention_mask, B, S, T, slot)
        indices, status = _MASK(m, _v4_max_keys(self, S, T, sliding_window))
        torch._assert_async(  # one check of both status bits (a decoding step pays it in every layer)
            status == 0,
            f"{slot}: the mask is not DeepseekV4Attention's: a query with more valid keys than the window plus the "
            "compressor's entries, or values other than 0 and the dtype's minimum (a bias); use "
            "dsa_attention_implementation 'torch'",  # under 255 characters: torch._assert_async's limit on CUDA
        )
    sinks = None if s_aux is None else s_aux.float()
    scale = float(D**-0.5 if scaling is None else scaling)
    out, _ = _FWD(q.transpose(1, 2), kv[:, 0], indices, sinks, scale, int(D))
    return out, None
