"""Loading libopslot_kernels.so (kernels/ at the repository root) and calling its C ABI.

The library is looked up, in order, at `$OPSLOT_KERNELS_LIB`, in this package's `_native/`
folder (where an installed opslot carries it), and in the build tree of a source checkout
(`build/kernels/`). Every failure names its cause: no library found (and where it looked), a
library built for another ABI, no CUDA device, a device the library has no code for. Nothing falls
back silently to another implementation.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

ABI_VERSION = 1  # OPSLOT_KERNELS_ABI_VERSION in kernels/include/opslot_kernels/common.h
LIB_NAME = "libopslot_kernels.so"
ENV_VAR = "OPSLOT_KERNELS_LIB"

#: opslot_dtype codes.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class KernelLibraryError(RuntimeError):
    """libopslot_kernels cannot be used here (the message says why and what to do)."""


def candidate_paths() -> List[Path]:
    """Where the library is looked for, in order."""
    paths = []
    env = os.environ.get(ENV_VAR)
    if env:
        paths.append(Path(env))
    here = Path(__file__).resolve()
    paths.append(here.parent.parent.parent / "_native" / LIB_NAME)     # opslot/_native/
    paths.append(here.parents[4] / "build" / "kernels" / LIB_NAME)     # <checkout>/build/kernels/
    return paths


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_error: Optional[str] = None
_checked_devices: Dict[int, Optional[str]] = {}


def _load() -> ctypes.CDLL:
    env = os.environ.get(ENV_VAR)
    tried = []
    for path in candidate_paths():
        if env and path != Path(env):
            break  # an explicit $OPSLOT_KERNELS_LIB is the only place looked at
        tried.append(str(path))
        if path.is_file():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise KernelLibraryError(f"cannot load {path}: {exc}") from None
            lib.opslot_abi_version.restype = ctypes.c_int
            lib.opslot_last_error.restype = ctypes.c_char_p
            lib.opslot_build_info.restype = ctypes.c_char_p
            lib.opslot_check_device.argtypes = [ctypes.c_int]
            version = lib.opslot_abi_version()
            if version != ABI_VERSION:
                raise KernelLibraryError(
                    f"{path} has C ABI version {version}, this opslot needs {ABI_VERSION}: rebuild kernels/ "
                    "(`make kernels`) or point ${ENV_VAR} at a matching build")
            lib._opslot_path = str(path)  # type: ignore[attr-defined]
            return lib
    where = f"${ENV_VAR}={env}" if env else ", ".join(tried)
    raise KernelLibraryError(
        f"{LIB_NAME} not found (looked at {where}); build it with `make kernels` in the opslot source "
        f"checkout, or set ${ENV_VAR} to its path")


def library() -> ctypes.CDLL:
    """The loaded library (loaded once; the first failure is remembered and raised again)."""
    global _lib, _error
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            if _error is not None:
                raise KernelLibraryError(_error)
            try:
                _lib = _load()
            except KernelLibraryError as exc:
                _error = str(exc)
                raise
    return _lib


def check_device(device: torch.device) -> None:
    """Raise KernelLibraryError unless the library runs on `device` (a CUDA device)."""
    if device.type != "cuda":
        raise KernelLibraryError(
            f"opslot's cuda kernels run on CUDA tensors, got a tensor on {device} (on a CUDA machine they are "
            "the default: move the model to the GPU, or choose 'eager' or 'torch' for this op in "
            "ops_implementation, or set OPSLOT_FORCE_IMPL=eager)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _checked_devices:
        lib = library()
        rc = lib.opslot_check_device(index)
        _checked_devices[index] = None if rc == 0 else lib.opslot_last_error().decode(errors="replace")
    reason = _checked_devices[index]
    if reason is not None:
        raise KernelLibraryError(reason)


def unavailable_reason() -> Optional[str]:
    """None when the library loads and the current CUDA device can run it, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        library()
        check_device(torch.device("cuda", torch.cuda.current_device()))
    except KernelLibraryError as exc:
        return str(exc)
    return None


def function(name: str, argtypes: Sequence[Any]) -> Callable[..., None]:
    """A Python callable for the entry point `name`: returns None, raises RuntimeError with the
    library's message when the call fails."""
    lib = library()
    try:
        raw = getattr(lib, name)
    except AttributeError:
        raise KernelLibraryError(
            f"{lib._opslot_path} has no entry point {name!r}: it was built without that kernel "  # type: ignore[attr-defined]
            "(OPSLOT_KERNELS_ONLY?) or is older than this opslot; rebuild kernels/") from None
    raw.argtypes = list(argtypes)
    raw.restype = ctypes.c_int

    def call(*args: Any) -> None:
        rc = raw(*args)
        if rc != 0:
            raise RuntimeError(f"opslot cuda kernel {name} failed ({rc}): "
                               f"{lib.opslot_last_error().decode(errors='replace')}")

    call.__name__ = name
    return call


def dtype_code(t: torch.Tensor) -> int:
    try:
        return DTYPE_CODES[t.dtype]
    except KeyError:
        raise TypeError(f"opslot cuda kernels take float32, float16 or bfloat16 tensors, got {t.dtype}") from None


def stream_of(t: torch.Tensor) -> ctypes.c_void_p:
    """The current CUDA stream of `t`'s device, as the C ABI's cudaStream_t."""
    return ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)


# ctypes argument types used by the bindings.
PTR = ctypes.c_void_p
I64 = ctypes.c_int64
I32 = ctypes.c_int
F32 = ctypes.c_float
