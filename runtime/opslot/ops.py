"""The ops a generated file can dispatch, their variants (the contract is docs/ops.md), and the field
of the ops config that chooses each op's implementation.

A variant names the mathematics (`rms_norm/offset` is `(1 + w) * x / rms`), so a kernel registered
for one variant can never be bound to a slot that needs another.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

#: op -> variants that docs/ops.md defines. Plug-ins may register further variants.
KNOWN_OPS: Dict[str, Tuple[str, ...]] = {
    "rms_norm": ("standard", "offset", "unweighted", "unweighted_cast"),
    "rms_norm_gated": ("standard",),
    "rotary_pos_emb": ("full", "partial", "interleaved", "deepseek_v4"),
    "rotary_pos_emb_vision": ("standard",),
    "swiglu_mlp": ("standard", "clamped"),
    "cross_entropy_loss": ("causal", "sequence_classification"),
    "load_balancing_loss": ("standard",),
    "moe": ("standard", "gpt_oss", "clamped"),
    "causal_conv1d": ("standard",),
    "chunk_gated_delta_rule": ("standard",),
    "dsa_indexer": ("glm", "deepseek_v4"),
    "dsa_attention": ("glm", "deepseek_v4"),
    "mhc": ("pre", "post", "head"),
}

#: The implementation name that means "run the upstream code below the guard".
EAGER = "eager"

#: op name -> its field in the ops config. `attn` has no slot: its value goes to Transformers'
#: attention dispatch.
FIELD_FOR_OP: Dict[str, str] = {
    op: f"{op}_implementation"
    for op in (
        "rms_norm",
        "rms_norm_gated",
        "rotary_pos_emb",
        "rotary_pos_emb_vision",
        "swiglu_mlp",
        "cross_entropy_loss",
        "load_balancing_loss",
        "moe",
        "causal_conv1d",
        "chunk_gated_delta_rule",
        "dsa_indexer",
        "dsa_attention",
        "mhc",
        "attn",
    )
}

#: Every field of the ops config (`OpsImplementationConfig`), in its order: one per op, then
#: `allow_unbound` (the ops whose explicit choice may bind no slot).
CONFIG_FIELDS: Tuple[str, ...] = tuple(FIELD_FOR_OP.values()) + ("allow_unbound",)


def field_of(op: str) -> str:
    """The config field of `op`; KeyError for an op that has none."""
    field = FIELD_FOR_OP.get(op)
    if field is None:
        raise KeyError(
            f"slot op {op!r} has no field in OpsImplementationConfig "
            f"(ops with a field: {', '.join(sorted(FIELD_FOR_OP))})"
        )
    return field


def slot_fields() -> List[str]:
    """The fields of ops that have slots (every op field but attn_implementation)."""
    return [field for op, field in FIELD_FOR_OP.items() if op != "attn"]
