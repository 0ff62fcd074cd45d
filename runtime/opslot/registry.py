"""Kernel registry: which implementations exist for each (op, variant), and on what hardware.

A `KernelSpec` names one implementation of one (op, variant). Its `factory` is imported lazily
(a "module:attr" string or a zero-argument callable), so registering a CUDA or NPU kernel costs
nothing on machines that never use it. Third-party packages add kernels by calling `register`, or
through the entry-point group `opslot.kernels` (each entry point is a callable taking the registry),
loaded once, the first time the global registry is asked for anything.

The global registry, `KERNEL_REGISTRY`, registers opslot's built-in kernels (opslot.kernels) itself
the first time it is used (registered into, queried or resolved from), before the plug-ins: importing
opslot registers nothing.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .hardware import ANY, DeviceInfo, HardwareRequirement
from .ops import EAGER, KNOWN_OPS

PLUGIN_GROUP = "opslot.kernels"

Factory = Union[str, Callable[[], Callable[..., Any]]]


@dataclass(frozen=True)
class KernelSpec:
    """One implementation `name` of `op`/`variant`. `factory` returns the kernel callable and runs
    at most once (the result is cached); a string "pkg.module:attr" is imported lazily."""

    name: str
    op: str
    variant: str
    factory: Factory
    hardware: HardwareRequirement = ANY
    description: str = ""
    _loaded: Dict[str, Callable[..., Any]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for attr in ("name", "op", "variant"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not value:
                raise ValueError(f"KernelSpec.{attr} must be a non-empty string, got {value!r}")
        if self.name == EAGER:
            raise ValueError("'eager' means the upstream code and cannot be registered as a kernel")
        if isinstance(self.factory, str) and ":" not in self.factory:
            raise ValueError(f"KernelSpec.factory string must be 'module:attr', got {self.factory!r}")

    def load(self) -> Callable[..., Any]:
        """The kernel callable (imported/built on first use, then cached)."""
        fn = self._loaded.get("fn")
        if fn is None:
            if isinstance(self.factory, str):
                module_name, _, attr = self.factory.partition(":")
                fn = getattr(importlib.import_module(module_name), attr)
            else:
                fn = self.factory()
            if not callable(fn):
                raise TypeError(
                    f"factory of kernel {self.name!r} ({self.op}/{self.variant}) returned {fn!r}, not a callable"
                )
            self._loaded["fn"] = fn
        return fn


def _suggest(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


_Builtins = Union[str, Callable[["KernelRegistry"], None]]


class KernelRegistry:
    """(op, variant) -> {implementation name: KernelSpec}.

    `builtins` ("module:function" imported lazily, or a callable) registers kernels into the registry,
    once, before its first registration or query; `plugin_group` names the entry-point group of
    plug-ins, run once before its first query."""

    def __init__(self, plugin_group: Optional[str] = None, builtins: Optional[_Builtins] = None) -> None:
        self._kernels: Dict[Tuple[str, str], Dict[str, KernelSpec]] = {}
        self._plugin_group = plugin_group
        self._plugins_loaded = plugin_group is None
        self._builtins = builtins
        self._loading_builtins = False
        self._lock = threading.RLock()

    # -- built-ins ----------------------------------------------------------------------------
    def _ensure_builtins(self) -> None:
        if self._builtins is None:  # registered (or none): other threads wait on the lock until then
            return
        with self._lock:
            if self._builtins is None or self._loading_builtins:  # loading: their own register() calls
                return
            self._loading_builtins = True
            try:
                builtins = self._builtins
                if isinstance(builtins, str):
                    module_name, _, attr = builtins.partition(":")
                    builtins = getattr(importlib.import_module(module_name), attr)
                builtins(self)
            finally:  # also after a failure: registering them again would clash with those registered
                self._builtins = None
                self._loading_builtins = False

    # -- plug-ins -----------------------------------------------------------------------------
    def load_plugins(self) -> List[str]:
        """Run every entry point of the plug-in group once; returns their names."""
        with self._lock:
            if self._plugins_loaded:
                return []
            self._plugins_loaded = True  # set first: a failing plug-in is not retried on every call
            self._ensure_builtins()  # a plug-in replaces a built-in kernel with force=True, as before
            from importlib.metadata import entry_points

            names = []
            for ep in sorted(entry_points(group=self._plugin_group), key=lambda e: e.name):
                try:
                    hook = ep.load()
                    hook(self)
                except Exception as exc:
                    raise RuntimeError(
                        f"opslot plug-in {ep.name!r} ({ep.value}) from entry-point group "
                        f"{self._plugin_group!r} failed: {type(exc).__name__}: {exc}"
                    ) from exc
                names.append(ep.name)
            return names

    def _ensure_plugins(self) -> None:
        self._ensure_builtins()
        if not self._plugins_loaded:
            self.load_plugins()

    # -- registration -------------------------------------------------------------------------
    def register(self, spec: KernelSpec, *, force: bool = False) -> KernelSpec:
        """Add `spec`; a second kernel with the same (op, variant, name) is an error unless `force`."""
        self._ensure_builtins()
        with self._lock:
            impls = self._kernels.setdefault((spec.op, spec.variant), {})
            old = impls.get(spec.name)
            if old is not None and not force:
                what = old.description or repr(old.factory)
                raise ValueError(
                    f"kernel {spec.name!r} is already registered for {spec.op}/{spec.variant} "
                    f"({what}); pass force=True to replace it"
                )
            impls[spec.name] = spec
            return spec

    def kernel(
        self,
        name: str,
        op: str,
        variants: Union[str, Iterable[str]],
        *,
        hardware: HardwareRequirement = ANY,
        description: str = "",
        force: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register the decorated function as kernel `name` for each of `variants`."""
        variant_list = [variants] if isinstance(variants, str) else list(variants)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            for variant in variant_list:
                summary = description or (fn.__doc__ or "").strip().split("\n")[0]
                self.register(KernelSpec(name, op, variant, lambda fn=fn: fn, hardware, summary), force=force)
            return fn

        return decorate

    def unregister(self, op: str, variant: str, name: str) -> None:
        """Remove one kernel (KeyError if absent)."""
        self._ensure_builtins()
        with self._lock:
            del self._kernels[(op, variant)][name]

    # -- queries ------------------------------------------------------------------------------
    def get(self, op: str, variant: str, name: str) -> Optional[KernelSpec]:
        """The spec, or None, without hardware checks."""
        self._ensure_plugins()
        return self._kernels.get((op, variant), {}).get(name)

    def list_available(
        self,
        op: Optional[str] = None,
        variant: Optional[str] = None,
        *,
        device: Optional[DeviceInfo] = None,
        include_unsupported: bool = False,
    ) -> Dict[Tuple[str, str], List[str]]:
        """{(op, variant): sorted implementation names} usable on this machine (or every registered
        one with `include_unsupported`), filtered by `op`/`variant` when given."""
        self._ensure_plugins()
        out: Dict[Tuple[str, str], List[str]] = {}
        for (o, v), impls in sorted(self._kernels.items()):
            if (op is not None and o != op) or (variant is not None and v != variant):
                continue
            names = sorted(n for n, s in impls.items() if include_unsupported or s.hardware.is_satisfied(device))
            if names:
                out[(o, v)] = names
        return out

    def resolve(
        self, op: str, variant: str, name: str, *, device: Optional[DeviceInfo] = None
    ) -> Optional[Callable[..., Any]]:
        """The kernel callable for `name` on `op`/`variant`; None for "eager".

        KeyError when no such kernel exists (the message lists what does), RuntimeError when it
        exists but this machine does not meet its hardware requirement (the message says which)."""
        if name == EAGER:
            return None
        self._ensure_plugins()
        spec = self._kernels.get((op, variant), {}).get(name)
        if spec is None:
            raise KeyError(self._missing_message(op, variant, name, device))
        reason = spec.hardware.unmet_reason(device)
        if reason is not None:
            raise RuntimeError(f"kernel {name!r} for {op}/{variant} cannot run here: {reason}")
        return spec.load()

    def _missing_message(self, op: str, variant: str, name: str, device: Optional[DeviceInfo]) -> str:
        known_ops = sorted(set(KNOWN_OPS) | {o for o, _ in self._kernels})
        if op not in known_ops:
            return f"unknown op {op!r}{_suggest(op, known_ops)} (known ops: {', '.join(known_ops)})"
        variants = sorted(set(KNOWN_OPS.get(op, ())) | {v for o, v in self._kernels if o == op})
        if variant not in variants:
            return (
                f"unknown variant {variant!r} of op {op!r}{_suggest(variant, variants)} "
                f"(known variants: {', '.join(variants)})"
            )
        impls = self._kernels.get((op, variant), {})
        here = sorted(impls)
        listed = [
            n if impls[n].hardware.is_satisfied(device) else f"{n} [needs {impls[n].hardware.describe()}]" for n in here
        ]
        msg = f"no kernel {name!r} for {op}/{variant}; available: {', '.join(['eager'] + listed)}"
        elsewhere = sorted(v for (o, v), names in self._kernels.items() if o == op and name in names)
        if elsewhere:
            msg += f" ({name!r} implements {op} variant(s) {', '.join(elsewhere)} only)"
        else:
            msg += _suggest(name, here)
        return msg

    def __contains__(self, key: Tuple[str, str, str]) -> bool:
        op, variant, name = key
        return self.get(op, variant, name) is not None


#: The process-wide registry: built-in kernels (registered on first use) plus entry-point plug-ins
#: (group `opslot.kernels`, loaded on first query).
KERNEL_REGISTRY = KernelRegistry(plugin_group=PLUGIN_GROUP, builtins=f"{__package__}.kernels:register_builtin_kernels")


def register_kernel(
    name: str,
    op: str,
    variants: Union[str, Iterable[str]],
    *,
    hardware: HardwareRequirement = ANY,
    description: str = "",
    force: bool = False,
    registry: Optional[KernelRegistry] = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a function in `registry` (default: KERNEL_REGISTRY)."""
    return (registry or KERNEL_REGISTRY).kernel(
        name, op, variants, hardware=hardware, description=description, force=force
    )
