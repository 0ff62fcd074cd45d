"""The ops a generated file can dispatch, with their variants (the contract is docs/ops.md).

A variant names the mathematics (`rms_norm/offset` is `(1 + w) * x / rms`), so a kernel registered
for one variant can never be bound to a slot that needs another.
"""

from __future__ import annotations

from typing import Dict, Tuple

#: op -> variants that docs/ops.md defines. Plug-ins may register further variants.
KNOWN_OPS: Dict[str, Tuple[str, ...]] = {
    "rms_norm": ("standard", "offset", "unweighted"),
    "rms_norm_gated": ("standard",),
    "rotary_pos_emb": ("full", "partial"),
    "swiglu_mlp": ("standard",),
    "cross_entropy_loss": ("causal", "sequence_classification"),
    "load_balancing_loss": ("standard",),
    "moe": ("standard", "gpt_oss"),
    "causal_conv1d": ("standard",),
    "chunk_gated_delta_rule": ("standard",),
}

#: The implementation name that means "run the upstream code below the guard".
EAGER = "eager"
