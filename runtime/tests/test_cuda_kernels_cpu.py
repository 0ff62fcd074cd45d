"""opslot's `cuda` kernels on machines that cannot run them: asking for them is a clear error,
never a silent fallback (the kernels themselves are tested on a GPU: tests/gpu/kernels/)."""

import sys

import pytest
import torch

from opslot import DeviceInfo, OpsImplementationConfig, use_device
from opslot.kernels.cuda import _lib

H200 = DeviceInfo("cuda", (9, 0))
CUDA_OPS = [
    ("rms_norm", "standard"),
    ("rms_norm", "offset"),
    ("rms_norm", "unweighted"),
    ("rms_norm_gated", "standard"),
    ("rotary_pos_emb", "full"),
    ("rotary_pos_emb", "partial"),
    ("swiglu_mlp", "standard"),
    ("load_balancing_loss", "standard"),
    ("causal_conv1d", "standard"),
    ("chunk_gated_delta_rule", "standard"),
]


def test_explicit_cuda_on_a_cpu_machine_is_an_error():
    cfg = OpsImplementationConfig(rms_norm_implementation="cuda", rotary_pos_emb_implementation="cuda")
    with use_device(DeviceInfo("cpu")), pytest.raises(ValueError) as err:
        cfg.validate([("rms_norm", "standard"), ("rotary_pos_emb", "full")])
    assert str(err.value) == (
        "invalid ops_implementation:\n"
        "  rms_norm/standard (rms_norm_implementation='cuda'): kernel 'cuda' for rms_norm/standard cannot run here: "
        "needs cuda sm_80+; this machine has cpu\n"
        "  rotary_pos_emb/full (rotary_pos_emb_implementation='cuda'): kernel 'cuda' for rotary_pos_emb/full cannot "
        "run here: needs cuda sm_80+; this machine has cpu"
    )


@pytest.fixture
def missing_library(monkeypatch, tmp_path):
    """A CUDA machine (pretended) whose $OPSLOT_KERNELS_LIB points nowhere; restores the loader."""
    monkeypatch.setenv(_lib.ENV_VAR, str(tmp_path / "libopslot_kernels.so"))
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_error", None)
    saved = {
        name: mod
        for name, mod in sys.modules.items()
        if name.startswith("opslot.kernels.cuda.") and not name.endswith("._lib") and not name.endswith("._ops_common")
    }
    for name in saved:
        del sys.modules[name]
    # Kernels already loaded by earlier tests (on a GPU machine) are cached in their specs: forget them.
    from opslot.registry import KERNEL_REGISTRY

    specs = [
        KERNEL_REGISTRY.get(op, variant, "cuda")
        for (op, variant) in KERNEL_REGISTRY.list_available(include_unsupported=True)
    ]
    cached = [(spec, dict(spec._loaded)) for spec in specs if spec is not None]
    for spec, _ in cached:
        spec._loaded.clear()
    try:
        yield tmp_path / "libopslot_kernels.so"
    finally:
        sys.modules.update(saved)
        for spec, loaded in cached:
            spec._loaded.clear()
            spec._loaded.update(loaded)


def test_explicit_cuda_without_the_library_is_an_error_at_bind_time(missing_library):
    if any(name in sys.modules for name in ("opslot.kernels.cuda.norms",)):
        pytest.skip("module already imported")
    cfg = OpsImplementationConfig(rms_norm_implementation="cuda")
    with use_device(H200), pytest.raises(ValueError) as err:
        cfg.validate([("rms_norm", "standard")])
    msg = str(err.value)
    assert msg.startswith("invalid ops_implementation:\n  rms_norm/standard (rms_norm_implementation='cuda'): ")
    assert f"libopslot_kernels.so not found (looked at ${_lib.ENV_VAR}={missing_library})" in msg
    assert "make kernels" in msg


def test_calling_a_cuda_kernel_without_a_gpu_is_an_error():
    from opslot.kernels.cuda import norms  # imports fine on a CPU machine (fake implementations work anywhere)

    x = torch.randn(2, 8)
    # Raised by the CPU kernel libopslot_torch.so registers for every opslot op (a RuntimeError).
    with pytest.raises(
        RuntimeError,
        match=r"^opslot's cuda kernels run on CUDA tensors, got a tensor on cpu "
        r"\(on a CUDA machine they are the default: move the model to the "
        r"GPU, or choose 'eager' or 'torch' for this op in ops_implementation, "
        r"or set OPSLOT_FORCE_IMPL=eager\)$",
    ):
        norms.rms_norm_standard(x, torch.ones(8), 1e-6)


def test_fake_implementations_run_without_a_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opslot.kernels.cuda import load_balancing, norms, rope, swiglu  # noqa: F401

    with FakeTensorMode():
        x = torch.randn(3, 5, 64, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(64, dtype=torch.float32, requires_grad=True)
        y = norms.rms_norm_standard(x, w, 1e-6)
        assert y.dtype == torch.float32 and y.shape == x.shape  # w * x.to(bf16) promotes, as upstream
        y.sum().backward()
        assert x.grad.shape == x.shape and w.grad.dtype == torch.float32
        q = torch.randn(2, 7, 4, 32, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        k = torch.randn(2, 7, 2, 32, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        cos, sin = torch.randn(2, 7, 16, dtype=torch.bfloat16), torch.randn(2, 7, 16, dtype=torch.bfloat16)
        qe, ke = rope.rotary_pos_emb_partial(q, k, cos, sin)
        assert qe.stride() == q.stride() and ke.shape == k.shape  # the input's layout is kept
        logits = tuple(torch.randn(10, 8, requires_grad=True) for _ in range(3))
        loss = load_balancing.load_balancing_loss(logits, 8, 2, torch.ones(2, 5))
        loss.backward()
        assert loss.shape == () and logits[0].grad.shape == (10, 8)
    with pytest.raises(ValueError, match="cos/sin require grad"):
        rope.rotary_pos_emb_full(
            torch.randn(1, 1, 2, 4),
            torch.randn(1, 1, 2, 4),
            torch.randn(1, 2, 4, requires_grad=True),
            torch.randn(1, 2, 4),
        )
    assert load_balancing.load_balancing_loss(None, 8) == 0
