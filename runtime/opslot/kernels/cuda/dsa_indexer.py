"""DeepSeek sparse attention's lightning indexer (GLM-MoE-DSA, DeepSeek-V4) on libopslot_kernels.

The queries, keys and head weights are computed as upstream computes them (the projections, norms,
RoPE and cache updates of `opslot.reference`'s `glm_indexer_inputs` / `v4_indexer_*`, upstream's
operations in its order); the scores are one kernel, `opslot::dsa_index_scores` (registered from C++,
kernels/torch/dsa_indexer.cc):

    scores[b, s, t] = scale * sum_h w[b, s, h] * relu(q[b, s, h] . k[b, t]),  -inf at t >= limit[b, s]

fp32 `[B, S, T]`, on tensor cores for 16-bit q/k (fp32 accumulation; upstream multiplies the same
values upcast to fp32, so only the order of the fp32 sums differs), skipping the key tiles past every
limit of a block of queries. The top k is a second kernel, `opslot::topk_indices` (kernels/torch/topk.cc):
the columns of the k largest scores of each row in ascending order, the columns past the limit never
read, equal scores taken lowest column first (a radix select; upstream's `torch.topk` leaves the order
of ties unspecified and returns its picks by value; the slots' consumers use the set). Forward only:
upstream runs the indexer under `torch.no_grad()`, and so does this.

- `dsa_indexer/glm`: the limit is the last key the mask `[B, S, T]` shows each query, plus one
  (`opslot::mask_limit`, any mask: causal, padding, or other); the top k applies the mask itself as
  upstream applies it to the scores (bool: hidden -> -inf; float: added, in fp32), so the values it
  ranks are upstream's up to fp32 rounding. A missing mask is refused (upstream cannot run without
  one either).
- `dsa_indexer/deepseek_v4`: the limit is upstream's causal threshold `(position_ids + 1) //
  compress_rate`; picks at or past it are -1, as upstream.

Both support a cache (decode: the keys come from it, as upstream). Near-ties in the scores may pick
other keys than upstream's fp32 matmul does (different summation order).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ... import reference
from . import _ops_common as C

C.require_library_on_cuda_machines()
_SCORES = C.torch_op("dsa_index_scores")
_TOPK = C.torch_op("topk_indices")
_MASK_LIMIT = C.torch_op("mask_limit")


def dsa_index_scores(
    q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, scale: float, limit: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """`opslot::dsa_index_scores`: fp32 `[B, S, T]` from q `[B, S, H, D]`, k `[B, T, D]` (q's dtype),
    fp32 weights `[B, S, H]` and an optional int32 limit `[B, S]`."""
    return _SCORES(q, k, weights, float(scale), limit)


def topk_indices(
    scores: torch.Tensor, k: int, limit: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """`opslot::topk_indices`: int32 `[..., k]`, the columns of the k largest of each row of fp32
    `scores [..., T]` in ascending order; columns at or past the int32 `limit [...]` count as -inf;
    `mask` (broadcast to the scores) hides (bool False) or is added (float) first."""
    return _TOPK(scores, int(k), limit, mask)


def _same_dtype(q: torch.Tensor, k: torch.Tensor):
    """q and k in one dtype (upstream multiplies both upcast to fp32; a mixed pair takes the wider)."""
    if q.dtype == k.dtype:
        return q, k
    dtype = torch.promote_types(q.dtype, k.dtype)
    return q.to(dtype), k.to(dtype)


def visible_limit(mask: torch.Tensor) -> torch.Tensor:
    """int32 `[B, S]`: one past the last key each row of the mask `[B, S, T]` shows (0 for a row that
    shows none), `opslot::mask_limit` (one kernel, no host synchronisation). A bool mask shows True;
    an additive mask hides a key with its dtype's minimum, -inf or NaN (what the model's masks hide
    with) and shows it with any other value (which is then added to the computed score)."""
    return _MASK_LIMIT(mask)


def _glm_mask(attention_mask: Optional[torch.Tensor], batch: int, seq: int, keys: int) -> torch.Tensor:
    if attention_mask is None:
        raise ValueError(
            "dsa_indexer/glm (cuda): attention_mask is None; the indexer needs the [B, S, T] mask the model "
            "builds (upstream's indexer cannot run without one either)"
        )
    try:
        return attention_mask.expand(batch, seq, keys)
    except RuntimeError as exc:
        raise ValueError(
            f"dsa_indexer/glm (cuda): attention_mask of shape {tuple(attention_mask.shape)} does not broadcast "
            f"to the scores [batch, queries, keys] = [{batch}, {seq}, {keys}]"
        ) from exc


def dsa_indexer_glm(
    module: Any, hidden_states, q_resid, position_embeddings, attention_mask, position_ids=None, past_key_values=None
) -> torch.Tensor:
    """`GlmMoeDsaIndexer.forward`: int32 `[B, S, min(index_topk, T)]`, the keys of the largest scores
    after the mask (bool: False -> -inf; float: added, as upstream)."""
    with torch.no_grad():
        q, k, weights = reference.glm_indexer_inputs(
            module, hidden_states, q_resid, position_embeddings, past_key_values
        )
        q, k = _same_dtype(q, k)
        batch, seq, keys = q.shape[0], q.shape[1], k.shape[1]
        mask = _glm_mask(attention_mask, batch, seq, keys)
        limit = visible_limit(mask)
        scores = _SCORES(q, k, weights, float(module.softmax_scale), limit)
        # The mask applied inside the top-k (bool: hidden -> -inf; float: added); past the limit every
        # key is hidden, so neither the scores nor the mask are read there.
        return _TOPK(scores, min(module.index_topk, keys), limit, mask)


def dsa_indexer_deepseek_v4(module: Any, hidden_states, q_residual, position_ids, past_key_values, layer_idx: int):
    """`DeepseekV4Indexer.forward`: int64 `[B, S, min(index_topk, T)]` over the compressed keys, -1 for a
    pick at or past the query's causal threshold `(position + 1) // compress_rate`."""
    with torch.no_grad():
        keys = reference.v4_indexer_keys(module, hidden_states, past_key_values, layer_idx)
        q = reference.v4_indexer_queries(module, hidden_states, q_residual, position_ids)
        weights = reference.v4_index_weights(module, hidden_states)
        q, keys = _same_dtype(q, keys)
        batch, seq, count = q.shape[0], q.shape[1], keys.shape[1]
        top_k = min(module.index_topk, count)
        if count == 0:  # no compressed entry yet: upstream's topk of nothing
            return torch.empty((batch, seq, 0), dtype=torch.int64, device=q.device)
        threshold = ((position_ids + 1) // module.compress_rate).expand(batch, seq)
        limit = threshold.clamp(-1, count).to(torch.int32)
        scores = _SCORES(q, keys, weights, float(module.scorer.softmax_scale), limit)
        picks = _TOPK(scores, top_k, limit).long()
        return torch.where(picks >= threshold.unsqueeze(-1), torch.full_like(picks, -1), picks)
