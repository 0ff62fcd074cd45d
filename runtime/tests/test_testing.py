"""opslot.testing.compare_models on the generated-style fixture module."""

import types
import uuid

import pytest
import torch

from generated_fixture import SOURCE
from opslot import build_model
from opslot.testing import compare_models


@pytest.fixture
def gen_module(tmp_path, monkeypatch):
    name = f"tiny_generated_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(SOURCE.replace("torch.ones(dim)", "torch.rand(dim) + 0.5"))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def config():
    return types.SimpleNamespace(hidden_size=8, hidden_act="silu")


def test_eager_build_is_bit_identical(gen_module):
    upstream = build_model(config(), module=gen_module, model_class="TinyModel")
    patched = build_model(config(), module=gen_module, model_class="TinyModel")
    diff = compare_models(upstream, patched, {"x": torch.randn(4, 8)})
    assert diff.logits == 0.0 and diff.grads == 0.0 and diff.loss is None
    assert sorted(diff.grad_by_param) == [
        "mlp.down_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "norm.weight",
    ]


def test_torch_kernels_within_tolerance(gen_module):
    upstream = build_model(config(), module=gen_module, model_class="TinyModel")
    patched = build_model(
        config(),
        ops={"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"},
        module=gen_module,
        model_class="TinyModel",
    )
    diff = compare_models(upstream, patched, {"x": torch.randn(4, 8)})
    assert diff.logits < 1e-5 and diff.grads < 1e-5


def test_a_wrong_kernel_is_visible(gen_module):
    from opslot import KERNEL_REGISTRY, KernelSpec
    from opslot.kernels import torch_ops

    KERNEL_REGISTRY.register(KernelSpec("wrong", "rms_norm", "standard", lambda: torch_ops.rms_norm_offset))
    try:
        upstream = build_model(config(), module=gen_module, model_class="TinyModel")
        patched = build_model(
            config(), ops={"rms_norm_implementation": "wrong"}, module=gen_module, model_class="TinyModel"
        )
        diff = compare_models(upstream, patched, {"x": torch.randn(4, 8)})
    finally:
        KERNEL_REGISTRY.unregister("rms_norm", "standard", "wrong")
    assert diff.logits > 1e-2 and diff.grads > 1e-2
