"""`OpsImplementationConfig`: which implementation each op uses, as written in a training config.

YAML form (the `model.ops_implementation` section of a training config, or a bare mapping):

    model:
      ops_implementation:
        rms_norm_implementation: torch
        moe_implementation: fused_torch
        cross_entropy_loss_implementation: torch_chunked

Field names are `<op>_implementation` (the canonical spelling; the bare op name is rejected with a
pointer to it). Values are plain strings so plug-ins can add backends. A field left unset takes the
default of the machine's device: on CPU every default is "eager"; on a CUDA machine where opslot's
CUDA kernel library (libopslot_kernels.so, docs/kernels.md) loads and runs on the current device,
unset fields take the `cuda` kernels listed in `CUDA_DEFAULTS` (else "eager"; the library check is
lazy, done once, and only on CUDA machines); on NPU, unset fields take NPU kernels where
`NPU_DEFAULTS` has one. A default that has no kernel for a slot's variant falls back to eager; an
explicitly written value that cannot be honoured is an error (never a silent fallback).

Which kernel each slot runs: `opslot.bind_ops(module, ops)` returns {slot name: impl}, and every
bound slot reports it as `slot.impl`; `config.effective_impl(op, variant)` answers without binding.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from .hardware import DeviceInfo, current_device
from .ops import EAGER
from .registry import KERNEL_REGISTRY, KernelRegistry

#: op name -> config field. `attn` has no slot: its value goes to Transformers' attention dispatch.
FIELD_FOR_OP: Dict[str, str] = {
    op: f"{op}_implementation"
    for op in (
        "rms_norm",
        "rms_norm_gated",
        "rotary_pos_emb",
        "swiglu_mlp",
        "cross_entropy_loss",
        "load_balancing_loss",
        "moe",
        "causal_conv1d",
        "chunk_gated_delta_rule",
        "attn",
    )
}

#: Defaults on CPU machines: the upstream code. attn None keeps the model config's choice.
CPU_DEFAULTS: Dict[str, Optional[str]] = {f: EAGER for f in FIELD_FOR_OP.values()}
CPU_DEFAULTS["attn_implementation"] = None

#: Defaults on CUDA machines whose kernel library loads (`cuda_kernels_unavailable_reason()` is
#: None): opslot's CUDA kernels; where the library is unavailable, the CPU defaults (eager).
CUDA_DEFAULTS: Dict[str, Optional[str]] = dict(
    CPU_DEFAULTS,
    rms_norm_implementation="cuda",
    rms_norm_gated_implementation="cuda",
    rotary_pos_emb_implementation="cuda",
    swiglu_mlp_implementation="cuda",
    load_balancing_loss_implementation="cuda",
    cross_entropy_loss_implementation="cuda",
    moe_implementation="fused_cuda",
    causal_conv1d_implementation="cuda",
    chunk_gated_delta_rule_implementation="cuda",
)

_cuda_kernels_reason: Optional[Tuple[Optional[str]]] = None


def cuda_kernels_unavailable_reason() -> Optional[str]:
    """None when libopslot_kernels loads and runs on the current CUDA device, else why not.
    Checked once (lazily: nothing is loaded until a CUDA default is asked for), then cached."""
    global _cuda_kernels_reason
    if _cuda_kernels_reason is None:
        try:
            from .kernels.cuda._lib import unavailable_reason

            reason = unavailable_reason()
        except Exception as exc:  # a broken install is "unavailable", with its reason
            reason = f"{type(exc).__name__}: {exc}"
        _cuda_kernels_reason = (reason,)
    return _cuda_kernels_reason[0]


def set_cuda_kernels_check(check: Optional[Any]) -> None:
    """Replace the library check (a callable returning None or a reason; None restores the real
    one and clears its cache). For tests."""
    global _cuda_kernels_reason, cuda_kernels_unavailable_reason
    _cuda_kernels_reason = None
    if check is None:
        cuda_kernels_unavailable_reason = _real_cuda_check
    else:
        cuda_kernels_unavailable_reason = check


_real_cuda_check = cuda_kernels_unavailable_reason


def device_defaults(device: Optional[DeviceInfo] = None) -> Dict[str, Optional[str]]:
    """The defaults that apply on `device` (default: this machine)."""
    device = device or current_device()
    if device.type == "npu":
        return NPU_DEFAULTS
    if device.type == "cuda" and cuda_kernels_unavailable_reason() is None:
        return CUDA_DEFAULTS
    return CPU_DEFAULTS


#: Defaults on NPU machines, applied to fields the user did not set.
NPU_DEFAULTS: Dict[str, Optional[str]] = dict(
    CPU_DEFAULTS,
    rms_norm_implementation="npu",
    rotary_pos_emb_implementation="npu",
    swiglu_mlp_implementation="npu",
    moe_implementation="fused_npu",
)


def _field_of(op: str) -> str:
    field = FIELD_FOR_OP.get(op)
    if field is None:
        raise KeyError(
            f"slot op {op!r} has no field in OpsImplementationConfig "
            f"(ops with a field: {', '.join(sorted(FIELD_FOR_OP))})"
        )
    return field


@dataclass(frozen=True)
class OpsImplementationConfig:
    """One implementation name per op; None means "not set: use the device default"."""

    rms_norm_implementation: Optional[str] = None
    rms_norm_gated_implementation: Optional[str] = None
    rotary_pos_emb_implementation: Optional[str] = None
    swiglu_mlp_implementation: Optional[str] = None
    cross_entropy_loss_implementation: Optional[str] = None
    load_balancing_loss_implementation: Optional[str] = None
    moe_implementation: Optional[str] = None
    causal_conv1d_implementation: Optional[str] = None
    chunk_gated_delta_rule_implementation: Optional[str] = None
    attn_implementation: Optional[str] = None
    #: Ops whose explicit choice may bind no slot of a model (a model family that keeps the op
    #: upstream on purpose); any other explicit choice that binds nowhere is an error.
    allow_unbound: Tuple[str, ...] = ()
    #: {field: (value as written, opslot's value)}: the reference trainer's names from_dict translated
    #: (opslot.compat, docs/migration.md); empty for a config in opslot's names. Not a field.
    aliases = MappingProxyType({})

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow_unbound", _normalise_allow_unbound(self.allow_unbound))
        for f in dataclasses.fields(self):
            if f.name == "allow_unbound":
                continue
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"ops_implementation.{f.name} must be a non-empty string, got {value!r}")
        moe = self.moe_implementation
        if moe is not None and moe != EAGER and not moe.startswith("fused_"):
            values = moe_config_values()
            hint = _suggest_value(moe, values) or f" (values: {', '.join(values)})"
            raise ValueError(
                f"ops_implementation.moe_implementation must be 'eager' or 'fused_<impl>', got {moe!r}{hint}"
            )
        if self.attn_implementation is not None:
            _check_attn_implementation(self.attn_implementation)

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
        data = _ops_section(data)
        from .compat import translate  # the reference trainer's names and fields (docs/migration.md)

        data, aliases = translate(data)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                note = _config_attribute_note(key)
                hint = f": {note}" if note else _did_you_mean(str(key), [_SECTION] if _is_section_key(key) else names)
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

    # -- values -------------------------------------------------------------------------------
    def value(self, field: str, device: Optional[DeviceInfo] = None) -> Optional[str]:
        """The field's value: explicit, else the default for the device."""
        explicit = getattr(self, field)
        if explicit is not None:
            return explicit
        return device_defaults(device)[field]

    def is_explicit(self, op: str) -> bool:
        return getattr(self, _field_of(op)) is not None

    def impl_for(self, op: str, device: Optional[DeviceInfo] = None) -> str:
        """Kernel name for `op`: the field value, with `moe: fused_<x>` mapped to `<x>`."""
        value = self.value(_field_of(op), device) or EAGER
        if op == "moe" and value.startswith("fused_"):
            return value[len("fused_") :]
        return value

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
        return self.choose(op, variant, registry=registry, device=device)[0]

    def choose(
        self,
        op: str,
        variant: str,
        *,
        registry: Optional[KernelRegistry] = None,
        device: Optional[DeviceInfo] = None,
    ) -> Tuple[str, str]:
        """(implementation, why) for a slot of `op`/`variant`; why is "explicit" (a field set),
        "default" (the device default), "fallback (...)" (a default without a usable kernel for
        this variant: eager) or "forced (OPSLOT_FORCE_IMPL=...)"."""
        forced = forced_impl(op, variant, registry=registry, device=device)
        if forced is not None:
            return forced
        impl = self.impl_for(op, device)
        if self.is_explicit(op):
            return impl, "explicit"
        if impl == EAGER:
            return impl, "default"
        spec = (registry or KERNEL_REGISTRY).get(op, variant, impl)
        if spec is None:
            return EAGER, f"fallback (default {impl!r} has no kernel for {op}/{variant})"
        reason = spec.hardware.unmet_reason(device)
        if reason is not None:
            return EAGER, f"fallback (default {impl!r}: {reason})"
        return impl, "default"

    def unbound_choices(self, ops_with_slots: Iterable[str]) -> List[str]:
        """Fields set explicitly to a kernel (not eager) whose op has no slot among `ops_with_slots`
        and is not in `allow_unbound`: requests that would bind nowhere. `attn` (no slot) is skipped."""
        have = set(ops_with_slots)
        out = []
        for op, field in sorted(FIELD_FOR_OP.items()):
            value = getattr(self, field)
            if op == "attn" or value is None or value == EAGER or op in have or op in self.allow_unbound:
                continue
            out.append(op)
        return out

    def validate(
        self,
        slots: Iterable[Tuple[str, str]],
        *,
        registry: Optional[KernelRegistry] = None,
        device: Optional[DeviceInfo] = None,
    ) -> Dict[Tuple[str, str], str]:
        """Check every (op, variant) a module's slots use; returns {(op, variant): impl}.
        All problems are reported together in one ValueError, $OPSLOT_FORCE_IMPL values that bind
        nothing (`forced_name_problem`) included."""
        registry = registry or KERNEL_REGISTRY
        chosen: Dict[Tuple[str, str], str] = {}
        problem = forced_name_problem(None, registry, device)
        errors = [f"  every slot ({FORCE_ENV}={os.environ.get(FORCE_ENV)!r}): {problem}"] if problem else []
        for op, variant in sorted(set(slots)):
            try:
                problem = forced_name_problem(op, registry, device)
                if problem is not None:
                    raise KeyError(problem)
                impl = self.effective_impl(op, variant, registry=registry, device=device)
                registry.resolve(op, variant, impl, device=device)
            except (KeyError, RuntimeError) as exc:
                errors.append(self._slot_problem(op, variant, exc, registry, device))
                continue
            chosen[(op, variant)] = impl
        if errors:
            raise ValueError("invalid ops_implementation:\n" + "\n".join(errors))
        return chosen

    def _slot_problem(
        self, op: str, variant: str, exc: Exception, registry: KernelRegistry, device: Optional[DeviceInfo]
    ) -> str:
        """validate's line for a slot of `op`/`variant` whose choice failed with `exc`."""
        msg = exc.args[0] if exc.args else str(exc)
        field = FIELD_FOR_OP.get(op)
        where = f"{field}={self.value(field, device)!r}" if field else "no config field"
        if field and forced_impl_spec(op) is not None:
            where = f"{FORCE_ENV}={os.environ.get(FORCE_ENV)!r}"
        elif op == "moe" and isinstance(exc, KeyError) and msg.startswith("no kernel"):
            msg = _moe_missing_message(self.impl_for(op, device), variant, registry, device)
        return f"  {op}/{variant} ({where}): {msg}"


def config_values(
    op: str, variant: str, registry: Optional[KernelRegistry] = None, device: Optional[DeviceInfo] = None
) -> List[str]:
    """The values a config field may take for a slot of `op`/`variant` here (moe: `fused_<impl>`)."""
    impls = (registry or KERNEL_REGISTRY).list_available(op, variant, device=device).get((op, variant), [])
    prefix = "fused_" if op == "moe" else ""
    return [EAGER] + [prefix + name for name in impls]


def _moe_missing_message(impl: str, variant: str, registry: KernelRegistry, device: Optional[DeviceInfo]) -> str:
    """The registry's "no kernel" message in moe_implementation values (`fused_<impl>`)."""
    every = registry.list_available("moe", include_unsupported=True)
    here = every.get(("moe", variant), [])
    listed = []
    for name in here:
        spec = registry.get("moe", variant, name)
        ok = spec is not None and spec.hardware.is_satisfied(device)
        listed.append(f"fused_{name}" if ok else f"fused_{name} [needs {spec.hardware.describe()}]")
    msg = f"no kernel {impl!r} for moe/{variant}; available: {', '.join([EAGER] + listed)}"
    elsewhere = sorted(v for (_, v), names in every.items() if impl in names)
    if elsewhere:
        return msg + f" ('fused_{impl}' implements moe variant(s) {', '.join(elsewhere)} only)"
    return msg + _suggest_value(f"fused_{impl}", [f"fused_{n}" for n in here])  # kernel names compared, not the prefix


# -- $OPSLOT_FORCE_IMPL ------------------------------------------------------------------------
#: Debugging switch: `eager` (every slot runs the upstream code), `<kernel>` (every slot that has
#: that kernel runs it, the others eager) or `op=kernel,op=kernel` (those ops, strictly). A value
#: that binds nothing (a typo, a kernel no op has or none can run here) is an error.
FORCE_ENV = "OPSLOT_FORCE_IMPL"


def _parse_force(text: str) -> Tuple[Optional[str], Dict[str, str]]:
    everything: Optional[str] = None
    per_op: Dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if "=" in item:
            op, _, impl = (x.strip() for x in item.partition("="))
            op = op[: -len("_implementation")] if op.endswith("_implementation") else op
            if op not in FIELD_FOR_OP or op == "attn" or not impl:
                raise ValueError(
                    f"{FORCE_ENV}={text!r}: {item!r} is not op=kernel"
                    f"{_did_you_mean(op + '_implementation', _slot_fields())}"
                )
            per_op[op] = impl[len("fused_") :] if op == "moe" and impl.startswith("fused_") else impl
        else:
            everything = item
    return everything, per_op


def forced_impl_spec(op: str) -> Optional[Tuple[str, bool]]:
    """(kernel, strict) that $OPSLOT_FORCE_IMPL imposes on `op`, or None."""
    text = os.environ.get(FORCE_ENV, "").strip()
    if not text:
        return None
    everything, per_op = _parse_force(text)
    if op in per_op:
        return per_op[op], True
    if everything is not None:
        return everything, False
    return None


def forced_name_problem(
    op: Optional[str], registry: Optional[KernelRegistry] = None, device: Optional[DeviceInfo] = None
) -> Optional[str]:
    """Why the kernel $OPSLOT_FORCE_IMPL names binds nothing, or None: the one check of both forms.
    `op` None checks the bare value (`torch`: it must name a kernel of some op, usable on this
    machine for at least one), an op checks its `op=kernel` value (a kernel of that op; whether it
    fits each variant and the machine, binding then says). `eager` always binds."""
    spec = _forced_value(op)
    if spec is None or spec == EAGER:
        return None
    registry = registry or KERNEL_REGISTRY
    every = registry.list_available(op, include_unsupported=True)
    names = sorted({name for names in every.values() for name in names})
    scope = f"for {op}" if op else "for any op"
    if spec not in names:
        values = [EAGER] + names
        return f"no kernel {spec!r} {scope}{_suggest_value(spec, values)} (values: {', '.join(values)})"
    usable = sorted({n for names in registry.list_available(device=device).values() for n in names})
    if op is None and spec not in usable:
        return (
            f"no kernel {spec!r} can run on this machine, so every slot would run eager (usable here: "
            f"{', '.join([EAGER] + usable)})"
        )
    return None


def _forced_value(op: Optional[str]) -> Optional[str]:
    """The kernel $OPSLOT_FORCE_IMPL names for `op` in its `op=kernel` form (`op` None: its bare
    value), or None."""
    text = os.environ.get(FORCE_ENV, "").strip()
    if not text:
        return None
    everything, per_op = _parse_force(text)
    return everything if op is None else per_op.get(op)


def forced_impl(
    op: str, variant: str, *, registry: Optional[KernelRegistry] = None, device: Optional[DeviceInfo] = None
) -> Optional[Tuple[str, str]]:
    """(impl, why) imposed by $OPSLOT_FORCE_IMPL for a slot of `op`/`variant`, or None."""
    spec = forced_impl_spec(op)
    if spec is None:
        return None
    impl, strict = spec
    why = f"forced ({FORCE_ENV}={os.environ.get(FORCE_ENV)})"
    if impl == EAGER or strict:
        return impl, why
    kernel = (registry or KERNEL_REGISTRY).get(op, variant, impl)
    if kernel is None or not kernel.hardware.is_satisfied(device):
        return EAGER, f"forced ({FORCE_ENV}={os.environ.get(FORCE_ENV)}; no usable {impl!r} for {op}/{variant}: eager)"
    return impl, why


# -- training-config sections --------------------------------------------------------------------
_SECTION = "ops_implementation"


def _slot_fields() -> List[str]:
    """The fields of ops that have slots (every field but attn_implementation)."""
    return [field for op, field in FIELD_FOR_OP.items() if op != "attn"]


def _field_names() -> List[str]:
    return [f.name for f in dataclasses.fields(OpsImplementationConfig)]


def _is_section_key(key: Any) -> bool:
    """`ops_implementation`, or a close misspelling of it (`ops_implmentation`, `Ops_Implementations`;
    not another `*_implementation` key such as `attn_implementation`)."""
    if not isinstance(key, str) or not key.lower().startswith("op"):
        return False
    return bool(difflib.get_close_matches(key.lower(), [_SECTION], n=1, cutoff=0.8))


def _looks_like_ops_key(key: str) -> bool:
    return key in _field_names() or key.endswith("_implementation")


def _misplaced_fields(mapping: Mapping[str, Any], where: str, allowed: Iterable[str]) -> List[str]:
    """Keys of one level of a training config that look like ops fields (outside the ops section)."""
    allowed = set(allowed)
    problems = []
    for key in mapping:
        if not isinstance(key, str) or key in allowed or _is_section_key(key) or not _looks_like_ops_key(key):
            continue
        path = f"{where}.{key}" if where else key
        note = _config_attribute_note(key)
        if key in _field_names():
            problems.append(f"{path!r}: ops fields go under 'model.{_SECTION}' (model.{_SECTION}.{key})")
        elif note:
            problems.append(f"{path!r}: {note}")
        else:
            problems.append(
                f"{path!r}: not an ops field{_did_you_mean(key, _field_names())}; ops fields go "
                f"under 'model.{_SECTION}'"
            )
    return problems


def _misplaced_sections(value: Any, path: str, allowed: str, seen: Set[int]) -> List[str]:
    """Paths in `value` (mappings and lists, walked whole) of every ops section (the key
    `ops_implementation` or a close misspelling) other than the one at `allowed`."""
    if isinstance(value, Mapping):
        items = [(f"{path}.{k}" if path else str(k), k, v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}[{i}]", None, v) for i, v in enumerate(value)]
    else:
        return []
    if id(value) in seen:  # YAML aliases may share (or nest) a node
        return []
    seen.add(id(value))
    found = []
    for sub, key, child in items:
        if sub == allowed:
            continue
        if _is_section_key(key):
            found.append(sub)
        found += _misplaced_sections(child, sub, allowed, seen)
    return found


def _check_placement(data: Mapping[str, Any], model: Optional[Mapping[str, Any]], allowed: str) -> None:
    """Refuse ops settings anywhere in a training config but its section at `allowed`: an ops
    section at any depth (`train.ops_implementation`, `model.model.ops_implementation`, ...), ops
    fields directly at the top or under `model:`. One ValueError lists every place found."""
    problems = [
        f"{path!r}: the ops section is 'model.{_SECTION}'" for path in _misplaced_sections(data, "", allowed, set())
    ]
    problems += _misplaced_fields(data, "", allowed={"model", _SECTION})
    if model is not None:
        problems += _misplaced_fields(model, "model", allowed={_SECTION})
    if problems:
        raise ValueError("misplaced ops settings in the training config: " + "; ".join(problems))


def _section(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{path} must be a mapping of <op>_implementation fields, got {type(value).__name__}")
    return value


def _ops_section(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ops mapping inside `data`: a training config (`model:` present; its section is
    `model.ops_implementation`), an `ops_implementation:` section, or `data` itself (a bare mapping
    of fields). An ops section anywhere else in `data`, at any depth, is an error (`_check_placement`)."""
    if "model" in data:
        model = data["model"]
        if model is None:
            model = {}
        if not isinstance(model, Mapping):
            raise TypeError(
                f"'model' (the model section of a training config) must be a mapping, got {type(model).__name__}"
            )
        _check_placement(data, model, allowed=f"model.{_SECTION}")
        return _section(model.get(_SECTION), f"model.{_SECTION}")
    if _SECTION in data:
        _check_placement(data, None, allowed=_SECTION)
        return _section(data[_SECTION], _SECTION)
    nested = [path for path in _misplaced_sections(data, "", "", set()) if path not in data]
    if nested:  # e.g. a training config without `model:` whose section sits under `train:`
        raise ValueError(
            "misplaced ops settings in the training config: "
            + "; ".join(f"{path!r}: the ops section is 'model.{_SECTION}'" for path in nested)
        )
    return data  # its own keys are checked as fields (unknown ones: did-you-mean)


def _normalise_allow_unbound(value: Any) -> Tuple[str, ...]:
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
                f"{_did_you_mean(str(item) + '_implementation', _slot_fields())}"
            )
        out.append(op)
    return tuple(sorted(set(out)))


# -- attention implementations -------------------------------------------------------------------
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


def _registered_attn_implementations() -> List[str]:
    """Keys of Transformers' AttentionInterface when Transformers is already imported."""
    if "transformers" not in sys.modules:
        return []
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return list(ALL_ATTENTION_FUNCTIONS.valid_keys())
    except Exception:
        return []


def _check_attn_implementation(value: str) -> None:
    if value == VARLEN_ATTN_IMPLEMENTATION:
        from .packing import register_attention

        register_attention()  # Transformers checks the name when a model is built
        return
    if "/" in value or value in KNOWN_ATTN_IMPLEMENTATIONS:  # a Hub kernel repository: Transformers resolves it
        return
    known = list(KNOWN_ATTN_IMPLEMENTATIONS) + [VARLEN_ATTN_IMPLEMENTATION] + _registered_attn_implementations()
    if value in known:
        return
    close = difflib.get_close_matches(value, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"ops_implementation.attn_implementation={value!r} is not an attention implementation{hint} "
        f"(known: {', '.join(dict.fromkeys(known))}; a Hub kernel is written 'org/repo')"
    )


#: Common other names of ops, for suggestions.
_OP_ALIASES = {
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


def _did_you_mean(word: str, names: Iterable[str]) -> str:
    """ "; did you mean 'X'?" for the name of `names` that `word` most likely meant (an op alias or a
    close spelling), or "" when none is close. Only ever suggests a member of `names`."""
    names = list(names)
    base = word[: -len("_implementation")] if word.endswith("_implementation") else word
    base = _OP_ALIASES.get(base, base)
    if f"{base}_implementation" in names:
        return f"; did you mean '{base}_implementation'?"
    if base in FIELD_FOR_OP:  # a known op (e.g. attn) that `names` leaves out: nothing to suggest
        return ""
    close = difflib.get_close_matches(word, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _suggest_value(word: str, values: Iterable[str]) -> str:
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


def _config_attribute_note(key: Any) -> Optional[str]:
    """What to say of `key` when it is a model-config attribute that a config slot reads (e.g. the
    MoE specs' `router_implementation`): where it goes instead of the ops section. None otherwise."""
    from .config_slot import CONFIG_ATTRIBUTES

    if key not in CONFIG_ATTRIBUTES:
        return None
    return (
        f"{key} is a model-config attribute, not an ops field (a config slot of the generated model reads "
        f"config.{key}); set it on the model config (config.{key} = ..., or in its config.json)"
    )


def moe_config_values(registry: Optional[KernelRegistry] = None) -> List[str]:
    """Every value `moe_implementation` may take: eager and `fused_<kernel>` for each moe kernel
    registered (any variant, any hardware)."""
    every = (registry or KERNEL_REGISTRY).list_available("moe", include_unsupported=True)
    return [EAGER] + sorted({f"fused_{name}" for names in every.values() for name in names})
