"""Shared test setup: make `opslot` importable from runtime/ (no install needed), parametrise over
the devices present (cpu always, cuda when available), and reset device detection after each test."""

import os
import sys

import pytest

RUNTIME_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if RUNTIME_ROOT not in sys.path:
    sys.path.insert(0, RUNTIME_ROOT)

import torch  # noqa: E402

import opslot  # noqa: E402

# fp32 comparisons against CPU references need true fp32 on the GPU (no TF32 matmuls/convolutions).
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _restore_device_detection():
    """Every test sees a CPU machine's defaults (eager) unless it pretends otherwise (use_device):
    the tests build models on the CPU, and on a GPU machine the unset fields would take the cuda
    kernels, which need CUDA tensors. Tensors still go to the `device` fixture's devices."""
    opslot.set_device_detector(lambda: opslot.DeviceInfo("cpu"))
    yield
    opslot.set_device_detector(None)


#: torch._assert_async refuses a message of this many characters or more on CUDA, not on the CPU.
ASSERT_ASYNC_MESSAGE_LIMIT = 255


@pytest.fixture(autouse=True)
def _assert_async_messages_fit_cuda(monkeypatch):
    """Every torch._assert_async call of a test checks its message against CUDA's limit, so that a message
    too long fails here, on the CPU, and not first on a GPU (where the call raises instead of checking)."""
    real = torch._assert_async

    def checked(cond, msg=None):
        if msg is None:
            return real(cond)
        if len(msg) >= ASSERT_ASYNC_MESSAGE_LIMIT:
            raise AssertionError(
                f"torch._assert_async message of {len(msg)} characters, CUDA refuses {ASSERT_ASYNC_MESSAGE_LIMIT} "
                f"or more: {msg!r}"
            )
        return real(cond, msg)

    monkeypatch.setattr(torch, "_assert_async", checked)
