"""`OpsImplementationConfig`: which implementation each op uses, as written in a training config, and
its parsing.

YAML form (the `model.ops_implementation` section of a training config, or a bare mapping):

    model:
      ops_implementation:
        rms_norm_implementation: torch
        moe_implementation: fused_torch
        cross_entropy_loss_implementation: torch_chunked

Field names are `<op>_implementation` (the canonical spelling; the bare op name is rejected with a
pointer to it). Values are plain strings so plug-ins can add backends. A field left unset takes the
default of the machine's device (opslot.device_defaults); an explicitly written value that cannot be
honoured is an error (never a silent fallback). Where the section sits in a training config is
opslot.ops_section's; the reference trainer's names are translated by opslot.compat.

Which kernel each slot runs: `config.choose(op, variant)` / `config.effective_impl(op, variant)`
answer without binding (opslot.choice), `opslot.bind_ops(module, ops)` binds and returns
{slot name: impl}, and every bound slot reports it as `slot.impl`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from . import choice
from .attention_names import check_attn_implementation
from .compat import translate
from .config_attributes import config_attribute_note
from .hardware import DeviceInfo
from .ops import EAGER, FIELD_FOR_OP, slot_fields
from .ops_section import SECTION, is_section_key, ops_section
from .registry import KernelRegistry
from .suggestions import did_you_mean, suggest_value


@dataclass(frozen=True)
class OpsImplementationConfig:
    """One implementation name per op; None means "not set: use the device default"."""

    rms_norm_implementation: Optional[str] = None
    rms_norm_gated_implementation: Optional[str] = None
    rotary_pos_emb_implementation: Optional[str] = None
    rotary_pos_emb_vision_implementation: Optional[str] = None
    swiglu_mlp_implementation: Optional[str] = None
    cross_entropy_loss_implementation: Optional[str] = None
    load_balancing_loss_implementation: Optional[str] = None
    moe_implementation: Optional[str] = None
    causal_conv1d_implementation: Optional[str] = None
    chunk_gated_delta_rule_implementation: Optional[str] = None
    dsa_indexer_implementation: Optional[str] = None
    dsa_attention_implementation: Optional[str] = None
    mhc_implementation: Optional[str] = None
    attn_implementation: Optional[str] = None
    #: Ops whose explicit choice may bind no slot of a model (a model family that keeps the op
    #: upstream on purpose); any other explicit choice that binds nowhere is an error.
    allow_unbound: Tuple[str, ...] = ()
    #: {field: (value as written, opslot's value)}: the reference trainer's names from_dict translated
    #: (opslot.compat, docs/migration.md); empty for a config in opslot's names. Not a field.
    aliases = MappingProxyType({})

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow_unbound", normalise_allow_unbound(self.allow_unbound))
        for f in dataclasses.fields(self):
            if f.name == "allow_unbound":
                continue
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"ops_implementation.{f.name} must be a non-empty string, got {value!r}")
        moe = self.moe_implementation
        if moe is not None and moe != EAGER and not moe.startswith("fused_"):
            values = choice.moe_config_values()
            hint = suggest_value(moe, values) or f" (values: {', '.join(values)})"
            raise ValueError(
                f"ops_implementation.moe_implementation must be 'eager' or 'fused_<impl>', got {moe!r}{hint}"
            )
        if self.attn_implementation is not None:
            check_attn_implementation(self.attn_implementation)

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> "OpsImplementationConfig":
        """From `{field: value}`, `{"ops_implementation": {...}}` or a whole training config
        `{"model": {"ops_implementation": {...}, ...}, "train": {...}, ...}` (other sections and other
        `model:` keys are ignored). Unknown fields are errors with a did-you-mean; so is an ops field
        or a misspelt `ops_implementation` section anywhere else in a training config."""
        if data is None:
            return cls()
        if isinstance(data, OpsImplementationConfig):
            return data
        if not isinstance(data, Mapping):
            raise TypeError(f"ops_implementation must be a mapping, got {type(data).__name__}")
        data = ops_section(data)
        data, aliases = translate(data)  # the reference trainer's names and fields (docs/migration.md)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                note = config_attribute_note(key)
                hint = f": {note}" if note else did_you_mean(str(key), [SECTION] if is_section_key(key) else names)
                raise ValueError(f"unknown ops_implementation field {key!r}{hint}")
        config = cls(**dict(data))
        if aliases:
            object.__setattr__(config, "aliases", aliases)
        return config

    @classmethod
    def from_yaml(cls, path: Any) -> "OpsImplementationConfig":
        """Load a YAML or JSON file (a training config with `model.ops_implementation`, an
        `ops_implementation:` section, or a bare mapping)."""
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
        try:
            return cls.from_dict(data or {})
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{path}: {exc}") from None

    @classmethod
    def coerce(cls, ops: Any) -> "OpsImplementationConfig":
        """Accept None, a config, a mapping, a path to a YAML/JSON file, or JSON/YAML text of a mapping."""
        if isinstance(ops, os.PathLike):
            return cls.from_yaml(ops)
        if isinstance(ops, str):
            text = ops.strip()
            if os.path.isfile(ops) or (text.endswith((".yaml", ".yml", ".json")) and "\n" not in text):
                return cls.from_yaml(ops)
            if text.startswith("{"):
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"ops is not valid JSON: {exc}") from None
                return cls.from_dict(data)
            if ":" in text:
                import yaml

                data = yaml.safe_load(text)
                if isinstance(data, Mapping):
                    return cls.from_dict(data)
            raise ValueError(
                f"ops={ops!r} is neither a YAML/JSON file nor a mapping; give a mapping such as "
                f"{{'rms_norm_implementation': {text!r}}}, its JSON text, or the path of a (training) YAML file"
            )
        return cls.from_dict(ops)

    def to_dict(self) -> Dict[str, Any]:
        """The fields that were set explicitly (JSON-serialisable)."""
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "allow_unbound":
                if value:
                    out[f.name] = list(value)
            elif value is not None:
                out[f.name] = value
        return out

    # -- what it chooses (opslot.choice) ------------------------------------------------------
    def value(self, field: str, device: Optional[DeviceInfo] = None) -> Optional[str]:
        """The field's value: explicit, else the field's default for the device (a variant's own
        default, `CUDA_VARIANT_DEFAULTS`, applies in `choose` / `effective_impl`)."""
        return choice.field_value(self, field, device)

    def is_explicit(self, op: str) -> bool:
        """Whether the field of `op` is set (not left to the device default)."""
        return choice.is_explicit(self, op)

    def impl_for(self, op: str, device: Optional[DeviceInfo] = None) -> str:
        """Kernel name for `op`: the field value, with `moe: fused_<x>` mapped to `<x>`."""
        return choice.impl_for(self, op, device)

    def effective_impl(
        self,
        op: str,
        variant: str,
        *,
        registry: Optional[KernelRegistry] = None,
        device: Optional[DeviceInfo] = None,
    ) -> str:
        """The implementation to bind for a slot of `op`/`variant`. A device default without a
        usable kernel for that variant falls back to eager; explicit values are returned as written
        (binding then raises if they cannot be honoured). `$OPSLOT_FORCE_IMPL` overrides both."""
        return choice.choose(self, op, variant, registry=registry, device=device)[0]

    def choose(
        self,
        op: str,
        variant: str,
        *,
        registry: Optional[KernelRegistry] = None,
        device: Optional[DeviceInfo] = None,
    ) -> Tuple[str, str]:
        """(implementation, why) for a slot of `op`/`variant` (see opslot.choice.choose)."""
        return choice.choose(self, op, variant, registry=registry, device=device)

    def unbound_choices(self, ops_with_slots: Iterable[str]) -> List[str]:
        """Fields set explicitly to a kernel (not eager) whose op has no slot among `ops_with_slots`
        and is not in `allow_unbound`: requests that would bind nowhere. `attn` (no slot) is skipped."""
        return choice.unbound_choices(self, ops_with_slots)

    def validate(
        self,
        slots: Iterable[Tuple[str, str]],
        *,
        registry: Optional[KernelRegistry] = None,
        device: Optional[DeviceInfo] = None,
    ) -> Dict[Tuple[str, str], str]:
        """Check every (op, variant) a module's slots use; returns {(op, variant): impl}.
        All problems are reported together in one ValueError (see opslot.choice.validate)."""
        return choice.validate(self, slots, registry=registry, device=device)


def normalise_allow_unbound(value: Any) -> Tuple[str, ...]:
    """`allow_unbound` as a sorted tuple of op names (`rms_norm` or `rms_norm_implementation` each)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    out = []
    for item in value:
        op = item[: -len("_implementation")] if isinstance(item, str) and item.endswith("_implementation") else item
        if op not in FIELD_FOR_OP or op == "attn":
            raise ValueError(
                f"ops_implementation.allow_unbound: {item!r} is not an op with slots"
                f"{did_you_mean(str(item) + '_implementation', slot_fields())}"
            )
        out.append(op)
    return tuple(sorted(set(out)))
