"""Choosing an implementation: what an ops config makes a slot of `op`/`variant` run on this
machine, and why.

`choose(config, op, variant)` is `(impl, why)`: `$OPSLOT_FORCE_IMPL` first (opslot.force_override),
then an explicit field ("explicit"), else the device default (opslot.device_defaults: the variant's own
where it has one, else the field's): "default", or "fallback (...)" to eager when the default has no
usable kernel for the variant here. `validate`
checks every (op, variant) of a module against the kernel registry and the machine and reports
every problem in one ValueError. `OpsImplementationConfig`'s methods of the same names call these.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple

from .device_defaults import device_defaults, variant_default
from .force_override import FORCE_ENV, forced_impl, forced_impl_spec, forced_name_problem
from .hardware import DeviceInfo
from .ops import EAGER, FIELD_FOR_OP, field_of
from .registry import KERNEL_REGISTRY, KernelRegistry
from .suggestions import suggest_value

if TYPE_CHECKING:  # annotations only: ops_config imports this module
    from .ops_config import OpsImplementationConfig


def field_value(config: OpsImplementationConfig, field: str, device: Optional[DeviceInfo] = None) -> Optional[str]:
    """The field's value: explicit, else the field's default for the device (a variant with a default
    of its own, `CUDA_VARIANT_DEFAULTS`, gets it from `choose`)."""
    explicit = getattr(config, field)
    if explicit is not None:
        return explicit
    return device_defaults(device)[field]


def is_explicit(config: OpsImplementationConfig, op: str) -> bool:
    """Whether the field of `op` is set (not left to the device default)."""
    return getattr(config, field_of(op)) is not None


def impl_for(config: OpsImplementationConfig, op: str, device: Optional[DeviceInfo] = None) -> str:
    """Kernel name for `op`: the field value, with `moe: fused_<x>` mapped to `<x>`."""
    value = field_value(config, field_of(op), device) or EAGER
    if op == "moe" and value.startswith("fused_"):
        return value[len("fused_") :]
    return value


def choose(
    config: OpsImplementationConfig,
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
    impl = impl_for(config, op, device)
    if is_explicit(config, op):
        return impl, "explicit"
    impl = variant_default(op, variant, device) or impl
    if impl == EAGER:
        return impl, "default"
    spec = (registry or KERNEL_REGISTRY).get(op, variant, impl)
    if spec is None:
        return EAGER, f"fallback (default {impl!r} has no kernel for {op}/{variant})"
    reason = spec.hardware.unmet_reason(device)
    if reason is not None:
        return EAGER, f"fallback (default {impl!r}: {reason})"
    return impl, "default"


def unbound_choices(config: OpsImplementationConfig, ops_with_slots: Iterable[str]) -> List[str]:
    """Fields set explicitly to a kernel (not eager) whose op has no slot among `ops_with_slots`
    and is not in `allow_unbound`: requests that would bind nowhere. `attn` (no slot) is skipped."""
    have = set(ops_with_slots)
    out = []
    for op, field in sorted(FIELD_FOR_OP.items()):
        value = getattr(config, field)
        if op == "attn" or value is None or value == EAGER or op in have or op in config.allow_unbound:
            continue
        out.append(op)
    return out


def validate(
    config: OpsImplementationConfig,
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
            impl = choose(config, op, variant, registry=registry, device=device)[0]
            registry.resolve(op, variant, impl, device=device)
        except (KeyError, RuntimeError) as exc:
            errors.append(_slot_problem(config, op, variant, exc, registry, device))
            continue
        chosen[(op, variant)] = impl
    if errors:
        raise ValueError("invalid ops_implementation:\n" + "\n".join(errors))
    return chosen


def _slot_problem(
    config: OpsImplementationConfig,
    op: str,
    variant: str,
    exc: Exception,
    registry: KernelRegistry,
    device: Optional[DeviceInfo],
) -> str:
    """validate's line for a slot of `op`/`variant` whose choice failed with `exc`."""
    msg = exc.args[0] if exc.args else str(exc)
    field = FIELD_FOR_OP.get(op)
    where = f"{field}={field_value(config, field, device)!r}" if field else "no config field"
    own = None if not field or is_explicit(config, op) else variant_default(op, variant, device)
    if own is not None:
        where = f"{field} unset: {op}/{variant}'s default {own!r}"
    if field and forced_impl_spec(op) is not None:
        where = f"{FORCE_ENV}={os.environ.get(FORCE_ENV)!r}"
    elif op == "moe" and isinstance(exc, KeyError) and msg.startswith("no kernel"):
        msg = _moe_missing_message(impl_for(config, op, device), variant, registry, device)
    return f"  {op}/{variant} ({where}): {msg}"


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
    return msg + suggest_value(f"fused_{impl}", [f"fused_{n}" for n in here])  # kernel names compared, not the prefix


def moe_config_values(registry: Optional[KernelRegistry] = None) -> List[str]:
    """Every value `moe_implementation` may take: eager and `fused_<kernel>` for each moe kernel
    registered (any variant, any hardware)."""
    every = (registry or KERNEL_REGISTRY).list_available("moe", include_unsupported=True)
    return [EAGER] + sorted({f"fused_{name}" for names in every.values() for name in names})
