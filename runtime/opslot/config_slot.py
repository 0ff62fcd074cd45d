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
otherwise run eager where the config says a kernel).
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Optional, Tuple

from .config_attributes import CONFIG_ATTRIBUTES  # every ConfigSlot adds the attribute it reads


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
                f"{self._label()} has no implementation {impl!r}{_did_you_mean(impl, self.values)}; "
                f"its implementations: {_names(self.values)}"
            )
        return self.value == impl

    def bind_from(self, config: Any) -> "ConfigSlot":
        """Choose the implementation from `config.<attribute>` (the first of the config and its text
        config that sets it, i.e. has it and not None); `default` when none does. Returns self.
        Called from a generated `__init__` with a config that carries `ops_implementation` (a saved
        model's), the module-level slots of that module must follow it (see `_checked`)."""
        raw, found = _read(config, self.attribute)
        if not found:
            if self.default is None:
                raise ValueError(
                    f"{self._label()} reads config.{self.attribute}, which the model config does not set, "
                    f"and it has no default; set config.{self.attribute} to one of: {_names(self.values)}"
                )
            self._value, self._why = self.default, "default"
            return self._checked(config)
        if not isinstance(raw, str):
            raise ValueError(
                f"{self._label()}: config.{self.attribute} is {raw!r} ({type(raw).__name__}); "
                f"it must name one of the implementations: {_names(self.values)}"
            )
        if raw not in self.values:
            raise ValueError(
                f"{self._label()}: config.{self.attribute} is {raw!r}, which is not one of its "
                f"implementations: {_names(self.values)}{_did_you_mean(raw, self.values)}"
            )
        self._value, self._why = raw, "config"
        return self._checked(config)

    def _checked(self, config: Any) -> "ConfigSlot":
        """Self, once the module being constructed (the caller of bind_from, i.e. a generated
        `__init__`) is known to follow the ops_implementation `config` carries: a model built
        directly from a saved config (`Class(config)`, `from_config`) whose module-level slots are
        not bound as it says is a ValueError, as for instance-scoped slots (checks.py)."""
        from .checks import check_caller_follows_config

        check_caller_follows_config(config, depth=2)
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
    from .checks import _configs

    for cfg in _configs(config):
        value = getattr(cfg, attribute, None)
        if value is not None:
            return value, True
    return None, False


def _names(values: Iterable[str]) -> str:
    return ", ".join(repr(v) for v in values)


def _did_you_mean(word: str, values: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(values), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
