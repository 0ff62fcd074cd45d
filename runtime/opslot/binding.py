"""Bind a generated module's slots from an ops config, and build models that keep their kernels apart.

`bind_ops(module, ops)` binds every module-level `OpSlot`. `build_model(hf_config, ops=..., module=...)`
does it the safe way for several models in one process: it copies the HF config, stores the ops
choice on the copy (`config.ops_implementation`, read by instance-scoped slots through `bind_from`),
and, when the module has module-level slots, binds them in a private copy of the module (named after
its binding, see copies.py) so that binding it cannot change models built earlier with other choices.
Nothing asked for is dropped: see docs/runtime.md, "Strictness".
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import importlib.util
import itertools
import os
import sys
import types
import warnings
from collections.abc import Mapping
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from .attention_names import SDPA_ATTN_IMPLEMENTATION, VARLEN_ATTN_IMPLEMENTATION
from .checks import allowing_version_mismatch, check_kernels_for_model, check_module_upstream, import_generated
from .copies import LOCK, Pin, adopt, release_unused_copies, shared_copy
from .copy_names import is_copy, named_binding, original_name
from .dispatch import watch_dispatch
from .force_override import forced_impl_spec
from .hardware import DeviceInfo
from .ops import FIELD_FOR_OP
from .ops_config import OpsImplementationConfig
from .plan import binding_plan, declared_config_slots, declared_slots, log_plan, logger
from .registry import KERNEL_REGISTRY, KernelRegistry
from .saved_choice import saved_ops
from .slot import OpSlot, module_slots

_copy_counter = itertools.count(1)


def _not_a_module(target: Any) -> str:
    kind = type(target).__name__
    if hasattr(target, "named_modules"):
        return (
            f"bind_ops binds the module-level slots of a generated module, not a model ({kind}); build the model "
            f"with opslot.build_model(config, ops, module=..., model_class=...) (or opslot.hf.from_pretrained), "
            f"or bind its module: opslot.bind_ops(sys.modules[type(model).__module__], ops)"
        )
    return f"bind_ops takes a generated module (or its import name), got {kind}"


def _no_slots(module: types.ModuleType, what: str) -> str:
    return (
        f"{what}: module {module.__name__!r} declares no OpSlot, so there is nothing to bind (an upstream module? "
        f"generate a patched one with patchgen and pass that, e.g. module='patched_modeling_<model>_gpu')"
    )


def _unbound_error(config: OpsImplementationConfig, ops: List[str], where: str, have: Iterable[str]) -> ValueError:
    have = sorted(set(have))
    asked = ", ".join(f"{FIELD_FOR_OP[op]}={getattr(config, FIELD_FOR_OP[op])!r}" for op in ops)
    return ValueError(
        f"{asked} binds no slot: {where} has no {'/'.join(ops)} slot (its slots: {', '.join(have) or 'none'}). "
        f"Remove the field, or, if this model keeps {'/'.join(ops)} upstream on purpose, say so with "
        f"ops_implementation.allow_unbound: [{', '.join(ops)}]"
    )


def _resolve_module(module: Union[str, types.ModuleType], allow_version_mismatch: bool = False) -> types.ModuleType:
    """The module (imported by name), refused when generated for another upstream release."""
    if isinstance(module, str):
        return import_generated(module, allow_version_mismatch)
    if not isinstance(module, types.ModuleType):
        raise TypeError(_not_a_module(module))
    check_module_upstream(module, allow_version_mismatch)
    return module


def _live_models_of(module: types.ModuleType, exclude: Iterable[Any]) -> List[Any]:
    """Objects alive now whose class is defined in `module` and that no slot records as a user
    (models constructed directly from the module), outermost ones only."""
    skip = {id(x) for x in exclude}
    found = [
        o
        for o in gc.get_objects()
        if getattr(type(o), "__module__", None) == module.__name__ and hasattr(o, "named_modules")
    ]
    inner = set()
    for obj in found + [x for x in exclude if hasattr(x, "named_modules")]:
        for _, sub in obj.named_modules():
            if sub is not obj:
                inner.add(id(sub))
    return [o for o in found if id(o) not in inner and id(o) not in skip]


def _bind_module(
    module: types.ModuleType,
    config: OpsImplementationConfig,
    slots: Dict[str, OpSlot],
    registry: Optional[KernelRegistry],
    device: Optional[DeviceInfo],
    warn_live: bool,
) -> Dict[str, str]:
    chosen = config.validate({(s.op, s.variant) for s in slots.values()}, registry=registry, device=device)
    _check_name_kept(module, [chosen[(s.op, s.variant)] for _, s in sorted(slots.items())])
    changing = [(n, s) for n, s in sorted(slots.items()) if chosen[(s.op, s.variant)] != s.impl]
    if warn_live and changing:
        users = [u for s in slots.values() for u in s._users]
        live = _live_models_of(module, users)
        if live:
            names = sorted({type(o).__name__ for o in live})
            changes = ", ".join(f"{n} {s.impl!r}->{chosen[(s.op, s.variant)]!r}" for n, s in changing)
            warnings.warn(
                f"rebinding module {module.__name__!r} changes {len(live)} live model(s) built from it directly "
                f"({', '.join(names)}): {changes}; "
                f"build models with opslot.build_model (private module copy) to keep them apart",
                RuntimeWarning,
                stacklevel=3,
            )
    bound = {}
    for name, slot in sorted(slots.items()):
        slot.name = name
        impl = chosen[(slot.op, slot.variant)]
        _, why = config.choose(slot.op, slot.variant, registry=registry, device=device)
        slot.bind(impl, registry=registry, why=why)
        bound[name] = impl
    return bound


def _check_name_kept(module: types.ModuleType, impls: List[str]) -> None:
    """Refuse to bind a copy made by build_model to anything but what its name says: pickled models
    are restored from the name, so the name must always say the binding."""
    said = named_binding(module.__name__)
    if said is None or said == impls:
        return
    raise ValueError(
        f"module {module.__name__!r} is a private copy named after its binding ({'-'.join(said)}), which "
        f"pickled models are restored with; binding it to {'-'.join(impls)} would make its name lie. Build "
        f"another model with opslot.build_model(config, ops, module=..., model_class=...) (its copy is named after "
        f"its own binding), or bind a copy of your own: opslot.bind_ops(opslot.load_private_copy("
        f"sys.modules[{original_name(module.__name__)!r}]), ops)"
    )


def bind_ops(
    module: Union[str, types.ModuleType],
    ops: Any = None,
    *,
    registry: Optional[KernelRegistry] = None,
    device: Optional[DeviceInfo] = None,
    allow_version_mismatch: bool = False,
) -> Dict[str, str]:
    """Bind every module-level slot of `module` from `ops` (config, mapping, YAML/JSON path or text,
    or None for the device defaults). Everything is validated before anything is bound. Returns
    {slot name: impl} and logs the module's binding plan at INFO.

    Errors (nothing is bound): `module` is a model instance or declares no slot; an explicit choice
    binds no module-level slot (an op the module does not have, or one whose slots are
    instance-scoped: those bind from `config.ops_implementation`, use build_model), unless the op is
    in `allow_unbound`; `module` is a copy made by build_model and `ops` would change its binding (its
    name says the binding: see copies.py); `module` was generated for another release of its upstream
    package than the installed one (GeneratedVersionError), unless `allow_version_mismatch`. Rebinding
    a module that models were constructed from directly warns."""
    module = _resolve_module(module, allow_version_mismatch)
    config = OpsImplementationConfig.coerce(ops)
    declared = declared_slots(module)
    if not declared:
        raise ValueError(_no_slots(module, "bind_ops"))
    slots = module_slots(module)
    module_ops = {s.op for s in slots.values()}
    unbound = config.unbound_choices(module_ops)
    if unbound:
        instance = sorted({d.op for d in declared if d.scope == "instance"} & set(unbound))
        if instance:
            raise ValueError(
                f"{', '.join(f'{FIELD_FOR_OP[op]}={getattr(config, FIELD_FOR_OP[op])!r}' for op in instance)}: the "
                f"{'/'.join(instance)} slots of {module.__name__} are instance-scoped and bind from "
                f"config.ops_implementation when a model is built, which bind_ops cannot do; use "
                f"opslot.build_model(config, ops, module=..., model_class=...) or opslot.hf.from_pretrained"
            )
        raise _unbound_error(config, unbound, f"module {module.__name__}", [f"{d.op}/{d.variant}" for d in declared])
    with LOCK:
        bound = _bind_module(module, config, slots, registry, device, warn_live=not is_copy(module.__name__))
    log_plan(binding_plan(module))
    return bound


def load_private_copy(module: types.ModuleType, *, allow_version_mismatch: bool = False) -> types.ModuleType:
    """A fresh, independent instance of `module` loaded from its file under a unique name (so its
    module-level slots are its own). Registered in sys.modules under that name. A module generated
    for another upstream release is refused (GeneratedVersionError) unless `allow_version_mismatch`."""
    check_module_upstream(module, allow_version_mismatch)
    path = getattr(module, "__file__", None)
    if not path:
        raise ValueError(f"module {module.__name__!r} has no source file to copy")
    name = f"{module.__name__}__opslot_copy{next(_copy_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    clone = importlib.util.module_from_spec(spec)
    clone.__package__ = module.__package__
    sys.modules[name] = clone
    try:
        with allowing_version_mismatch(allow_version_mismatch):
            spec.loader.exec_module(clone)
    except BaseException:
        del sys.modules[name]
        raise
    return clone


#: What Transformers' `@use_experts_implementation` must dispatch to for the moe guard to run.
EXPERTS_EAGER = "eager"


def moe_runs_kernel(
    slots: Dict[str, OpSlot],
    config: OpsImplementationConfig,
    device: Optional[DeviceInfo] = None,
    registry: Optional[KernelRegistry] = None,
) -> bool:
    """Whether a `moe` slot of the model runs a kernel. Transformers wraps `*Experts.forward` in
    `@use_experts_implementation`, which calls the eager body (where the moe guard sits) only when
    `config._experts_implementation == "eager"` and otherwise its own grouped_mm etc.; build_model
    then sets that on its config copy. Module-level moe slots answer by their binding; without one
    (instance-scoped slots bind from the config later), the config's moe choice decides."""
    moe_slots = [slot for slot in slots.values() if slot.op == "moe"]
    if moe_slots:
        return any(slot.use_non_eager_impl for slot in moe_slots)
    forced = forced_impl_spec("moe")  # $OPSLOT_FORCE_IMPL decides the instance-scoped slots too
    if forced is not None:
        name, strict = forced
        if name == EXPERTS_EAGER:
            return False
        available = (registry or KERNEL_REGISTRY).list_available("moe", device=device).values()
        return strict or any(name in names for names in available)
    return config.impl_for("moe", device) != EXPERTS_EAGER


def build_model(
    hf_config: Any,
    ops: Any = None,
    module: Union[str, types.ModuleType, None] = None,
    model_class: Union[str, type, None] = None,
    *,
    private_copy: bool = True,
    registry: Optional[KernelRegistry] = None,
    device: Optional[DeviceInfo] = None,
    allow_unreached: Union[bool, Iterable[str]] = False,
    allow_version_mismatch: bool = False,
) -> Any:
    """Construct `model_class(config)` from the generated `module` with kernels chosen by `ops`.

    `hf_config` is the model's config object (a Transformers `PretrainedConfig`); `module` a module
    or its import name (default: the module of `model_class`); `model_class` a class or a class name
    in the module. The HF config is copied; the copy gets `ops_implementation` (the explicit fields, a
    plain dict) for instance-scoped slots, `_attn_implementation` when `attn_implementation` is set,
    and `_experts_implementation = "eager"` when a moe slot runs a kernel (see `moe_runs_kernel`), both
    also as the public keys Transformers saves and reads back (`carry_dispatch`). Module-level slots are
    bound in a private copy of the module (`private_copy=False` binds the module itself, shared with
    every model built from it). Thread-safe: copies are made, bound and released under one lock, and
    the copy of a model under construction is never released. The model is watched for proof of
    dispatch (`opslot.dispatch.watch_dispatch`): after its first forward and backward, a bound kernel
    whose guard the model reaches but never ran is an error (a warning for device defaults and for
    the ops in `allow_unreached`, True for all). A module generated for another release of its
    upstream package than the installed one is refused (GeneratedVersionError, before it is
    imported when `module` is a name) unless `allow_version_mismatch` (docs/runtime.md)."""
    _check_hf_config(hf_config)
    config = _ops_for(hf_config, ops)
    module, class_name = _build_target(module, model_class, allow_version_mismatch)
    chosen = _check_choices(config, hf_config, module, class_name, registry, device)
    with (
        allowing_version_mismatch(allow_version_mismatch),
        _bound_module(module, config, chosen, private_copy, registry, device) as (module, slots),
    ):
        model = getattr(module, class_name)(_config_copy(hf_config, config, slots, registry, device))
        with LOCK:
            for slot in slots.values():
                slot.attach(model)
    plan = binding_plan(model)
    unbound = config.unbound_choices(plan.ops())
    if unbound:
        raise _unbound_error(
            config, unbound, f"{class_name} (built from {module.__name__})", [f"{e.op}/{e.variant}" for e in plan]
        )
    log_plan(plan)
    return watch_dispatch(model, allow_unreached=allow_unreached)


def _check_hf_config(hf_config: Any) -> None:
    """Refuse what is not a model config object (None, a dict, a path) with what build_model takes."""
    if (
        hf_config is not None
        and not isinstance(hf_config, (Mapping, str, bytes, os.PathLike))
        and hasattr(hf_config, "__dict__")
    ):
        return
    got = "None" if hf_config is None else type(hf_config).__name__
    if isinstance(hf_config, Mapping):
        got += (
            " (make the config object from it: e.g. Qwen3Config(**values), or "
            "AutoConfig.for_model(model_type, **values))"
        )
    elif isinstance(hf_config, (str, os.PathLike)):
        got += (
            " (for a checkpoint or config folder: opslot.hf.from_pretrained(path, module), or "
            "AutoConfig.from_pretrained(path))"
        )
    raise TypeError(
        f"build_model takes the model's config object (a transformers PretrainedConfig, e.g. "
        f"Qwen3Config(...) or AutoConfig.from_pretrained(path)) as hf_config, got {got}"
    )


def _ops_for(hf_config: Any, ops: Any) -> OpsImplementationConfig:
    """`ops`, else the choice `hf_config` carries (a saved model's `ops_implementation`)."""
    saved = saved_ops(hf_config)
    if ops is None and saved is not None:
        return saved
    config = OpsImplementationConfig.coerce(ops)
    if ops is not None and saved is not None and saved != config:
        logger.warning(
            "build_model: ops=%s replaces the config's ops_implementation %s", config.to_dict(), saved.to_dict()
        )
    return config


def _build_target(
    module: Union[str, types.ModuleType, None],
    model_class: Union[str, type, None],
    allow_version_mismatch: bool = False,
) -> Tuple[types.ModuleType, str]:
    """(module, class name) that build_model constructs."""
    if module is not None:
        module = _resolve_module(module, allow_version_mismatch)
    if module is None:
        if not isinstance(model_class, type):
            raise ValueError("build_model needs `module`, or `model_class` as a class")
        module = sys.modules[model_class.__module__]
        check_module_upstream(module, allow_version_mismatch)
    if model_class is None:
        raise ValueError(f"build_model needs `model_class` (a class or a class name in {module.__name__})")
    return module, model_class if isinstance(model_class, str) else model_class.__name__


def _check_choices(
    config: OpsImplementationConfig,
    hf_config: Any,
    module: types.ModuleType,
    class_name: str,
    registry: Optional[KernelRegistry],
    device: Optional[DeviceInfo],
) -> Dict[Tuple[str, str], str]:
    """Everything the model will bind (instance-scoped slots and config slots included), checked
    before anything is bound; returns {(op, variant): impl}."""
    declared = declared_slots(module)
    config_slots = declared_config_slots(module)
    if not declared and not config_slots:
        raise ValueError(_no_slots(module, "build_model"))
    if not isinstance(getattr(module, class_name, None), type):
        raise AttributeError(f"module {module.__name__!r} has no class {class_name!r}")
    for config_slot in config_slots:  # a config value they refuse is an error before construction
        config_slot.choose_from(hf_config)
    pairs = {(d.op, d.variant) for d in declared}
    chosen = config.validate(pairs, registry=registry, device=device)
    unbound = config.unbound_choices(d.op for d in declared)
    if unbound:
        raise _unbound_error(config, unbound, f"module {module.__name__}", [f"{op}/{v}" for op, v in sorted(pairs)])
    check_kernels_for_model([(op, v, impl) for (op, v), impl in chosen.items()], hf_config)
    return chosen


@contextlib.contextmanager
def _bound_module(
    module: types.ModuleType,
    config: OpsImplementationConfig,
    chosen: Dict[Tuple[str, str], str],
    private_copy: bool,
    registry: Optional[KernelRegistry],
    device: Optional[DeviceInfo],
) -> Iterator[Tuple[types.ModuleType, Dict[str, OpSlot]]]:
    """(module, its module-level slots) bound as `chosen`: the shared private copy named after that
    binding (or `module` itself with `private_copy=False`), pinned until the `with` block ends."""
    pin = Pin()  # a user of the copy until the model is constructed and attached
    with LOCK:
        slots = module_slots(module)
        if slots and private_copy:
            release_unused_copies()
            module = shared_copy(module, {n: chosen[(s.op, s.variant)] for n, s in slots.items()}) or load_private_copy(
                module
            )
            slots = module_slots(module)
            adopt(pin, module)
        if slots:
            _bind_module(module, config, slots, registry, device, warn_live=not private_copy)
    yield module, slots
    del pin


def _config_copy(
    hf_config: Any,
    config: OpsImplementationConfig,
    slots: Dict[str, OpSlot],
    registry: Optional[KernelRegistry],
    device: Optional[DeviceInfo],
) -> Any:
    """The copy of `hf_config` the model is constructed with (see build_model)."""
    hf_config = copy.deepcopy(hf_config)
    hf_config.ops_implementation = config.to_dict()
    if config.aliases:  # the reference trainer's names it was written with (opslot.compat): binding_plan shows them
        hf_config.ops_implementation_aliases = {field: list(pair) for field, pair in config.aliases.items()}
    elif hasattr(hf_config, "ops_implementation_aliases"):
        del hf_config.ops_implementation_aliases
    attn = config.value("attn_implementation", device)
    if attn in (VARLEN_ATTN_IMPLEMENTATION, SDPA_ATTN_IMPLEMENTATION):
        _register_opslot_attention(attn)
    if attn is not None:
        carry_dispatch(hf_config, "attn_implementation", attn)
    if moe_runs_kernel(slots, config, device, registry):
        carry_dispatch(hf_config, "experts_implementation", EXPERTS_EAGER)
    return hf_config


def _register_opslot_attention(name: str) -> None:
    """Register `opslot_varlen` or `opslot_sdpa` with Transformers, which checks the name when the
    model is built (the modules are imported here: they import Transformers)."""
    if name == VARLEN_ATTN_IMPLEMENTATION:
        from .packing import register_attention
    else:
        from .compiled_sdpa import register_attention
    register_attention()


def carry_dispatch(hf_config: Any, name: str, value: str) -> None:
    """Set Transformers' `attn_implementation` or `experts_implementation` on `hf_config` so that it
    also holds for models built from it after a save and a load: Transformers keeps the choice in
    `_<name>`, which it never saves, and reads the public `<name>` of a saved config back into it."""
    setattr(hf_config, f"_{name}", value)
    setattr(hf_config, name, value)
