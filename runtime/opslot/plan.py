"""The binding plan: which implementation every slot of a model (or module) runs, and why.

    >>> plan = opslot.binding_plan(model)
    >>> plan
    BindingPlan of ToyMoeForCausalLM (module patched_modeling_toy_moe_gpu__opslot__eager-eager):
      slot                                        op/variant                 impl   why
      causal_lm_loss_slot                         cross_entropy_loss/causal  torch  explicit
      load_balancing_loss_slot                    load_balancing_loss/standard eager default
      model.layers.*.mlp.experts.moe_experts_slot moe/standard (x2)          torch  explicit
      attention: eager (config._attn_implementation)

`build_model` and `bind_ops` log their plan once, at INFO, on the `opslot` logger. Once the model's
first step has started, a `dispatch` column says which bound slots ran (opslot.dispatch).
`declared_slots(module)` lists the slots a generated module declares, instance-scoped ones
included (read from its source), so that a choice that binds nowhere is found before any model
is constructed; `declared_config_slots(module)` the config slots (`ConfigSlot`) it sets.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import types
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .config_slot import ConfigSlot
from .dispatch import dispatch_report
from .slot import OpSlot, slots_of_class

logger = logging.getLogger("opslot")


@dataclass(frozen=True)
class DeclaredSlot:
    """A slot a module declares: `scope` "module" (a module attribute) or "instance" (`self.<name>`
    assigned in `owner.__init__` & co.)."""

    op: str
    variant: str
    scope: str
    name: str
    owner: Optional[str] = None


_source_cache: Dict[Tuple[str, float], List[DeclaredSlot]] = {}


def _is_opslot_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "OpSlot") or (
        isinstance(func, ast.Attribute) and func.attr == "OpSlot"
    )


def _instance_slots_in_source(path: str) -> List[DeclaredSlot]:
    try:
        key = (path, os.path.getmtime(path))
    except OSError:
        return []
    if key in _source_cache:
        return _source_cache[key]
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    found: List[DeclaredSlot] = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if not isinstance(node, ast.Assign):
                continue
            targets = [
                t
                for t in node.targets
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            ]
            if not targets:
                continue
            for call in (n for n in ast.walk(node.value) if _is_opslot_call(n)):
                args = call.args
                if len(args) >= 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args[:2]):
                    found.append(DeclaredSlot(args[0].value, args[1].value, "instance", targets[0].attr, cls.name))
    _source_cache[key] = found
    return found


_config_slot_cache: Dict[Tuple[str, float], List[ConfigSlot]] = {}


def _literal_config_slot(call: ast.Call) -> Optional[ConfigSlot]:
    """The unbound ConfigSlot of a `ConfigSlot("A.x", "attr", ("a", "b"), default="a")` call whose
    arguments are literals (what patchgen writes), else None."""
    func = call.func
    if not (
        (isinstance(func, ast.Name) and func.id == "ConfigSlot")
        or (isinstance(func, ast.Attribute) and func.attr == "ConfigSlot")
    ):
        return None
    try:
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
        return ConfigSlot(*args, **kwargs)
    except (ValueError, TypeError, SyntaxError):
        return None


def declared_config_slots(module: types.ModuleType) -> List[ConfigSlot]:
    """The config slots `module`'s source declares (`ConfigSlot(...)` calls with literal arguments,
    as patchgen's config_slot patches write them), unbound, in source order; so that a config value
    they refuse is found before any model is constructed."""
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return []
    try:
        key = (path, os.path.getmtime(path))
    except OSError:
        return []
    if key not in _config_slot_cache:
        try:
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
        except (OSError, SyntaxError, ValueError):
            return []
        calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        _config_slot_cache[key] = [s for s in map(_literal_config_slot, calls) if s is not None]
    return [ConfigSlot(s.name, s.attribute, s.values, s.default) for s in _config_slot_cache[key]]


def declared_slots(module: types.ModuleType) -> List[DeclaredSlot]:
    """Every slot `module` declares: its module-level OpSlot attributes, and the instance-scoped
    `self.x = OpSlot(op, variant)...` assignments found in its source file."""
    out = [
        DeclaredSlot(slot.op, slot.variant, "module", name)
        for name, slot in sorted(vars(module).items())
        if isinstance(slot, OpSlot)
    ]
    path = getattr(module, "__file__", None)
    if path and path.endswith(".py"):
        out += _instance_slots_in_source(path)
    return out


@dataclass(frozen=True)
class PlanEntry:
    """One slot (or a group of identical instance-scoped slots, `count` of them). `dispatch`, once
    the model's first step has started (opslot.dispatch): "ran", "not reached", "not used by this
    model", or "-" for an eager slot; None before."""

    slot: str
    scope: str
    op: str
    variant: str
    impl: str
    why: str
    count: int = 1
    dispatch: Optional[str] = None


class BindingPlan:
    """What runs where: `entries` (PlanEntry), `target` (the model class or module name),
    `attention` (the model config's `_attn_implementation`, if any), `config_slots` (the model's
    ConfigSlots as PlanEntry rows with op "config", variant the config attribute, impl the value;
    listed apart: they bind no kernel), `aliases` ({field: (the reference trainer's name, opslot's)}
    the ops config was translated with, opslot.compat; from the model config's
    `ops_implementation_aliases`). Iterable over `entries`; `as_dict()` gives {slot: impl}; equal when
    the entries are."""

    def __init__(
        self,
        target: str,
        entries: List[PlanEntry],
        module: Optional[str] = None,
        attention: Optional[str] = None,
        config_slots: Optional[List[PlanEntry]] = None,
        aliases: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.target = target
        self.aliases = {field: tuple(pair) for field, pair in (aliases or {}).items()}
        self.entries = list(entries)
        self.module = module
        self.attention = attention
        self.config_slots = list(config_slots or [])

    def __iter__(self) -> Iterator[PlanEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, BindingPlan)
            and [(e.slot, e.op, e.variant, e.impl, e.count) for e in self]
            == [(e.slot, e.op, e.variant, e.impl, e.count) for e in other]
            and self.attention == other.attention
        )

    def as_dict(self) -> Dict[str, str]:
        return {e.slot: e.impl for e in self.entries}

    def ops(self) -> List[str]:
        return sorted({e.op for e in self.entries})

    def __repr__(self) -> str:
        where = f" (module {self.module})" if self.module else ""
        stepped = any(e.dispatch is not None for e in self.entries)  # the proof of dispatch, after a step
        rows = [("slot", "op/variant", "impl", "why") + (("dispatch",) if stepped else ())]
        for e in self.entries:
            count = f" (x{e.count})" if e.count > 1 else ""
            rows.append(
                (e.slot, f"{e.op}/{e.variant}{count}", e.impl, e.why) + ((e.dispatch or "-",) if stepped else ())
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = [f"BindingPlan of {self.target}{where}:"]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1])
        if not self.entries:
            lines.append("  (no slots)")
        for e in self.config_slots:
            count = f" (x{e.count})" if e.count > 1 else ""
            lines.append(f"  config slot {e.slot}{count}: {e.impl} ({e.why}, config.{e.variant})")
        if self.attention is not None:
            lines.append(f"  attention: {self.attention} (config._attn_implementation)")
        if self.aliases:
            lines.append(
                "  reference trainer's names: "
                + ", ".join(f"{field} {given!r} -> {ours!r}" for field, (given, ours) in sorted(self.aliases.items()))
            )
        return "\n".join(lines)


_INDEX = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")


def _module_entries(module: Any, dispatch: Any = None) -> List[PlanEntry]:
    items = module.items() if isinstance(module, dict) else vars(module).items()
    return [
        PlanEntry(
            name,
            "module",
            s.op,
            s.variant,
            s.impl,
            s.why,
            dispatch=dispatch.status_of(s) if dispatch is not None else None,
        )
        for name, s in sorted(items)
        if isinstance(s, OpSlot)
    ]


def binding_plan(target: Any) -> BindingPlan:
    """The binding plan of a model (its modules' module-level slots and every instance-scoped slot
    of its submodules, identical layers grouped as `layers.*`) or of a generated module."""
    if isinstance(target, types.ModuleType):
        return BindingPlan(target.__name__, _module_entries(target), module=target.__name__)
    named = getattr(target, "named_modules", None)
    if not callable(named):
        raise TypeError(
            f"binding_plan takes a model (torch.nn.Module) or a generated module, got {type(target).__name__}"
        )
    report = dispatch_report(target)  # which slots ran, once the model's first step has started
    entries: List[PlanEntry] = []
    modules_seen: Dict[str, type] = {}
    groups: Dict[Tuple[Any, ...], int] = {}
    order: List[Tuple[Any, ...]] = []
    for path, sub in named():
        modules_seen.setdefault(type(sub).__module__, type(sub))
        for attr, value in vars(sub).items():
            if isinstance(value, (OpSlot, ConfigSlot)):
                name = f"{path}.{attr}" if path else attr
                if isinstance(value, ConfigSlot):  # config/<attribute>, the chosen implementation
                    key = (_INDEX.sub("*", name), "config", value.attribute, value._value or "unbound", value.why, None)
                else:
                    key = (
                        _INDEX.sub("*", name),
                        value.op,
                        value.variant,
                        value.impl,
                        value.why,
                        report.status_of(value) if report is not None else None,
                    )
                if key not in groups:
                    order.append(key)
                    groups[key] = 0
                groups[key] += 1
    for cls in modules_seen.values():
        entries += _module_entries(slots_of_class(cls), report)
    rows = [PlanEntry(k[0], "instance", k[1], k[2], k[3], k[4], groups[k], k[5]) for k in order]
    entries += [e for e in rows if e.op != "config"]
    config = getattr(target, "config", None)
    attention = getattr(config, "_attn_implementation", None) if config is not None else None
    aliases = getattr(config, "ops_implementation_aliases", None) if config is not None else None
    aliases = aliases if isinstance(aliases, dict) else None
    return BindingPlan(
        type(target).__name__,
        entries,
        module=type(target).__module__,
        attention=attention,
        config_slots=[e for e in rows if e.op == "config"],
        aliases=aliases,
    )


def log_plan(plan: BindingPlan) -> None:
    """Log `plan` once at INFO on the `opslot` logger."""
    logger.info("%r", plan)
