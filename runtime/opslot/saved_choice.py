"""The ops choice a model config carries, and the module-level slots that must follow it.

`build_model` writes its ops choice into the config it constructs the model with
(`config.ops_implementation`), and `save_pretrained` saves it. Instance-scoped slots bind from it
(`OpSlot.bind_from`); module-level slots are bound by `build_model` / `opslot.hf.from_pretrained`.
A model built directly from such a config (`Class(config)`, `Class.from_pretrained(dir)`) whose
module-level slots run something else than the config chooses would silently run other kernels
than it was saved with: `check_slots_follow` refuses it, naming the slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Optional

from .ops import FIELD_FOR_OP
from .ops_config import OpsImplementationConfig
from .registry import KernelRegistry

if TYPE_CHECKING:  # annotations only: slot.py imports this module
    from .slot import OpSlot


def saved_ops(config: Any) -> Optional[OpsImplementationConfig]:
    """`config.ops_implementation` as an OpsImplementationConfig (None when absent)."""
    ops = getattr(config, "ops_implementation", None)
    if ops is None or isinstance(ops, OpsImplementationConfig):
        return ops
    return OpsImplementationConfig.coerce(ops)


def mismatched_slots(
    ops: OpsImplementationConfig, slots: Mapping[str, OpSlot], registry: Optional[KernelRegistry] = None
) -> List[str]:
    """One line per slot of `slots` ({name: module-level slot}) that runs something else than `ops`
    chooses for it; slots bound by hand (why "direct") and slots of ops without a field are left out."""
    mismatched = []
    for name, value in sorted(slots.items()):
        if value.why == "direct" or value.op not in FIELD_FOR_OP:
            continue
        impl, _ = ops.choose(value.op, value.variant, registry=registry)
        if impl != value.impl:
            mismatched.append(f"{name} ({value.op}/{value.variant}) runs {value.impl!r}, the config chooses {impl!r}")
    return mismatched


def check_slots_follow(
    ops: OpsImplementationConfig,
    slots: Mapping[str, OpSlot],
    module_name: str,
    registry: Optional[KernelRegistry] = None,
) -> None:
    """Refuse (ValueError) a model of module `module_name` built from a config whose `ops` its
    module-level `slots` do not follow."""
    mismatched = mismatched_slots(ops, slots, registry)
    if mismatched:
        raise ValueError(
            f"a model of {module_name} is being built from a config whose ops_implementation its module-level slots "
            f"do not follow: {'; '.join(mismatched)}. Build it with opslot.build_model(config, module=..., "
            f"model_class=...) or opslot.hf.from_pretrained(path, module), which bind every slot"
        )
