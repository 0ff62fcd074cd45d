"""`OpSlot`: the dispatch handle a generated modeling file declares and its guards call.

    rms_norm_slot = OpSlot("rms_norm", "standard")          # module scope, bound by bind_ops
    self.rope_slot = OpSlot("rotary_pos_emb", "full").bind_from(config, owner=self)   # instance scope

An unbound slot (or one bound to "eager") reports `use_non_eager_impl == False`, so the guard falls
through to the upstream code. A module-scoped slot is shared by every model built from that module;
rebinding it while such models are alive warns, because it silently changes them too.

`module_slots(module)`, `slots_of_class(cls)`: the module-level slots of a module, and those the
methods of a class read.
"""

from __future__ import annotations

import sys
import types
import warnings
import weakref
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from . import legacy_caller
from .checks import model_refusal
from .ops import EAGER
from .registry import KERNEL_REGISTRY, KernelRegistry
from .saved_choice import check_slots_follow, saved_ops


class OpSlot:
    """A named dispatch point for one (op, variant)."""

    __slots__ = ("op", "variant", "name", "_impl", "_fn", "_bind_count", "_users", "_why", "_ran", "__weakref__")

    def __init__(self, op: str, variant: str) -> None:
        if not isinstance(op, str) or not op or not isinstance(variant, str) or not variant:
            raise ValueError(f"OpSlot needs a non-empty op and variant, got {op!r}, {variant!r}")
        self.op = op
        self.variant = variant
        self.name: Optional[str] = None  # the module attribute name, set by bind_ops
        self._impl = EAGER
        self._fn: Optional[Callable[..., Any]] = None
        self._bind_count = 0
        self._users: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._why = "unbound"
        # Proof of dispatch (opslot.dispatch): set by every call of the bound kernel, never read on
        # the hot path. A plain store: torch.compile replays it after each run of a compiled graph,
        # with no guard on its value (so no recompilation) and no graph break.
        self._ran = False

    @property
    def impl(self) -> str:
        """Name of the bound implementation ("eager" when unbound)."""
        return self._impl

    @property
    def use_non_eager_impl(self) -> bool:
        """True when a kernel is bound: the guard calls the slot instead of the upstream code."""
        return self._fn is not None

    @property
    def why(self) -> str:
        """Why the slot runs `impl`: "explicit", "default", "fallback (...)", "forced (...)",
        "direct" (slot.bind called by hand) or "unbound"."""
        return self._why

    @property
    def ran(self) -> bool:
        """True when the bound kernel has been called since the flag was last cleared (opslot.dispatch
        clears it when a model's first step starts; see docs/runtime.md, "Proof of dispatch")."""
        return self._ran

    @property
    def bind_count(self) -> int:
        """How many times this slot has been bound."""
        return self._bind_count

    def bind(self, impl: str, *, registry: Optional[KernelRegistry] = None, why: str = "direct") -> "OpSlot":
        """Bind to implementation `impl` ("eager" unbinds); resolves it in `registry`.

        Raises the registry's KeyError/RuntimeError when the kernel is missing or cannot run here.
        Warns when the binding changes while models built with this slot are alive."""
        fn = (registry or KERNEL_REGISTRY).resolve(self.op, self.variant, impl)
        users = len(self._users)
        if users and impl != self._impl:
            warnings.warn(
                f"rebinding {self._label()} from {self._impl!r} to {impl!r} changes the "
                f"{users} live model instance(s) that share it; build models with "
                f"opslot.build_model (private module copy) or instance-scoped slots to keep them apart",
                RuntimeWarning,
                stacklevel=2,
            )
        self._impl, self._fn, self._why = impl, fn, why
        self._ran = False  # what ran before was another binding
        self._bind_count += 1
        return self

    def bind_from(self, config: Any, *, registry: Optional[KernelRegistry] = None, owner: Any = None) -> "OpSlot":
        """Bind from `config.ops_implementation` (set by build_model on its config copy: a dict or
        an OpsImplementationConfig); a config without it leaves the slot on eager (why "unbound"),
        as the module-level slots of a module nobody bound. $OPSLOT_FORCE_IMPL applies to what is
        bound. For instance-scoped slots:
        `self.x = OpSlot(op, variant).bind_from(config, owner=self)` in `__init__`.

        A choice that cannot be honoured is a ValueError in config terms (the field, its value, the
        values possible for this slot); so is a model the op's kernels refuse (e.g. a swiglu_mlp
        kernel on a model whose hidden_act is not SiLU), and a model whose module-level slots do not
        follow the config (built directly from a saved config: opslot.saved_choice). Those are the
        slots of the module of `owner`'s class (`owner=self` in a generated `__init__`); without
        `owner` (a file generated by a patchgen older than `owner=self`), of the module whose code
        called bind_from, read from the call stack (opslot.legacy_caller)."""
        registry = registry or KERNEL_REGISTRY
        try:
            ops = saved_ops(config)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"config.ops_implementation of {self._label()}: {exc}") from None
        if ops is None:  # not built by opslot: like the module-level slots, nothing is bound
            return self
        caller = legacy_caller.caller_namespace() if owner is None else None
        impl, why = ops.choose(self.op, self.variant, registry=registry)
        try:
            ops.validate([(self.op, self.variant)], registry=registry)
        except ValueError as exc:
            raise ValueError(
                f"cannot bind instance-scoped {self._label()} from config.ops_implementation: {exc}"
            ) from None
        module_name, module_level = constructing_module_slots(owner, caller)
        check_slots_follow(ops, module_level, module_name, registry)
        refusal = model_refusal(self.op, self.variant, impl, config)
        if refusal is not None:
            raise ValueError(f"cannot bind {self._label()}: {refusal}")
        return self.bind(impl, registry=registry, why=why)

    @property
    def kernel(self) -> Optional[Callable[..., Any]]:
        """The callable a call of the slot runs (None when unbound): the bound kernel, or what
        `wrap_kernel` made of it."""
        return self._fn

    def wrap_kernel(self, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace the bound kernel by `wrapper(kernel)` (e.g. sequence parallelism's exchange around
        the Gated DeltaNet kernels), until the slot is bound again. The implementation name, the
        reason and the proof of dispatch are unchanged. An unbound slot cannot be wrapped."""
        if self._fn is None:
            raise RuntimeError(f"{self._label()} is not bound to a kernel (impl 'eager'): there is nothing to wrap")
        wrapped = wrapper(self._fn)
        if not callable(wrapped):
            raise TypeError(f"wrap_kernel: the wrapper returned {type(wrapped).__name__}, not a callable")
        self._fn = wrapped

    def attach(self, model: Any) -> None:
        """Record that `model` uses this slot (weakly), for the rebinding warning."""
        self._users.add(model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if fn is None:
            raise RuntimeError(
                f"{self._label()} is not bound to a kernel (impl 'eager'): a guard must check "
                f"`use_non_eager_impl` before calling it; bind it with opslot.bind_ops(module, ops) "
                f"or slot.bind('<impl>')"
            )
        self._ran = True
        return fn(*args, **kwargs)

    def __reduce__(self) -> Any:
        # Pickled as (op, variant, name, impl, why) and bound again on load: kernels are found in the
        # registry of the loading process, the users of a module-level slot are not carried over.
        return (_restore_slot, (self.op, self.variant, self.name, self._impl, self._why))

    def _label(self) -> str:
        named = f" {self.name!r}" if self.name else ""
        return f"OpSlot{named} ({self.op}/{self.variant})"

    def __repr__(self) -> str:
        named = f", name={self.name!r}" if self.name else ""
        return f"OpSlot({self.op!r}, {self.variant!r}, impl={self._impl!r}{named})"


def _restore_slot(op: str, variant: str, name: Optional[str], impl: str, why: str) -> OpSlot:
    slot = OpSlot(op, variant)
    slot.name = name
    if impl != EAGER:
        slot.bind(impl, why=why)
    else:
        slot._why = why
    return slot


def slots_in(namespace: Mapping[str, Any]) -> Dict[str, OpSlot]:
    """{name: slot} for every OpSlot among the values of `namespace` (a module's globals)."""
    return {name: value for name, value in list(namespace.items()) if isinstance(value, OpSlot)}


def module_slots(module: types.ModuleType) -> Dict[str, OpSlot]:
    """{attribute name: slot} for every OpSlot defined at the top level of `module`."""
    return slots_in(vars(module))


def slots_of_class(cls: type) -> Dict[str, OpSlot]:
    """The module-level slots the methods of `cls` read: those of the globals of its functions
    (its module's, also for a private copy no longer in sys.modules)."""
    for value in vars(cls).values():
        fn = getattr(value, "__func__", value)
        globs = getattr(fn, "__globals__", None)
        if isinstance(globs, dict) and globs.get("__name__") == cls.__module__:
            return slots_in(globs)
    module = sys.modules.get(cls.__module__)
    return module_slots(module) if module is not None else {}


def constructing_module_slots(owner: Any, caller: Optional[Mapping[str, Any]] = None) -> Tuple[str, Dict[str, OpSlot]]:
    """(module name, module-level slots) of the module constructing a model, which a saved ops
    choice must be followed by: the first class of `owner`'s type (MRO order) whose module declares
    slots, else, without an owner, the module globals `caller` (opslot.legacy_caller)."""
    if owner is not None:
        for cls in type(owner).__mro__:
            slots = slots_of_class(cls)
            if slots:
                return cls.__module__, slots
        return type(owner).__module__, {}
    if caller is None:
        return "?", {}
    return caller.get("__name__", "?"), slots_in(caller)
