"""`$OPSLOT_FORCE_IMPL`: the debugging switch that overrides every ops config.

`eager` (every slot runs the upstream code), `<kernel>` (every slot that has that kernel runs it,
the others eager) or `op=kernel,op=kernel` (those ops, strictly). A value that binds nothing (a
typo, a kernel no op has or none can run here) is an error (`forced_name_problem`).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

from .hardware import DeviceInfo
from .ops import EAGER, FIELD_FOR_OP, slot_fields
from .registry import KERNEL_REGISTRY, KernelRegistry
from .suggestions import did_you_mean, suggest_value

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
                    f"{did_you_mean(op + '_implementation', slot_fields())}"
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
        return f"no kernel {spec!r} {scope}{suggest_value(spec, values)} (values: {', '.join(values)})"
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
