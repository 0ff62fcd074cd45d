"""opslot::ce_linear_fwd / ce_logits_fwd / ce_scale_ / ce_rows, registered from C++ by
libopslot_torch.so (kernels/torch/cross_entropy.cc), on a machine without a GPU: the dispatch keys
and schemas, opcheck's schema, autograd-registration and fake-tensor tests on meta tensors, the
autograd nodes (no gradient for the gradient outputs), ce_scale_'s version bump, symbolic ints under
torch.compile, and CPU tensors refused by the real launches. The ops' chunking, reductions and
backward on CPU with emulated launches: test_cuda_cross_entropy_cpu.py; the kernels:
tests/gpu/kernels/test_cross_entropy.py."""

from __future__ import annotations

import pytest
import torch

from test_kernel_library_symbols import _library

O = torch.ops.opslot  # noqa: E741
TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")
SCHEMAS = {
    "ce_linear_fwd": "opslot::ce_linear_fwd(Tensor hidden, Tensor weight, Tensor targets, Tensor? divisor, "
    "float divisor_value, SymInt mode, SymInt ignore_index, SymInt chunk_size, bool grad_hidden, bool "
    "grad_weight) -> (Tensor, Tensor, Tensor)",
    "ce_logits_fwd": "opslot::ce_logits_fwd(Tensor logits, Tensor targets, Tensor? divisor, float divisor_value, "
    "SymInt mode, SymInt ignore_index, bool compute_grad) -> (Tensor, Tensor)",
    "ce_scale_": "opslot::ce_scale_(Tensor(a!) x, Tensor factor) -> ()",
    "ce_rows": "opslot::ce_rows(Tensor logits, Tensor(a!)? grad, Tensor targets, int ignore_index, Tensor? "
    "grad_scale, Tensor(b!) row_loss) -> ()",
}


@pytest.fixture(scope="module")
def ce():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import cross_entropy

    return cross_entropy


def meta(*shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def test_ops_are_registered_from_cpp(ce):
    keys = {
        "ce_linear_fwd": ("CUDA", "CPU", "Meta", "Autograd"),
        "ce_logits_fwd": ("CUDA", "CPU", "Meta", "Autograd"),
        "ce_scale_": ("CUDA", "CPU", "Meta", "ADInplaceOrView"),
        "ce_rows": ("CUDA", "CPU"),
    }
    for op, wanted in keys.items():
        name = f"opslot::{op}"
        assert str(getattr(O, op).default._schema) == SCHEMAS[op]
        for key in wanted:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch._library.custom_ops.OPDEFS.get(name) is None  # no Python custom op behind it


def _cases():
    h = meta(70, 32, dtype=torch.bfloat16, requires_grad=True)
    w = meta(1001, 32, dtype=torch.bfloat16, requires_grad=True)
    t = torch.zeros(70, dtype=torch.int64, device="meta")
    x = meta(6, 5, requires_grad=True)
    y = torch.zeros(6, dtype=torch.int64, device="meta")
    return [
        ("linear mean", O.ce_linear_fwd.default, (h, w, t, None, 0.0, 0, -100, 32, True, True)),
        ("linear tensor divisor", O.ce_linear_fwd.default, (h, w, t, meta(()), 0.0, 2, -100, 64, True, False)),
        ("linear no grad", O.ce_linear_fwd.default, (h.detach(), w.detach(), t, None, 5.0, 1, -100, 128, False, False)),
        ("logits", O.ce_logits_fwd.default, (x, y, None, 0.0, 0, -100, True)),
        ("logits no grad", O.ce_logits_fwd.default, (x.detach(), y, None, 3.0, 1, -100, False)),
        ("scale", O.ce_scale_.default, (meta(1037, dtype=torch.bfloat16), meta(()))),
    ]


@pytest.mark.parametrize("index", range(6))
def test_opcheck_on_meta(ce, index):
    name, op, args = _cases()[index]
    torch.library.opcheck(op, args, test_utils=TEST_UTILS)


def test_outputs_and_autograd(ce):
    h = meta(9, 8, dtype=torch.bfloat16, requires_grad=True)
    w = meta(13, 8, dtype=torch.bfloat16, requires_grad=True)
    t = torch.zeros(9, dtype=torch.int64, device="meta")
    loss, gh, gw = O.ce_linear_fwd(h, w, t, None, 0.0, 0, -100, 4, True, False)
    assert loss.shape == () and loss.dtype == torch.float32 and "CeLinearFunction" in loss.grad_fn.name()
    assert gh.shape == h.shape and gh.dtype == torch.bfloat16 and gw.shape == (0,)
    loss.backward()
    assert h.grad.shape == h.shape and w.grad is None  # grad_weight was not asked for
    x = meta(6, 5, dtype=torch.float16, requires_grad=True)
    loss, g = O.ce_logits_fwd(x, t[:6], None, 0.0, 0, -100, True)
    assert g.shape == (6, 5) and g.is_contiguous() and g.dtype == torch.float16
    loss.backward()
    assert x.grad.shape == x.shape
    loss, g = O.ce_logits_fwd(x[:, 1:], t[:6], None, 0.0, 0, -100, False)
    assert g.shape == (0,)


def test_scale_is_in_place_for_autograd(ce):
    x = meta(7)
    version = x._version
    O.ce_scale_(x, meta(()))
    assert x._version > version


def test_symbolic_ints_do_not_specialise(ce):
    """Under torch.compile(dynamic=True) the chunk size follows the token count: the Meta and Autograd
    kernels keep it symbolic, so another length reuses the graph."""
    torch._dynamo.reset()
    counts = []

    def step(h, w, t):
        return O.ce_linear_fwd(h, w, t, None, 0.0, 0, -100, h.shape[0], True, True)[0]

    def backend(gm, example_inputs):
        counts.append(1)
        return gm

    compiled = torch.compile(step, backend=backend, dynamic=True, fullgraph=True)
    for n in (5, 7):
        h = meta(n, 8, requires_grad=True)
        compiled(h, meta(11, 8, requires_grad=True), torch.zeros(n, dtype=torch.int64, device="meta"))
    assert len(counts) == 1


def test_cpu_tensors_are_refused_by_the_real_launches(ce):
    from opslot.kernels.cuda import KernelLibraryError

    with pytest.raises(KernelLibraryError, match="CUDA tensors"):
        O.ce_logits_fwd(torch.randn(4, 3), torch.zeros(4, dtype=torch.int64), None, 0.0, 0, -100, False)
    targets = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(KernelLibraryError, match="CUDA tensors"):
        O.ce_linear_fwd(torch.randn(4, 3), torch.randn(5, 3), targets, None, 0.0, 0, -100, 2, False, False)
    with pytest.raises(KernelLibraryError, match="CUDA tensors"):
        O.ce_scale_(torch.randn(3), torch.tensor(2.0))
    O.ce_scale_(torch.randn(0), torch.tensor(2.0))  # nothing to scale: no launch, no check
