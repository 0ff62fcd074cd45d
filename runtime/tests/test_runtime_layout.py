"""The runtime's layout (issue #34): its modules depend on each other one way (no import circle, not
even one held together by a function-local import), no module inspects the call stack but the one
that says so (opslot.legacy_caller, for the calls of generated files that do not name their owner),
and `import opslot` registers no kernel before one is asked for."""

import ast
import os
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

import opslot

PACKAGE = Path(opslot.__file__).resolve().parent

#: Import circles the runtime still has: none.
KNOWN_CIRCLES: list = []


def _modules():
    """{dotted name: path} of every module of the opslot package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_only(tree):
    """The import nodes inside `if TYPE_CHECKING:` blocks (annotations only: no dependency at run time)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    return skip


def import_graph():
    """{module: {imported opslot module}} over every import statement, function-local ones included."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        skip = _type_checking_only(tree)
        edges = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                target = (base + "." + node.module if node.module else base) if node.level else node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                edges |= set(subs)
                if len(subs) < len(node.names) and target in modules:
                    edges.add(target)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
        graph[name] = edges - {name}
    return graph


def _circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _reached(graph, start):
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_modules_import_each_other_one_way():
    circles = [sorted(c) for c in _circles(import_graph()) if c not in KNOWN_CIRCLES]
    assert circles == []


def test_the_checks_and_the_ops_config_sit_below_the_slots():
    graph = import_graph()
    above = {"opslot.slot", "opslot.copies", "opslot.binding", "opslot.config_slot", "opslot.plan", "opslot.hf"}
    assert _reached(graph, "opslot.checks") & above == set()  # checks -> copies -> slot -> checks was a circle
    assert _reached(graph, "opslot.ops_config") & above == set()
    assert _reached(graph, "opslot.saved_choice") & above == set()
    assert "opslot.slot" not in _reached(graph, "opslot.copy_names")


def test_the_ops_config_imports_no_kernel_and_no_transformers():
    graph = import_graph()
    reached = _reached(graph, "opslot.ops_config")
    assert "opslot.packing" not in reached  # it imports Transformers
    # only the CUDA library probe (device_defaults), imported when a CUDA default is first asked for
    assert {m for m in reached if m.startswith("opslot.kernels")} <= {"opslot.kernels.cuda._lib"} | _reached(
        graph, "opslot.kernels.cuda._lib"
    )


FRAME_NAMES = {"_getframe", "currentframe", "stack", "getouterframes", "getinnerframes", "_current_frames"}
FRAME_ATTRIBUTES = {"f_back", "f_globals", "f_locals", "tb_frame"}


def _frame_uses(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = getattr(node.value, "id", None)
            if (node.attr in FRAME_NAMES and owner in ("sys", "inspect")) or node.attr in FRAME_ATTRIBUTES:
                uses.append(f"{path.name}:{node.lineno}: {owner or '<expr>'}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("sys", "inspect"):
            uses += [
                f"{path.name}:{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if a.name in FRAME_NAMES
            ]
    return uses


def test_no_module_inspects_the_call_stack_but_legacy_caller():
    uses = {name: _frame_uses(path) for name, path in _modules().items()}
    assert {name: u for name, u in uses.items() if u and name != "opslot.legacy_caller"} == {}
    assert sorted(u.split(": ", 1)[1] for u in uses["opslot.legacy_caller"]) == ["<expr>.f_globals", "sys._getframe"]


def _module_with_a_slot(name):
    """A stand-in for a generated module: a module-level slot left eager, and a class."""
    module = types.ModuleType(name)
    exec(
        "from opslot import OpSlot\n"
        "rms_norm_slot = OpSlot('rms_norm', 'standard')\n"
        "class Layer:\n"
        "    def __init__(self, config, owner):\n"
        "        self.experts = OpSlot('moe', 'standard').bind_from(config, owner=owner)\n",
        module.__dict__,
    )
    return module


def test_bind_from_with_an_owner_checks_its_module_without_the_call_stack(monkeypatch):
    import opslot.slot

    def no_frames():
        raise AssertionError("bind_from(owner=...) looked at the call stack")

    monkeypatch.setattr(opslot.slot, "caller_namespace", no_frames)
    module = _module_with_a_slot("toy_owner_module")
    saved = SimpleNamespace(
        ops_implementation={"rms_norm_implementation": "torch", "moe_implementation": "fused_torch"}
    )
    layer = module.Layer(saved, owner=SimpleNamespace())  # an owner of no module with slots: nothing to follow
    assert layer.experts.impl == "torch"
    with pytest.raises(ValueError) as err:
        module.Layer(saved, owner=module.Layer.__new__(module.Layer))
    assert str(err.value) == (
        "a model of toy_owner_module is being built from a config whose ops_implementation its module-level slots "
        "do not follow: rms_norm_slot (rms_norm/standard) runs 'eager', the config chooses 'torch'. Build it with "
        "opslot.build_model(config, module=..., model_class=...) or opslot.hf.from_pretrained(path, module), which "
        "bind every slot"
    )
    module.rms_norm_slot.bind("torch", why="explicit")
    layer = module.Layer(saved, owner=module.Layer.__new__(module.Layer))
    assert layer.experts.impl == "torch"


def test_config_slot_bind_from_with_an_owner_checks_its_module(monkeypatch):
    import opslot.config_slot

    monkeypatch.setattr(opslot.config_slot, "caller_namespace", lambda: pytest.fail("looked at the call stack"))
    module = _module_with_a_slot("toy_config_slot_owner")
    slot = opslot.ConfigSlot("Layer.kernel", "layer_kernel", ("eager", "fast"), default="eager")
    saved = SimpleNamespace(ops_implementation={"rms_norm_implementation": "torch"})
    with pytest.raises(ValueError, match=r"^a model of toy_config_slot_owner is being built"):
        slot.bind_from(saved, owner=module.Layer.__new__(module.Layer))
    assert slot.choose_from(saved).value == "eager"  # the value alone: what build_model checks first


def test_without_an_owner_the_calling_module_is_checked():
    module = _module_with_a_slot("toy_legacy_caller")
    exec(
        "class Legacy:\n"
        "    def __init__(self, config):\n"
        "        self.experts = OpSlot('moe', 'standard').bind_from(config)\n",
        module.__dict__,
    )
    saved = SimpleNamespace(ops_implementation={"rms_norm_implementation": "torch"})
    with pytest.raises(ValueError, match=r"^a model of toy_legacy_caller is being built .* rms_norm_slot"):
        module.Legacy(saved)
    assert module.Legacy(SimpleNamespace()).experts.impl == "eager"  # no saved choice: nothing to follow


def _fresh_python(code):
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return out.stdout.strip()


def test_import_opslot_registers_kernels_when_the_registry_is_first_asked():
    code = (
        "import opslot\n"
        "reg = opslot.KERNEL_REGISTRY\n"
        "print(len(reg._kernels))\n"
        "print(reg.get('rms_norm', 'standard', 'torch').factory)\n"
    )
    assert _fresh_python(code).splitlines() == ["0", "opslot.kernels.torch_ops:rms_norm_standard"]


def test_import_opslot_installs_only_the_copy_finder():
    code = (
        "import sys\n"
        "before = list(sys.meta_path)\n"
        "import opslot\n"
        "print([type(f).__name__ for f in sys.meta_path if f not in before])\n"
    )
    assert _fresh_python(code) == "['_CopyFinder']"  # pickled models of private copies load by name


def test_a_fresh_registry_gets_the_builtin_kernels_only_when_asked_to():
    from opslot.kernels import register_builtin_kernels

    reg = opslot.KernelRegistry()
    assert reg.list_available() == {}
    register_builtin_kernels(reg)
    assert reg.get("rms_norm", "standard", "torch") is not None


def test_a_registry_registers_its_builtins_once_and_other_threads_wait_for_them():
    import threading

    started, release, calls = threading.Event(), threading.Event(), []

    def builtins(reg):
        calls.append(1)
        started.set()
        release.wait(10)
        reg.register(opslot.KernelSpec("k", "rms_norm", "standard", lambda: abs))

    reg = opslot.KernelRegistry(builtins=builtins)
    first = threading.Thread(target=reg.get, args=("rms_norm", "standard", "k"))
    first.start()
    assert started.wait(10)
    seen = []
    second = threading.Thread(target=lambda: seen.append(reg.get("rms_norm", "standard", "k")))
    second.start()
    second.join(0.2)
    assert seen == []  # waiting for the first thread's registration, not answering from a half-filled registry
    release.set()
    first.join(10)
    second.join(10)
    assert [s.name for s in seen] == ["k"] and calls == [1]
