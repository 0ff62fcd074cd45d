"""Packed (padding-free) batches: document boundaries for every layer, and `opslot_varlen` attention.

A packed row concatenates documents; each restarts its position ids at 0 (what Transformers'
`DataCollatorWithFlattening` produces, with `cu_seq_lens_q/k` and `max_length_q/k` when asked for
`return_flash_attn_kwargs=True`). Three pieces keep the documents apart (docs/packing.md):

- `packed_sequence_kwargs`: called by every generated text model at the start of its forward. It
  finds the documents once per forward (from `cu_seq_lens_q` or the restarting position ids),
  passes their boundaries to every layer as the flash-attention kwargs, refuses inputs where the
  boundaries would be lost (an attention mask with a packed row, token mixers that ignore them) and
  turns the cache off for a packed row (a cache across documents means nothing).
- `packed_labels`: called by every generated causal-LM head. A label at a document's first token is
  what the previous document's last token would be trained to predict; it becomes -100 (the
  collator does the same), so the loss never crosses a boundary whatever the labels.
- `opslot_varlen`: an attention implementation (Transformers' AttentionInterface) that attends
  within documents: PyTorch's variable-length FlashAttention (`torch.nn.attention.varlen`) on CUDA
  in fp16/bf16, an exact per-document `scaled_dot_product_attention` on the CPU. It also serves
  plain and padded batches (rows are documents; padding is dropped, not masked).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .attention_names import VARLEN_ATTN_IMPLEMENTATION as ATTN_IMPLEMENTATION
from .compiled_sdpa import UNPACKED_CAUSAL_ROWS

#: Head dimensions PyTorch's FlashAttention kernels take (a multiple of 8, at most 256).
MAX_FLASH_HEAD_DIM = 256

_log = logging.getLogger("opslot.packing")
_logged_cache_off = False


class PackedSequenceError(ValueError):
    """A packed batch whose document boundaries would be lost or ignored."""


# -- document boundaries --------------------------------------------------------------------------
def text_positions(position_ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The [batch, seq] text position ids of `position_ids` ([seq], [batch, seq], or the
    multimodal [4, batch, seq] of Qwen3.5/VL models, whose first row is the text position). None
    for the bare multimodal-RoPE positions [3, batch, seq] (`get_rope_index`'s): they have no text
    row, and a constant temporal row inside an image is no document boundary, so they name no
    packed documents (as Transformers builds no packed mask from them)."""
    if position_ids is None:
        return None
    if position_ids.ndim == 1:
        return position_ids[None]
    if position_ids.ndim == 3:
        return position_ids[0] if position_ids.shape[0] != 3 else None
    return position_ids


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Bool [batch, seq]: True where a document starts (a row's first token, or a position id that
    does not follow the previous one). Device-side, no host synchronisation."""
    pos = text_positions(position_ids)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    return starts


def boundaries(position_ids: torch.Tensor) -> Tuple[torch.Tensor, int, int]:
    """(cu_seqlens int32 [documents + 1] over the flattened rows, on the ids' device; the longest
    document; the number of documents). One host synchronisation."""
    starts = document_starts(position_ids).flatten().cpu()
    first = starts.nonzero().flatten()
    cu = torch.cat([first, torch.tensor([starts.numel()])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    return cu.to(position_ids.device, non_blocking=True), longest, cu.numel() - 1


def packed_sequence_kwargs(
    position_ids: Optional[torch.Tensor],
    attention_mask: Any,
    past_key_values: Any,
    use_cache: Optional[bool],
    kwargs: Dict[str, Any],
    token_mixers: Sequence[Any] = (),
) -> Tuple[Dict[str, Any], Optional[bool]]:
    """(kwargs, use_cache) for the layers of a generated text model's forward.

    A packed row (position ids restarting inside a row, or `cu_seq_lens_q` given) gets
    `cu_seq_lens_q/k` (int32, over the flattened rows) and `max_length_q/k` in the returned kwargs,
    found once here; `use_cache` becomes False. Raises PackedSequenceError when the boundaries
    would be lost: `cu_seq_lens_q` without position ids or disagreeing with them, a packed row with
    an `attention_mask` or a cache, or a token mixer in `token_mixers` (OpSlots of ops that take
    `cu_seqlens`, e.g. the Gated DeltaNet conv and delta rule) left on upstream's eager code, which
    ignores them. Anything else (no position ids, one document per row, generation with a cache)
    returns `kwargs` and `use_cache` unchanged, except that under torch.compile a call with no position
    ids, cu_seq_lens, attention mask or cache gets `opslot_unpacked_causal_rows=True`: its rows are plain
    causal sequences, which `opslot_sdpa` reads to leave out the mask Transformers builds while tracing
    (opslot.compiled_sdpa)."""
    given = kwargs.get("cu_seq_lens_q")
    described = given is not None or position_ids is not None or attention_mask is not None
    if not described and past_key_values is None and torch.compiler.is_compiling():
        return dict(kwargs, **{UNPACKED_CAUSAL_ROWS: True}), use_cache
    if position_ids is not None and text_positions(position_ids) is None:
        position_ids = None  # multimodal-RoPE positions without a text row: no documents in them
    if given is None and (position_ids is None or past_key_values is not None):
        return kwargs, use_cache
    if given is not None and position_ids is None:
        raise PackedSequenceError(
            "cu_seq_lens_q was given without position_ids: RoPE and the attention mask need the positions "
            "restarting at 0 in each document (DataCollatorWithFlattening(return_position_ids=True) gives both)"
        )
    if given is None and attention_mask is not None:
        _refuse_packed_padding(position_ids, attention_mask)
        return kwargs, use_cache  # a padded batch: Transformers' masks (or opslot_varlen's unpadding) take it
    cu, longest, count = boundaries(position_ids)
    batch = text_positions(position_ids).shape[0]
    if given is not None:
        for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
            other = kwargs.get(name)
            if other is not None and not torch.equal(other.to(cu.device, torch.int32), cu):
                raise PackedSequenceError(
                    f"{name}={other.tolist()} disagrees with the documents of position_ids (restarts give "
                    f"{cu.tolist()}); pass the collator's position_ids and cu_seq_lens together"
                )
    elif count == batch:
        return kwargs, use_cache  # one document per row: nothing is packed
    if attention_mask is not None:
        raise PackedSequenceError(
            "cu_seq_lens_q came with an attention_mask: pass one or the other (a packed row "
            "has no padding; DataCollatorWithFlattening gives no mask)"
        )
    if past_key_values is not None:
        raise PackedSequenceError("a packed row came with past_key_values: a cache cannot hold several documents")
    eager = [slot for slot in token_mixers if not slot.use_non_eager_impl]
    if eager:
        names = ", ".join(f"{slot.op}_implementation" for slot in eager)
        raise PackedSequenceError(
            f"a packed row reaches {names} = eager: upstream's code runs the state across document boundaries; "
            f"choose 'torch' or 'cuda' for it (they take cu_seqlens), or do not pack rows for this model here"
        )
    if use_cache:
        _note_cache_off()
    out = dict(kwargs, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    out.setdefault("max_length_q", longest)
    out.setdefault("max_length_k", longest)
    return out, False


def refuse_packed_rows(
    model: str,
    why: str,
    position_ids: Optional[torch.Tensor],
    attention_mask: Any,
    past_key_values: Any,
    kwargs: Dict[str, Any],
) -> None:
    """For a generated text model whose own code cannot keep the documents of a packed row apart
    (DeepSeek-V4's compressors): raise PackedSequenceError, naming `model` and saying `why`, when the
    batch is packed as `packed_sequence_kwargs` finds it (position ids restarting inside a row, or
    `cu_seq_lens_q` given); its own refusals (boundaries without positions, a packed row with a mask)
    come first. Anything else (padded batches, one document per row, generation with a cache) passes."""
    packed, _ = packed_sequence_kwargs(position_ids, attention_mask, past_key_values, None, kwargs)
    if "cu_seq_lens_q" in packed:
        raise PackedSequenceError(
            f"{model} does not take packed rows (documents restarting their position ids inside a row): {why}"
        )


def _refuse_packed_padding(position_ids: torch.Tensor, attention_mask: Any) -> None:
    """Raise when a row with a 2-D padding mask restarts its positions between two real tokens (a
    packed row with padding: Transformers would ignore the boundaries). Restarts at padding (the
    positions `generate` derives from a left-padded mask) are not packing. One synchronisation."""
    if not torch.is_tensor(attention_mask) or attention_mask.ndim != 2:
        return
    pos = text_positions(position_ids)
    real = attention_mask[:, -pos.shape[1] :].to(device=pos.device, dtype=torch.bool)
    inside = document_starts(pos)[:, 1:] & real[:, 1:] & real[:, :-1]
    if bool(inside.any()):
        raise PackedSequenceError(
            "a packed row (position ids restart inside the row) came with an attention_mask: Transformers "
            "then ignores the document boundaries; pass attention_mask=None for packed rows "
            "(DataCollatorWithFlattening does), or pad instead of packing"
        )


def _note_cache_off() -> None:
    global _logged_cache_off
    if not _logged_cache_off:
        _logged_cache_off = True
        _log.info("packed row: use_cache is off for this forward (a cache cannot hold several documents)")


def packed_labels(
    labels: Optional[torch.Tensor],
    position_ids: Optional[torch.Tensor],
    kwargs: Dict[str, Any],
    ignore_index: int = -100,
) -> Tuple[Optional[torch.Tensor], Dict[str, Any]]:
    """(labels, kwargs) for a generated causal-LM head: the label at each document's first token
    becomes `ignore_index` (it is the target of the previous document's last token; a row's first
    label is never a target, so unpacked rows are unchanged). A given `shift_labels` (already
    shifted) is masked at each document's last token instead. Device-side, no synchronisation."""
    if text_positions(position_ids) is None or (labels is None and kwargs.get("shift_labels") is None):
        return labels, kwargs
    starts = document_starts(position_ids)
    if labels is not None:
        labels = labels.masked_fill(starts.to(labels.device), ignore_index)
    shift = kwargs.get("shift_labels")
    if shift is not None:
        ends = torch.zeros_like(starts)
        ends[:, :-1] = starts[:, 1:]
        kwargs = dict(kwargs, shift_labels=shift.masked_fill(ends.to(shift.device), ignore_index))
    return labels, kwargs


# -- opslot_varlen attention ----------------------------------------------------------------------
def varlen_attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, None]:
    """Transformers' attention-interface signature: query [B, H, Sq, D], key/value [B, Hkv, Sk, D(v)]
    -> ([B, Sq, H, Dv], None). Documents come from `cu_seq_lens_q/k` (set by packed_sequence_kwargs or
    the collator), else from restarting `position_ids`, else each row is one (its padding, given by
    the 2-D `attention_mask`, dropped). Causal per `module.is_causal`, bottom-right aligned when
    queries are the last tokens of the keys (decoding); GQA; a sliding window of `sliding_window`
    tokens (the query's own included, as Transformers' masks count it)."""
    _refuse_unsupported(module, dropout, softcap, kwargs)
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[2]
    q_tok = query.transpose(1, 2).reshape(batch * q_len, heads, query.shape[-1])
    k_tok = key.transpose(1, 2).reshape(batch * k_len, key.shape[1], key.shape[-1])
    v_tok = value.transpose(1, 2).reshape(batch * k_len, value.shape[1], value.shape[-1])
    docs = _documents(query, key, attention_mask, kwargs)
    q_keep, k_keep = docs.q_keep, docs.k_keep
    if q_keep is not None:
        q_tok, k_tok, v_tok = q_tok[q_keep], k_tok[k_keep], v_tok[k_keep]
    causal = getattr(module, "is_causal", True)
    if query.is_cuda:
        out = _flash(q_tok, k_tok, v_tok, docs, scaling, causal, sliding_window)
    else:
        out = _exact(q_tok, k_tok, v_tok, docs, scaling, causal, sliding_window)
    if q_keep is not None:
        full = out.new_zeros(batch * q_len, heads, out.shape[-1])
        full[q_keep] = out
        out = full
    return out.reshape(batch, q_len, heads, out.shape[-1]), None


def _refuse_unsupported(module: Any, dropout: float, softcap: Optional[float], kwargs: Dict[str, Any]) -> None:
    name = type(module).__name__
    if softcap is not None:
        raise NotImplementedError(
            f"{ATTN_IMPLEMENTATION}: {name} caps attention logits (softcap={softcap}); "
            f"FlashAttention in PyTorch has no softcapping: use attn_implementation='eager'"
        )
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        raise NotImplementedError(
            f"{ATTN_IMPLEMENTATION}: {name} has attention sinks (GPT-OSS); PyTorch's "
            f"variable-length attention cannot add them: use attn_implementation='eager' "
            f"(Transformers' block-diagonal mask keeps a packed row exact)"
        )
    if dropout and getattr(module, "training", False):
        raise NotImplementedError(
            f"{ATTN_IMPLEMENTATION}: attention dropout ({dropout}) is not supported; "
            f"set attention_dropout=0 in the model config"
        )


class _Docs:
    """Document boundaries of one attention call: cumulative offsets over the kept query and key
    tokens, the longest document of each, and the flat indices of the kept tokens (None: all)."""

    def __init__(
        self,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: int,
        max_k: int,
        q_keep: Optional[torch.Tensor] = None,
        k_keep: Optional[torch.Tensor] = None,
    ) -> None:
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.q_keep, self.k_keep = q_keep, k_keep


def _documents(
    query: torch.Tensor, key: torch.Tensor, attention_mask: Optional[torch.Tensor], kwargs: Dict[str, Any]
) -> _Docs:
    batch, q_len, k_len, device = query.shape[0], query.shape[2], key.shape[2], query.device
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None:
        if attention_mask is not None:
            raise PackedSequenceError(f"{ATTN_IMPLEMENTATION}: cu_seq_lens_q and a padding mask together")
        cu_k = cu_q if cu_k is None else cu_k
        max_q = kwargs.get("max_length_q")
        max_k = kwargs.get("max_length_k", max_q)
        if max_q is None:
            lengths = (cu_q[1:] - cu_q[:-1]).tolist()
            max_q = max_k = max(lengths, default=0)
        return _Docs(cu_q.to(device, torch.int32), cu_k.to(device, torch.int32), int(max_q), int(max_k))
    position_ids = kwargs.get("position_ids")
    if attention_mask is None and position_ids is not None and q_len == k_len and q_len > 1:
        cu, longest, _ = boundaries(position_ids.expand(batch, -1) if position_ids.ndim == 2 else position_ids)
        return _Docs(cu, cu, longest, longest)
    if attention_mask is None:
        cu_q = torch.arange(batch + 1, device=device, dtype=torch.int32) * q_len
        cu_k = torch.arange(batch + 1, device=device, dtype=torch.int32) * k_len
        return _Docs(cu_q, cu_k, q_len, k_len)
    if attention_mask.ndim != 2:
        raise PackedSequenceError(
            f"{ATTN_IMPLEMENTATION} takes a 2-D padding mask [batch, keys], got shape {tuple(attention_mask.shape)}"
        )
    keep_k = attention_mask[:, -k_len:].to(torch.bool)
    keep_q = keep_k[:, -q_len:]
    counts = torch.stack([keep_q.sum(1), keep_k.sum(1)]).cpu()
    cu_q = F.pad(counts[0].cumsum(0), (1, 0)).to(device, torch.int32)
    cu_k = F.pad(counts[1].cumsum(0), (1, 0)).to(device, torch.int32)
    return _Docs(
        cu_q,
        cu_k,
        int(counts[0].max()),
        int(counts[1].max()),
        keep_q.flatten().nonzero().flatten(),
        keep_k.flatten().nonzero().flatten(),
    )


def _window(causal: bool, sliding_window: Optional[int]) -> Tuple[int, int]:
    """FlashAttention's (left, right) window: Transformers' sliding window W lets a query see
    itself and the W - 1 tokens before it."""
    left = sliding_window - 1 if sliding_window is not None else -1
    return (left, 0) if causal else (left, left)


def _flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    docs: _Docs,
    scaling: Optional[float],
    causal: bool,
    sliding_window: Optional[int],
) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            f"{ATTN_IMPLEMENTATION} on CUDA runs FlashAttention, which takes float16 or bfloat16; "
            f"got query {q.dtype}, key {k.dtype}, value {v.dtype} (run the model in bf16/fp16, or "
            f"use attn_implementation='sdpa' for fp32)"
        )
    dim, dim_v = q.shape[-1], v.shape[-1]
    width = max(dim, dim_v)
    if width > MAX_FLASH_HEAD_DIM or dim != k.shape[-1]:
        raise ValueError(
            f"{ATTN_IMPLEMENTATION}: head dims query {dim}, key {k.shape[-1]}, value {dim_v}; "
            f"FlashAttention needs query and key equal and at most {MAX_FLASH_HEAD_DIM}"
        )
    pad = (-width) % 8
    if dim_v != dim or pad:  # e.g. DeepSeek-V3's MLA: value head 128 under a 192-wide query
        q = F.pad(q, (0, width + pad - dim))
        k = F.pad(k, (0, width + pad - dim))
        v = F.pad(v, (0, width + pad - dim_v))
    if scaling is None:
        scaling = dim**-0.5
    out = varlen_attn(
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        docs.cu_q,
        docs.cu_k,
        docs.max_q,
        docs.max_k,
        scale=scaling,
        window_size=_window(causal, sliding_window),
    )
    return out[..., :dim_v]


def _exact(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    docs: _Docs,
    scaling: Optional[float],
    causal: bool,
    sliding_window: Optional[int],
) -> torch.Tensor:
    """Per-document scaled_dot_product_attention with the mask written out: exact, for the CPU."""
    if scaling is None:
        scaling = q.shape[-1] ** -0.5
    group = q.shape[1] // k.shape[1]
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    cu_q, cu_k = docs.cu_q.tolist(), docs.cu_k.tolist()
    for (q0, q1), (k0, k1) in zip(zip(cu_q, cu_q[1:]), zip(cu_k, cu_k[1:])):
        if q1 == q0:
            continue
        qd = q[q0:q1].transpose(0, 1)
        kd = k[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)
        vd = v[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0)
        mask = _allowed(q1 - q0, k1 - k0, causal, sliding_window, q.device)
        out[q0:q1] = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scaling).transpose(0, 1)
    return out


def _allowed(q_len: int, k_len: int, causal: bool, sliding_window: Optional[int], device: torch.device) -> torch.Tensor:
    """Bool [q_len, k_len]: which keys each query sees (queries aligned to the last keys)."""
    qi = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    kj = torch.arange(k_len, device=device)[None, :]
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        allowed &= kj <= qi
    if sliding_window is not None:
        allowed &= (qi - kj).abs() < sliding_window
    return allowed


def varlen_attention_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> Optional[torch.Tensor]:
    """Transformers' mask-interface signature: no 4-D mask is built; the 2-D padding mask (sliced to
    the keys) passes through when it has padding, else None."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def register_attention() -> None:
    """Register `opslot_varlen` with Transformers' AttentionInterface and AttentionMaskInterface
    (idempotent). Done when this module is imported, which every generated module does."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, varlen_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, varlen_attention_mask)


register_attention()
