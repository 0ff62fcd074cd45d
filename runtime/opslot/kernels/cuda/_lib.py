"""Loading libopslot_kernels.so (kernels/ at the repository root), the torch ops over it
(libopslot_torch.so, kernels/torch/), and calling its C ABI.

The library is looked up, in order, at `$OPSLOT_KERNELS_LIB`, in this package's `_native/`
folder (where an installed opslot carries it), and in the build tree of a source checkout
(`build/kernels/`). Every failure names its cause: no library found (and where it looked), a
library built for another ABI, no CUDA device, a device the library has no code for. Nothing falls
back silently to another implementation.

libopslot_torch.so registers the `opslot::*` ops of RMSNorm, RoPE, SwiGLU and the load-balancing
loss with PyTorch's dispatcher from C++ (CUDA, Meta and Autograd kernels) and calls the kernel
library opslot loaded here (`torch_ops()` attaches it). It is looked up at `$OPSLOT_TORCH_LIB`,
beside `$OPSLOT_KERNELS_LIB`, in `_native/` and in `build/kernels/`; a build for another torch
release is refused before it is loaded.

Benchmarks and the GPU tests of the tuning knobs use the bench library, libopslot_kernels_bench.so
(the same kernels plus the knobs of kernels/include/opslot_kernels/bench.h; docs/kernels.md):
`bench_library_path()` finds it, `using_library(path)` makes every op call it for a while.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

ABI_VERSION = 1  # OPSLOT_KERNELS_ABI_VERSION in kernels/include/opslot_kernels/common.h
LIB_NAME = "libopslot_kernels.so"
ENV_VAR = "OPSLOT_KERNELS_LIB"
BENCH_LIB_NAME = "libopslot_kernels_bench.so"  # CMake target opslot_kernels_bench
BENCH_ENV_VAR = "OPSLOT_KERNELS_BENCH_LIB"
TORCH_LIB_NAME = "libopslot_torch.so"  # CMake target opslot_torch (kernels/torch/)
TORCH_ENV_VAR = "OPSLOT_TORCH_LIB"

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
    paths.append(here.parent.parent.parent / "_native" / LIB_NAME)  # opslot/_native/
    paths.append(here.parents[4] / "build" / "kernels" / LIB_NAME)  # <checkout>/build/kernels/
    return paths


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_error: Optional[str] = None
_checked_devices: Dict[int, Optional[str]] = {}
# Bumped whenever using_library() swaps the library: the callables of function() then look their
# entry point up again in the library now in use.
_generation = 0
_opened: Dict[str, ctypes.CDLL] = {}


def _open(path: Path, env_var: str = ENV_VAR) -> ctypes.CDLL:
    """The library at `path`, loaded once (KernelLibraryError when it cannot be, or has another ABI)."""
    key = str(path)
    if key in _opened:
        return _opened[key]
    try:
        lib = ctypes.CDLL(key)  # RTLD_LOCAL: a second library's entry points do not interpose
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
            f"(`make kernels`) or point ${env_var} at a matching build"
        )
    lib._opslot_path = key  # type: ignore[attr-defined]
    _opened[key] = lib
    return lib


def _load() -> ctypes.CDLL:
    env = os.environ.get(ENV_VAR)
    tried = []
    for path in candidate_paths():
        if env and path != Path(env):
            break  # an explicit $OPSLOT_KERNELS_LIB is the only place looked at
        tried.append(str(path))
        if path.is_file():
            return _open(path)
    where = f"${ENV_VAR}={env}" if env else ", ".join(tried)
    raise KernelLibraryError(
        f"{LIB_NAME} not found (looked at {where}); build it with `make kernels` in the opslot source "
        f"checkout, or set ${ENV_VAR} to its path"
    )


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
            "ops_implementation, or set OPSLOT_FORCE_IMPL=eager)"
        )
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


def generation() -> int:
    """A number that changes whenever using_library() swaps the library (for callers that cache
    raw entry points)."""
    return _generation


def function(name: str, argtypes: Sequence[Any]) -> Callable[..., None]:
    """A Python callable for the entry point `name`: returns None, raises RuntimeError with the
    library's message when the call fails. It follows using_library(): inside such a block it calls
    that library's entry point."""
    argtypes = list(argtypes)
    bound: List[Any] = [None, None, None]  # generation, library, raw function

    def bind() -> None:
        lib = library()
        try:
            raw = getattr(lib, name)
        except AttributeError:
            raise KernelLibraryError(
                f"{lib._opslot_path} has no entry point {name!r}: it was built without that kernel "  # type: ignore[attr-defined]
                "(OPSLOT_KERNELS_ONLY?) or is older than this opslot; rebuild kernels/"
            ) from None
        raw.argtypes = argtypes
        raw.restype = ctypes.c_int
        bound[:] = [_generation, lib, raw]

    bind()

    def call(*args: Any) -> None:
        if bound[0] != _generation:
            bind()
        rc = bound[2](*args)
        if rc != 0:
            raise RuntimeError(
                f"opslot cuda kernel {name} failed ({rc}): {bound[1].opslot_last_error().decode(errors='replace')}"
            )

    call.__name__ = name
    return call


def bench_candidate_paths() -> List[Path]:
    """Where the bench library is looked for, in order: `$OPSLOT_KERNELS_BENCH_LIB` (when set, the
    only place), beside the production library opslot loads, and `<checkout>/build/kernels/`."""
    env = os.environ.get(BENCH_ENV_VAR)
    if env:
        return [Path(env)]
    paths = []
    try:
        paths.append(Path(library()._opslot_path).with_name(BENCH_LIB_NAME))  # type: ignore[attr-defined]
    except KernelLibraryError:
        pass
    paths.append(Path(__file__).resolve().parents[4] / "build" / "kernels" / BENCH_LIB_NAME)
    unique: List[Path] = []
    for p in paths:
        if p not in unique:
            unique.append(p)
    return unique


def bench_library_path() -> Path:
    """The bench library's path, or KernelLibraryError saying where it looked and how to build it."""
    paths = bench_candidate_paths()
    for path in paths:
        if path.is_file():
            return path
    raise KernelLibraryError(
        f"{BENCH_LIB_NAME} (the tuning knobs; benchmarks and their tests only) not found (looked at "
        f"{', '.join(map(str, paths))}): build it with `cmake --build build --target "
        f"opslot_kernels_bench` (or configure with -DOPSLOT_KERNELS_BENCH=ON), or set ${BENCH_ENV_VAR}"
    )


@contextlib.contextmanager
def using_library(path: "os.PathLike[str] | str") -> Iterator[ctypes.CDLL]:
    """Benchmarks and tests only: inside the block every op of opslot.kernels.cuda calls the library
    at `path` (e.g. bench_library_path(), whose knobs the caller sets on the yielded CDLL); after
    it, the library it called before. Process-wide and not thread-safe: no other thread may launch
    kernels meanwhile. Blocks nest."""
    global _lib, _error, _checked_devices, _generation
    lib = _open(Path(path), BENCH_ENV_VAR)
    with _lock:
        saved = (_lib, _error, _checked_devices)
        _lib, _error, _checked_devices = lib, None, {}
        _generation += 1
    ops = _torch_ops_lib
    if ops is not None:
        _attach(ops, lib._opslot_path)  # type: ignore[attr-defined]
    try:
        yield lib
    finally:
        with _lock:
            _lib, _error, _checked_devices = saved
            _generation += 1
        if ops is not None and _lib is not None:
            _attach(ops, _lib._opslot_path)  # type: ignore[attr-defined]


def torch_candidate_paths() -> List[Path]:
    """Where libopslot_torch.so is looked for, in order: `$OPSLOT_TORCH_LIB` (when set, the only
    place), beside `$OPSLOT_KERNELS_LIB`, `opslot/_native/`, `<checkout>/build/kernels/`."""
    env = os.environ.get(TORCH_ENV_VAR)
    if env:
        return [Path(env)]
    paths = []
    kernels_env = os.environ.get(ENV_VAR)
    if kernels_env:
        paths.append(Path(kernels_env).with_name(TORCH_LIB_NAME))
    here = Path(__file__).resolve()
    paths.append(here.parent.parent.parent / "_native" / TORCH_LIB_NAME)
    paths.append(here.parents[4] / "build" / "kernels" / TORCH_LIB_NAME)
    return paths


_torch_ops_lib: Optional[ctypes.CDLL] = None
_torch_ops_error: Optional[str] = None
_BUILT_FOR = re.compile(rb"opslot_torch built for torch (\d+)\.(\d+)\.(\d+);")


def _torch_release() -> Tuple[int, int, int]:
    major, minor, patch = re.match(r"(\d+)\.(\d+)\.(\d+)", torch.__version__).groups()  # type: ignore[union-attr]
    return int(major), int(minor), int(patch)


def _load_torch_ops(path: Path) -> ctypes.CDLL:
    """Loads libopslot_torch.so at `path` after checking which torch it was built for."""
    found = _BUILT_FOR.search(path.read_bytes())
    built = tuple(int(g) for g in found.groups()) if found else None
    if built != _torch_release():
        what = "torch " + ".".join(map(str, built)) if built else "an unknown torch"
        raise KernelLibraryError(
            f"{path} was built for {what}, this process runs torch {torch.__version__}: rebuild it "
            "against this torch (`make kernels`, or cmake -DOPSLOT_TORCH_PYTHON=<this python>)"
        )
    try:
        torch.ops.load_library(str(path))
    except OSError as exc:
        raise KernelLibraryError(f"cannot load {path}: {exc}") from None
    lib = ctypes.CDLL(str(path))  # the same handle; for opslot_torch_use_library
    lib.opslot_torch_use_library.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.opslot_torch_use_library.restype = ctypes.c_int
    lib.opslot_torch_library_path.restype = ctypes.c_char_p
    lib._opslot_path = str(path)  # type: ignore[attr-defined]
    return lib


def _attach(ops: ctypes.CDLL, kernels_path: str) -> None:
    """Makes the torch ops call the kernel library at `kernels_path`."""
    buf = ctypes.create_string_buffer(1024)
    if ops.opslot_torch_use_library(kernels_path.encode(), buf, len(buf)) != 0:
        raise KernelLibraryError(buf.value.decode(errors="replace"))


def torch_ops() -> ctypes.CDLL:
    """libopslot_torch.so, loaded once (its ops registered with torch) and attached to the kernel
    library when that one loads here (on a machine without it, the Meta kernels work and a CUDA
    call says why). KernelLibraryError (remembered) when it cannot be loaded or attached."""
    global _torch_ops_lib, _torch_ops_error
    if _torch_ops_lib is not None:
        return _torch_ops_lib
    try:
        kernels_path: Optional[str] = library()._opslot_path  # type: ignore[attr-defined]
    except KernelLibraryError:
        kernels_path = None
    with _lock:
        if _torch_ops_lib is None:
            if _torch_ops_error is not None:
                raise KernelLibraryError(_torch_ops_error)
            try:
                lib = _find_torch_ops()
                if kernels_path is not None:
                    _attach(lib, kernels_path)
            except KernelLibraryError as exc:
                _torch_ops_error = str(exc)
                raise
            _torch_ops_lib = lib
    return _torch_ops_lib


def _find_torch_ops() -> ctypes.CDLL:
    paths = torch_candidate_paths()
    for path in paths:
        if path.is_file():
            return _load_torch_ops(path)
    raise KernelLibraryError(
        f"{TORCH_LIB_NAME} not found (looked at {', '.join(map(str, paths))}); build it with `make kernels` "
        f"in the opslot source checkout, or set ${TORCH_ENV_VAR} to its path"
    )


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
