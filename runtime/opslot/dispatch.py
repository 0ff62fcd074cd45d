"""Proof of dispatch: which bound slots of a model actually ran in its first forward and backward.

Every call of a bound kernel sets its slot's flag (`OpSlot.__call__`: one attribute store). After a
model's first training step, each slot bound to a kernel (not "eager") is one of:

- "ran": its kernel was called;
- "not used by this model": no guard of the slot is in code the model can reach: the class that
  holds the guard is not instantiated (e.g. the dense-MLP slot of an all-sparse MoE), the guarded
  function is referenced by no class the model instantiates, or the module declares the slot
  without a guard and reads it nowhere (DeepSeek-V4's `rms_norm_slot`, guarded only before
  Transformers 5.23, beside the guarded `rms_norm_unweighted_slot` that the same
  `rms_norm_implementation` binds). Not an error;
- "not reached": the model can reach the guard's code but the kernel did not run: the class that
  holds the guard is instantiated (as the generated class, or as its upstream original, e.g. a
  sub-model built by upstream's `AutoModel.from_config`), or a class it instantiates references the
  guarded function (then a branch, such as `if self.config.rope_interleave:`, took another way: unless
  another slot of the same op, guarding a function called in that other branch, ran; then the model's
  config chose that variant and this slot is "not used"), or
  the guard is in another task head's forward (`*ForCausalLM.forward`) and this model is a head too
  (`*ForConditionalGeneration`, `*ForSequenceClassification`, ...) in which no slot of the op ran:
  upstream code computed what the user asked a kernel for.

A "not reached" slot whose kernel was asked for (`explicit`, `direct`, a per-op OPSLOT_FORCE_IMPL, or
a restored binding the saved ops config names) is an `UnreachedSlotError`, unless its op is in
`allow_unreached` (then a warning); one chosen by the device defaults is an `UnreachedSlotWarning`.

When: `watch_dispatch(model)` (build_model calls it) installs a forward pre-hook and a forward hook on
the root module. The first forward clears the flags of the model's slots; when its outputs carry a
graph, tensor hooks on them queue the check at the end of the first backward through them
(`queue_callback`), else the check runs when the forward returns; a second forward before any such
backward checks the first one. Then the hooks remove themselves. Under torch.compile the hooks do
nothing (the flags still count): call `check_dispatch(model)` after the first step. `binding_plan`
shows the status of every slot once a step has started. See docs/runtime.md, "Proof of dispatch".
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import logging
import os
import re
import sys
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import torch

from .copy_names import original_name
from .ops import FIELD_FOR_OP, KNOWN_OPS
from .slot import OpSlot, slots_of_class

logger = logging.getLogger("opslot")

RAN = "ran"
NOT_REACHED = "not reached"
NOT_USED = "not used by this model"
EAGER_STATUS = "-"  # an eager slot runs upstream's code: there is no kernel whose call to prove

#: Attribute of the model (pickled with it) holding its `allow_unreached` choice.
ALLOW_ATTR = "_opslot_allow_unreached"

_HEAD = re.compile(r"For[A-Z]")  # Transformers' task heads: *ForCausalLM, *ForConditionalGeneration, ...


class UnreachedSlotError(RuntimeError):
    """Bound kernels that the model could reach did not run (see the module docstring)."""

    def __init__(self, message: str, report: "DispatchReport") -> None:
        super().__init__(message)
        self.report = report


class UnreachedSlotWarning(RuntimeWarning):
    """As UnreachedSlotError, for default kernels and ops in `allow_unreached`."""


# -- the source of a generated module: where its guards are, what references what ----------------------
@dataclass(frozen=True)
class Guard:
    """A `<slot>.use_non_eager_impl` test: `slot` is the module attribute (scope "module") or the
    `self.<slot>` attribute (scope "instance"); `owner` the qualified name of the class whose method
    (`function`) holds it, None for a module-level function."""

    slot: str
    scope: str
    owner: Optional[str]
    function: str
    line: int


@dataclass(frozen=True)
class RefSite:
    """Where a name is first referenced in a class or function: the method, the enclosing `if`
    tests (outermost first, with True for their else branch) and the line."""

    method: str
    conditions: Tuple[Tuple[str, bool], ...]
    line: int


@dataclass
class SourceIndex:
    upstream: Optional[str]  # the module it was generated from (patchgen's header)
    guards: List[Guard]
    class_refs: Dict[str, Dict[str, RefSite]]  # class qualname -> names its body and methods read
    func_refs: Dict[str, Dict[str, RefSite]]  # top-level function or assigned name -> names it reads
    decorators: Dict[Tuple[str, Optional[str]], List[str]]  # (class, method or None) -> decorator source


class _Collector(ast.NodeVisitor):
    def __init__(self, owner: Optional[str], method: str, names: Dict[str, RefSite], guards: List[Guard]) -> None:
        self.owner, self.method, self.names, self.guards = owner, method, names, guards
        self.cond: List[Tuple[str, bool]] = []

    def _branches(self, test: ast.AST, body: List[ast.AST], orelse: List[ast.AST]) -> None:
        self.visit(test)
        text = ast.unparse(test)
        for in_else, nodes in ((False, body), (True, orelse)):
            self.cond.append((text, in_else))
            for node in nodes:
                self.visit(node)
            self.cond.pop()

    def visit_If(self, node: ast.If) -> None:
        self._branches(node.test, node.body, node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._branches(node.test, [node.body], [node.orelse])

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.names.setdefault(node.id, RefSite(self.method, tuple(self.cond), node.lineno))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "use_non_eager_impl":
            value = node.value
            if isinstance(value, ast.Name):
                self.guards.append(Guard(value.id, "module", self.owner, self.method, node.lineno))
            elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self":
                self.guards.append(Guard(value.attr, "instance", self.owner, self.method, node.lineno))
        self.generic_visit(node)


_UPSTREAM = re.compile(r"^#\s+upstream:\s+([\w.]+)", re.MULTILINE)
_index_cache: Dict[Tuple[str, float], SourceIndex] = {}


def _index_class(node: ast.ClassDef, prefix: str, index: SourceIndex) -> None:
    qual = prefix + node.name
    names: Dict[str, RefSite] = {}
    index.decorators[(qual, None)] = [ast.unparse(d) for d in node.decorator_list]
    for stmt in node.body:
        if isinstance(stmt, ast.ClassDef):
            _index_class(stmt, qual + ".", index)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            index.decorators[(qual, stmt.name)] = [ast.unparse(d) for d in stmt.decorator_list]
            collector = _Collector(qual, stmt.name, names, index.guards)
            for inner in stmt.body:
                collector.visit(inner)
        else:
            _Collector(qual, "<class body>", names, index.guards).visit(stmt)
    index.class_refs[qual] = names


def source_index(path: Optional[str]) -> Optional[SourceIndex]:
    """The guards and name references of the Python file `path` (cached by modification time);
    None when it cannot be read."""
    if not path or not path.endswith(".py"):
        return None
    try:
        key = (path, os.path.getmtime(path))
    except OSError:
        return None
    if key in _index_cache:
        return _index_cache[key]
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        tree = ast.parse(text, path)
    except (OSError, SyntaxError, ValueError):
        return None
    match = _UPSTREAM.search(text[:4000])
    index = SourceIndex(match.group(1) if match else None, [], {}, {}, {})
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            _index_class(node, "", index)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names: Dict[str, RefSite] = {}
            collector = _Collector(None, node.name, names, index.guards)
            for inner in node.body:
                collector.visit(inner)
            index.func_refs[node.name] = names
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names = index.func_refs.setdefault(target.id, {})
                    _Collector(None, target.id, names, index.guards).visit(node.value)
    _index_cache[key] = index
    return index


def _reach(index: SourceIndex, classes: Iterable[str]) -> Dict[str, Tuple[str, str, RefSite]]:
    """Module-level functions (and assigned names) referenced, directly or through one another, by
    the code of `classes`: {name: (the class it is reached from, the direct caller, its site)}."""
    found: Dict[str, Tuple[str, str, RefSite]] = {}
    queue: List[str] = []
    for cls in classes:
        for name, site in index.class_refs.get(cls, {}).items():
            if name in index.func_refs and name not in found:
                found[name] = (cls, f"{cls}.{site.method}", site)
                queue.append(name)
    while queue:
        caller = queue.pop(0)
        for name, site in index.func_refs[caller].items():
            if name in index.func_refs and name not in found:
                found[name] = (found[caller][0], caller, site)
                queue.append(name)
    return found


# -- the slots of a model ------------------------------------------------------------------------------
@dataclass
class _SlotRef:
    slot: OpSlot
    name: str  # the module attribute, or the submodule path + attribute (as binding_plan names it)
    scope: str
    module: str  # name of the module whose source holds the guards (a private copy's name)
    globs: Dict[str, Any]  # that module's globals
    owner: Optional[type] = None  # instance scope: the class of the submodule holding the slot
    path: str = ""
    twins: Tuple[OpSlot, ...] = ()  # module scope: the same slot in earlier instances of this copy

    @property
    def ran(self) -> bool:
        return self.slot._ran or any(t._ran for t in self.twins)


#: Module objects seen per module name. A private copy released by build_model and imported again
#: under the same name (its name is its binding) is a new module object, but code compiled by
#: torch.compile reaches the module-level slots of an inlined function through an alias to the module
#: that Dynamo keeps by name (`__import_<name>` in the compiled frame's globals): the earlier instance
#: of the copy. Its slots are the same binding, so their flags count for the slots of the new one.
_MODULES: Dict[str, "weakref.WeakSet[types.ModuleType]"] = {}


def _twins(modname: str, globs: Dict[str, Any], name: str, slot: OpSlot) -> Tuple[OpSlot, ...]:
    module = sys.modules.get(modname)
    if module is not None and vars(module) is globs:
        _MODULES.setdefault(modname, weakref.WeakSet()).add(module)
    out = []
    for other in list(_MODULES.get(modname, ())):
        twin = vars(other).get(name)
        if vars(other) is not globs and isinstance(twin, OpSlot) and twin.impl == slot.impl and twin.op == slot.op:
            out.append(twin)
    return tuple(out)


def _globals_of(modname: str, classes: Iterable[type]) -> Dict[str, Any]:
    for cls in classes:
        for value in vars(cls).values():
            fn = getattr(value, "__func__", value)
            globs = getattr(fn, "__globals__", None)
            if isinstance(globs, dict) and globs.get("__name__") == modname:
                return globs
    module = sys.modules.get(modname)
    return vars(module) if module is not None else {}


def _slot_refs(model: Any) -> List[_SlotRef]:
    refs: List[_SlotRef] = []
    classes: Dict[str, List[type]] = {}
    seen: Set[int] = set()
    for path, sub in model.named_modules():
        for k in type(sub).__mro__:
            if id(k) not in seen:
                seen.add(id(k))
                classes.setdefault(k.__module__, []).append(k)
        for attr, value in vars(sub).items():
            if isinstance(value, OpSlot):
                cls = type(sub)
                globs = _globals_of(cls.__module__, [k for k in cls.__mro__ if k.__module__ == cls.__module__])
                refs.append(
                    _SlotRef(value, f"{path}.{attr}" if path else attr, "instance", cls.__module__, globs, cls, path)
                )
    for modname, members in classes.items():
        slots: Dict[str, OpSlot] = {}
        for cls in members:
            slots = slots_of_class(cls)
            if slots:
                break
        if not slots:
            continue
        globs = _globals_of(modname, members)
        refs += [
            _SlotRef(slot, name, "module", modname, globs, twins=_twins(modname, globs, name, slot))
            for name, slot in sorted(slots.items())
        ]
    return refs


def _instances(model: Any) -> Dict[Tuple[str, str], str]:
    """(original module name, class qualname) -> path of the first submodule of that class (or a
    subclass); the root's path is ""."""
    out: Dict[Tuple[str, str], str] = {}
    for path, sub in model.named_modules():
        for k in type(sub).__mro__:
            out.setdefault((original_name(k.__module__), k.__qualname__), path)
    return out


def _where(path: str) -> str:
    return f"model.{path}" if path else "the model itself"


def _config_values(model: Any, tests: Iterable[str]) -> str:
    """`config.X=value` for the names the `tests` read that the model config (or its text config)
    has, e.g. "config.rope_interleave=True"."""
    config = getattr(model, "config", None)
    configs = [c for c in (config, getattr(config, "text_config", None)) if c is not None]
    found: Dict[str, str] = {}
    for test in tests:
        try:
            tree = ast.parse(test, mode="eval")
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in (None, "self", "config", "kwargs") or name in found:
                continue
            for cfg in configs:
                try:
                    value = getattr(cfg, name, None)
                except Exception:  # a config property that cannot answer
                    value = None
                if value is not None and not callable(value):
                    found[name] = f"config.{name}={value!r}"
                    break
    return f" (here {', '.join(found.values())})" if found else ""


# -- classification ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DispatchEntry:
    """One slot (or `count` identical instance-scoped ones) after a step: `status` is "ran", "not
    reached", "not used by this model" or "-" (eager); `severity` "error" or "warning" for "not
    reached", else ""; `hint` the likely cause."""

    slot: str
    scope: str
    op: str
    variant: str
    impl: str
    why: str
    status: str
    hint: str = ""
    severity: str = ""
    count: int = 1


class DispatchReport:
    """The proof of dispatch of one model: `entries` (DispatchEntry), `errors` and `warnings` (the
    "not reached" entries by severity). `as_dict()` gives {slot: status}."""

    def __init__(self, target: str, entries: List[DispatchEntry], by_id: Dict[int, str]) -> None:
        self.target = target
        self.entries = entries
        self._by_id = by_id

    @property
    def errors(self) -> List[DispatchEntry]:
        return [e for e in self.entries if e.severity == "error"]

    @property
    def warnings(self) -> List[DispatchEntry]:
        return [e for e in self.entries if e.severity == "warning"]

    def status_of(self, slot: OpSlot) -> Optional[str]:
        return self._by_id.get(id(slot))

    def as_dict(self) -> Dict[str, str]:
        return {e.slot: e.status for e in self.entries}

    def __repr__(self) -> str:
        rows = [("slot", "op/variant", "impl", "status")] + [
            (e.slot, f"{e.op}/{e.variant}" + (f" (x{e.count})" if e.count > 1 else ""), e.impl, e.status)
            for e in self.entries
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"DispatchReport of {self.target}:"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
        return "\n".join(lines)


def _normalize_allow(allow: Any) -> Union[bool, Tuple[str, ...]]:
    if allow is None or allow is False:
        return ()
    if allow is True:
        return True
    ops = (allow,) if isinstance(allow, str) else tuple(allow)
    known = sorted(set(KNOWN_OPS) | (set(FIELD_FOR_OP) - {"attn"}))
    for op in ops:
        if not isinstance(op, str) or op not in known:
            close = difflib.get_close_matches(str(op).replace("_implementation", ""), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"allow_unreached: {op!r} is not an op{hint}; it takes True or a list of ops: {', '.join(known)}"
            )
    return tuple(sorted(set(ops)))


def _requested(slot: OpSlot, model: Any) -> bool:
    """Whether the user asked for this slot's kernel (else a device default chose it)."""
    why = slot.why
    if why in ("explicit", "direct"):
        return True
    if why.startswith("forced ("):  # the per-op form of OPSLOT_FORCE_IMPL names the op: strict
        text = why[len("forced (") :].split(";")[0].rstrip(")").split("=", 1)[-1]
        return any(piece.split("=")[0].strip() == slot.op for piece in text.split(",") if "=" in piece)
    if why.startswith("restored"):  # a re-created copy: explicit when the saved ops config names the op
        saved = getattr(getattr(model, "config", None), "ops_implementation", None)
        saved = saved.to_dict() if hasattr(saved, "to_dict") else saved
        return isinstance(saved, dict) and FIELD_FOR_OP.get(slot.op) in saved
    return False


class _Classifier:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.instances = _instances(model)
        self.refs = _slot_refs(model)
        self.ran_ops = {r.slot.op for r in self.refs if r.slot.use_non_eager_impl and r.ran}
        self.root = type(model)

    def status(self, ref: _SlotRef) -> Tuple[str, str]:
        slot = ref.slot
        if not slot.use_non_eager_impl:
            return EAGER_STATUS, ""
        if ref.ran:
            return RAN, ""
        index = source_index(ref.globs.get("__file__"))
        if index is None:
            return NOT_REACHED, f"opslot cannot read the source of {ref.module} to locate its guards"
        gen = original_name(ref.module)
        attr = ref.name.rsplit(".", 1)[-1]
        owners = None
        if ref.scope == "instance" and ref.owner is not None:
            owners = {k.__qualname__ for k in ref.owner.__mro__ if original_name(k.__module__) == gen}
        guards = [
            g for g in index.guards if g.slot == attr and g.scope == ref.scope and (owners is None or g.owner in owners)
        ]
        if not guards:
            if ref.scope == "module" and not _reads(index, attr):
                # declared without a guard (patchgen's header: "slots without a guard", e.g. a guard
                # kept for other upstream releases): no code of the module can dispatch through it
                return NOT_USED, f"declared without a guard: nothing in {gen} dispatches through it"
            return NOT_REACHED, f"no guard in {gen} tests it"
        for guard in guards:
            hint = self._reachable(guard, ref, index, gen)
            if hint is not None:
                return NOT_REACHED, hint
        return NOT_USED, ""

    def _module_class(self, ref: _SlotRef, qualname: str) -> Optional[type]:
        obj: Any = ref.globs.get(qualname.split(".")[0])
        for part in qualname.split(".")[1:]:
            obj = getattr(obj, part, None)
        return obj if isinstance(obj, type) else None

    def _reachable(self, guard: Guard, ref: _SlotRef, index: SourceIndex, gen: str) -> Optional[str]:
        """The likely cause when the model can reach `guard` (it then should have run), else None."""
        up = index.upstream
        cls = self._module_class(ref, guard.owner) if guard.owner else None
        if guard.owner is not None and (cls is None or issubclass(cls, torch.nn.Module)):
            where = f"{guard.owner}.{guard.function}"
            path = self.instances.get((gen, guard.owner))
            if path is not None:
                return self._method_hint(guard, ref, index, path)
            up_path = self.instances.get((up, guard.owner)) if up else None
            if up_path is not None:
                return (
                    f"{self._upstream_root(up_path, up)}, so {_where(up_path)} is upstream's {guard.owner}, not "
                    f"the generated class whose {where} holds the guard"
                )
            # Another head's forward (the causal-LM loss guard): upstream code computed this head's
            # loss, unless the model's own head dispatches that op itself (a guard of the op in a
            # generated class it instantiates: a *ForSequenceClassification's `loss_function`). A guard
            # outside a forward (that `loss_function`) is never another head's loss path: "not used".
            if (
                _HEAD.search(guard.owner.rsplit(".", 1)[-1])
                and guard.function == "forward"
                and ref.slot.op not in self.ran_ops
                and not self._own_guard_of_op(ref, index, gen)
            ):
                head = next((k for k in self.root.__mro__ if original_name(k.__module__) == gen), None)
                if head is not None and _HEAD.search(head.__name__):
                    return (
                        f"the guard is in {where}, and this model is a {head.__name__}, whose forward "
                        f"computes its output and loss with upstream code that has no guard (a multimodal "
                        f"*ForConditionalGeneration or a classification head never calls {where})"
                    )
            return None
        target = guard.function if guard.owner is None else guard.owner.split(".")[0]
        generated = [q for (m, q) in self.instances if m == gen]
        found = _reach(index, generated)
        if target in found:
            start, caller, site = found[target]
            if self._other_branch_ran(ref, index, start, caller, site):
                return None  # the model's config takes the other branch, where the op's kernel ran
            branch = ""
            if site.conditions:
                parts = [f"the else branch of `if {t}:`" if in_else else f"`if {t}:`" for t, in_else in site.conditions]
                branch = " under " + " within ".join(reversed(parts))
                branch += _config_values(self.model, [t for t, _ in site.conditions])
            path = self.instances[(gen, start)]
            who = f"the model instantiates {start} ({_where(path)}), whose code" if path else "the model's own code"
            return f"{who} calls {target} from {caller}{branch}, but that call did not happen in this step"
        upstream = [q for (m, q) in self.instances if up and m == up]
        found = _reach(index, upstream)
        if target in found:
            start = found[target][0]
            path = self.instances[(up, start)]
            return (
                f"{self._upstream_root(path, up)}, so {_where(path)} is upstream's {start}, which calls "
                f"upstream's {target}, not the generated one that holds the guard"
            )
        return None

    def _other_branch_ran(self, ref: _SlotRef, index: SourceIndex, start: str, caller: str, site: RefSite) -> bool:
        """Whether `caller` (the method of `start`, or the function, that calls the guarded function
        at `site`) calls, in the other branch of one of the `if` tests around `site`, a function
        guarded by another module-level slot of the same op that ran: two variants of one op chosen
        by the model's config (DeepSeek-V3's `if self.config.rope_interleave:` between its
        interleaved and its rotate_half RoPE), of which the config took the other."""
        if not site.conditions:
            return False
        refs = index.func_refs.get(caller)
        if refs is None:
            refs = {n: s for n, s in index.class_refs.get(start, {}).items() if s.method == site.method}
        ran = {r.name for r in self.refs if r.scope == "module" and r.module == ref.module and r.ran}
        for name, other in refs.items():
            if not any(
                g.owner is None
                and g.function == name
                and g.scope == "module"
                and g.slot != ref.name
                and g.slot in ran
                and getattr(ref.globs.get(g.slot), "op", None) == ref.slot.op
                for g in index.guards
            ):
                continue
            for i, (test, in_else) in enumerate(site.conditions):
                if other.conditions[:i] == site.conditions[:i] and other.conditions[i : i + 1] == (
                    (test, not in_else),
                ):
                    return True
        return False

    def _own_guard_of_op(self, ref: _SlotRef, index: SourceIndex, gen: str) -> bool:
        """Whether a module-level slot of `ref`'s op has a guard in a generated class the model
        instantiates."""
        return any(
            g.scope == "module"
            and g.owner is not None
            and (gen, g.owner) in self.instances
            and getattr(ref.globs.get(g.slot), "op", None) == ref.slot.op
            for g in index.guards
        )

    def _upstream_root(self, path: str, up: str) -> str:
        """ "model.X is upstream's <module>.<Class> (built by upstream code, ...)" for the outermost
        submodule on `path` whose class is upstream's."""
        parts = path.split(".") if path else []
        for i in range(len(parts) + 1):
            prefix = ".".join(parts[:i])
            sub = self.model.get_submodule(prefix) if prefix else self.model
            if original_name(type(sub).__module__) == up:
                return (
                    f"{_where(prefix)} is upstream's {up}.{type(sub).__qualname__} (a sub-model built by "
                    f"upstream code, e.g. AutoModel.from_config)"
                )
        return f"{_where(path)} is upstream's code"

    def _method_hint(self, guard: Guard, ref: _SlotRef, index: SourceIndex, path: str) -> str:
        where = f"{guard.owner}.{guard.function}"
        sub = self.model.get_submodule(path) if path else self.model
        experts = None
        for holder in (sub, self.model):
            config = getattr(holder, "config", None)
            if config is not None and getattr(config, "_experts_implementation", None) is not None:
                experts = config._experts_implementation
                break
        decorators = index.decorators.get((guard.owner, None), []) + index.decorators.get(
            (guard.owner, guard.function), []
        )
        if ref.slot.op == "moe" and experts not in (None, "eager"):
            return (
                f"config._experts_implementation is {experts!r}: Transformers' @use_experts_implementation runs "
                f"its {experts!r} experts and never calls the eager {where} that holds the guard (build_model "
                f"sets 'eager' when a moe slot runs a kernel; an experts_implementation given to from_pretrained "
                f"or set_experts_implementation overrides it)"
            )
        decorated = [
            d
            for d in decorators
            if d.split("(")[0].rsplit(".", 1)[-1]
            not in ("auto_docstring", "can_return_tuple", "staticmethod", "classmethod", "property", "getter", "setter")
        ]
        by = (
            f" ({guard.owner} is decorated with {', '.join('@' + d for d in decorated)}, which can dispatch elsewhere)"
            if decorated
            else ""
        )
        return (
            f"{_where(path)} is a {guard.owner}, but {where} did not run its guard{by}: the model's forward "
            f"does not reach it in this configuration (another branch, an early return, or a replaced forward)"
        )


def _reads(index: SourceIndex, name: str) -> bool:
    """Whether any class or function of the indexed module reads `name`."""
    return any(name in refs for refs in (*index.class_refs.values(), *index.func_refs.values()))


def _classify(model: Any, allow: Union[bool, Tuple[str, ...]]) -> DispatchReport:
    classifier = _Classifier(model)
    index_re = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")
    groups: Dict[Tuple[str, ...], List[Any]] = {}
    by_id: Dict[int, str] = {}
    for ref in classifier.refs:
        slot = ref.slot
        status, hint = classifier.status(ref)
        by_id[id(slot)] = status
        severity = ""
        if status == NOT_REACHED:
            allowed = allow is True or slot.op in allow
            severity = "error" if _requested(slot, model) and not allowed else "warning"
        name = index_re.sub("*", ref.name) if ref.scope == "instance" else ref.name
        key = (name, ref.scope, slot.op, slot.variant, slot.impl, slot.why, status, severity)
        if key in groups:
            groups[key][1] += 1
        else:
            groups[key] = [hint, 1]
    entries = [
        DispatchEntry(k[0], k[1], k[2], k[3], k[4], k[5], k[6], hint, k[7], count)
        for k, (hint, count) in groups.items()
    ]
    return DispatchReport(type(model).__name__, entries, by_id)


def _message(report: DispatchReport, entries: List[DispatchEntry], error: bool) -> str:
    lines = [
        f"opslot: {report.target} did not run {len(entries)} bound kernel(s) in its first forward and "
        f'backward, although the model can reach their guarded code (binding_plan says "not reached"):'
    ]
    for e in entries:
        count = f" (x{e.count})" if e.count > 1 else ""
        lines.append(f"  - {e.slot}{count} ({e.op}/{e.variant} -> {e.impl!r}, {e.why}): {e.hint}")
    ops = sorted({e.op for e in entries})
    if error:
        lines.append(
            f"Fix the cause, remove the field(s) from the ops config, or let these ops run upstream code with "
            f"a warning: build_model(..., allow_unreached=[{', '.join(repr(op) for op in ops)}]) "
            f"(or allow_unreached=True)."
        )
    else:
        lines.append("These run upstream code instead (device defaults and ops in allow_unreached are warnings).")
    return "\n".join(lines)


def _raise_or_warn(report: DispatchReport) -> None:
    if report.warnings:
        warnings.warn(_message(report, report.warnings, error=False), UnreachedSlotWarning, stacklevel=3)
    if report.errors:
        raise UnreachedSlotError(_message(report, report.errors, error=True), report)
    ran = sum(e.count for e in report.entries if e.status == RAN)
    logger.info(
        "opslot: %s ran %d bound kernel(s) in its first step; proof of dispatch: %s",
        report.target,
        ran,
        ", ".join(f"{e.slot}={e.status}" for e in report.entries if e.status != EAGER_STATUS) or "no kernels",
    )


# -- when: hooks on the root module --------------------------------------------------------------------
_IDLE, _FORWARD, _AWAIT, _DONE = range(4)


class _Watch:
    __slots__ = ("phase", "queued", "report", "slots", "__weakref__")

    def __init__(self) -> None:
        self.phase = _IDLE
        self.queued = False
        self.report: Optional[DispatchReport] = None
        self.slots: List[OpSlot] = []


_WATCHES: "weakref.WeakKeyDictionary[Any, _Watch]" = weakref.WeakKeyDictionary()


def _watch(model: Any) -> _Watch:
    state = _WATCHES.get(model)
    if state is None:
        state = _WATCHES[model] = _Watch()
    return state


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None) or torch._dynamo.is_compiling
    return bool(check())


def _allow_of(model: Any) -> Union[bool, Tuple[str, ...]]:
    return getattr(model, "__dict__", {}).get(ALLOW_ATTR, ())


def _clear_flags(model: Any, state: _Watch) -> None:
    """Clear the flags of the model's bound slots, except those another model's open step shares
    (a module-level slot of a private copy is shared by the models of one binding)."""
    state.slots = [s for r in _slot_refs(model) if r.slot.use_non_eager_impl for s in (r.slot,) + r.twins]
    busy = {
        id(s)
        for other, st in list(_WATCHES.items())
        if other is not model and st.phase in (_FORWARD, _AWAIT)
        for s in st.slots
    }
    for slot in state.slots:
        if id(slot) not in busy:
            slot._ran = False


def _remove_hooks(model: Any) -> None:
    for hooks in (model._forward_pre_hooks, model._forward_hooks):
        for key, hook in list(hooks.items()):
            if hook is _pre_hook or hook is _post_hook:
                del hooks[key]
                for extra in (
                    "_forward_pre_hooks_with_kwargs",
                    "_forward_hooks_with_kwargs",
                    "_forward_hooks_always_called",
                ):
                    getattr(model, extra, {}).pop(key, None)


def _finish(model: Any, state: _Watch) -> DispatchReport:
    state.phase = _DONE
    _remove_hooks(model)
    state.report = _classify(model, _allow_of(model))
    _raise_or_warn(state.report)
    return state.report


def _output_tensors(output: Any, depth: int = 0) -> List[torch.Tensor]:
    if torch.is_tensor(output):
        return [output]
    if depth > 1:
        return []
    if isinstance(output, dict):  # Transformers' ModelOutput
        values: Iterable[Any] = output.values()
    elif isinstance(output, (tuple, list)):
        values = output
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        values = (getattr(output, f.name) for f in dataclasses.fields(output))
    else:
        values = ()
    return [t for v in values for t in _output_tensors(v, depth + 1)]


def _pre_hook(model: Any, args: Any) -> None:
    if _compiling():
        return None
    state = _watch(model)
    if state.phase == _DONE:
        _remove_hooks(model)
    elif state.phase == _AWAIT:  # the first step's outputs were never back-propagated: check its forward
        _finish(model, state)
    else:  # the first forward (or again, after a first forward that raised)
        _clear_flags(model, state)
        state.phase = _FORWARD
    return None


def _post_hook(model: Any, args: Any, output: Any) -> None:
    if _compiling():
        return None
    state = _WATCHES.get(model)
    if state is None or state.phase != _FORWARD:
        return None
    tensors = [t for t in _output_tensors(output) if t.requires_grad]
    if not tensors:  # no graph (no_grad, inference, eval): the step is this forward
        _finish(model, state)
        return None
    state.phase, state.queued = _AWAIT, False
    ref = weakref.ref(model)
    for tensor in tensors:
        tensor.register_hook(functools.partial(_on_grad, ref))
    return None


def _on_grad(ref: Any, grad: Any) -> None:
    model = ref()
    state = _WATCHES.get(model) if model is not None else None
    if state is not None and state.phase == _AWAIT and not state.queued:
        state.queued = True
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_after_backward, ref))
    return None


def _after_backward(ref: Any) -> None:
    model = ref()
    state = _WATCHES.get(model) if model is not None else None
    if state is not None and state.phase == _AWAIT:
        _finish(model, state)


# -- public API ----------------------------------------------------------------------------------------
def watch_dispatch(model: Any, allow_unreached: Any = False) -> Any:
    """Check `model`'s first step automatically (build_model calls this): hooks on the root module,
    removed after the check. `allow_unreached`: False (default), True, or ops (e.g. ["rotary_pos_emb"])
    whose unreached kernels are a warning instead of an error. Idempotent; returns `model`."""
    allow = _normalize_allow(allow_unreached)
    model.__dict__[ALLOW_ATTR] = allow
    hooks = list(model._forward_pre_hooks.values()) + list(model._forward_hooks.values())
    if _pre_hook not in hooks:
        model.register_forward_pre_hook(_pre_hook)
    if _post_hook not in hooks:
        model.register_forward_hook(_post_hook)
    state = _watch(model)
    state.phase, state.report = _IDLE, None
    _clear_flags(model, state)
    return model


def check_dispatch(model: Any, *, allow_unreached: Any = None) -> DispatchReport:
    """Check now which bound slots of `model` ran since its first forward (or since it was built or
    watched): raises UnreachedSlotError for kernels asked for that the model could reach and did not
    run, warns (UnreachedSlotWarning) for default ones and ops in `allow_unreached` (default: the
    model's own choice, from build_model). For models built another way, or compiled. Returns the
    report; binding_plan(model) shows it."""
    if not hasattr(model, "named_modules"):
        raise TypeError(f"check_dispatch takes a model (torch.nn.Module), got {type(model).__name__}")
    allow = _allow_of(model) if allow_unreached is None else _normalize_allow(allow_unreached)
    state = _watch(model)
    state.phase = _DONE
    _remove_hooks(model)
    state.report = _classify(model, allow)
    _raise_or_warn(state.report)
    return state.report


def dispatch_report(model: Any) -> Optional[DispatchReport]:
    """The model's proof of dispatch without raising: the report of its check when done, the live
    state during its first step, None before its first forward (or when it is not watched)."""
    state = _WATCHES.get(model)
    if state is None or state.phase == _IDLE:
        return None
    if state.report is not None:
        return state.report
    return _classify(model, _allow_of(model))
