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
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

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

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"ops_implementation.{f.name} must be a non-empty string, got {value!r}")
        moe = self.moe_implementation
        if moe is not None and moe != EAGER and not moe.startswith("fused_"):
            raise ValueError(
                f"ops_implementation.moe_implementation must be 'eager' or 'fused_<impl>', "
                f"got {moe!r}; did you mean 'fused_{moe}'?"
            )

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> "OpsImplementationConfig":
        """From `{field: value}`, `{"ops_implementation": {...}}` or `{"model": {"ops_implementation": {...}}}`.
        Unknown fields are errors with a did-you-mean."""
        if data is None:
            return cls()
        if isinstance(data, OpsImplementationConfig):
            return data
        if not isinstance(data, Mapping):
            raise TypeError(f"ops_implementation must be a mapping, got {type(data).__name__}")
        if set(data) == {"model"} and isinstance(data["model"], Mapping):
            data = data["model"].get("ops_implementation") or {}
        elif set(data) == {"ops_implementation"}:
            data = data["ops_implementation"] or {}
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise ValueError(f"unknown ops_implementation field {key!r}{_did_you_mean(str(key), names)}")
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str) -> "OpsImplementationConfig":
        """Load a YAML file (a training config with `model.ops_implementation`, or a bare mapping)."""
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
        try:
            return cls.from_dict(data or {})
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{path}: {exc}") from None

    @classmethod
    def coerce(cls, ops: Any) -> "OpsImplementationConfig":
        """Accept None, a config, a mapping, or a YAML path."""
        if isinstance(ops, str):
            return cls.from_yaml(ops)
        return cls.from_dict(ops)

    def to_dict(self) -> Dict[str, str]:
        """The fields that were set explicitly (JSON-serialisable)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

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
            return value[len("fused_"):]
        return value

    def effective_impl(
        self, op: str, variant: str, *, registry: Optional[KernelRegistry] = None,
        device: Optional[DeviceInfo] = None,
    ) -> str:
        """The implementation to bind for a slot of `op`/`variant`. A device default without a
        usable kernel for that variant falls back to eager; explicit values are returned as written
        (binding then raises if they cannot be honoured)."""
        impl = self.impl_for(op, device)
        if impl == EAGER or self.is_explicit(op):
            return impl
        spec = (registry or KERNEL_REGISTRY).get(op, variant, impl)
        if spec is None or not spec.hardware.is_satisfied(device):
            return EAGER
        return impl

    def validate(
        self, slots: Iterable[Tuple[str, str]], *, registry: Optional[KernelRegistry] = None,
        device: Optional[DeviceInfo] = None,
    ) -> Dict[Tuple[str, str], str]:
        """Check every (op, variant) a module's slots use; returns {(op, variant): impl}.
        All problems are reported together in one ValueError."""
        registry = registry or KERNEL_REGISTRY
        chosen: Dict[Tuple[str, str], str] = {}
        errors = []
        for op, variant in sorted(set(slots)):
            try:
                impl = self.effective_impl(op, variant, registry=registry, device=device)
                registry.resolve(op, variant, impl, device=device)
            except (KeyError, RuntimeError) as exc:
                msg = exc.args[0] if exc.args else str(exc)
                field = FIELD_FOR_OP.get(op)
                where = f"{field}={self.value(field, device)!r}" if field else "no config field"
                errors.append(f"  {op}/{variant} ({where}): {msg}")
                continue
            chosen[(op, variant)] = impl
        if errors:
            raise ValueError("invalid ops_implementation:\n" + "\n".join(errors))
        return chosen


#: Common other names of ops, for suggestions.
_OP_ALIASES = {
    "rope": "rotary_pos_emb", "rotary": "rotary_pos_emb", "swiglu": "swiglu_mlp", "mlp": "swiglu_mlp",
    "cross_entropy": "cross_entropy_loss", "ce": "cross_entropy_loss", "aux_loss": "load_balancing_loss",
    "experts": "moe", "attention": "attn", "conv1d": "causal_conv1d", "gated_delta_rule": "chunk_gated_delta_rule",
}


def _did_you_mean(word: str, names: Iterable[str]) -> str:
    names = list(names)
    base = word[: -len("_implementation")] if word.endswith("_implementation") else word
    base = _OP_ALIASES.get(base, base)
    if f"{base}_implementation" in names:
        return f"; did you mean '{base}_implementation'?"
    close = difflib.get_close_matches(word, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
