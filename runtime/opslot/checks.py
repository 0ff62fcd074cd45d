"""Checks that need the model: refusals that depend on its config (made at bind time, not at the
first forward), and binding an instance-scoped slot from `config.ops_implementation` in config terms.

`MODEL_CHECKS[(op, variant)]` (variant None: every variant) is `fn(hf_config) -> reason or None`;
a reason refuses every kernel (anything but eager) for that slot on that model. Plug-ins may add
entries for their own ops.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .ops import EAGER

_SILU_NAMES = ("silu", "swish")


def _configs(config: Any) -> List[Any]:
    """`config`, then its text config when it has a different one (multimodal models)."""
    out = [config]
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            text = get_text()
        except Exception:
            text = None
        if text is not None and text is not config:
            out.append(text)
    sub = getattr(config, "text_config", None)
    if sub is not None and all(sub is not c for c in out):
        out.append(sub)
    return out


def check_silu(config: Any) -> Optional[str]:
    """swiglu_mlp computes `down(silu(gate(x)) * up(x))`: refuse another activation."""
    for cfg in _configs(config):
        for attr in ("hidden_act", "hidden_activation"):
            act = getattr(cfg, attr, None)
            if isinstance(act, str):
                return None if act in _SILU_NAMES else f"computes SiLU gating but the model's {attr} is {act!r}"
    return None


def check_no_softcapping(config: Any) -> Optional[str]:
    """cross_entropy_loss/causal kernels compute the loss of the plain lm_head logits."""
    for cfg in _configs(config):
        cap = getattr(cfg, "final_logit_softcapping", None)
        if cap is not None:
            return f"does not apply the model's final_logit_softcapping ({cap})"
    return None


MODEL_CHECKS: Dict[Tuple[str, Optional[str]], Callable[[Any], Optional[str]]] = {
    ("swiglu_mlp", None): check_silu,
    ("cross_entropy_loss", "causal"): check_no_softcapping,
}


def model_refusal(op: str, variant: str, impl: str, hf_config: Any) -> Optional[str]:
    """Why `impl` cannot run `op`/`variant` on a model with `hf_config` (None: it can)."""
    if impl == EAGER or hf_config is None:
        return None
    check = MODEL_CHECKS.get((op, variant)) or MODEL_CHECKS.get((op, None))
    reason = check(hf_config) if check is not None else None
    if reason is None:
        return None
    from .config import FIELD_FOR_OP

    field = FIELD_FOR_OP.get(op, f"{op}_implementation")
    return f"{op}/{variant} kernel {impl!r} {reason}; set {field}: eager for this model"


def check_model(pairs: Iterable[Tuple[str, str, str]], hf_config: Any) -> None:
    """Raise ValueError listing every (op, variant, impl) the model refuses."""
    problems = sorted({r for op, variant, impl in pairs if (r := model_refusal(op, variant, impl, hf_config))})
    if problems:
        raise ValueError("the model refuses these kernels:\n" + "\n".join(f"  {p}" for p in problems))


def saved_ops(config: Any) -> Any:
    """`config.ops_implementation` as an OpsImplementationConfig (None when absent)."""
    from .config import OpsImplementationConfig

    ops = getattr(config, "ops_implementation", None)
    if ops is None or isinstance(ops, OpsImplementationConfig):
        return ops
    return OpsImplementationConfig.coerce(ops)


def bind_from_config(slot: Any, config: Any, *, registry: Any = None, _depth: int = 3) -> Any:
    """What `OpSlot.bind_from` does (see there)."""
    from .registry import KERNEL_REGISTRY

    registry = registry or KERNEL_REGISTRY
    try:
        ops = saved_ops(config)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"config.ops_implementation of {slot._label()}: {exc}") from None
    if ops is None:  # not built by opslot: like the module-level slots, nothing is bound
        return slot
    impl, why = ops.choose(slot.op, slot.variant, registry=registry)
    try:
        ops.validate([(slot.op, slot.variant)], registry=registry)
    except ValueError as exc:
        raise ValueError(f"cannot bind instance-scoped {slot._label()} from config.ops_implementation: "
                         f"{exc}") from None
    _check_module_slots(ops, registry, _depth)
    refusal = model_refusal(slot.op, slot.variant, impl, config)
    if refusal is not None:
        raise ValueError(f"cannot bind {slot._label()}: {refusal}")
    return slot.bind(impl, registry=registry, why=why)


def _mismatched_module_slots(ops: Any, slots: Dict[str, Any], registry: Any) -> List[str]:
    from .config import FIELD_FOR_OP

    mismatched = []
    for name, value in sorted(slots.items()):
        if value.why == "direct" or value.op not in FIELD_FOR_OP:
            continue
        impl, _ = ops.choose(value.op, value.variant, registry=registry)
        if impl != value.impl:
            mismatched.append(f"{name} ({value.op}/{value.variant}) runs {value.impl!r}, the config chooses {impl!r}")
    return mismatched


def _not_followed(module: str, mismatched: List[str]) -> ValueError:
    return ValueError(
        f"a model of {module} is being built from a config whose ops_implementation its module-level slots do "
        f"not follow: {'; '.join(mismatched)}. Build it with opslot.build_model(config, module=..., "
        f"model_class=...) or opslot.hf.from_pretrained(path, module), which bind every slot")


def _check_module_slots(ops: Any, registry: Any, depth: int) -> None:
    """A model constructed directly (`Class(config)`) from a config that carries ops_implementation
    binds its instance-scoped slots; refuse when the module-level slots of the calling module run
    something else than that config chooses (they would silently stay as they are)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return
    from .slot import OpSlot

    slots = {k: v for k, v in list(frame.f_globals.items()) if isinstance(v, OpSlot)}
    mismatched = _mismatched_module_slots(ops, slots, registry)
    if mismatched:
        raise _not_followed(frame.f_globals.get("__name__", "?"), mismatched)


def check_caller_follows_config(config: Any, depth: int) -> None:
    """For code run while a generated model is constructed (a config slot's bind_from): refuse, as
    `_check_module_slots` does, a `config` carrying an ops_implementation that the module-level slots
    of the module `depth` frames above the caller do not follow. Nothing to check without one."""
    try:
        ops = saved_ops(config)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"config.ops_implementation: {exc}") from None
    if ops is not None:
        _check_module_slots(ops, None, depth + 2)


def check_model_follows_config(model: Any, registry: Any = None) -> None:
    """Refuse a loaded model (e.g. `generated.Class.from_pretrained(dir)` of a checkpoint saved with
    ops_implementation) whose module-level slots do not run what its `config.ops_implementation`
    chooses; nothing to check when the config carries none."""
    ops = saved_ops(getattr(model, "config", None))
    named = getattr(model, "named_modules", None)
    if ops is None or not callable(named):
        return
    from .copies import slots_of_class

    seen = set()
    for _, sub in named():
        cls = type(sub)
        if cls.__module__ in seen:
            continue
        seen.add(cls.__module__)
        mismatched = _mismatched_module_slots(ops, slots_of_class(cls), registry)
        if mismatched:
            raise _not_followed(cls.__module__, mismatched)
