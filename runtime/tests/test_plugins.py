"""Entry-point plug-ins: a throwaway distribution on sys.path registers a kernel that a config selects."""

import importlib
import types
import uuid

import pytest

from opslot import KernelRegistry, OpSlot, bind_ops
from opslot.kernels import register_builtin_kernels


def install_plugin(tmp_path, monkeypatch, body):
    """Write module + dist-info with an `opslot.kernels` entry point; return the module name."""
    name = f"opslot_demo_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(body)
    dist = tmp_path / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[opslot.kernels]\ndemo = {name}:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


PLUGIN = """
LOADS = []

def double_norm(hidden_states, weight, eps):
    return 2 * hidden_states

def register(registry):
    from opslot import KernelSpec
    LOADS.append(1)
    registry.register(KernelSpec("demo", "rms_norm", "standard", lambda: double_norm, description="demo plug-in"))
"""


def test_plugin_kernel_is_selected_from_config(tmp_path, monkeypatch):
    name = install_plugin(tmp_path, monkeypatch, PLUGIN)
    reg = KernelRegistry(plugin_group="opslot.kernels")
    register_builtin_kernels(reg)
    plugin = importlib.import_module(name)
    assert plugin.LOADS == []  # lazy: nothing loaded until the registry is asked

    module = types.ModuleType("generated_demo")
    module.rms_norm_slot = OpSlot("rms_norm", "standard")
    assert bind_ops(module, {"model": {"ops_implementation": {"rms_norm_implementation": "demo"}}}, registry=reg) == {
        "rms_norm_slot": "demo"
    }
    assert module.rms_norm_slot(3, None, 0.0) == 6
    assert reg.get("rms_norm", "standard", "demo").description == "demo plug-in"
    reg.list_available()
    reg.resolve("rms_norm", "standard", "demo")
    assert plugin.LOADS == [1]  # loaded once


def test_failing_plugin_names_itself(tmp_path, monkeypatch):
    name = install_plugin(tmp_path, monkeypatch, "def register(registry):\n    raise ImportError('no GPU toolkit')\n")
    reg = KernelRegistry(plugin_group="opslot.kernels")
    with pytest.raises(RuntimeError) as err:
        reg.list_available()
    assert str(err.value) == (
        f"opslot plug-in 'demo' ({name}:register) from entry-point group 'opslot.kernels' "
        "failed: ImportError: no GPU toolkit"
    )


def test_registry_without_group_loads_no_plugins(tmp_path, monkeypatch):
    install_plugin(tmp_path, monkeypatch, PLUGIN)
    assert KernelRegistry().list_available() == {}
