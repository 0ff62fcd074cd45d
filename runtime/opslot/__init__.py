"""opslot: kernel dispatch for patchgen-generated modeling files.

Generated files declare `OpSlot(op, variant)` handles and guard upstream code with
`if slot.use_non_eager_impl: return slot(...)`. This package decides which implementation each
slot runs (`OpsImplementationConfig`, `bind_ops`, `build_model`), keeps the catalogue of kernels
(`KERNEL_REGISTRY`, extensible by plug-ins) and ships portable PyTorch and NPU kernels with fp32
references. See docs/runtime.md and docs/ops.md.

What `import opslot` does besides defining names: it refuses a torch older than MIN_TORCH, and puts
one finder on `sys.meta_path` (opslot.copies.install_copy_finder) that answers only the names of
private module copies (`<module>__opslot__<impls>`), so that a pickled model of a copy loads in a new
process. It registers no kernel: KERNEL_REGISTRY registers the built-in ones the first time it is
used, and the plug-ins the first time it is queried. It imports no Transformers.
"""

import torch as _torch

#: The oldest torch opslot supports: torch.library.custom_op (the CUDA kernels' binding) is 2.4's.
MIN_TORCH = (2, 4)


def _check_torch(version: str) -> None:
    """Raise ImportError when `version` (a torch.__version__) is older than MIN_TORCH."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    if tuple(parts) < MIN_TORCH:
        raise ImportError(f"opslot needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, found torch {version}")


_check_torch(_torch.__version__)

# The imports below come after the torch version check on purpose: an old torch fails with its message.
# ruff: noqa: E402
from . import auto, compat, hf, loss_hook, models  # noqa: F401  (opslot.auto, opslot.hf, ...)
from .auto import AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText, GeneratedModuleError
from .binding import bind_ops, build_model, load_private_copy
from .config_slot import ConfigSlot
from .copies import install_copy_finder as _install_copy_finder, is_instance, release_unused_copies
from .device_defaults import CUDA_DEFAULTS, CUDA_VARIANT_DEFAULTS, NPU_DEFAULTS
from .dispatch import (
    DispatchReport,
    UnreachedSlotError,
    UnreachedSlotWarning,
    check_dispatch,
    dispatch_report,
    watch_dispatch,
)
from .force_override import FORCE_ENV
from .hardware import DeviceInfo, HardwareRequirement, current_device, set_device_detector, use_device
from .loss_hook import CausalLMLoss, CausalLMLossHandle, install_causal_lm_loss, installed_causal_lm_loss
from .models import MODELS, UnsupportedModelError
from .ops import EAGER, FIELD_FOR_OP, KNOWN_OPS
from .ops_config import OpsImplementationConfig
from .plan import BindingPlan, PlanEntry, binding_plan, declared_config_slots, declared_slots
from .registry import KERNEL_REGISTRY, PLUGIN_GROUP, KernelRegistry, KernelSpec, register_kernel
from .slot import OpSlot, module_slots

_install_copy_finder()  # the one import-time effect (see the docstring): pickled models of copies load by name

__all__ = [
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoModelForImageTextToText",
    "CausalLMLoss",
    "CausalLMLossHandle",
    "GeneratedModuleError",
    "MODELS",
    "UnsupportedModelError",
    "install_causal_lm_loss",
    "installed_causal_lm_loss",
    "BindingPlan",
    "CUDA_DEFAULTS",
    "CUDA_VARIANT_DEFAULTS",
    "ConfigSlot",
    "DeviceInfo",
    "DispatchReport",
    "EAGER",
    "FIELD_FOR_OP",
    "FORCE_ENV",
    "HardwareRequirement",
    "KERNEL_REGISTRY",
    "KNOWN_OPS",
    "KernelRegistry",
    "KernelSpec",
    "NPU_DEFAULTS",
    "OpSlot",
    "OpsImplementationConfig",
    "PLUGIN_GROUP",
    "PlanEntry",
    "bind_ops",
    "binding_plan",
    "build_model",
    "current_device",
    "declared_config_slots",
    "declared_slots",
    "is_instance",
    "load_private_copy",
    "module_slots",
    "register_kernel",
    "release_unused_copies",
    "set_device_detector",
    "use_device",
    "UnreachedSlotError",
    "UnreachedSlotWarning",
    "check_dispatch",
    "dispatch_report",
    "watch_dispatch",
]
__version__ = "0.1.0"
