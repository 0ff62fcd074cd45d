"""libopslot_torch.so (kernels/torch/): found where documented, refused when built for another torch
release (read from the file before it is loaded), and its ops registered from C++ with Meta and
Autograd kernels that work on any machine (docs/kernels.md, "The boundary")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from opslot.kernels.cuda import _lib
from test_kernel_library_symbols import _library


def test_a_build_for_another_torch_release_is_refused_before_loading(tmp_path):
    built = _library("libopslot_torch.so").read_bytes()
    marker = re.search(rb"opslot_torch built for torch (\d+\.\d+\.\d+);", built)
    assert marker is not None and marker.group(1).decode() == torch.__version__.split("+")[0]
    other = tmp_path / "libopslot_torch.so"
    other.write_bytes(built.replace(marker.group(0), b"opslot_torch built for torch 2.10.9;"))
    with pytest.raises(_lib.KernelLibraryError) as err:
        _lib._load_torch_ops(other)
    assert str(err.value) == (
        f"{other} was built for torch 2.10.9, this process runs torch {torch.__version__}: rebuild it "
        "against this torch (`make kernels`, or cmake -DOPSLOT_TORCH_PYTHON=<this python>)"
    )


def test_not_found_names_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv(_lib.TORCH_ENV_VAR, str(tmp_path / "missing.so"))
    with pytest.raises(_lib.KernelLibraryError, match=r"^libopslot_torch.so not found \(looked at .*missing.so\)"):
        _lib._find_torch_ops()


def test_looked_up_beside_the_kernel_library(monkeypatch, tmp_path):
    monkeypatch.delenv(_lib.TORCH_ENV_VAR, raising=False)
    monkeypatch.setenv(_lib.ENV_VAR, str(tmp_path / "libopslot_kernels.so"))
    paths = _lib.torch_candidate_paths()
    assert paths[0] == tmp_path / "libopslot_torch.so"
    assert [p.parent.name for p in paths[1:]] == ["_native", "kernels"]


def test_ops_are_registered_from_cpp_with_meta_and_autograd_kernels():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import load_balancing, norms, rope, swiglu  # noqa: F401

    for op in ("rms_norm_fwd", "rope_fwd", "silu_mul", "load_balancing_loss_fwd"):
        name = f"opslot::{op}"
        for key in ("CUDA", "Meta", "Autograd", "CPU"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        # Not a Python custom op: no Python fake or autograd registration behind it.
        assert torch._library.custom_ops.OPDEFS.get(name) is None
    x = torch.randn(4, 8, device="meta", requires_grad=True)
    w = torch.randn(8, device="meta", requires_grad=True)
    y = norms.rms_norm_standard(x, w, 1e-6)
    assert y.shape == (4, 8) and y.grad_fn is not None and "RmsNormFunction" in y.grad_fn.name()
    with pytest.raises(ValueError, match=r"^rms_norm/standard: weight of shape \[4\] for rows of 8$"):
        norms.rms_norm_standard(x, torch.randn(4, device="meta"), 1e-6)
    with pytest.raises(TypeError, match=r"silu_mul: opslot cuda kernels take float32, float16 or bfloat16"):
        swiglu.silu_mul(torch.ones(2, 4, dtype=torch.int32, device="meta"), torch.ones(2, 4, dtype=torch.int32))


def test_attaching_a_library_that_is_not_opslots_is_refused_and_keeps_the_table():
    _library("libopslot_torch.so")
    ops = _lib.torch_ops()
    before = ops.opslot_torch_library_path()
    libm = next(
        (p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6") if Path(p).is_file()),
        None,
    )
    if libm is None:
        pytest.skip("no libm.so.6 at the Debian paths")
    with pytest.raises(_lib.KernelLibraryError) as err:
        _lib._attach(ops, libm)
    assert str(err.value) == (
        f"{libm} is not an opslot kernel library (it lacks opslot_abi_version, opslot_last_error or "
        "opslot_check_device)"
    )
    assert ops.opslot_torch_library_path() == before
