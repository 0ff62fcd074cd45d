"""GPU tests of opslot's `cuda` cross-entropy (runtime/opslot/kernels/cuda/cross_entropy.py and
kernels/src/cross_entropy.cu) against the fp32 references of opslot.reference.

Run: OPSLOT_KERNELS_LIB=<path to libopslot_kernels.so> python3 -m pytest -q tests/gpu/kernels/test_cross_entropy.py
Skips cleanly without CUDA or without the library.
"""

import types

import pytest
import torch
import torch.nn as nn

from opslot import reference  # noqa: E402
from opslot.kernels.cuda import cross_entropy as ce, unavailable_reason  # noqa: E402

_REASON = unavailable_reason() if torch.cuda.is_available() else "no CUDA device"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or _REASON is not None, reason=str(_REASON))

torch.backends.cuda.matmul.allow_tf32 = False

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
VOCABS = [151936, 128256, 262208, 32001]
# relative Frobenius error of a gradient / absolute error of the loss, vs the fp32 reference
GRAD_TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}
LOSS_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def make_module(vocab, hidden, dtype, seed=0, softcap=None, bias=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    head = nn.Linear(hidden, vocab, bias=bias, device="cuda", dtype=dtype)
    with torch.no_grad():  # logits of std ~2: a peaked softmax, unlike nn.Linear's default init
        head.weight.copy_(torch.randn(vocab, hidden, device="cuda", generator=g) * (2.0 / hidden**0.5))
    return types.SimpleNamespace(
        lm_head=head, config=types.SimpleNamespace(vocab_size=vocab, final_logit_softcapping=softcap)
    )


def make_inputs(batch, seq, hidden, vocab, dtype, pattern="none", seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(batch, seq, hidden, device="cuda", generator=g).to(dtype)
    labels = torch.randint(0, vocab, (batch, seq), device="cuda", generator=g)
    if pattern == "half":
        labels[:, ::2] = -100
    elif pattern == "all":
        labels[:] = -100
    return h, labels


def fp32_module(module):
    w = module.lm_head.weight.detach().float()
    head = nn.Linear(w.shape[1], w.shape[0], bias=False, device="cuda")
    with torch.no_grad():
        head.weight.copy_(w)
    return types.SimpleNamespace(lm_head=head, config=module.config)


def run(fn, module, hidden, labels, **kwargs):
    module.lm_head.weight.grad = None
    h = hidden.detach().clone().requires_grad_(True)
    _, loss = fn(module, h, labels, **kwargs)
    loss.backward()
    return loss.detach(), h.grad, module.lm_head.weight.grad


def reference_run(module, hidden, labels, **kwargs):
    return run(reference.cross_entropy_causal, fp32_module(module), hidden.float(), labels, **kwargs)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("pattern", ["none", "half", "all"])
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_causal_matches_fp32_reference(dtype, vocab, pattern):
    module = make_module(vocab, 64, dtype)
    hidden, labels = make_inputs(2, 40, 64, vocab, dtype, pattern)
    loss, gh, gw = run(ce.cross_entropy_causal, module, hidden, labels, chunk_size=32)  # 3 chunks, last ragged
    ref, rgh, rgw = reference_run(module, hidden, labels)
    assert loss.dtype == torch.float32 and gh.dtype == dtype and gw.dtype == dtype
    if pattern == "all":  # upstream: mean over 0 tokens = NaN with zero gradients; here 0
        assert torch.isnan(ref)
        assert loss.item() == 0.0 and torch.count_nonzero(gh) == 0 and torch.count_nonzero(gw) == 0
        return
    assert abs(loss.item() - ref.item()) <= LOSS_TOL[dtype] * max(1.0, abs(ref.item()))
    assert rel_err(gh, rgh) <= GRAD_TOL[dtype], rel_err(gh, rgh)
    assert rel_err(gw, rgw) <= GRAD_TOL[dtype], rel_err(gw, rgw)
    if dtype != torch.float32:  # no worse than upstream eager in the same dtype (bf16 grad_weight sum)
        up, ugh, ugw = run(reference.cross_entropy_causal, module, hidden, labels)
        assert abs(loss.item() - ref.item()) <= 3 * abs(up.item() - ref.item()) + 2e-3
        assert rel_err(gh, rgh) <= 3 * rel_err(ugh, rgh) + 1e-3
        assert rel_err(gw, rgw) <= 3 * rel_err(ugw, rgw) + 1e-3


@pytest.mark.parametrize("num_items", ["int", "tensor"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_num_items_in_batch_and_shift_labels(dtype, num_items):
    vocab = 32001
    module = make_module(vocab, 64, dtype)
    hidden, labels = make_inputs(2, 33, 64, vocab, dtype, "half")
    n = 29 if num_items == "int" else torch.tensor(29, device="cuda")
    for kwargs in ({"num_items_in_batch": n}, {"num_items_in_batch": n, "shift_labels": labels}):
        loss, gh, gw = run(ce.cross_entropy_causal, module, hidden, labels, chunk_size=20, **kwargs)
        ref, rgh, rgw = reference_run(module, hidden, labels, **kwargs)
        assert abs(loss.item() - ref.item()) <= LOSS_TOL[dtype] * max(1.0, abs(ref.item()))
        assert rel_err(gh, rgh) <= GRAD_TOL[dtype]
        assert rel_err(gw, rgw) <= GRAD_TOL[dtype]
    # all ignored with num_items_in_batch: 0 / n = 0, as upstream
    loss, gh, gw = run(ce.cross_entropy_causal, module, hidden, torch.full_like(labels, -100), num_items_in_batch=n)
    assert loss.item() == 0.0 and torch.count_nonzero(gw) == 0


def test_gradient_accumulation_matches_one_batch():
    vocab, dtype = 32001, torch.float32
    module = make_module(vocab, 64, dtype)
    hidden, labels = make_inputs(4, 17, 64, vocab, dtype, "half")
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    total = (shift != -100).sum()
    module.lm_head.weight.grad = None
    h = hidden.clone().requires_grad_(True)
    for part in (slice(0, 2), slice(2, 4)):
        _, loss = ce.cross_entropy_causal(module, h[part], labels[part], num_items_in_batch=total)
        loss.backward()
    ref, rgh, rgw = reference_run(module, hidden, labels)
    assert rel_err(h.grad, rgh) <= 1e-4 and rel_err(module.lm_head.weight.grad, rgw) <= 1e-4


def test_deterministic_bitwise():
    vocab, dtype = 151936, torch.bfloat16
    module = make_module(vocab, 256, dtype)
    hidden, labels = make_inputs(2, 500, 256, vocab, dtype, "half")
    a = run(ce.cross_entropy_causal, module, hidden, labels, chunk_size=256)
    b = run(ce.cross_entropy_causal, module, hidden, labels, chunk_size=256)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_forward_only_does_no_backward_work():
    vocab, dtype = 151936, torch.bfloat16
    module = make_module(vocab, 256, dtype)
    hidden, labels = make_inputs(1, 300, 256, vocab, dtype)
    loss_grad, _, _ = run(ce.cross_entropy_causal, module, hidden, labels)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        _, loss = ce.cross_entropy_causal(module, hidden, labels)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert loss.grad_fn is None
    assert torch.equal(loss, loss_grad)  # the same statistics pass, without the gradient write
    tile = 300 * vocab * 2
    assert extra < tile + (4 << 20), extra  # no grad_weight [V, H] / grad_hidden buffers
    # inputs that do not require grad: no autograd node either
    _, loss2 = ce.cross_entropy_causal(
        types.SimpleNamespace(lm_head=module.lm_head.requires_grad_(False), config=module.config), hidden, labels
    )
    module.lm_head.requires_grad_(True)
    assert loss2.grad_fn is None and torch.equal(loss2, loss_grad)


def test_training_step_memory_is_one_tile_plus_gradients():
    vocab, hidden_size, tokens, dtype = 151936, 256, 2048, torch.bfloat16
    module = make_module(vocab, hidden_size, dtype)
    hidden, labels = make_inputs(1, tokens, hidden_size, vocab, dtype)
    h = hidden.clone().requires_grad_(True)
    for _ in range(2):  # the second step is measured (cuBLAS workspace etc. already allocated)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _, loss = ce.cross_entropy_causal(module, h, labels)
        grads = torch.autograd.grad(loss, [h, module.lm_head.weight])
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
        del loss, grads
    chunk = ce.default_chunk_size(tokens, vocab, 2)
    tile, grad_bytes = chunk * vocab * 2, (tokens + vocab) * hidden_size * 2
    assert extra <= tile + grad_bytes + (4 << 20), (extra, tile, grad_bytes)


def test_incoming_gradient_scales_and_second_backward_is_refused():
    vocab, dtype = 32001, torch.bfloat16
    module = make_module(vocab, 64, dtype)
    hidden, labels = make_inputs(1, 50, 64, vocab, dtype)
    _, gh1, gw1 = run(ce.cross_entropy_causal, module, hidden, labels)
    module.lm_head.weight.grad = None
    h = hidden.clone().requires_grad_(True)
    _, loss = ce.cross_entropy_causal(module, h, labels)
    (loss * 0.25).backward(retain_graph=True)
    assert torch.equal(h.grad, (gh1.float() * 0.25).to(dtype))
    assert torch.equal(module.lm_head.weight.grad, (gw1.float() * 0.25).to(dtype))
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


def test_noncontiguous_hidden_single_and_empty():
    vocab, dtype = 32001, torch.float32
    module = make_module(vocab, 64, dtype)
    big, labels = make_inputs(2, 21, 64, vocab, dtype)
    hidden = big[:, 1:, :]  # a strided view, as hidden_states[:, slice_indices, :]
    loss, gh, gw = run(ce.cross_entropy_causal, module, hidden, labels[:, 1:])
    ref, rgh, rgw = reference_run(module, hidden, labels[:, 1:])
    assert abs(loss.item() - ref.item()) <= 1e-4 and rel_err(gh, rgh) <= 1e-4 and rel_err(gw, rgw) <= 1e-4
    one = big[:1, :1, :]
    loss, gh, gw = run(ce.cross_entropy_causal, module, one, labels[:1, :1], shift_labels=labels[:1, :1])
    ref, rgh, rgw = reference_run(module, one, labels[:1, :1], shift_labels=labels[:1, :1])
    assert abs(loss.item() - ref.item()) <= 1e-4 and rel_err(gw, rgw) <= 1e-4
    loss, gh, gw = run(ce.cross_entropy_causal, module, big[:, :0, :], labels[:, :0])
    assert loss.item() == 0.0 and gh.shape == (2, 0, 64) and torch.count_nonzero(gw) == 0


def test_out_of_range_target_gives_nan():
    module = make_module(1000, 32, torch.float32)
    hidden, labels = make_inputs(1, 8, 32, 1000, torch.float32)
    with torch.no_grad():
        _, loss = ce.cross_entropy_causal(module, hidden, labels, shift_labels=torch.full_like(labels, 1000))
    assert torch.isnan(loss)


def test_refusals_and_no_labels():
    hidden, labels = make_inputs(1, 8, 32, 1000, torch.bfloat16)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        ce.cross_entropy_causal(make_module(1000, 32, torch.bfloat16, softcap=30.0), hidden, labels)
    with pytest.raises(ValueError, match="bias"):
        ce.cross_entropy_causal(make_module(1000, 32, torch.bfloat16, bias=True), hidden, labels)
    with pytest.raises(ValueError, match="dtype|float"):
        ce.cross_entropy_causal(make_module(1000, 32, torch.float32), hidden, labels)
    module = make_module(1000, 32, torch.bfloat16)
    logits, loss = ce.cross_entropy_causal(module, hidden, None)
    assert loss is None and torch.equal(logits, module.lm_head(hidden))


def test_opcheck():
    h = torch.randn(70, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1001, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 1001, (70,), device="cuda")
    t[::3] = -100
    for args in [
        (h, w, t, None, 0.0, 0, -100, 32, True, True),
        (h, w, t, torch.tensor(9.0, device="cuda"), 0.0, 2, -100, 64, True, False),
        (h.detach(), w.detach(), t, None, 5.0, 1, -100, 128, False, False),
    ]:
        torch.library.opcheck(torch.ops.opslot.ce_linear_fwd.default, args)
    x = torch.randn(6, 5, device="cuda", requires_grad=True)
    y = torch.tensor([0, 4, -100, 2, 1, 3], device="cuda")
    torch.library.opcheck(torch.ops.opslot.ce_logits_fwd.default, (x, y, None, 0.0, 0, -100, True))
    torch.library.opcheck(torch.ops.opslot.ce_logits_fwd.default, (x.detach(), y, None, 3.0, 1, -100, False))
    torch.library.opcheck(
        torch.ops.opslot.ce_scale_.default,
        (torch.randn(1037, device="cuda", dtype=torch.bfloat16), torch.tensor(2.5, device="cuda")),
    )


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    vocab, dtype = 32001, torch.bfloat16
    module = make_module(vocab, 64, dtype)
    hidden, labels = make_inputs(2, 24, 64, vocab, dtype, "half")

    def step(h, labels):
        return ce.cross_entropy_causal(module, h, labels)[1]

    eager = run(lambda m, h, lab: (None, step(h, lab)), module, hidden, labels)
    compiled_step = torch.compile(step, backend="aot_eager", fullgraph=True)
    comp = run(lambda m, h, lab: (None, compiled_step(h, lab)), module, hidden, labels)
    for x, y in zip(eager, comp):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["plain", "ignored", "num_items", "all_ignored", "unaligned"])
def test_sequence_classification_single_label(dtype, case):
    torch.manual_seed(0)
    rows, classes = 37, (1001 if case == "unaligned" else 7)
    base = torch.randn(rows, classes + 1, device="cuda") * 3
    labels = torch.randint(0, classes, (rows,), device="cuda")
    if case in ("ignored", "num_items"):
        labels[::3] = -100
    if case == "all_ignored":
        labels[:] = -100
    kwargs = {"num_items_in_batch": 20} if case == "num_items" else {}
    # "unaligned": a view with an odd row stride and offset (vector head/tail paths, scalar grad path)
    pooled = (base[:, 1:] if case == "unaligned" else base[:, :classes].contiguous()).to(dtype)
    x = pooled.detach().clone() if case != "unaligned" else pooled.detach()
    x.requires_grad_(True)
    cfg = types.SimpleNamespace(num_labels=classes, problem_type=None)
    loss = ce.cross_entropy_sequence_classification(pooled_logits=x, labels=labels, config=cfg, **kwargs)
    assert cfg.problem_type == "single_label_classification" and loss.dtype == dtype
    loss.backward()
    xr = pooled.detach().float().requires_grad_(True)
    ref = reference.cross_entropy_sequence_classification(
        pooled_logits=xr, labels=labels, config=types.SimpleNamespace(num_labels=classes, problem_type=None), **kwargs
    )
    ref.backward()
    if case == "all_ignored":
        assert loss.item() == 0.0 and torch.count_nonzero(x.grad) == 0
        return
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    assert abs(loss.float().item() - ref.item()) <= tol * max(1.0, abs(ref.item()))
    assert rel_err(x.grad, xr.grad) <= tol


@pytest.mark.parametrize("problem", ["regression", "multi_label"])
def test_sequence_classification_other_problems_use_reference_math(problem):
    torch.manual_seed(0)
    num_labels = 1 if problem == "regression" else 4
    x = torch.randn(6, num_labels, device="cuda", requires_grad=True)
    labels = (
        torch.randn(6, device="cuda")
        if problem == "regression"
        else torch.randint(0, 2, (6, num_labels), device="cuda").float()
    )
    loss = ce.cross_entropy_sequence_classification(
        pooled_logits=x, labels=labels, config=types.SimpleNamespace(num_labels=num_labels, problem_type=None)
    )
    ref = reference.cross_entropy_sequence_classification(
        pooled_logits=x, labels=labels, config=types.SimpleNamespace(num_labels=num_labels, problem_type=None)
    )
    assert torch.equal(loss, ref)


def test_sequence_classification_deterministic():
    x = torch.randn(513, 3001, device="cuda", dtype=torch.bfloat16)
    y = torch.randint(0, 3001, (513,), device="cuda")
    outs = []
    for _ in range(2):
        xx = x.clone().requires_grad_(True)
        loss = ce.logits_cross_entropy(xx, y)
        loss.backward()
        outs.append((loss, xx.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
