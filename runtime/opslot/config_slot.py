"""`ConfigSlot`: an implementation chosen from the model config when the model is built.

A spec's `config_slot: Class.name` patch (docs/spec-format.md, "Config slots") makes patchgen set,
in `Class.__init__`:

    self.attention_kernel = ConfigSlot("ToyAttention.attention_kernel", "toy_attention_kernel",
                                       ("eager", "sdpa"), default="eager").bind_from(config)

and the code the spec patches in reads it (`if self.attention_kernel.uses("sdpa"): ...`). The value
comes from `config.toy_attention_kernel` (or the text config of a multimodal config), so it is
per model instance, is saved with the config, and two models built from one module with different
configs do not share it. A value that is not one of the declared implementations, or a missing
attribute without a default, is a ValueError when the model is built, naming the attribute, the
value and the implementations allowed: never a silent fallback. Since a config slot's `bind_from` runs
while the model is constructed, it also refuses a config carrying an `ops_implementation` that the
module's module-level slots do not follow (a model built directly from a saved config, which would
otherwise run eager where the config says a kernel; opslot.saved_choice).
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Optional, Tuple

from .checks import configs_of
from .config_attributes import CONFIG_ATTRIBUTES  # every ConfigSlot adds the attribute it reads
from .legacy_caller import caller_namespace
from .saved_choice import check_slots_follow, saved_ops
from .slot import constructing_module_slots


class ConfigSlot:
    """An implementation name read from `config.<attribute>`, one of `values`."""

    __slots__ = ("name", "attribute", "values", "default", "_value", "_why")

    def __init__(self, name: str, attribute: str, values: Iterable[str], default: Optional[str] = None) -> None:
        values = tuple(values)
        if not isinstance(name, str) or not name or not isinstance(attribute, str) or not attribute:
            raise ValueError(f"ConfigSlot needs a name and a config attribute, got {name!r}, {attribute!r}")
        if not values or not all(isinstance(v, str) and v for v in values) or len(set(values)) != len(values):
            raise ValueError(f"ConfigSlot {name!r} needs distinct, non-empty implementation names, got {values!r}")
        if default is not None and default not in values:
            raise ValueError(f"ConfigSlot {name!r}: default {default!r} is not one of {_names(values)}")
        self.name = name
        self.attribute = attribute
        CONFIG_ATTRIBUTES.setdefault(attribute, set()).add(name)
        self.values: Tuple[str, ...] = values
        self.default = default
        self._value: Optional[str] = None
        self._why = "unbound"

    @property
    def value(self) -> str:
        """The chosen implementation. Reading it before `bind_from` is a RuntimeError."""
        if self._value is None:
            raise RuntimeError(
                f"{self._label()} is not bound: call bind_from(config) (patchgen's "
                f"generated __init__ does) before reading it"
            )
        return self._value

    @property
    def why(self) -> str:
        """ "config" (the config sets the attribute), "default" or "unbound"."""
        return self._why

    def uses(self, impl: str) -> bool:
        """Whether the chosen implementation is `impl`; `impl` must be one of `values`, so a typo in
        patched code is an error, not a branch that is never taken."""
        if impl not in self.values:
            raise ValueError(
                f"{self._label()} has no implementation {impl!r}{_close_value_hint(impl, self.values)}; "
                f"its implementations: {_names(self.values)}"
            )
        return self.value == impl

    def bind_from(self, config: Any, *, owner: Any = None) -> "ConfigSlot":
        """Choose the implementation from `config` (`choose_from`). Returns self. Since it runs while
        a model is constructed (a generated `__init__`), a config carrying an `ops_implementation` (a
        saved model's) that the module-level slots of that model's module do not follow is a
        ValueError, as for instance-scoped slots: a model built directly from a saved config would
        otherwise run eager where the config says a kernel. The module is that of `owner`'s class
        (`owner=self`); without `owner`, the module whose code called bind_from (opslot.legacy_caller)."""
        caller = caller_namespace() if owner is None else None
        self.choose_from(config)
        try:
            ops = saved_ops(config)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"config.ops_implementation: {exc}") from None
        if ops is not None:
            module_name, module_level = constructing_module_slots(owner, caller)
            check_slots_follow(ops, module_level, module_name)
        return self

    def choose_from(self, config: Any) -> "ConfigSlot":
        """Choose the implementation from `config.<attribute>` (the first of the config and its text
        config that sets it, i.e. has it and not None); `default` when none does. Returns self. A value
        that is not one of `values`, or a missing attribute without a default, is a ValueError.
        (build_model checks a config with it before binding the module-level slots itself.)"""
        raw, found = _read(config, self.attribute)
        if not found:
            if self.default is None:
                raise ValueError(
                    f"{self._label()} reads config.{self.attribute}, which the model config does not set, "
                    f"and it has no default; set config.{self.attribute} to one of: {_names(self.values)}"
                )
            self._value, self._why = self.default, "default"
            return self
        if not isinstance(raw, str):
            raise ValueError(
                f"{self._label()}: config.{self.attribute} is {raw!r} ({type(raw).__name__}); "
                f"it must name one of the implementations: {_names(self.values)}"
            )
        if raw not in self.values:
            raise ValueError(
                f"{self._label()}: config.{self.attribute} is {raw!r}, which is not one of its "
                f"implementations: {_names(self.values)}{_close_value_hint(raw, self.values)}"
            )
        self._value, self._why = raw, "config"
        return self

    def _label(self) -> str:
        return f"config slot {self.name!r}"

    def __getstate__(self) -> Any:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: Any) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def __repr__(self) -> str:
        value = self._value if self._value is not None else "<unbound>"
        return (
            f"ConfigSlot({self.name!r}, config.{self.attribute}={value!r}, why={self._why!r}, values={self.values!r})"
        )


def _read(config: Any, attribute: str) -> Tuple[Any, bool]:
    """(value, True) from the first of `config` and its text config that sets `attribute` (not None)."""
    if config is None:
        return None, False
    for cfg in configs_of(config):
        value = getattr(cfg, attribute, None)
        if value is not None:
            return value, True
    return None, False


def _names(values: Iterable[str]) -> str:
    return ", ".join(repr(v) for v in values)


def _close_value_hint(word: str, values: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(values), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
