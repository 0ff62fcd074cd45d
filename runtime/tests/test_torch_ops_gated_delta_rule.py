"""opslot::gdr_fwd / opslot::gdr_bwd, registered from C++ by libopslot_torch.so
(kernels/torch/gated_delta_rule.cc), on a machine without a GPU: the dispatch keys, opcheck's schema,
autograd-registration and fake-tensor tests on meta tensors, the shapes of what the forward saves for
the backward, the autograd node and which inputs get gradients, and the argument checks' exact
messages and exception types (those of the Python custom ops they replace). The kernels themselves:
tests/gpu/kernels/test_gated_delta_rule.py."""

from __future__ import annotations

import re

import pytest
import torch

from test_kernel_library_symbols import _library

O = torch.ops.opslot  # noqa: E741
TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture(scope="module")
def gdr():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import gated_delta_rule

    return gated_delta_rule


def meta(*shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def inputs(B=1, T=70, H=2, Dk=32, Dv=48, dtype=torch.bfloat16, requires_grad=False):
    """q, k, v [B, T, H, D] in `dtype`, g fp32 and beta in `dtype` [B, T, H]."""
    shapes = [(B, T, H, Dk), (B, T, H, Dk), (B, T, H, Dv), (B, T, H), (B, T, H)]
    dtypes = [dtype, dtype, dtype, torch.float32, dtype]
    return [meta(*s, dtype=d, requires_grad=requires_grad) for s, d in zip(shapes, dtypes)]


def test_ops_are_registered_from_cpp(gdr):
    for op in ("gdr_fwd", "gdr_bwd"):
        name = f"opslot::{op}"
        for key in ("CUDA", "Meta", "CPU"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch._library.custom_ops.OPDEFS.get(name) is None  # no Python custom op behind it
    assert torch._C._dispatch_has_kernel_for_dispatch_key("opslot::gdr_fwd", "Autograd")


def _cases():
    ins = inputs(requires_grad=True)
    s0 = meta(1, 2, 32, 48, requires_grad=True)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device="meta")
    packed = [x.detach() for x in inputs(T=70)]
    out, final, hs, vnew, w, gamma = O.gdr_fwd(*packed, None, cu, True, 0.17)
    return [
        ("fwd dense with a state", O.gdr_fwd.default, (*ins, s0, None, True, 0.17)),
        ("fwd packed", O.gdr_fwd.default, (*ins, None, cu, True, 0.17)),
        (
            "fwd fp32 without l2norm",
            O.gdr_fwd.default,
            (*inputs(2, 5, 1, 128, 128, torch.float32), None, None, False, 0.5),
        ),
        ("bwd packed", O.gdr_bwd.default, (out, final, *packed, hs, vnew, w, gamma, cu, True, 0.17)),
        ("bwd no dfinal", O.gdr_bwd.default, (out, None, *packed, hs, vnew, w, gamma, cu, True, 0.17)),
    ]


@pytest.mark.parametrize("index", range(5))
def test_opcheck_on_meta(gdr, index):
    name, op, args = _cases()[index]
    torch.library.opcheck(op, args, test_utils=TEST_UTILS)


def test_saved_tensors_and_gradients(gdr):
    ins = inputs(B=1, T=130, H=3, Dk=64, Dv=32, requires_grad=True)
    cu = torch.tensor([0, 1, 60, 130], dtype=torch.int64, device="meta")
    out, final, hs, vnew, w, gamma = O.gdr_fwd(*ins, None, cu, True, 0.125)
    # 130 tokens: 3 chunks, plus one per packed sequence (an upper bound)
    assert out.shape == (1, 130, 3, 32) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert final.shape == (3, 3, 64, 32) and final.dtype == torch.float32
    assert hs.shape == (6, 3, 128, 128) and vnew.shape == w.shape == (6, 3, 64, 128) and gamma.shape == (6, 3, 64)
    assert (hs.dtype, gamma.dtype) == (torch.bfloat16, torch.float32)
    assert "GatedDeltaRuleFunction" in out.grad_fn.name()
    assert not any(t.requires_grad for t in (hs, vnew, w, gamma))  # marked non-differentiable
    (out.float().sum() + final.sum()).backward()
    assert [x.grad.dtype for x in ins] == [x.dtype for x in ins]
    assert all(x.grad.shape == x.shape for x in ins)
    # the initial state gets its gradient only when it was given
    ins = inputs(B=2, T=10, requires_grad=True)
    s0 = meta(2, 2, 32, 48, requires_grad=True)
    out, final = gdr.chunk_gated_delta_rule(*ins, initial_state=s0, output_final_state=True)
    out.float().sum().backward()
    assert s0.grad.shape == s0.shape and s0.grad.dtype == torch.float32
    assert final.shape == (2, 2, 32, 48)


def test_strided_inputs_give_contiguous_outputs_and_gradients(gdr):
    B, T, H, D = 2, 9, 4, 16
    mixed = meta(B, T, 3 * H * D, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = (x.reshape(B, T, H, D) for x in torch.split(mixed, H * D, dim=-1))
    g, beta = meta(B, T, H), meta(B, T, H, dtype=torch.bfloat16)
    out, _ = gdr.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    assert not q.is_contiguous() and out.is_contiguous()
    q, k, v = q.detach(), k.detach(), v.detach()
    saved = O.gdr_fwd(q, k, v, g, beta, None, None, True, 0.25)[2:]
    dq, dk, dv, dg, dbeta, dinit = O.gdr_bwd(out, None, q, k, v, g, beta, *saved, None, True, 0.25)
    assert dq.is_contiguous() and dq.shape == q.shape and dinit.shape == (2, 4, 16, 16)


def _expect(error, message, fn):
    with pytest.raises(error) as err:
        fn()
    assert str(err.value).split("\n\nWhile executing")[0] == message


def _with(index, value, B=2):
    args = inputs(B=B, T=10, H=3, Dk=64, Dv=32) + [None, None]
    args[index] = value
    return args


MESSAGES = [
    (
        TypeError,
        "chunk_gated_delta_rule: query: opslot cuda kernels take float32, float16 or bfloat16 tensors, got torch.int32",
        lambda: _with(0, meta(2, 10, 3, 64).int()),
    ),
    (
        ValueError,
        "chunk_gated_delta_rule: key must be [batch, seq, heads, dim], got (2, 10, 3)",
        lambda: _with(1, meta(2, 10, 3, dtype=torch.bfloat16)),
    ),
    (
        TypeError,
        "chunk_gated_delta_rule: query, key and value must share a dtype, got torch.bfloat16, torch.bfloat16, "
        "torch.float16",
        lambda: _with(2, meta(2, 10, 3, 32, dtype=torch.float16)),
    ),
    (
        ValueError,
        "chunk_gated_delta_rule: query (2, 10, 3, 64), key (2, 10, 3, 64) and value (2, 11, 3, 32) must agree in "
        "batch, sequence and heads (repeat query/key heads to the value heads first)",
        lambda: _with(2, meta(2, 11, 3, 32, dtype=torch.bfloat16)),
    ),
    (
        ValueError,
        "chunk_gated_delta_rule: the cuda kernel takes head dims 1..128, got key 64 and value 256",
        lambda: _with(2, meta(2, 10, 3, 256, dtype=torch.bfloat16)),
    ),
    (
        ValueError,
        "chunk_gated_delta_rule: g must be [batch, seq, heads] = (2, 10, 3), got (2, 10)",
        lambda: _with(3, meta(2, 10)),
    ),
    (
        ValueError,
        "chunk_gated_delta_rule: cu_seqlens must be a 1-D int32/int64 tensor [num_seqs + 1], got torch.float32 (3,)",
        lambda: _with(6, meta(3), B=1),
    ),
    (
        ValueError,
        "chunk_gated_delta_rule: packed sequences (cu_seqlens) need batch 1, got 2",
        lambda: _with(6, meta(3).int()),
    ),
    (
        ValueError,
        "chunk_gated_delta_rule: initial_state must be (2, 3, 64, 32) (one per sequence), got (2, 3, 64, 64)",
        lambda: _with(5, meta(2, 3, 64, 64)),
    ),
]


@pytest.mark.parametrize("index", range(len(MESSAGES)))
def test_argument_checks_have_opslots_messages(gdr, index):
    error, message, args = MESSAGES[index]
    _expect(error, message, lambda: O.gdr_fwd(*args(), True, 0.1))


def test_cpu_tensors_are_checked_then_refused(gdr):
    refusal = "^" + re.escape("opslot's cuda kernels run on CUDA tensors, got a tensor on cpu")
    cpu = [torch.zeros(x.shape, dtype=x.dtype) for x in inputs(T=10)]
    with pytest.raises(ValueError, match="head dims 1..128"):  # the checks come first, as in the Python op
        gdr.chunk_gated_delta_rule(*cpu[:2], torch.randn(1, 10, 2, 200, dtype=torch.bfloat16), *cpu[3:])
    with pytest.raises(RuntimeError, match=refusal):
        gdr.chunk_gated_delta_rule(*cpu)
    with pytest.raises(RuntimeError, match=refusal):
        O.gdr_bwd(torch.randn(1, 10, 2, 48), None, *cpu, *(torch.empty(0) for _ in range(4)), None, True, 0.1)
