"""The attention implementations an ops config may name (`attn_implementation`, handed to
Transformers as `config._attn_implementation`): Transformers' own, opslot's `opslot_varlen` and
`opslot_sdpa`, whatever is registered with Transformers' AttentionInterface, and Hub kernels
("org/repo").

Only names are checked here; registering opslot's with Transformers is `opslot.packing`'s and
`opslot.compiled_sdpa`'s (`build_model` does it when the ops config chooses one)."""

from __future__ import annotations

import difflib
import sys
from typing import List

#: Transformers' attention implementations (5.x); values registered with its AttentionInterface at
#: run time and Hub kernels ("org/repo[:fn]") are accepted as well.
KNOWN_ATTN_IMPLEMENTATIONS = (
    "eager",
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
    "flex_attention",
    "paged|eager",
    "paged|sdpa",
    "paged|flash_attention_2",
    "paged|flash_attention_3",
    "paged|flash_attention_4",
)


#: opslot's own: variable-length attention for packed rows (opslot.packing, docs/packing.md).
VARLEN_ATTN_IMPLEMENTATION = "opslot_varlen"
#: opslot's own: Transformers' sdpa whose causal mask torch.compile can skip (opslot.compiled_sdpa).
SDPA_ATTN_IMPLEMENTATION = "opslot_sdpa"
OPSLOT_ATTN_IMPLEMENTATIONS = (VARLEN_ATTN_IMPLEMENTATION, SDPA_ATTN_IMPLEMENTATION)


def registered_attn_implementations() -> List[str]:
    """Keys of Transformers' AttentionInterface when Transformers is already imported."""
    if "transformers" not in sys.modules:
        return []
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return list(ALL_ATTENTION_FUNCTIONS.valid_keys())
    except Exception:
        return []


def check_attn_implementation(value: str) -> None:
    """Refuse (ValueError with a did-you-mean) a value that names no attention implementation."""
    if value in OPSLOT_ATTN_IMPLEMENTATIONS:
        return
    if "/" in value or value in KNOWN_ATTN_IMPLEMENTATIONS:  # a Hub kernel repository: Transformers resolves it
        return
    known = list(KNOWN_ATTN_IMPLEMENTATIONS) + list(OPSLOT_ATTN_IMPLEMENTATIONS) + registered_attn_implementations()
    if value in known:
        return
    close = difflib.get_close_matches(value, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"ops_implementation.attn_implementation={value!r} is not an attention implementation{hint} "
        f"(known: {', '.join(dict.fromkeys(known))}; a Hub kernel is written 'org/repo')"
    )
