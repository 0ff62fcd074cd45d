"""opslot::causal_conv1d_fwd / _bwd / _update, registered from C++ by libopslot_torch.so
(kernels/torch/causal_conv1d.cc), on a machine without a GPU: the dispatch keys, opcheck's schema,
autograd-registration and fake-tensor tests on meta tensors, the output layouts, the autograd node,
the in-place update's version bump, and the argument checks' exact messages and exception types
(those of the Python custom ops they replace). The kernels themselves: tests/gpu/kernels/
test_causal_conv1d.py."""

from __future__ import annotations

import re

import pytest
import torch

from test_kernel_library_symbols import _library

O = torch.ops.opslot  # noqa: E741
OPS = ("causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update")
TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture(scope="module")
def cc():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import causal_conv1d

    return causal_conv1d


def meta(*shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def channels_last(b, c, t, dtype=torch.bfloat16, requires_grad=False):
    """Upstream's layout: the transpose of a contiguous [B, T, C]."""
    return meta(b, t, c, dtype=dtype).transpose(1, 2).requires_grad_(requires_grad)


def test_ops_are_registered_from_cpp(cc):
    for op in OPS:
        name = f"opslot::{op}"
        for key in ("CUDA", "Meta", "CPU"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch._library.custom_ops.OPDEFS.get(name) is None  # no Python custom op behind it
    assert torch._C._dispatch_has_kernel_for_dispatch_key("opslot::causal_conv1d_fwd", "Autograd")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("opslot::causal_conv1d_update", "ADInplaceOrView")
    assert str(O.causal_conv1d_update.default._schema) == (
        "opslot::causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, bool silu) "
        "-> Tensor"
    )


def _cases():
    x = channels_last(1, 40, 37, torch.float32, requires_grad=True)
    w = meta(40, 4, requires_grad=True)
    b = meta(40, requires_grad=True)
    cu = torch.tensor([0, 1, 20, 37], dtype=torch.int32, device="meta")
    xc = meta(2, 40, 37, requires_grad=True)
    g = meta(1, 40, 37)
    return [
        ("fwd channels-last", O.causal_conv1d_fwd.default, (x, w, b, None, True)),
        ("fwd packed", O.causal_conv1d_fwd.default, (x, w, None, cu, False)),
        ("fwd contiguous, bf16 x, fp32 params", O.causal_conv1d_fwd.default, (xc.bfloat16(), w, b, None, True)),
        ("bwd packed", O.causal_conv1d_bwd.default, (g, x.detach(), w.detach(), b.detach(), cu, True)),
        ("bwd no bias", O.causal_conv1d_bwd.default, (g, x.detach(), w.detach(), None, None, False)),
        ("update", O.causal_conv1d_update.default, (x.detach()[:, :, :1], meta(1, 40, 4), w.detach(), None, True)),
    ]


@pytest.mark.parametrize("index", range(6))
def test_opcheck_on_meta(cc, index):
    name, op, args = _cases()[index]
    torch.library.opcheck(op, args, test_utils=TEST_UTILS)


def test_outputs_keep_the_input_layout_and_autograd_saves_the_inputs(cc):
    x = channels_last(2, 64, 9, requires_grad=True)
    w = meta(64, 4, dtype=torch.bfloat16, requires_grad=True)
    b = meta(64, requires_grad=True)  # an fp32 bias with bf16 activations
    y = cc.causal_conv1d(x, w, b, "silu")
    assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == torch.bfloat16
    assert "CausalConv1dFunction" in y.grad_fn.name()
    y.sum().backward()
    assert x.grad.stride() == x.stride() and w.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.float32
    xc = meta(2, 64, 9, requires_grad=True)  # contiguous [B, C, T]: a contiguous output
    w2 = meta(64, 3, requires_grad=True)
    yc = cc.causal_conv1d(xc, w2, None, None)
    assert yc.stride() == (576, 9, 1)
    yc.sum().backward()
    assert xc.grad.shape == xc.shape and w2.grad.shape == (64, 3)
    dx, dw, db = O.causal_conv1d_bwd(meta(2, 64, 9), xc.detach(), w2.detach(), None, None, False)
    assert dx.stride() == (576, 9, 1) and dw.is_contiguous() and db.shape == (64,) and db.dtype == torch.float32


def test_the_update_is_in_place_for_autograd(cc):
    state = meta(2, 64, 3)
    version = state._version
    with torch.no_grad():
        out = cc.causal_conv1d(channels_last(2, 64, 1, torch.float32), meta(64, 4), None, "silu", conv_state=state)
    assert out.shape == (2, 64, 1) and state._version > version


def _expect(error, message, fn):
    with pytest.raises(error) as err:
        fn()
    assert str(err.value).split("\n\nWhile executing")[0] == message


MESSAGES = [
    (
        TypeError,
        "causal_conv1d: opslot cuda kernels take float32, float16 or bfloat16 tensors, got torch.int32",
        lambda: (meta(2, 8, 5).int(), meta(8, 4), None, None),
    ),
    (
        ValueError,
        "causal_conv1d: hidden_states must be [batch, channels, seq], got shape (8, 5)",
        lambda: (meta(8, 5), meta(8, 4), None, None),
    ),
    (
        ValueError,
        "causal_conv1d: weight must be [channels, width] = [8, width], got (8,)",
        lambda: (meta(2, 8, 5), meta(8), None, None),
    ),
    (
        ValueError,
        "causal_conv1d: kernel width 5; the cuda kernel takes widths 2 to 4 (use 'torch' or 'eager')",
        lambda: (meta(2, 8, 5), meta(8, 5), None, None),
    ),
    (
        TypeError,
        "causal_conv1d: weight dtype torch.bfloat16 with input dtype torch.float16 (the cuda kernel takes a "
        "weight in the input's dtype or float32); use 'torch' or 'eager'",
        lambda: (meta(2, 8, 5).half(), meta(8, 4).bfloat16(), None, None),
    ),
    (
        ValueError,
        "causal_conv1d: bias must be [8], got (7,)",
        lambda: (meta(2, 8, 5), meta(8, 4), meta(7), None),
    ),
    (
        TypeError,
        "causal_conv1d: bias dtype torch.bfloat16 with input dtype torch.float16 (the cuda kernel takes the "
        "input's dtype or float32)",
        lambda: (meta(2, 8, 5).half(), meta(8, 4).half(), meta(8).bfloat16(), None),
    ),
    (
        ValueError,
        "causal_conv1d: weight is on cpu, hidden_states on meta",
        lambda: (meta(2, 8, 5), torch.randn(8, 4), None, None),
    ),
    (
        ValueError,
        "causal_conv1d: cu_seqlens must be a 1-D int32 or int64 tensor [num_sequences + 1] (at least 2 "
        "entries), got a 1-D torch.float32 tensor of 2 entries",
        lambda: (meta(1, 8, 5), meta(8, 4), None, meta(2)),
    ),
    (
        ValueError,
        "causal_conv1d: cu_seqlens (packed sequences) needs batch size 1, got 2",
        lambda: (meta(2, 8, 5), meta(8, 4), None, meta(3).long()),
    ),
]


@pytest.mark.parametrize("index", range(len(MESSAGES)))
def test_argument_checks_have_opslots_messages(cc, index):
    error, message, args = MESSAGES[index]
    _expect(error, message, lambda: O.causal_conv1d_fwd(*args(), True))
    x = args()[0]
    _expect(error, message, lambda: O.causal_conv1d_bwd(torch.empty_like(x), *args(), True))


def test_backward_and_update_checks(cc):
    x, w = meta(2, 8, 5), meta(8, 4)
    _expect(
        ValueError,
        "causal_conv1d backward: gradient (2, 8, 4) on meta for an input (2, 8, 5) on meta",
        lambda: O.causal_conv1d_bwd(meta(2, 8, 4), x, w, None, None, True),
    )
    x1 = meta(2, 8, 1)
    _expect(
        ValueError,
        "causal_conv1d: conv_state must be [batch, channels, S] = [2, 8, S], got (3, 8, 3)",
        lambda: O.causal_conv1d_update(x1, meta(3, 8, 3), w, None, True),
    )
    _expect(
        ValueError,
        "causal_conv1d: conv_state holds 2 columns, the kernel width 4 needs at least 3",
        lambda: O.causal_conv1d_update(x1, meta(2, 8, 2), w, None, True),
    )
    _expect(
        ValueError,
        "causal_conv1d: conv_state (torch.float16 on meta) must have the input's dtype and device "
        "(torch.float32 on meta)",
        lambda: O.causal_conv1d_update(x1, meta(2, 8, 3).half(), w, None, True),
    )


def test_python_side_refusals(cc):
    x, w = meta(1, 8, 5), meta(8, 4, requires_grad=True)
    _expect(
        ValueError,
        "causal_conv1d supports activation None, 'silu' or 'swish', got 'gelu'",
        lambda: cc.causal_conv1d(x, w, None, "gelu"),
    )
    with pytest.raises(ValueError, match=r"decode update \(conv_state\) computes no gradients"):
        cc.causal_conv1d(x, w, None, conv_state=meta(1, 8, 3))
    with pytest.raises(ValueError, match="cannot be combined"):
        cc.causal_conv1d(x, w, None, conv_state=meta(1, 8, 3), cu_seqlens=meta(2).long())


def test_cpu_tensors_are_checked_then_refused(cc):
    refusal = re.escape("opslot's cuda kernels run on CUDA tensors, got a tensor on cpu")
    with pytest.raises(ValueError, match="kernel width 5"):  # the checks come first, as in the Python op
        cc.causal_conv1d(torch.randn(1, 4, 3), torch.randn(4, 5))
    with pytest.raises(RuntimeError, match="^" + refusal):
        cc.causal_conv1d(torch.randn(1, 4, 3), torch.randn(4, 2))
    with pytest.raises(RuntimeError, match="^" + refusal):
        O.causal_conv1d_bwd(torch.randn(1, 4, 3), torch.randn(1, 4, 3), torch.randn(4, 2), None, None, False)
    with pytest.raises(RuntimeError, match="^" + refusal):
        O.causal_conv1d_update(torch.randn(1, 4, 1), torch.randn(1, 4, 3), torch.randn(4, 2), None, False)
    assert cc.causal_conv1d(torch.randn(1, 4, 0), torch.randn(4, 2)).shape == (1, 4, 0)  # empty: no launch
