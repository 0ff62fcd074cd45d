"""Helpers shared by the op modules of opslot.kernels.cuda (not public)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from . import _lib

_functions: Dict[str, Callable[..., None]] = {}
_raw: Dict[str, Tuple[int, Any]] = {}
_cpu_library: Optional[torch.library.Library] = None
_cpu_kernels: Dict[str, Callable[..., Any]] = {}


def fn(name: str, argtypes: Sequence[Any]) -> Callable[..., None]:
    """The library entry point `name` (looked up once)."""
    f = _functions.get(name)
    if f is None:
        f = _functions[name] = _lib.function(name, argtypes)
    return f


def raw(name: str, restype: Any, argtypes: Sequence[Any]) -> Any:
    """A raw ctypes function (for entry points that return a value instead of a status), of the
    library in use (it follows _lib.using_library)."""
    key = "raw:" + name
    entry = _raw.get(key)
    if entry is None or entry[0] != _lib.generation():
        f = getattr(_lib.library(), name)
        f.argtypes = list(argtypes)
        f.restype = restype
        entry = _raw[key] = (_lib.generation(), f)
    return entry[1]


def last_error() -> str:
    return _lib.library().opslot_last_error().decode(errors="replace")


def _on_cuda_machine() -> bool:
    from ...hardware import current_device

    return current_device().type == "cuda"


def require_library_on_cuda_machines() -> None:
    """Called when an op module is imported (which is when a slot binds to it): on a machine that
    opslot sees as a CUDA machine, load the library now, so that a missing or mismatched library is
    an error at bind time rather than at the first call. CPU-only machines can import the modules
    (their fake implementations work everywhere)."""
    if _on_cuda_machine():
        _lib.library()


def torch_op(name: str, overload: str = "default") -> Callable[..., Any]:
    """`torch.ops.opslot.<name>.<overload>`, registered from C++ by libopslot_torch.so (loaded and
    attached to the kernel library on first use). On a CUDA machine a missing or mismatched
    library raises here (bind time); elsewhere the returned callable raises it when called."""
    try:
        _lib.torch_ops()
    except _lib.KernelLibraryError as exc:
        if _on_cuda_machine():
            raise
        reason = str(exc)

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise _lib.KernelLibraryError(reason)

        return unavailable
    return getattr(getattr(torch.ops.opslot, name), overload)


def cpu_kernel(name: str, fn: Callable[..., Any]) -> None:
    """Makes `fn` the CPU kernel of `torch.ops.opslot.<name>`, an op libopslot_torch.so defines
    without one (the launches of cross_entropy and moe, which CPU tests emulate). Registered
    once per process, through a trampoline: importing the op module again (tests do) replaces `fn`.
    Nothing is registered where the ops library is unavailable."""
    global _cpu_library
    if not isinstance(torch_op(name), torch._ops.OpOverload):
        return
    if name not in _cpu_kernels:
        if _cpu_library is None:
            _cpu_library = torch.library.Library("opslot", "IMPL")
        _cpu_library.impl(name, lambda *args: _cpu_kernels[name](*args), "CPU")
    _cpu_kernels[name] = fn


def prepare(t: torch.Tensor) -> None:
    """Check that `t` lives on a CUDA device the library runs on."""
    _lib.check_device(t.device)


def ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None or t.numel() == 0 else t.data_ptr()


def stream(t: torch.Tensor) -> int:
    """The current CUDA stream of `t`'s device (a raw cudaStream_t; no Stream object is made)."""
    return torch._C._cuda_getCurrentRawStream(t.device.index)


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """`t` as [rows, last dim] with a contiguous last dimension (a view when possible)."""
    if t.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    v = t.reshape(-1, t.shape[-1])
    if v.shape[-1] > 1 and v.stride(-1) != 1:
        v = v.contiguous()
    return v


def row_stride(v: torch.Tensor) -> int:
    return v.stride(0) if v.shape[0] > 1 else v.shape[1]


def check_float(t: torch.Tensor, what: str) -> None:
    if t.dtype not in _lib.DTYPE_CODES:
        raise TypeError(f"{what}: opslot cuda kernels take float32, float16 or bfloat16 tensors, got {t.dtype}")
