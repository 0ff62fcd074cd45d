"""`opslot_sdpa`: Transformers' sdpa attention whose causal mask is skipped under torch.compile too.

Transformers 5.17's sdpa mask (`masking_utils.sdpa_mask`) never skips the causal mask while it is
traced, so under `torch.compile` every layer gets a [batch, 1, q, kv] boolean mask and SDPA runs its
masked kernel instead of the causal one (on an H200 the attention of a Qwen3 4-layer step takes 3x as
long: bench/compile_breaks.py). Transformers 5.23 means to skip it unless it exports or traces a
padding mask, but asks `torch.compiler.is_exporting()`, which Dynamo answers True under
torch.compile as well (torch 2.11). `opslot_sdpa` applies the rule on every release: with no padding mask, a causal mask
function, no sliding window reached and `q_length` equal to `kv_length` (or 1), the mask is None and
SDPA takes `is_causal=True`; `torch.export` and everything else get Transformers' own mask. The
attention function is Transformers' sdpa unchanged. Chosen with `attn_implementation: opslot_sdpa`;
`build_model` registers it (docs/runtime.md).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .attention_names import SDPA_ATTN_IMPLEMENTATION as ATTN_IMPLEMENTATION


def _exporting() -> bool:
    """True under torch.export. Not `torch.compiler.is_exporting()`: torch 2.11's Dynamo folds that
    to True while it traces for torch.compile too (which is why Transformers 5.23's skip does not
    reach compiled models either); the flag it reads is set by torch.export only, and Dynamo guards
    on the global it reads here."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if flag is None:  # another torch: never skip while tracing
        return torch.compiler.is_compiling()
    return bool(flag)


def causal_skip(
    q_length: Any,
    kv_length: Any,
    q_offset: Any,
    attention_mask: Optional[torch.Tensor],
    mask_function: Any,
    local_size: Optional[int],
    allow_is_causal_skip: bool,
) -> bool:
    """True when SDPA's `is_causal=True` is exactly the mask Transformers would build."""
    from transformers.masking_utils import causal_mask_function

    if not allow_is_causal_skip or attention_mask is not None or mask_function is not causal_mask_function:
        return False
    if _exporting() or isinstance(q_offset, torch.Tensor):
        return False  # an exported graph would hard-code is_causal; a traced offset is not static
    if local_size is not None and kv_length >= local_size:
        return False
    return q_length == 1 or q_length == kv_length


def sdpa_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Optional[torch.Tensor] = None,
    local_size: Optional[int] = None,
    allow_is_causal_skip: bool = True,
    **kwargs: Any,
) -> Optional[torch.Tensor]:
    """Transformers' sdpa mask, or None where `causal_skip` holds (the arguments are its mask
    interface's)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask as transformers_sdpa_mask

    if mask_function is None:
        mask_function = causal_mask_function
    if causal_skip(q_length, kv_length, q_offset, attention_mask, mask_function, local_size, allow_is_causal_skip):
        return None
    return transformers_sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        local_size=local_size,
        allow_is_causal_skip=allow_is_causal_skip,
        **kwargs,
    )


def register_attention() -> None:
    """Register `opslot_sdpa` with Transformers' AttentionInterface (its sdpa function) and
    AttentionMaskInterface (`sdpa_mask` above). Idempotent."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, ALL_ATTENTION_FUNCTIONS["sdpa"])
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_mask)
