"""The MoE ops registered from C++ by libopslot_torch.so (kernels/torch/moe.cc), on a machine without a
GPU: the dispatch keys and schemas (those of the Python custom ops they replace), opcheck's schema,
autograd-registration and fake-tensor tests on meta tensors, which inputs get gradients, the
GEMM_BACKEND switch choosing the `.portable` overloads, and CPU tensors refused by the real launches.
The ops' composition and autograd on CPU with emulated launches: test_cuda_moe_cpu.py; the kernels:
tests/gpu/kernels/test_moe.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from test_kernel_library_symbols import _library

O = torch.ops.opslot  # noqa: E741
TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")
SCHEMAS = [
    "moe_route(Tensor top_k_index, SymInt num_experts) -> (Tensor, Tensor, Tensor, Tensor)",
    "moe_gather(Tensor x, Tensor inv, Tensor offs, SymInt top_k) -> Tensor",
    "moe_gather_backward(Tensor grad, Tensor inv, Tensor offs, SymInt top_k) -> Tensor",
    "moe_combine(Tensor rows, Tensor inv, Tensor offs, Tensor weights, Tensor row_expert, Tensor? bias) -> Tensor",
    "moe_combine_backward(Tensor grad, Tensor rows, Tensor inv, Tensor offs, Tensor weights, Tensor row_expert, "
    "Tensor? bias) -> (Tensor, Tensor, Tensor)",
    "moe_act(Tensor h, Tensor offs, Tensor row_expert, Tensor? bias, SymInt kind, float alpha, float limit) -> Tensor",
    "moe_act_backward(Tensor grad, Tensor h, Tensor offs, Tensor row_expert, Tensor? bias, SymInt kind, float "
    "alpha, float limit) -> (Tensor, Tensor)",
    "moe_grouped_mm(Tensor a, Tensor w, Tensor offs, bool w_transposed) -> Tensor",
    "moe_grouped_mm_backward(Tensor grad, Tensor a, Tensor w, Tensor offs, bool w_transposed) -> (Tensor, Tensor)",
]
DIFFERENTIABLE = ("moe_gather", "moe_combine", "moe_act", "moe_grouped_mm")
T, H, I, E, K = 10, 16, 8, 4, 2  # noqa: E741  (I: the intermediate size)


@pytest.fixture(scope="module")
def moe():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import moe

    return moe


def meta(*shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def routing():
    i32 = dict(dtype=torch.int32, device="meta")
    return torch.empty(E, **i32), torch.empty(T * K, **i32), torch.empty(T * K, **i32)  # offs, inv, row_expert


def test_ops_are_registered_from_cpp(moe):
    for schema in SCHEMAS:
        op = schema.split("(")[0]
        name = f"opslot::{op}"
        assert str(getattr(O, op).default._schema) == f"opslot::{schema}"
        for key in ("CUDA", "CPU", "Meta") + (("Autograd",) if op in DIFFERENTIABLE else ()):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch._library.custom_ops.OPDEFS.get(name) is None  # no Python custom op behind it
    for op in ("moe_grouped_mm", "moe_grouped_mm_backward"):
        assert str(getattr(O, op).portable._schema) == str(getattr(O, op).default._schema).replace(
            f"{op}(", f"{op}.portable("
        )
    for launch in ("scatter_rows", "gather_sum", "act_forward", "segment_sum", "gmm_rows", "use_grouped_mm"):
        for key in ("CUDA", "CPU"):  # CPU: moe.py's hooks, which CPU tests emulate
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opslot::moe_k_{launch}", key), (launch, key)


def _cases():
    offs, inv, row_expert = routing()
    bf = torch.bfloat16
    x = meta(T, H, dtype=bf, requires_grad=True)
    rows = meta(T * K, H, dtype=bf, requires_grad=True)
    w = meta(T, K, requires_grad=True)
    bias = meta(E, H, dtype=bf, requires_grad=True)
    h = meta(T * K, 2 * I, dtype=bf, requires_grad=True)
    b1 = meta(E, 2 * I, dtype=bf, requires_grad=True)
    a = meta(T * K, H, dtype=bf, requires_grad=True)
    wq, wg = meta(E, 2 * I, H, dtype=bf, requires_grad=True), meta(E, H, 2 * I, dtype=bf, requires_grad=True)
    g = meta(T * K, 2 * I, dtype=bf)
    idx = torch.zeros(T, K, dtype=torch.int64, device="meta")
    return [
        (O.moe_route.default, (idx, E)),
        (O.moe_gather.default, (x, inv, offs, K)),
        (O.moe_gather_backward.default, (rows.detach(), inv, offs, K)),
        (O.moe_combine.default, (rows, inv, offs, w, row_expert, bias)),
        (O.moe_combine.default, (rows, inv, offs, w, row_expert, None)),
        (O.moe_combine_backward.default, (x.detach(), rows.detach(), inv, offs, w.detach(), row_expert, bias.detach())),
        (O.moe_act.default, (h, offs, row_expert, None, 0, 0.0, 0.0)),
        (O.moe_act.default, (h, offs, row_expert, b1, 1, 1.702, 1.5)),
        (O.moe_act_backward.default, (g[:, :I], h.detach(), offs, row_expert, b1.detach(), 1, 1.702, 1.5)),
        (O.moe_grouped_mm.default, (a, wq, offs, True)),
        (O.moe_grouped_mm.default, (a, wg, offs, False)),
        (O.moe_grouped_mm.portable, (a, wq, offs, True)),
        (O.moe_grouped_mm_backward.default, (g, a.detach(), wq.detach(), offs, True)),
        (O.moe_grouped_mm_backward.portable, (g[:, :H], a.detach(), wg.detach(), offs, False)),
    ]


@pytest.mark.parametrize("index", range(14))
def test_opcheck_on_meta(moe, index):
    op, args = _cases()[index]
    torch.library.opcheck(op, args, test_utils=TEST_UTILS)


def test_output_shapes_and_gradients(moe):
    offs, inv, row_expert = routing()
    r = moe.Routing(*O.moe_route(torch.zeros(T, K, dtype=torch.int32, device="meta"), E))
    assert [t.shape for t in r] == [(E,), (T * K,), (T * K,), (T * K,)] and r.offs.dtype == torch.int32
    x = meta(T, H, requires_grad=True)
    xs = moe.moe_gather(x, inv, offs, K)
    assert xs.shape == (T * K, H) and "GatherFunction" in xs.grad_fn.name()
    wq = meta(E, 2 * I, H, requires_grad=True)
    hh = moe.moe_grouped_mm(xs, wq, offs, True)
    b1 = meta(E, 2 * I, requires_grad=True)
    a = moe.moe_act(hh, offs, row_expert, b1, moe.KIND_GPT_OSS, 1.702, 7.0)
    assert hh.shape == (T * K, 2 * I) and a.shape == (T * K, I)
    wd = meta(E, I, H, requires_grad=True)
    y = moe.moe_grouped_mm(a, wd, offs, False)
    weights = meta(T, K, requires_grad=True)
    out = moe.moe_combine(y, inv, offs, weights, row_expert, None)
    assert out.shape == (T, H)
    out.sum().backward()
    for t in (x, wq, b1, wd, weights):
        assert t.grad is not None and t.grad.shape == t.shape
    dx, dbias = O.moe_act_backward(meta(T * K, I), hh.detach(), offs, row_expert, None, 0, 0.0, 0.0)
    assert dx.shape == (T * K, 2 * I) and dbias.shape == (0,)


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_gemm_backend_chooses_the_overload(moe, monkeypatch):
    offs, _, _ = routing()
    a, w = meta(T * K, H, requires_grad=True), meta(E, 2 * I, H, requires_grad=True)
    for backend, overload in (("auto", "default"), ("portable", "portable")):
        monkeypatch.setattr(moe, "GEMM_BACKEND", backend)
        with _Calls() as calls:
            moe.moe_grouped_mm(a, w, offs, True).sum().backward()
        assert f"opslot.moe_grouped_mm.{overload}" in calls.ops
        assert f"opslot.moe_grouped_mm_backward.{overload}" in calls.ops
    monkeypatch.setattr(moe, "GEMM_BACKEND", "fast")
    with pytest.raises(ValueError, match=r"^opslot moe GEMM_BACKEND must be 'auto' or 'portable', got 'fast'$"):
        moe.moe_grouped_mm(a, w, offs, True)


def test_cpu_tensors_are_refused_by_the_real_launches(moe):
    from opslot.kernels.cuda import KernelLibraryError

    offs = torch.tensor([2, 4], dtype=torch.int32)
    inv = torch.arange(4, dtype=torch.int32)
    with pytest.raises(KernelLibraryError, match="CUDA tensors"):
        moe.moe_gather(torch.randn(2, 8), inv, offs, 2)
    with pytest.raises(KernelLibraryError, match="CUDA tensors"):
        moe.moe_grouped_mm(torch.randn(4, 8), torch.randn(2, 8, 8), offs, False)
    with pytest.raises(RuntimeError, match="opslot's cuda kernels run on CUDA tensors"):
        O.moe_route(torch.zeros(2, 2, dtype=torch.int64), 2)


_ENV_PROBE = """
import torch
from opslot.kernels.cuda import moe
calls = []
moe._check = lambda t: None
moe._use_cutlass = lambda a, w: calls.append("choice") or True
moe._k_gmm_rows = lambda a, b, c, offs: calls.append("portable")
moe._k_zero_tail = lambda c, offs: calls.append("grouped_mm")
a, w, offs = torch.randn(4, 8), torch.randn(2, 8, 8), torch.tensor([2, 4], dtype=torch.int32)
try:
    torch.ops.opslot.moe_grouped_mm.default(a, w, offs, False)
except ValueError as e:
    calls.append(str(e))
print(calls)
"""


@pytest.mark.parametrize(
    "env,calls",
    [
        ("auto", ["choice", "grouped_mm"]),
        ("portable", ["portable"]),
        ("fast", ["opslot moe GEMM_BACKEND must be 'auto' or 'portable', got 'fast'"]),
    ],
)
def test_environment_forces_the_portable_gemm_on_direct_calls(moe, env, calls):
    """$OPSLOT_MOE_GEMM=portable: torch.ops.opslot.moe_grouped_mm.default (what bench/moe.py times)
    takes the portable kernel without asking for the GEMM choice (CPU, emulated launches)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(moe.__file__).parents[3])  # the folder holding the opslot package
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env_vars = {**os.environ, "OPSLOT_MOE_GEMM": env, "PYTHONPATH": path}
    run = subprocess.run([sys.executable, "-c", _ENV_PROBE], env=env_vars, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == repr(calls)
