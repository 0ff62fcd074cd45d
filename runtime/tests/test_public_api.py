"""`opslot.__all__` is the public API, pinned: a name added or dropped is a deliberate change of this
list (and of docs/runtime.md), never a side effect of an import. (`register_builtin_kernels` left it: the
registry registers the built-in kernels on first use; `opslot.kernels.register_builtin_kernels` fills a
registry of one's own.)"""

import opslot

PUBLIC = [
    "AutoModel", "AutoModelForCausalLM", "AutoModelForImageTextToText", "BindingPlan", "CUDA_DEFAULTS",
    "CUDA_VARIANT_DEFAULTS",
    "CausalLMLoss", "CausalLMLossHandle", "ConfigSlot", "DeviceInfo", "DispatchReport", "EAGER", "FIELD_FOR_OP",
    "FORCE_ENV", "GeneratedModuleError", "HardwareRequirement", "KERNEL_REGISTRY", "KNOWN_OPS", "KernelRegistry",
    "KernelSpec", "MODELS", "NPU_DEFAULTS", "OpSlot", "OpsImplementationConfig", "PLUGIN_GROUP", "PlanEntry",
    "UnreachedSlotError", "UnreachedSlotWarning", "UnsupportedModelError", "bind_ops", "binding_plan", "build_model",
    "check_dispatch", "current_device", "declared_config_slots", "declared_slots", "dispatch_report",
    "install_causal_lm_loss", "installed_causal_lm_loss", "is_instance", "load_private_copy", "module_slots",
    "register_kernel", "release_unused_copies", "set_device_detector", "use_device",
    "watch_dispatch",
]  # fmt: skip


def test_all_is_the_pinned_public_api():
    assert sorted(opslot.__all__) == sorted(PUBLIC)
    assert len(opslot.__all__) == len(set(opslot.__all__))


def test_every_public_name_exists():
    assert [name for name in opslot.__all__ if not hasattr(opslot, name)] == []


def test_import_opslot_does_not_import_transformers():
    import os
    import subprocess
    import sys

    code = "import sys, opslot; print('transformers' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(opslot.__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"
