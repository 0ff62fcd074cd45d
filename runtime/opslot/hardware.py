"""What machine are we on, and does a kernel's hardware requirement hold on it.

Device detection is injectable (`set_device_detector`, `use_device`) so tests can pretend to be an
NPU or a given CUDA compute capability without that hardware.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

DEVICE_TYPES = ("any", "cuda", "npu")


@dataclass(frozen=True)
class DeviceInfo:
    """The accelerator of the live machine: `type` is "cuda", "npu" or "cpu"."""

    type: str
    capability: Optional[Tuple[int, int]] = None  # CUDA compute capability, e.g. (9, 0)

    def describe(self) -> str:
        if self.type == "cuda" and self.capability is not None:
            return f"cuda (sm_{self.capability[0]}{self.capability[1]})"
        return self.type


def _detect_live_device() -> DeviceInfo:
    import torch

    if torch.cuda.is_available():
        return DeviceInfo("cuda", tuple(torch.cuda.get_device_capability()))
    if importlib.util.find_spec("torch_npu") is not None:
        try:
            importlib.import_module("torch_npu")
            if torch.npu.is_available():  # type: ignore[attr-defined]
                return DeviceInfo("npu")
        except Exception:  # a broken torch_npu install means: no usable NPU
            pass
    return DeviceInfo("cpu")


_detector: Callable[[], DeviceInfo] = _detect_live_device
_cached: Optional[DeviceInfo] = None


def current_device() -> DeviceInfo:
    """The device of this machine (detected once, then cached)."""
    global _cached
    if _cached is None:
        _cached = _detector()
    return _cached


def set_device_detector(detector: Optional[Callable[[], DeviceInfo]]) -> None:
    """Replace device detection (None restores the live detector); clears the cache."""
    global _detector, _cached
    _detector = detector or _detect_live_device
    _cached = None


@contextlib.contextmanager
def use_device(info: DeviceInfo) -> Iterator[DeviceInfo]:
    """Pretend to run on `info` inside the block (for tests)."""
    global _detector, _cached
    saved = (_detector, _cached)
    _detector, _cached = (lambda: info), info
    try:
        yield info
    finally:
        _detector, _cached = saved


@dataclass(frozen=True)
class HardwareRequirement:
    """What a kernel needs: `device_type` "any", "cuda" or "npu"; for CUDA an optional
    compute-capability range, inclusive, as (major, minor) tuples."""

    device_type: str = "any"
    min_cc: Optional[Tuple[int, int]] = None
    max_cc: Optional[Tuple[int, int]] = None

    def __post_init__(self) -> None:
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"unknown device type {self.device_type!r}; expected one of: {', '.join(DEVICE_TYPES)}")
        if (self.min_cc is not None or self.max_cc is not None) and self.device_type != "cuda":
            raise ValueError("min_cc/max_cc only apply to device_type 'cuda'")

    def describe(self) -> str:
        text = self.device_type
        if self.min_cc is not None:
            text += f" sm_{self.min_cc[0]}{self.min_cc[1]}+"
        if self.max_cc is not None:
            text += f" up to sm_{self.max_cc[0]}{self.max_cc[1]}"
        return text

    def unmet_reason(self, device: Optional[DeviceInfo] = None) -> Optional[str]:
        """None when satisfied on `device` (default: this machine), else why not."""
        device = device or current_device()
        if self.device_type == "any":
            return None
        if device.type != self.device_type:
            return f"needs {self.describe()}; this machine has {device.describe()}"
        cc = device.capability
        if cc is not None:
            if self.min_cc is not None and tuple(cc) < tuple(self.min_cc):
                return f"needs {self.describe()}; this machine has {device.describe()}"
            if self.max_cc is not None and tuple(cc) > tuple(self.max_cc):
                return f"needs {self.describe()}; this machine has {device.describe()}"
        return None

    def is_satisfied(self, device: Optional[DeviceInfo] = None) -> bool:
        """True when the live machine (or `device`) meets this requirement."""
        return self.unmet_reason(device) is None


ANY = HardwareRequirement("any")
