"""Private module copies that pickle, and that are released with their models.

`build_model` binds a module's module-level slots in a copy of the module, so that models built
with other choices cannot change it. The copy is named after its binding:
`<module>__opslot__<impl>-<impl>-...` (the impls of the module-level slots, in slot-name order), e.g.
`patched_modeling_toy_gpu__opslot__eager-torch-eager-eager`. Consequences:

- models with the same module-level binding share one copy (copies no longer pile up per model);
- the name alone re-creates the copy: a meta-path finder (`install_copy_finder`, called by
  `import opslot`; it answers such names only) imports one by loading the original module's file
  again and binding its slots as the name says. So `pickle` / `torch.save(model)` of a whole model
  loads in a new process (`import opslot` first);
- copies whose models are all gone are dropped from `sys.modules` (`release_unused_copies`, run by
  every `build_model`), and garbage-collected with their classes. A model restored from a copy's
  classes (`pickle`, `torch.load`, `copy.deepcopy`: all call `__setstate__`) is recorded as a user
  like a built one, so its copy stays registered and the model can be saved again;
- the name always says the binding: `bind_ops` refuses to rebind a named copy to anything else
  (build another model instead: its copy is named after its own binding);
- thread safety: creating, binding and releasing copies happens under one lock (`LOCK`), and a
  copy being imported, imported by name but not used yet, or handed to a model under construction
  is never released.

`isinstance(model, generated.Class)` is False for a model of a copy: the copy's classes are other
class objects (that is what keeps their slots apart). `is_instance(model, generated.Class)` answers
by the class's qualified name and the copy's original module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any, Dict, List, Optional

from .copy_names import COPY_MARK, copy_name, named_binding, original_name
from .slot import OpSlot

#: Held while copies are created, bound, registered or released (re-entrant: build_model holds it
#: around calls that take it too).
LOCK = threading.RLock()


class _CopyLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, package: Optional[str], impls: List[str]) -> None:
        super().__init__(fullname, path)
        self._package = package
        self._impls = impls

    def exec_module(self, module: types.ModuleType) -> None:
        module.__package__ = self._package
        super().exec_module(module)
        slots = sorted((name, value) for name, value in vars(module).items() if isinstance(value, OpSlot))
        if len(slots) != len(self._impls):
            raise ImportError(
                f"{module.__name__}: the name binds {len(self._impls)} slot(s), the module has "
                f"{len(slots)} (its source changed?)",
                name=module.__name__,
            )
        for (name, slot), impl in zip(slots, self._impls):
            slot.name = name
            slot.bind(impl, why="restored (copy name)")
        _record_restored_users(module)
        pin = Pin()  # until adopt records its first user, e.g. the object being unpickled
        module.__dict__[_IMPORT_PIN] = pin
        for _, slot in slots:
            slot.attach(pin)


class Pin:
    """A stand-in user that keeps a copy from being released (see adopt)."""


_IMPORT_PIN = "__opslot_import_pin__"


def _record_restored_users(module: types.ModuleType) -> None:
    """Give every torch.nn.Module class defined in copy `module` a `__setstate__` that records each
    restored object (pickle, torch.load, copy.deepcopy all call it) as a user of the copy's slots, as
    build_model does for the models it builds (`adopt`)."""
    import torch

    for cls in list(vars(module).values()):
        if isinstance(cls, type) and cls.__module__ == module.__name__ and issubclass(cls, torch.nn.Module):
            cls.__setstate__ = _adopting_setstate(cls, module)


def _adopting_setstate(cls: type, module: types.ModuleType) -> Any:
    own = cls.__dict__.get("__setstate__")

    def __setstate__(self: Any, state: Any) -> None:
        if own is not None:
            own(self, state)
        else:
            super(cls, self).__setstate__(state)
        adopt(self, module)

    return __setstate__


def adopt(obj: Any, module: types.ModuleType) -> None:
    """Record `obj` as a user of copy `module`'s slots, and register the copy again under its name
    if it was released meanwhile (so that `obj` pickles). A copy imported by name is kept from
    release until its first user is recorded here (another thread may be unpickling from it)."""
    with LOCK:
        for value in vars(module).values():
            if isinstance(value, OpSlot):
                value.attach(obj)
        module.__dict__.pop(_IMPORT_PIN, None)
        if module.__name__ not in sys.modules:
            sys.modules[module.__name__] = module


class _CopyFinder(importlib.abc.MetaPathFinder):
    """Imports `<module>__opslot__<impls>` names (see the module docstring)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        impls = named_binding(fullname)
        if impls is None:
            return None
        original = importlib.import_module(fullname.rpartition(COPY_MARK)[0])
        file = getattr(original, "__file__", None)
        if not file or not file.endswith(".py"):
            return None
        loader = _CopyLoader(fullname, file, original.__package__, impls)
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def install_copy_finder() -> None:
    """Put the finder of copy names on `sys.meta_path` (once). `import opslot` does, so that a pickled model
    of a copy loads in a new process (see the module docstring)."""
    if not any(isinstance(f, _CopyFinder) for f in sys.meta_path):
        sys.meta_path.append(_CopyFinder())


def shared_copy(module: types.ModuleType, impls: Dict[str, str]) -> Optional[types.ModuleType]:
    """The copy of `module` bound to `impls` (imported, or reused when already loaded); None when
    the impls cannot be spelt in a module name."""
    name = copy_name(module.__name__, impls)
    if name is None:
        return None
    with LOCK:
        existing = sys.modules.get(name)
        if existing is not None and getattr(existing, "__file__", None) != getattr(module, "__file__", None):
            del sys.modules[name]  # a copy of another file of the same module name (e.g. generated elsewhere)
        install_copy_finder()
        return importlib.import_module(name)


def release_unused_copies() -> List[str]:
    """Drop from sys.modules every copy made by build_model (named after its binding) whose slots no
    live model uses; returns their names. (A dropped copy lives on as long as objects of its classes
    do; its name imports it again.) Copies made with `load_private_copy` are the caller's to keep; a
    copy still being imported, or imported by name and not used yet (e.g. by another thread's
    unpickling), is kept."""
    dropped = []
    with LOCK:
        for name, module in list(sys.modules.items()):
            if module is None or named_binding(name) is None or _importing(module):
                continue
            slots = [v for v in vars(module).values() if isinstance(v, OpSlot)]
            if slots and not any(len(s._users) for s in slots):
                del sys.modules[name]
                dropped.append(name)
    return dropped


def _importing(module: types.ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def is_instance(obj: Any, cls: type) -> bool:
    """`isinstance(obj, cls)`, also true when `obj`'s class (or a base) is `cls`'s counterpart in a
    private copy of `cls`'s module (same qualified name, copy of the same module)."""
    if isinstance(obj, cls):
        return True
    target = (original_name(cls.__module__), cls.__qualname__)
    return any((original_name(k.__module__), k.__qualname__) == target for k in type(obj).__mro__)
