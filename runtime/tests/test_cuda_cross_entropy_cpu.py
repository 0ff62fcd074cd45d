"""CPU checks of opslot's `cuda` cross-entropy (runtime/opslot/kernels/cuda/cross_entropy.py).

Without a GPU: the module imports, refuses CPU tensors and unsupported heads with clear errors,
picks chunk sizes within its memory budget. With the two kernel launches replaced by a torch
emulation (`EmulatedBackend`, this file only), the Python side - chunking, shifting, reductions,
the forward-computed gradients scaled in backward, the custom ops' fake/autograd registrations
(torch.library.opcheck) and torch.compile tracing - is checked against opslot.reference on CPU.
The CUDA kernels themselves are tested in tests/gpu/kernels/test_cross_entropy.py.
"""

import types

import pytest
import torch
import torch.nn as nn

from opslot import reference
from opslot.kernels.cuda import KernelLibraryError, cross_entropy as ce


class EmulatedBackend:
    """The math of opslot_ce_rows / opslot_ce_scale_inplace in torch (CPU)."""

    def check(self, t):
        pass

    def rows(self, logits, grad, targets, ignore_index, grad_scale, row_loss):
        x = logits.float()
        valid = targets != ignore_index
        safe = torch.where(valid, targets, torch.zeros_like(targets))
        lse = torch.logsumexp(x, -1)
        row_loss.copy_(torch.where(valid, lse - x.gather(1, safe[:, None])[:, 0], torch.zeros_like(lse)))
        if grad is not None:
            p = torch.softmax(x, -1)
            p.scatter_add_(1, safe[:, None], -torch.ones_like(p[:, :1]))
            grad.copy_((p * (valid.float() * grad_scale)[:, None]).to(grad.dtype))

    def scale_(self, x, factor):
        x.copy_((x.float() * factor).to(x.dtype))


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(ce, "_backend", EmulatedBackend())


def make_module(vocab, hidden, dtype=torch.float32, bias=False, softcap=None, seed=0):
    torch.manual_seed(seed)
    head = nn.Linear(hidden, vocab, bias=bias).to(dtype)
    config = types.SimpleNamespace(vocab_size=vocab, final_logit_softcapping=softcap)
    return types.SimpleNamespace(lm_head=head, config=config)


def fp32_copy(module):
    head = nn.Linear(module.lm_head.in_features, module.lm_head.out_features, bias=False)
    head.weight.data.copy_(module.lm_head.weight.detach().float())
    return types.SimpleNamespace(lm_head=head, config=module.config)


def labels_for(batch, seq, vocab, pattern, seed=1):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    if pattern == "half":
        labels[:, ::2] = -100
    elif pattern == "all":
        labels[:] = -100
    return labels


def run_both(module, hidden, labels, **kwargs):
    h = hidden.clone().requires_grad_(True)
    _, loss = ce.cross_entropy_causal(module, h, labels, **kwargs)
    loss.backward()
    ref_mod = fp32_copy(module)
    h32 = hidden.detach().float().requires_grad_(True)
    _, ref = reference.cross_entropy_causal(ref_mod, h32, labels, **kwargs)
    ref.backward()
    return (loss, h.grad, module.lm_head.weight.grad), (ref, h32.grad, ref_mod.lm_head.weight.grad)


# -- without the kernels ---------------------------------------------------------------------------
def test_cpu_tensors_are_refused_clearly():
    module = make_module(50, 16)
    with pytest.raises(KernelLibraryError, match="CUDA tensors"):
        ce.cross_entropy_causal(module, torch.randn(1, 4, 16), torch.randint(0, 50, (1, 4)))
    config = types.SimpleNamespace(num_labels=3, problem_type=None)
    with pytest.raises(KernelLibraryError, match="CUDA tensors"):
        ce.cross_entropy_sequence_classification(
            pooled_logits=torch.randn(4, 3), labels=torch.tensor([0, 1, 2, 1]), config=config
        )


def test_softcapping_and_bias_are_refused():
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        ce.cross_entropy_causal(
            make_module(50, 16, softcap=30.0), torch.randn(1, 4, 16), torch.zeros(1, 4, dtype=torch.long)
        )
    with pytest.raises(ValueError, match="bias"):
        ce.cross_entropy_causal(
            make_module(50, 16, bias=True), torch.randn(1, 4, 16), torch.zeros(1, 4, dtype=torch.long)
        )


def test_without_labels_returns_lm_head_logits():
    module = make_module(50, 16)
    h = torch.randn(2, 3, 16)
    logits, loss = ce.cross_entropy_causal(module, h, None)
    assert loss is None
    torch.testing.assert_close(logits, module.lm_head(h))


def test_default_chunk_size_within_budget():
    for vocab in (32001, 128256, 151936, 262208):
        for itemsize in (2, 4):
            for tokens in (1, 100, 4096, 16384, 65536):
                c = ce.default_chunk_size(tokens, vocab, itemsize)
                assert 1 <= c <= max(tokens, 1)
                if tokens > ce.CHUNK_MULTIPLE:
                    assert c * vocab * itemsize <= max(ce.CHUNK_BUDGET_BYTES, ce.CHUNK_MULTIPLE * vocab * itemsize)
    assert ce.default_chunk_size(16384, 151936, 2) == 3072  # 0.87 GiB tiles, 5 x 3072 + 1024
    assert ce.default_chunk_size(4096, 151936, 2) == 2048
    assert ce.default_chunk_size(16384, 262208, 2) == 1024
    assert ce.default_chunk_size(1000, 151936, 2) == 1000


# -- Python side with emulated kernels -------------------------------------------------------------
@pytest.mark.parametrize("pattern", ["none", "half", "all"])
@pytest.mark.parametrize("chunk_size", [None, 5])
@pytest.mark.parametrize("num_items", [None, "int", "tensor"])
def test_matches_reference(emulated, pattern, chunk_size, num_items):
    module = make_module(37, 16)
    hidden = torch.randn(2, 9, 16)
    labels = labels_for(2, 9, 37, pattern)
    kwargs = {}
    if num_items == "int":
        kwargs["num_items_in_batch"] = 11
    elif num_items == "tensor":
        kwargs["num_items_in_batch"] = torch.tensor(11)
    (loss, gh, gw), (ref, rgh, rgw) = (
        run_both(module, hidden, labels, chunk_size=chunk_size, **kwargs)
        if chunk_size
        else run_both(module, hidden, labels, **kwargs)
    )
    if pattern == "all" and num_items is None:
        assert torch.isnan(ref)  # upstream: 0 / 0
        assert loss.item() == 0.0  # documented: 0 here
        assert torch.count_nonzero(gh) == 0 and torch.count_nonzero(gw) == 0
        return
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gh, rgh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw, rgw, rtol=1e-4, atol=1e-6)


def test_shift_labels_and_bf16(emulated):
    module = make_module(41, 32, dtype=torch.bfloat16)
    hidden = torch.randn(3, 7, 32).to(torch.bfloat16)
    shift = labels_for(3, 7, 41, "half")
    (loss, gh, gw), (ref, rgh, rgw) = run_both(
        module, hidden, torch.zeros(3, 7, dtype=torch.long), shift_labels=shift, chunk_size=4
    )
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gh.float(), rgh, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(gw.float(), rgw, rtol=5e-2, atol=5e-3)


def test_backward_scales_by_incoming_gradient_and_refuses_second_backward(emulated):
    module = make_module(29, 8)
    hidden = torch.randn(1, 6, 8)
    labels = labels_for(1, 6, 29, "none")
    (_, gh1, gw1), _ = run_both(module, hidden, labels)
    module.lm_head.weight.grad = None
    h = hidden.clone().requires_grad_(True)
    _, loss = ce.cross_entropy_causal(module, h, labels)
    (loss * 3.0).backward(retain_graph=True)
    torch.testing.assert_close(h.grad, 3 * gh1)
    torch.testing.assert_close(module.lm_head.weight.grad, 3 * gw1)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


def test_forward_only_computes_no_gradients(emulated, monkeypatch):
    module = make_module(29, 8)
    calls = []
    backend = EmulatedBackend()
    orig = backend.rows
    monkeypatch.setattr(backend, "rows", lambda *a: (calls.append(a[1] is None), orig(*a))[1])
    monkeypatch.setattr(ce, "_backend", backend)
    with torch.no_grad():
        _, loss = ce.cross_entropy_causal(module, torch.randn(1, 6, 8), labels_for(1, 6, 29, "none"))
    assert loss.grad_fn is None and calls == [True]


def test_empty_and_single_token(emulated):
    module = make_module(29, 8)
    (loss, gh, gw), _ = run_both(module, torch.randn(1, 0, 8), torch.zeros(1, 0, dtype=torch.long))
    assert loss.item() == 0.0 and gh.shape == (1, 0, 8) and torch.count_nonzero(gw) == 0
    (loss, gh, gw), (ref, rgh, rgw) = run_both(
        module, torch.randn(1, 1, 8), torch.zeros(1, 1, dtype=torch.long), shift_labels=torch.tensor([[3]])
    )
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(gw, rgw)


def test_opcheck(emulated):
    h = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(13, 8, requires_grad=True)
    t = torch.randint(0, 13, (10,))
    t[3] = -100
    for args in [
        (h, w, t, None, 0.0, 0, -100, 4, True, True),
        (h, w, t, torch.tensor(7.0), 0.0, 2, -100, 3, True, False),
        (h.detach(), w.detach(), t, None, 5.0, 1, -100, 16, False, False),
    ]:
        torch.library.opcheck(torch.ops.opslot.ce_linear_fwd.default, args)
    x = torch.randn(6, 5, requires_grad=True)
    y = torch.tensor([0, 4, -100, 2, 1, 3])
    torch.library.opcheck(torch.ops.opslot.ce_logits_fwd.default, (x, y, None, 0.0, 0, -100, True))
    torch.library.opcheck(torch.ops.opslot.ce_logits_fwd.default, (x.detach(), y, None, 3.0, 1, -100, False))
    torch.library.opcheck(torch.ops.opslot.ce_scale_.default, (torch.randn(7), torch.tensor(2.5)))


def test_torch_compile_fullgraph(emulated):
    torch._dynamo.reset()
    module = make_module(23, 8)
    hidden = torch.randn(2, 5, 8)
    labels = labels_for(2, 5, 23, "half")

    def step(h, labels, n):
        _, loss = ce.cross_entropy_causal(module, h, labels, num_items_in_batch=n)
        return loss

    h1 = hidden.clone().requires_grad_(True)
    eager = step(h1, labels, torch.tensor(4))
    eager.backward()
    g_eager = h1.grad.clone()
    module.lm_head.weight.grad = None
    h2 = hidden.clone().requires_grad_(True)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(h2, labels, torch.tensor(4))
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(h2.grad, g_eager)


@pytest.mark.parametrize("problem", ["single", "single_ignored", "regression", "multi"])
def test_sequence_classification(emulated, problem):
    torch.manual_seed(0)
    num_labels = 1 if problem == "regression" else 4
    pooled = torch.randn(6, num_labels)
    if problem.startswith("single"):
        labels = torch.randint(0, num_labels, (6,))
        if problem == "single_ignored":
            labels[1] = -100
    elif problem == "regression":
        labels = torch.randn(6)
    else:
        labels = torch.randint(0, 2, (6, num_labels)).float()
    cfg = types.SimpleNamespace(num_labels=num_labels, problem_type=None)
    cfg_ref = types.SimpleNamespace(num_labels=num_labels, problem_type=None)
    x = pooled.clone().requires_grad_(True)
    loss = ce.cross_entropy_sequence_classification(pooled_logits=x, labels=labels, config=cfg)
    loss.backward()
    xr = pooled.clone().requires_grad_(True)
    ref = reference.cross_entropy_sequence_classification(pooled_logits=xr, labels=labels, config=cfg_ref)
    ref.backward()
    assert cfg.problem_type == cfg_ref.problem_type
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(x.grad, xr.grad)
