"""Bind a generated module's slots from an ops config, and build models that keep their kernels apart.

`bind_ops(module, ops)` binds every module-level `OpSlot`. `build_model(hf_config, ops=..., module=...)`
does it the safe way for several models in one process: it copies the HF config, stores the ops
choice on the copy (`config.ops_implementation`, read by instance-scoped slots through `bind_from`),
and, when the module has module-level slots, loads a private copy of the module for this model so
that binding it cannot change models built earlier with other choices.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import itertools
import sys
import types
from typing import Any, Dict, Optional, Union

from .config import OpsImplementationConfig
from .hardware import DeviceInfo
from .registry import KernelRegistry
from .slot import OpSlot

_copy_counter = itertools.count(1)


def module_slots(module: types.ModuleType) -> Dict[str, OpSlot]:
    """{attribute name: slot} for every OpSlot defined at the top level of `module`."""
    return {name: value for name, value in vars(module).items() if isinstance(value, OpSlot)}


def bind_ops(
    module: types.ModuleType, ops: Any = None, *, registry: Optional[KernelRegistry] = None,
    device: Optional[DeviceInfo] = None,
) -> Dict[str, str]:
    """Bind every module-level slot of `module` from `ops` (config, mapping, YAML path or None for
    the device defaults). Everything is validated before anything is bound. Returns {slot name: impl}."""
    config = OpsImplementationConfig.coerce(ops)
    slots = module_slots(module)
    chosen = config.validate({(s.op, s.variant) for s in slots.values()}, registry=registry, device=device)
    bound = {}
    for name, slot in sorted(slots.items()):
        slot.name = name
        impl = chosen[(slot.op, slot.variant)]
        slot.bind(impl, registry=registry)
        bound[name] = impl
    return bound


def load_private_copy(module: types.ModuleType) -> types.ModuleType:
    """A fresh, independent instance of `module` loaded from its file under a unique name (so its
    module-level slots are its own). Registered in sys.modules under that name."""
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
        spec.loader.exec_module(clone)
    except BaseException:
        del sys.modules[name]
        raise
    return clone


#: What Transformers' `@use_experts_implementation` must dispatch to for the moe guard to run.
EXPERTS_EAGER = "eager"


def moe_runs_kernel(slots: Dict[str, OpSlot], config: OpsImplementationConfig,
                    device: Optional[DeviceInfo] = None) -> bool:
    """Whether a `moe` slot of the model runs a kernel. Transformers wraps `*Experts.forward` in
    `@use_experts_implementation`, which calls the eager body (where the moe guard sits) only when
    `config._experts_implementation == "eager"` and otherwise its own grouped_mm etc.; build_model
    then sets that on its config copy. Module-level moe slots answer by their binding; without one
    (instance-scoped slots bind from the config later), the config's moe choice decides."""
    moe_slots = [slot for slot in slots.values() if slot.op == "moe"]
    if moe_slots:
        return any(slot.use_non_eager_impl for slot in moe_slots)
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
) -> Any:
    """Construct `model_class(config)` from the generated `module` with kernels chosen by `ops`.

    `module` is a module or its import name (default: the module of `model_class`); `model_class` a
    class or a class name in the module. The HF config is copied; the copy gets `ops_implementation`
    (the explicit fields, a plain dict) for instance-scoped slots, `_attn_implementation` when
    `attn_implementation` is set, and `_experts_implementation = "eager"` when a moe slot runs a
    kernel (see `moe_runs_kernel`). Module-level slots are bound in a private copy of the module
    (`private_copy=False` binds the module itself, shared with every model built from it)."""
    config = OpsImplementationConfig.coerce(ops)
    if isinstance(module, str):
        module = importlib.import_module(module)
    if module is None:
        if not isinstance(model_class, type):
            raise ValueError("build_model needs `module`, or `model_class` as a class")
        module = sys.modules[model_class.__module__]
    if model_class is None:
        raise ValueError(f"build_model needs `model_class` (a class or a class name in {module.__name__})")
    class_name = model_class if isinstance(model_class, str) else model_class.__name__

    slots = module_slots(module)
    if slots and private_copy:
        module = load_private_copy(module)
        slots = module_slots(module)
    if slots:
        bind_ops(module, config, registry=registry, device=device)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise AttributeError(f"module {module.__name__!r} has no class {class_name!r}")

    hf_config = copy.deepcopy(hf_config)
    hf_config.ops_implementation = config.to_dict()
    attn = config.value("attn_implementation", device)
    if attn is not None:
        hf_config._attn_implementation = attn
    if moe_runs_kernel(slots, config, device):
        hf_config._experts_implementation = EXPERTS_EAGER
    model = cls(hf_config)
    for slot in slots.values():
        slot.attach(model)
    return model
