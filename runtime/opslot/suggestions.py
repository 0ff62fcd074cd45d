"""Did-you-mean hints for names written in an ops config: fields (an op's aliases included) and
implementation values. They only ever suggest a member of the names given."""

from __future__ import annotations

import difflib
from typing import Dict, Iterable

from .ops import FIELD_FOR_OP

#: Common other names of ops, for suggestions.
OP_ALIASES = {
    "rope": "rotary_pos_emb",
    "rotary": "rotary_pos_emb",
    "swiglu": "swiglu_mlp",
    "mlp": "swiglu_mlp",
    "cross_entropy": "cross_entropy_loss",
    "ce": "cross_entropy_loss",
    "aux_loss": "load_balancing_loss",
    "experts": "moe",
    "attention": "attn",
    "conv1d": "causal_conv1d",
    "gated_delta_rule": "chunk_gated_delta_rule",
}


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """ "; did you mean 'X'?" for the name of `names` that `word` most likely meant (an op alias or a
    close spelling), or "" when none is close. Only ever suggests a member of `names`."""
    names = list(names)
    base = word[: -len("_implementation")] if word.endswith("_implementation") else word
    base = OP_ALIASES.get(base, base)
    if f"{base}_implementation" in names:
        return f"; did you mean '{base}_implementation'?"
    if base in FIELD_FOR_OP:  # a known op (e.g. attn) that `names` leaves out: nothing to suggest
        return ""
    close = difflib.get_close_matches(word, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def suggest_value(word: str, values: Iterable[str]) -> str:
    """ "; did you mean 'X'?" for the implementation value of `values` that `word` most likely meant,
    ignoring case and a `fused_` prefix (the same name first, else the closest spelling); "" when
    none is close. Only ever suggests a member of `values`; nothing for a bare `fused` (no kernel named)."""
    values = list(values)
    keys: Dict[str, str] = {}
    for value in values:
        keys.setdefault(value.lower(), value)
    for value in values:  # fused_torch is also found as torch, and torch as fused_torch
        keys.setdefault(_unfused(value.lower()), value)
    word = word.lower()
    for candidate in (word, _unfused(word)):
        if candidate in keys:
            return f"; did you mean {keys[candidate]!r}?"
    if _unfused(word).strip("_") in ("", "fused"):  # `fused`, `fused_`, `fused_fused`: the prefix names no kernel
        return ""
    close = difflib.get_close_matches(_unfused(word), list(keys), n=1)
    return f"; did you mean {keys[close[0]]!r}?" if close else ""


def _unfused(name: str) -> str:
    return name[len("fused_") :] if name.startswith("fused_") else name
