"""Shared setup of the CUDA kernel tests (pytest; every test skips cleanly without CUDA or without
libopslot_kernels). Kept generic: other ops' test files use the same helpers.

- `requires_cuda`: skip marker (no CUDA device, or the kernel library cannot run here).
- `seed` fixture (autouse): a fixed torch seed per test.
- `assert_close(out, ref, dtype, what)`: relative L2 error of `out` against an fp32 reference,
  with a tolerance per kernel dtype; NaN never passes; shapes must match.
- `bench_library()` / `knob(lib, name, nargs)`: the tests of the benchmark-only tuning knobs run
  on libopslot_kernels_bench.so (kernels/include/opslot_kernels/bench.h; docs/kernels.md "Two
  builds"), which every opslot cuda op calls inside the block; they skip when it is not built.
- `launched(fn, part)`: which kernels a call launches, by torch.profiler.
"""

import contextlib
import ctypes
import importlib
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RUNTIME = os.path.join(ROOT, "runtime")
if RUNTIME not in sys.path:
    sys.path.insert(0, RUNTIME)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def _unavailable():
    if not torch.cuda.is_available():
        return "no CUDA device"
    from opslot.kernels.cuda import unavailable_reason

    return unavailable_reason()


REASON = _unavailable()
requires_cuda = pytest.mark.skipif(REASON is not None, reason=f"opslot cuda kernels unavailable: {REASON}")

#: relative L2 tolerance of a kernel computing in fp32 and rounding its outputs to `dtype`.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(1234)
    yield


def rel_err(out: torch.Tensor, ref: torch.Tensor, floor=None) -> float:
    """‖out − ref‖ / ‖ref‖ (‖ref‖ raised to `floor` where given: for quantities that cancel to ~0)."""
    out, ref = out.double(), ref.double()
    denom = max(ref.norm().item(), floor or 0.0)
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


def assert_close(
    out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "", scale: float = 1.0, floor=None
):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), f"{what}: NaN in the output"
    if out.numel() == 0:
        return
    err = rel_err(out, ref, floor)
    tol = TOLERANCE[dtype] * scale
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


def runtime_test_module(name: str):
    """A module of runtime/tests (the CPU tests), whose references and inputs a GPU test shares."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "runtime", "tests")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


def bench_library_path():
    """The bench library's path (found beside the production library, in build/kernels/, or at
    $OPSLOT_KERNELS_BENCH_LIB); skips the test when it is not built."""
    from opslot.kernels.cuda import _lib

    try:
        return _lib.bench_library_path()
    except _lib.KernelLibraryError as exc:
        pytest.skip(f"needs the bench library: {exc}")


@contextlib.contextmanager
def bench_library():
    """Every opslot cuda op calls the bench library inside the block (it yields the CDLL, whose
    knobs the test sets and resets); skips the test when it is not built."""
    from opslot.kernels.cuda import _lib

    with _lib.using_library(bench_library_path()) as lib:
        yield lib


def knob(lib, name: str, nargs: int):
    """The bench library's knob `name` (int arguments, int return code)."""
    f = getattr(lib, name)
    f.argtypes = [ctypes.c_int] * nargs
    f.restype = ctypes.c_int
    return f


def capture_graph(step):
    """Runs `step` twice on a side stream (lazy loading, allocator warm-up), then captures one call in
    a CUDA graph: (the graph, the outputs of the captured call)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def fp32_leaf(t: torch.Tensor) -> torch.Tensor:
    """An fp32 copy of `t` that requires grad (for the reference)."""
    return t.detach().float().requires_grad_(True)


def launched(fn, part: str):
    """The short names (no namespace, no template arguments) of the profiler events of one call of `fn` whose
    names hold `part`: the kernels it launches, e.g. {"scores_mma_kernel"}."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name.split("<")[0].split("::")[-1] for e in prof.events() if part in e.name}
