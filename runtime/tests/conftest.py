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
