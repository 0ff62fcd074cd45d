"""Old import path, kept for callers outside runtime/ (bench/train_step.py, docs/kernels.md):
`opslot.config.cuda_kernels_unavailable_reason` is `opslot.device_defaults.cuda_kernels_unavailable_reason`
(looked up on each access, so `set_cuda_kernels_check` applies here too).

What config.py held is split by concern: `opslot.ops_config` (OpsImplementationConfig and its
parsing), `opslot.ops_section` (finding the section in a training config), `opslot.choice` (what a
slot runs here, and why), `opslot.device_defaults` (defaults per device, the kernel-library probe),
`opslot.force_override` ($OPSLOT_FORCE_IMPL), `opslot.attention_names`, `opslot.suggestions`;
FIELD_FOR_OP is in `opslot.ops`.
"""

from __future__ import annotations

from typing import Any

from . import device_defaults as _device_defaults


def __getattr__(name: str) -> Any:
    if name == "cuda_kernels_unavailable_reason":
        return _device_defaults.cuda_kernels_unavailable_reason
    raise AttributeError(
        f"module 'opslot.config' has no attribute {name!r}: it only keeps cuda_kernels_unavailable_reason "
        f"(opslot.device_defaults); the ops config is opslot.ops_config (see this module's docstring)"
    )
