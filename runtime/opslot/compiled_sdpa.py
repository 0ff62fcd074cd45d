"""`opslot_sdpa`: Transformers' sdpa attention, with the causal mask left out under torch.compile where
the rows cannot hold padding or packed documents.

Under torch.compile every Transformers release we support builds a full [batch, 1, q, kv] mask for
sdpa: its skip of the causal mask reads tensor values (`_ignore_causal_mask_sdpa` refuses while
tracing, and `find_packed_sequence_indices` cannot rule out packed documents in the position ids it
computed itself). SDPA then runs its masked kernel with K/V repeated per query head: on an H200 the
attention of a Qwen3 step takes about 3x as long as eager's `is_causal` kernel (bench/compile_breaks.py,
docs/results/compile_h200.md).

The facts the mask stands for are known before any value is: `opslot.packing.packed_sequence_kwargs`
(called at the start of every generated text model's forward) sees whether the caller passed position
ids, cu_seq_lens, an attention mask or a cache. When it passed none of them while torch.compile traces,
the rows are plain causal sequences, and it adds `UNPACKED_CAUSAL_ROWS=True` to the layers' kwargs.
The attention function here drops the mask for such a call when the layer's attention is the plain
causal one (no sliding window, `is_causal` not False, as many keys as queries) and hands SDPA
`is_causal=True` (Transformers' sdpa does that for a None mask); every other call, and every call in
eager mode, is Transformers' sdpa unchanged. The unused mask is dead code in the compiled graph.

Chosen with `attn_implementation: opslot_sdpa`; `build_model` registers it (docs/runtime.md).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .attention_names import SDPA_ATTN_IMPLEMENTATION as ATTN_IMPLEMENTATION

#: The layers' keyword argument packed_sequence_kwargs sets (under torch.compile only).
UNPACKED_CAUSAL_ROWS = "opslot_unpacked_causal_rows"


def plain_causal(module: Any, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    """True when this layer's mask, for rows without padding or documents, is SDPA's is_causal."""
    if not kwargs.get(UNPACKED_CAUSAL_ROWS, False):
        return False
    if kwargs.get("sliding_window") is not None or kwargs.get("is_causal") is False:
        return False
    return bool(getattr(module, "is_causal", True)) and query.shape[-2] == key.shape[-2]


def sdpa_attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    **kwargs: Any,
) -> Tuple[torch.Tensor, None]:
    """Transformers' sdpa; the mask left out where `plain_causal` holds."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as transformers_sdpa

    if attention_mask is not None and plain_causal(module, query, key, kwargs):
        attention_mask = None
    kwargs.pop(UNPACKED_CAUSAL_ROWS, None)
    return transformers_sdpa(module, query, key, value, attention_mask, **kwargs)


def register_attention() -> None:
    """Register `opslot_sdpa` with Transformers' AttentionInterface (the function above) and
    AttentionMaskInterface (Transformers' sdpa mask). Idempotent."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
