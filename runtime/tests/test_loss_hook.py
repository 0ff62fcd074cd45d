"""opslot.loss_hook: opslot's causal-LM loss in unpatched Transformers models, through Transformers'
own loss hook (a model instance's `loss_function`, or `LOSS_MAPPING["ForCausalLM"]`).

Tiny upstream Qwen3, Llama and Gemma3 (soft-capped logits) on CPU in fp32: loss and every parameter
gradient against the same model running Transformers' ForCausalLMLoss, with ignored labels,
`num_items_in_batch` (int and tensor) and `shift_labels`; `torch` bit-identical, `cuda` (its two
kernel launches emulated on the CPU, as in test_cuda_cross_entropy_cpu.py) within fp32 reduction
order. Every comparison also asserts that the hook ran (its call count), so it fails when the hook
is not installed. Install/uninstall restore exactly; refusals name their cause.
"""

import copy
import pickle
import sys
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss  # noqa: E402

import opslot  # noqa: E402
from opslot import loss_hook  # noqa: E402
from opslot.kernels.cuda import cross_entropy as ce  # noqa: E402
from opslot.loss_hook import install_causal_lm_loss, installed_causal_lm_loss  # noqa: E402
from opslot.registry import KernelRegistry, KernelSpec  # noqa: E402

VOCAB = 64
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
)


def qwen3():
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL)).eval()


def llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).eval()


def gemma3():
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**SMALL, final_logit_softcapping=3.0, sliding_window=4)
    return transformers.Gemma3ForCausalLM(config).eval()


FAMILIES = {"qwen3": qwen3, "llama": llama, "gemma3": gemma3}


def batch(seed=1, ignore="some"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 7), generator=g)
    labels = ids.clone()
    if ignore == "some":
        labels[0, :3] = -100
        labels[1, 5] = -100
    elif ignore == "all":
        labels[:] = -100
    return ids, labels


def step(model, ids, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kwargs)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads


class EmulatedBackend:
    """The math of opslot_ce_rows / opslot_ce_scale_inplace in torch (CPU), as in test_cuda_cross_entropy_cpu."""

    def __init__(self):
        self.launches = 0

    def check(self, t):
        pass

    def rows(self, logits, grad, targets, ignore_index, grad_scale, row_loss):
        self.launches += 1
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
def emulated_cuda(monkeypatch):
    """A CUDA machine whose kernel library 'loads', with the two kernel launches run on the CPU."""
    backend = EmulatedBackend()
    monkeypatch.setattr(ce, "_backend", backend)
    monkeypatch.setattr(opslot.device_defaults, "cuda_kernels_unavailable_reason", lambda: None)
    with opslot.use_device(opslot.DeviceInfo("cuda", (9, 0))):
        yield backend


def kernel_launches(request, impl):
    """For impl 'cuda': the emulated backend, whose `launches` prove the cuda kernel computed the loss."""
    return request.getfixturevalue("emulated_cuda") if impl == "cuda" else None


def assert_launched(backend, n):
    assert backend is None or backend.launches == n


@pytest.fixture(autouse=True)
def _mapping_untouched():
    before = dict(LOSS_MAPPING)
    yield
    assert LOSS_MAPPING == before, "a test left LOSS_MAPPING changed"
    assert LOSS_MAPPING["ForCausalLM"] is ForCausalLMLoss


def assert_same(got, want, exact):
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert loss.dtype == ref_loss.dtype == torch.float32
    assert sorted(grads) == sorted(ref_grads) and grads
    if exact:
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0, equal_nan=True)
        for name in ref_grads:
            assert torch.equal(grads[name], ref_grads[name]), name
    else:
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for name in ref_grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


CASES = {
    "ignored labels": ({}, "some"),
    "num_items_in_batch int": ({"num_items_in_batch": 9}, "some"),
    "num_items_in_batch tensor": ({"num_items_in_batch": torch.tensor(9)}, "some"),
    "no ignored labels": ({}, "none"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("impl", ["torch", "cuda"])
def test_equals_upstream_loss_and_gradients(impl, family, case, request):
    backend = kernel_launches(request, impl)
    upstream = FAMILIES[family]()
    model = copy.deepcopy(upstream)
    kwargs, ignore = CASES[case]
    ids, labels = batch(ignore=ignore)
    want = step(upstream, ids, labels, **kwargs)
    with install_causal_lm_loss(impl, model) as handle:
        assert upstream.loss_function is ForCausalLMLoss and model.loss_function is handle.hook
        got = step(model, ids, labels, **kwargs)
        assert handle.calls == 1  # the loss came through the hook
    assert_launched(backend, 1)  # and, for cuda, through its kernel
    assert_same(got, want, exact=impl == "torch")
    assert model.loss_function is ForCausalLMLoss and "_loss_function" not in vars(model)


@pytest.mark.parametrize("impl", ["torch", "cuda"])
def test_shift_labels(impl, request):
    backend = kernel_launches(request, impl)
    upstream = qwen3()
    model = copy.deepcopy(upstream)
    ids, labels = batch()
    shift = torch.roll(labels, -2, dims=1)  # not the default shift: proves shift_labels is used
    shift[:, -2:] = -100
    want = step(upstream, ids, labels, shift_labels=shift)
    with install_causal_lm_loss(impl, model) as handle:
        got = step(model, ids, labels, shift_labels=shift)
        assert handle.calls == 1
    assert_launched(backend, 1)
    assert_same(got, want, exact=impl == "torch")
    default = step(upstream, ids, labels)
    assert not torch.allclose(default[0], want[0])


@pytest.mark.parametrize("impl", ["torch", "cuda"])
def test_every_label_ignored_is_nan_with_zero_gradients_as_upstream(impl, request):
    backend = kernel_launches(request, impl)
    upstream = qwen3()
    model = copy.deepcopy(upstream)
    ids, labels = batch(ignore="all")
    ref_loss, ref_grads = step(upstream, ids, labels)
    with install_causal_lm_loss(impl, model) as handle:
        loss, grads = step(model, ids, labels)
        assert handle.calls == 1
    assert_launched(backend, 1)
    assert torch.isnan(ref_loss) and torch.isnan(loss)
    assert sorted(grads) == sorted(ref_grads)
    for name in ref_grads:
        assert torch.equal(grads[name], ref_grads[name]), name
    assert all(not g.any() for g in grads.values())


@pytest.mark.parametrize("impl", ["torch", "cuda"])
def test_deterministic(impl, request):
    backend = kernel_launches(request, impl)
    model = qwen3()
    ids, labels = batch()
    with install_causal_lm_loss(impl, model) as handle:
        first, second = step(model, ids, labels), step(model, ids, labels)
        assert handle.calls == 2
    assert_launched(backend, 2)
    assert_same(first, second, exact=True)


def test_cuda_bf16_logits_upcast_semantics(emulated_cuda):
    """bf16 logits: fp32 math and an fp32 loss as upstream's `.float()`; the logits' gradient is
    rounded to bf16 where upstream's is, so it agrees within one bf16 rounding."""
    logits = torch.randn(2, 7, VOCAB, dtype=torch.bfloat16)
    _, labels = batch()
    a = logits.clone().requires_grad_(True)
    want = ForCausalLMLoss(a, labels, VOCAB)
    want.backward()
    hook = loss_hook.CausalLMLoss("cuda")
    b = logits.clone().requires_grad_(True)
    got = hook(b, labels, VOCAB)
    got.backward()
    assert got.dtype == want.dtype == torch.float32 and hook.calls == 1 and emulated_cuda.launches == 1
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert b.grad.dtype == torch.bfloat16
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-2, atol=1e-4)


def test_the_models_loss_is_what_the_installed_kernel_returns():
    """A plug-in kernel of cross_entropy_loss/causal_logits (from a registry) is what the model's
    forward returns as its loss, with Transformers' arguments."""
    seen = []
    sentinel = torch.tensor(123.0, requires_grad=True)

    def spy(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kwargs):
        seen.append((tuple(logits.shape), vocab_size, num_items_in_batch, ignore_index, shift_labels))
        return sentinel

    registry = KernelRegistry()
    registry.register(KernelSpec("spy", "cross_entropy_loss", "causal_logits", lambda: spy))
    model = qwen3()
    ids, labels = batch()
    with install_causal_lm_loss("spy", model, registry=registry) as handle:
        out = model(input_ids=ids, labels=labels, num_items_in_batch=5)
        assert out.loss is sentinel and handle.calls == 1
    assert seen == [((2, 7, VOCAB), VOCAB, 5, -100, None)]
    assert model(input_ids=ids, labels=labels).loss is not sentinel  # uninstalled: upstream's loss again


def test_per_instance_install_touches_no_other_model_and_restores_exactly():
    a, b = qwen3(), qwen3()
    ids, labels = batch()
    handle = install_causal_lm_loss("torch", a)
    assert installed_causal_lm_loss(a) is handle.hook and installed_causal_lm_loss(b) is None
    assert installed_causal_lm_loss() is None and LOSS_MAPPING["ForCausalLM"] is ForCausalLMLoss
    b(input_ids=ids, labels=labels)
    assert handle.calls == 0
    a(input_ids=ids, labels=labels)
    assert handle.calls == 1
    assert "installed" in repr(handle) and handle.scope == "model"
    handle.uninstall()
    handle.uninstall()  # a second uninstall does nothing
    assert "_loss_function" not in vars(a) and a.loss_function is ForCausalLMLoss

    # an instance's own loss function is restored, not dropped
    own = lambda *args, **kwargs: ForCausalLMLoss(*args, **kwargs)  # noqa: E731
    a.loss_function = ForCausalLMLoss
    with install_causal_lm_loss("torch", a):
        assert a.loss_function is not ForCausalLMLoss
    assert vars(a)["_loss_function"] is ForCausalLMLoss
    a.loss_function = own
    with pytest.raises(ValueError, match="not Transformers' ForCausalLMLoss"):
        install_causal_lm_loss("torch", a)
    assert a.loss_function is own


def test_nested_installs_restore_in_reverse_order_and_refuse_out_of_order(emulated_cuda):
    model = qwen3()
    ids, labels = batch()
    outer = install_causal_lm_loss("torch", model)
    inner = install_causal_lm_loss("cuda", model)
    model(input_ids=ids, labels=labels)
    assert (outer.calls, inner.calls, emulated_cuda.launches) == (0, 1, 1)
    with pytest.raises(RuntimeError, match=r"not this hook: uninstall what was installed over it first"):
        outer.uninstall()
    inner.uninstall()
    assert model.loss_function is outer.hook
    outer.uninstall()
    assert "_loss_function" not in vars(model)


def test_global_install_reaches_models_without_their_own_loss_and_restores():
    model, other = qwen3(), qwen3()
    ids, labels = batch()
    upstream_cg = LOSS_MAPPING["ForConditionalGeneration"]
    own = install_causal_lm_loss("torch", other)  # a per-instance hook wins over the global one
    with install_causal_lm_loss("torch") as handle:
        assert LOSS_MAPPING["ForCausalLM"] is handle.hook and handle.scope == "global"
        assert installed_causal_lm_loss() is handle.hook and installed_causal_lm_loss(model) is handle.hook
        assert LOSS_MAPPING["ForConditionalGeneration"] is upstream_cg  # only the ForCausalLM key
        late = qwen3()  # built after the install: reached too
        model(input_ids=ids, labels=labels)
        late(input_ids=ids, labels=labels)
        other(input_ids=ids, labels=labels)
        assert handle.calls == 2 and own.calls == 1
    own.uninstall()
    assert LOSS_MAPPING["ForCausalLM"] is ForCausalLMLoss and model.loss_function is ForCausalLMLoss
    with pytest.raises(ZeroDivisionError):
        with install_causal_lm_loss("torch"):
            1 / 0
    assert LOSS_MAPPING["ForCausalLM"] is ForCausalLMLoss


def test_global_uninstall_out_of_order_is_refused():
    first = install_causal_lm_loss("torch")
    second = install_causal_lm_loss("torch")
    try:
        with pytest.raises(RuntimeError, match=r"LOSS_MAPPING\['ForCausalLM'\] is .* not this hook"):
            first.uninstall()
    finally:
        second.uninstall()
        first.uninstall()
    assert LOSS_MAPPING["ForCausalLM"] is ForCausalLMLoss


def test_a_hooked_model_deep_copies_and_pickles_with_its_hook():
    model = qwen3()
    with install_causal_lm_loss("torch", model):
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            hook = installed_causal_lm_loss(clone)
            assert hook is not None and hook.impl == "torch" and hook.calls == 0
            ids, labels = batch()
            clone(input_ids=ids, labels=labels)
            assert hook.calls == 1


# -- refusals ---------------------------------------------------------------------------------------
def test_impl_refusals():
    model = qwen3()
    with pytest.raises(ValueError, match="impl 'eager' is Transformers' own ForCausalLMLoss: there is nothing"):
        install_causal_lm_loss("eager", model)
    with pytest.raises(
        ValueError,
        match=r"no kernel 'trch' for cross_entropy_loss/causal_logits .*did you mean "
        r"'torch'\? \(available: cuda, torch\)",
    ):
        install_causal_lm_loss("trch", model)
    # the test machine is a CPU machine (conftest): cuda is refused with the reason, before anything changes
    with pytest.raises(RuntimeError, match="kernel 'cuda' for cross_entropy_loss/causal_logits cannot run here: "):
        install_causal_lm_loss("cuda", model)
    assert "_loss_function" not in vars(model)


def test_cuda_kernel_library_missing_is_refused_at_install(monkeypatch):
    monkeypatch.setattr(
        opslot.device_defaults, "cuda_kernels_unavailable_reason", lambda: "libopslot_kernels.so not found"
    )
    with opslot.use_device(opslot.DeviceInfo("cuda", (9, 0))):
        with pytest.raises(RuntimeError, match="cannot run here: libopslot_kernels.so not found"):
            install_causal_lm_loss("cuda")


def test_models_the_hook_cannot_stand_in_for_are_refused():
    config = transformers.Qwen3Config(**SMALL)
    with pytest.raises(TypeError, match="takes a Transformers PreTrainedModel"):
        install_causal_lm_loss("torch", torch.nn.Linear(2, 2))
    classifier = transformers.Qwen3ForSequenceClassification(config)
    with pytest.raises(
        ValueError,
        match=r"Qwen3ForSequenceClassification's loss function is "
        r"ForSequenceClassificationLoss \(loss_type 'ForSequenceClassification'\)",
    ):
        install_causal_lm_loss("torch", classifier)
    base = transformers.Qwen3Model(config)  # its loss_function falls back to ForCausalLMLoss, but it computes no loss
    with pytest.raises(ValueError, match="Qwen3Model.forward never calls self.loss_function"):
        install_causal_lm_loss("torch", base)
    model = qwen3()
    model.config.vocab_size = VOCAB + 1
    with pytest.raises(ValueError, match=f"the lm_head has {VOCAB} rows but config vocab_size is {VOCAB + 1}"):
        install_causal_lm_loss("torch", model)
    for m in (classifier, base, model):
        assert "_loss_function" not in vars(m)


def test_vocab_size_that_is_not_the_logits_width_is_refused_at_call():
    hook = loss_hook.CausalLMLoss("torch")
    logits = torch.randn(2, 4, 32)
    labels = torch.randint(0, 16, (2, 4))
    # upstream views [2, 4, 32] as [-1, 16] and silently computes the loss of another problem
    assert torch.isfinite(ForCausalLMLoss(logits, torch.randint(0, 16, (2, 8)), 16))
    with pytest.raises(ValueError, match=r"the logits have 32 classes but the model passes vocab_size=16"):
        hook(logits, labels, 16)
    assert hook.calls == 0


def test_generated_model_whose_loss_slot_runs_a_kernel_is_refused(monkeypatch):
    """A generated head computes its loss in its cross_entropy_loss/causal slot when that runs a
    kernel, never reaching loss_function: refused. With the slot eager, its upstream branch calls
    loss_function and the hook applies."""
    module = types.ModuleType("patched_modeling_hooktest_gpu")
    module.causal_lm_loss_slot = opslot.OpSlot("cross_entropy_loss", "causal")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cls = type("Qwen3ForCausalLM", (transformers.Qwen3ForCausalLM,), {"__module__": module.__name__})
    module.Qwen3ForCausalLM = cls
    torch.manual_seed(0)
    model = cls(transformers.Qwen3Config(**SMALL))
    module.causal_lm_loss_slot.bind("torch_chunked")
    with pytest.raises(
        ValueError,
        match=r"generated model whose causal_lm_loss_slot \(cross_entropy_loss/causal\) "
        r"runs kernel 'torch_chunked'",
    ):
        install_causal_lm_loss("torch", model)
    module.causal_lm_loss_slot.bind("eager")
    with install_causal_lm_loss("torch", model) as handle:
        ids, labels = batch()
        model(input_ids=ids, labels=labels)
        assert handle.calls == 1


def test_softcapping_is_not_refused_the_hook_sees_capped_logits():
    """Unlike the cross_entropy_loss/causal slot (which does the lm_head itself and so refuses
    final_logit_softcapping), the hook receives the logits after the model has soft-capped them."""
    upstream = gemma3()
    assert upstream.config.final_logit_softcapping == 3.0
    model = copy.deepcopy(upstream)
    ids, labels = batch()
    out = upstream(input_ids=ids, labels=labels)
    assert out.logits.abs().max() <= 3.0
    with install_causal_lm_loss("torch", model) as handle:
        assert torch.equal(model(input_ids=ids, labels=labels).loss, out.loss) and handle.calls == 1


# -- the real cuda kernel (GPU machines where libopslot_kernels loads) -----------------------------
def _real_cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    reason = opslot.device_defaults.cuda_kernels_unavailable_reason()
    if reason is not None:
        pytest.skip(f"opslot's cuda kernels cannot run here: {reason}")
    return opslot.DeviceInfo("cuda", torch.cuda.get_device_capability())


@pytest.mark.parametrize("ignore", ["some", "all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_cuda_kernel_equals_upstream(dtype, ignore):
    info = _real_cuda_or_skip()
    upstream = qwen3().to("cuda", dtype)
    model = copy.deepcopy(upstream)
    ids, labels = (t.cuda() for t in batch(ignore=ignore))
    want = step(upstream, ids, labels)
    with opslot.use_device(info):
        handle = install_causal_lm_loss("cuda", model)
    with handle:
        got, again = step(model, ids, labels), step(model, ids, labels)
        assert handle.calls == 2
    assert_same(got, again, exact=True)  # deterministic
    if ignore == "all":
        assert torch.isnan(got[0]) and torch.isnan(want[0])
        assert all(not g.any() for g in got[1].values())
    elif dtype == torch.float32:
        assert_same(got, want, exact=False)
    else:  # same bf16 logits; fp32 loss math in both; logits' gradient rounded to bf16 in both
        assert got[0].dtype == want[0].dtype == torch.float32
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        for name in want[1]:
            torch.testing.assert_close(got[1][name].float(), want[1][name].float(), rtol=2e-2, atol=2e-3, msg=name)
