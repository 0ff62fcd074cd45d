"""Proof of dispatch (opslot.dispatch) on the committed example and small generated-style modules:
the per-slot flag, when the check runs (after the first backward, at the end of a forward without a
graph, at a second forward), ran / not reached / not used, errors and warnings with their exact text,
allow_unreached, binding_plan's dispatch column, torch.compile, pickling, models sharing a copy.
Real generated models (multimodal, DeepSeek-V3 rope_interleave, all-sparse Qwen3-MoE, ...):
test_dispatch_proof_models.py."""

import gc
import inspect
import os
import pickle
import re
import sys
import uuid
import warnings

import pytest
import torch

import opslot
from example_models import REPO, TOY, TOY_MOE, moe_config, toy_config
from generated_fixture import SOURCE
from opslot import bind_ops, binding_plan, build_model
from opslot.dispatch import UnreachedSlotError, UnreachedSlotWarning, check_dispatch, dispatch_report, watch_dispatch
from opslot.slot import OpSlot

ALL_TORCH = {
    "rms_norm_implementation": "torch",
    "rotary_pos_emb_implementation": "torch",
    "swiglu_mlp_implementation": "torch",
    "cross_entropy_loss_implementation": "torch",
}


def build(config, ops, module, model_class, allow_unreached=False, **kwargs):
    """build_model, watched as build_model itself does once binding.py calls watch_dispatch
    (idempotent: calling it again only sets allow_unreached)."""
    model = build_model(config, ops=ops, module=module, model_class=model_class, **kwargs)
    return watch_dispatch(model, allow_unreached=allow_unreached)


def ids(vocab=64, n=7):
    return torch.arange(n).remainder(vocab).reshape(1, n)


def step(model, **kwargs):
    x = ids()
    out = model(input_ids=x, labels=x, **kwargs)
    out.loss.backward()
    return out


def watched(model):
    from opslot.dispatch import _post_hook, _pre_hook

    return (_pre_hook in model._forward_pre_hooks.values(), _post_hook in model._forward_hooks.values())


@pytest.fixture
def gen_module(tmp_path, monkeypatch):
    """A fresh importable module written from `source` (default: generated_fixture.SOURCE)."""

    def make(source=SOURCE):
        name = f"tiny_dispatch_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(source)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    return make


class Cfg:
    hidden_size = 8
    hidden_act = "silu"


# -- the flag ------------------------------------------------------------------------------------------
def test_slot_flag_is_set_by_a_kernel_call_and_cleared_by_bind():
    slot = OpSlot("rms_norm", "standard").bind("torch")
    assert slot.ran is False
    slot(torch.ones(2, 4), torch.ones(4), 1e-6)
    assert slot.ran is True
    slot.bind("torch")
    assert slot.ran is False  # a new binding has not run yet
    restored = pickle.loads(pickle.dumps(slot))
    assert restored.ran is False and restored.impl == "torch"


def test_hot_path_is_one_store():
    """The flag costs one attribute store per kernel call: no read, no branch, no lock."""
    source = inspect.getsource(OpSlot.__call__)
    assert source.count("self._ran") == 1 and "self._ran = True" in source


# -- a model whose every bound slot runs -------------------------------------------------------------
def test_every_bound_slot_of_the_toy_runs_and_the_plan_says_so():
    torch.manual_seed(0)
    model = build(toy_config(), ALL_TORCH, TOY, "ToyForCausalLM")
    assert watched(model) == (True, True)
    assert "dispatch" not in repr(binding_plan(model))  # before the first step: today's plan
    out = model(input_ids=ids(), labels=ids())
    assert dispatch_report(model).as_dict() == {  # live during the step: the forward ran them all
        "causal_lm_loss_slot": "ran",
        "rms_norm_slot": "ran",
        "rope_slot": "ran",
        "swiglu_mlp_slot": "ran",
    }
    assert watched(model) == (True, True)  # checked after the backward, not before
    out.loss.backward()
    assert watched(model) == (False, False)  # checked: the hooks removed themselves
    assert repr(binding_plan(model)) == (
        "BindingPlan of ToyForCausalLM (module patched_modeling_toy_gpu__opslot__torch-torch-torch-torch):\n"
        "  slot                 op/variant                 impl   why       dispatch\n"
        "  causal_lm_loss_slot  cross_entropy_loss/causal  torch  explicit  ran\n"
        "  rms_norm_slot        rms_norm/standard          torch  explicit  ran\n"
        "  rope_slot            rotary_pos_emb/full        torch  explicit  ran\n"
        "  swiglu_mlp_slot      swiglu_mlp/standard        torch  explicit  ran\n"
        "  attention: eager (config._attn_implementation)"
    )
    assert [e.dispatch for e in binding_plan(model)] == ["ran"] * 4


def test_eager_slots_show_a_dash():
    model = build(toy_config(), {"rms_norm_implementation": "torch"}, TOY, "ToyForCausalLM")
    step(model)
    plan = binding_plan(model)
    assert {e.slot: e.dispatch for e in plan} == {
        "causal_lm_loss_slot": "-",
        "rms_norm_slot": "ran",
        "rope_slot": "-",
        "swiglu_mlp_slot": "-",
    }


# -- not reached: errors, warnings, allow_unreached ------------------------------------------------------
TOY_MOE_OPS = {"load_balancing_loss_implementation": "torch", "moe_implementation": "fused_torch"}

LB_HINT = (
    "the model's own code calls load_balancing_loss_func from ToyMoeForCausalLM.forward under "
    "`if output_router_logits:` (here config.output_router_logits=False), but that call did not happen "
    "in this step"
)
LB_ERROR = (
    "opslot: ToyMoeForCausalLM did not run 1 bound kernel(s) in its first forward and backward, although the "
    'model can reach their guarded code (binding_plan says "not reached"):\n'
    f"  - load_balancing_loss_slot (load_balancing_loss/standard -> 'torch', explicit): {LB_HINT}\n"
    "Fix the cause, remove the field(s) from the ops config, or let these ops run upstream code with a warning: "
    "build_model(..., allow_unreached=['load_balancing_loss']) (or allow_unreached=True)."
)
MOE_PLAN_ROWS = (
    "  slot                                         op/variant                    impl   why       dispatch\n"
    "  causal_lm_loss_slot                          cross_entropy_loss/causal     eager  default   -\n"
    "  load_balancing_loss_slot                     load_balancing_loss/standard  torch  explicit  not reached\n"
    "  model.layers.*.mlp.experts.moe_experts_slot  moe/standard (x2)             torch  explicit  ran\n"
    "  attention: eager (config._attn_implementation)"
)


def test_a_function_guard_behind_a_config_branch_is_an_error_after_the_backward():
    """The load-balancing loss kernel is bound, the model's forward can call it, but only with
    output_router_logits (False here): the plan used to say it runs; now the first backward fails."""
    model = build(moe_config(), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM")
    out = model(input_ids=ids(), labels=ids())  # the forward itself succeeds
    with pytest.raises(UnreachedSlotError) as info:
        out.loss.backward()
    assert str(info.value) == LB_ERROR
    assert [e.slot for e in info.value.report.errors] == ["load_balancing_loss_slot"]
    assert repr(binding_plan(model)).split("\n", 1)[1] == MOE_PLAN_ROWS
    step(model)  # checked once: later steps run unchecked


def test_reaching_the_branch_makes_it_run():
    model = build(moe_config(output_router_logits=True), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM")
    step(model)
    assert dispatch_report(model).as_dict() == {
        "model.layers.*.mlp.experts.moe_experts_slot": "ran",
        "causal_lm_loss_slot": "-",
        "load_balancing_loss_slot": "ran",
    }


def test_allow_unreached_turns_the_error_into_a_warning():
    for allow in (True, ["load_balancing_loss"], "load_balancing_loss"):
        model = build(moe_config(), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM", allow_unreached=allow)
        with pytest.warns(UnreachedSlotWarning) as record:
            step(model)
        assert len(record) == 1
        assert str(record[0].message) == LB_ERROR.rsplit("\n", 1)[0] + (
            "\nThese run upstream code instead (device defaults and ops in allow_unreached are warnings)."
        )
        assert dispatch_report(model).as_dict()["load_balancing_loss_slot"] == "not reached"
    model = build(moe_config(), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM", allow_unreached=["moe"])
    with pytest.raises(UnreachedSlotError):  # another op allowed: still an error
        step(model)


def test_allow_unreached_names_ops():
    model = build_model(moe_config(), ops=TOY_MOE_OPS, module=TOY_MOE, model_class="ToyMoeForCausalLM")
    with pytest.raises(ValueError) as info:
        watch_dispatch(model, allow_unreached=["load_balancing"])
    assert str(info.value) == (
        "allow_unreached: 'load_balancing' is not an op (did you mean 'load_balancing_loss'?); it takes True or a "
        "list of ops: causal_conv1d, chunk_gated_delta_rule, cross_entropy_loss, dsa_attention, dsa_indexer, "
        "load_balancing_loss, mhc, moe, rms_norm, rms_norm_gated, rotary_pos_emb, rotary_pos_emb_vision, swiglu_mlp"
    )


def test_a_kernel_chosen_by_the_device_defaults_only_warns():
    model = build(moe_config(), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM")
    slot = next(s for s in module_level_slots(model) if s.op == "load_balancing_loss")
    slot._why = "default"  # what a CUDA machine's defaults give (opslot.CUDA_DEFAULTS), without the GPU
    with pytest.warns(UnreachedSlotWarning) as record:
        step(model)
    assert "  - load_balancing_loss_slot (load_balancing_loss/standard -> 'torch', default): " in str(record[0].message)
    assert dispatch_report(model).warnings[0].severity == "warning"


def test_a_method_never_called_is_not_reached(gen_module):
    """TinyModel is instantiated and holds the rope guard in TinyModel.rope, which its forward never
    calls: the instance-scoped rope slot is bound and would silently never run."""
    name = gen_module()
    model = build(
        Cfg(), {"rotary_pos_emb_implementation": "torch", "rms_norm_implementation": "torch"}, name, "TinyModel"
    )
    with pytest.raises(UnreachedSlotError) as info:
        model(torch.randn(2, 8)).sum().backward()
    assert str(info.value) == (
        "opslot: TinyModel did not run 1 bound kernel(s) in its first forward and backward, although the model can "
        'reach their guarded code (binding_plan says "not reached"):\n'
        "  - rope_slot (rotary_pos_emb/full -> 'torch', explicit): the model itself is a TinyModel, but TinyModel.rope "
        "did not run its guard: the model's forward does not reach it in this configuration (another branch, an early "
        "return, or a replaced forward)\n"
        "Fix the cause, remove the field(s) from the ops config, or let these ops run upstream code with a warning: "
        "build_model(..., allow_unreached=['rotary_pos_emb']) (or allow_unreached=True)."
    )
    assert {e.slot: e.dispatch for e in binding_plan(model)} == {
        "rms_norm_slot": "ran",
        "swiglu_slot": "-",
        "rope_slot": "not reached",
    }


SKIPPING = (
    SOURCE
    + '''

class TinySkip(nn.Module):
    """Instantiates the norm and the MLP, runs only the MLP."""

    def __init__(self, config):
        super().__init__()
        self.norm = TinyRMSNorm(config.hidden_size)
        self.mlp = TinyMLP(config)

    def forward(self, x):
        return self.mlp(x)


class TinyHeadless(nn.Module):
    """Never instantiates TinyRMSNorm."""

    def __init__(self, config):
        super().__init__()
        self.mlp = TinyMLP(config)

    def forward(self, x):
        return self.mlp(x)
'''
)


def test_a_class_the_model_does_not_instantiate_is_not_used(gen_module):
    name = gen_module(SKIPPING)
    model = build(
        Cfg(), {"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"}, name, "TinyHeadless"
    )
    model(torch.randn(2, 8)).sum().backward()  # no error, no warning
    assert dispatch_report(model).as_dict() == {"rms_norm_slot": "not used by this model", "swiglu_slot": "ran"}
    assert {e.slot: e.dispatch for e in binding_plan(model)} == {
        "rms_norm_slot": "not used by this model",
        "swiglu_slot": "ran",
    }


def test_a_slot_declared_without_a_guard_is_not_used(gen_module):
    """A module-level slot that no code of the module reads (patchgen declares it when every guard of it
    is for other upstream releases: DeepSeek-V4's rms_norm_slot from Transformers 5.23) is bound by
    its op's field with the guarded ones, and is "not used by this model": no error, no warning. One
    that code reads without a guard stays "not reached"."""
    declared = 'swiglu_slot = OpSlot("swiglu_mlp", "standard")\n'
    unguarded = declared + 'offset_norm_slot = OpSlot("rms_norm", "offset")\n'
    name = gen_module(SOURCE.replace(declared, unguarded))
    model = build(Cfg(), {"rms_norm_implementation": "torch"}, name, "TinyModel")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(2, 8)).sum().backward()
    report = dispatch_report(model)
    assert report.as_dict() == {
        "offset_norm_slot": "not used by this model",
        "rms_norm_slot": "ran",
        "rope_slot": "-",
        "swiglu_slot": "-",
    }
    (entry,) = [e for e in report.entries if e.slot == "offset_norm_slot"]
    assert (entry.impl, entry.severity) == ("torch", "")
    assert entry.hint == f"declared without a guard: nothing in {name} dispatches through it"

    read = SOURCE.replace(declared, unguarded) + "\n\ndef offset_norm(x, w):\n    return offset_norm_slot(x, w, 1e-6)\n"
    model = build(Cfg(), {"rms_norm_implementation": "torch"}, gen_module(read), "TinyModel")
    with pytest.raises(
        UnreachedSlotError, match=r"offset_norm_slot \(rms_norm/offset -> 'torch', explicit\): no guard in"
    ):
        model(torch.randn(2, 8)).sum().backward()


def test_models_sharing_a_module_copy_are_checked_apart(gen_module):
    """Module-level slots are shared by every model of one binding (one private copy): the flag a
    first model set is cleared when the second model's first step starts."""
    name = gen_module(SKIPPING)
    ops = {"rms_norm_implementation": "torch"}
    first = build(Cfg(), ops, name, "TinyModel")
    first(torch.randn(2, 8)).sum().backward()
    assert dispatch_report(first).as_dict()["rms_norm_slot"] == "ran"
    second = build(Cfg(), ops, name, "TinySkip")
    assert type(second).__module__ == type(first).__module__  # the same copy, the same slot objects
    with pytest.raises(
        UnreachedSlotError,
        match=r"rms_norm_slot \(rms_norm/standard -> 'torch', explicit\): "
        r"model.norm is a TinyRMSNorm, but TinyRMSNorm.forward did not run",
    ):
        second(torch.randn(2, 8)).sum().backward()
    assert dispatch_report(first).as_dict()["rms_norm_slot"] == "ran"  # the first model's report stays


# -- when the check runs ---------------------------------------------------------------------------------
def test_a_forward_without_a_graph_is_the_step():
    model = build(moe_config(), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM")
    with torch.no_grad(), pytest.raises(UnreachedSlotError, match="load_balancing_loss_slot"):
        model(input_ids=ids(), labels=ids())
    assert watched(model) == (False, False)


def test_a_second_forward_before_any_backward_checks_the_first():
    model = build(moe_config(), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM")
    model(input_ids=ids(), labels=ids())  # e.g. an output nobody back-propagates
    with pytest.raises(UnreachedSlotError, match="load_balancing_loss_slot"):
        model(input_ids=ids(), labels=ids())


def test_a_forward_that_raised_starts_the_step_again():
    model = build(toy_config(), ALL_TORCH, TOY, "ToyForCausalLM")
    with pytest.raises(Exception):
        model(input_ids=torch.full((1, 3), 10_000))  # out of the vocabulary
    step(model)
    assert set(dispatch_report(model).as_dict().values()) == {"ran"}


def test_backward_through_any_output_checks():
    model = build(toy_config(), ALL_TORCH, TOY, "ToyForCausalLM")
    out = model(input_ids=ids(), labels=ids())
    out.logits.float().pow(2).mean().backward()  # the user's own loss
    assert watched(model) == (False, False)
    assert set(dispatch_report(model).as_dict().values()) == {"ran"}


def test_check_dispatch_on_a_model_built_another_way(gen_module):
    import importlib

    module = importlib.import_module(gen_module(SKIPPING))
    bind_ops(module, {"rms_norm_implementation": "torch"})
    model = module.TinySkip(Cfg())  # constructed directly: no hooks
    model(torch.randn(2, 8)).sum().backward()
    assert dispatch_report(model) is None and all(e.dispatch is None for e in binding_plan(model))
    with pytest.raises(UnreachedSlotError, match="rms_norm_slot"):
        check_dispatch(model)
    with pytest.warns(UnreachedSlotWarning):
        report = check_dispatch(model, allow_unreached=["rms_norm"])
    assert report.as_dict() == {"rms_norm_slot": "not reached", "swiglu_slot": "-"}
    assert {e.slot: e.dispatch for e in binding_plan(model)} == {"rms_norm_slot": "not reached", "swiglu_slot": "-"}
    with pytest.raises(TypeError):
        check_dispatch(module)


# -- torch.compile, pickling ------------------------------------------------------------------------------
def module_level_slots(model):
    return list(opslot.module_slots(sys.modules[type(model).__module__]).values())


def test_compiled_model_counts_its_kernels_with_no_graph_break():
    """The hooks step aside while Dynamo traces (fullgraph passes with them installed); the flag store
    is replayed after each run of the compiled graph, so check_dispatch after a compiled step proves
    the dispatch."""
    torch._dynamo.reset()
    ops = dict(ALL_TORCH, cross_entropy_loss_implementation="eager")  # a binding no other test compiles
    model = build(toy_config(), ops, TOY, "ToyForCausalLM")
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    compiled(input_ids=ids(), labels=ids()).loss.backward()
    assert watched(model) == (True, True)  # the hooks did nothing while compiled
    report = check_dispatch(model)
    assert report.as_dict() == {
        "causal_lm_loss_slot": "-",
        "rms_norm_slot": "ran",
        "rope_slot": "ran",
        "swiglu_mlp_slot": "ran",
    }
    for slot in module_level_slots(model):
        slot._ran = False
    compiled(input_ids=ids(), labels=ids())  # the compiled graph again: the store is replayed
    assert {s.name: s.ran for s in module_level_slots(model)} == {
        "causal_lm_loss_slot": False,
        "rms_norm_slot": True,
        "rope_slot": True,
        "swiglu_mlp_slot": True,
    }


def test_compiled_model_of_a_copy_imported_again():
    """A private copy released with its last model and imported again under the same name is a new
    module, but Dynamo's compiled code keeps reaching the first one (it aliases inlined modules by
    name): its flags count for the new copy's slots."""
    torch._dynamo.reset()
    ops = {"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"}  # no other test's binding
    first = build(toy_config(), ops, TOY, "ToyForCausalLM")
    torch.compile(first, backend="eager", fullgraph=True)(input_ids=ids(), labels=ids())
    name, old = type(first).__module__, sys.modules[type(first).__module__]
    del first
    gc.collect()
    second = build(toy_config(), ops, TOY, "ToyForCausalLM")
    assert type(second).__module__ == name and sys.modules[name] is not old  # imported again
    compiled = torch.compile(second, backend="eager", fullgraph=True)
    compiled(input_ids=ids(), labels=ids()).loss.backward()
    assert check_dispatch(second).as_dict() == {
        "causal_lm_loss_slot": "-",
        "rms_norm_slot": "ran",
        "rope_slot": "-",
        "swiglu_mlp_slot": "ran",
    }


def test_compiled_model_with_an_unreached_slot_is_found_by_check_dispatch():
    torch._dynamo.reset()
    model = build(moe_config(num_hidden_layers=1), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM")
    compiled = torch.compile(model, backend="eager")
    compiled(input_ids=ids(), labels=ids()).loss.backward()
    with pytest.raises(UnreachedSlotError, match="load_balancing_loss_slot"):
        check_dispatch(model)


def test_a_pickled_model_is_checked_after_loading():
    model = build(moe_config(), TOY_MOE_OPS, TOY_MOE, "ToyMoeForCausalLM", allow_unreached=["load_balancing_loss"])
    restored = pickle.loads(pickle.dumps(model))
    assert watched(restored) == (True, True)
    with pytest.warns(UnreachedSlotWarning, match="load_balancing_loss_slot"):  # allow_unreached kept too
        step(restored)


# -- build_model installs the hooks (once binding.py calls watch_dispatch) --------------------------------
_BUILD_WATCHES = "allow_unreached" in inspect.signature(build_model).parameters


@pytest.mark.skipif(not _BUILD_WATCHES, reason="build_model does not take allow_unreached yet (binding.py hook)")
def test_build_model_watches_the_model():
    model = build_model(moe_config(), ops=TOY_MOE_OPS, module=TOY_MOE, model_class="ToyMoeForCausalLM")
    assert watched(model) == (True, True)
    with pytest.raises(UnreachedSlotError) as info:
        step(model)
    assert str(info.value) == LB_ERROR
    model = build_model(
        moe_config(), ops=TOY_MOE_OPS, module=TOY_MOE, model_class="ToyMoeForCausalLM", allow_unreached=True
    )
    with pytest.warns(UnreachedSlotWarning):
        step(model)


# -- docs/runtime.md ------------------------------------------------------------------------------------
def test_the_doc_example_prints_what_the_doc_shows(capsys, monkeypatch):
    text = open(os.path.join(REPO, "docs", "runtime.md"), encoding="utf-8").read()
    section = text.split("## Proof of dispatch", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    output = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    if not _BUILD_WATCHES:  # what build_model does once binding.py calls watch_dispatch
        monkeypatch.setattr(
            opslot,
            "build_model",
            lambda *a, allow_unreached=False, **k: watch_dispatch(
                build_model(*a, **k), allow_unreached=allow_unreached
            ),
        )
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreachedSlotWarning)
            exec(compile(code, "runtime.md", "exec"), {"__name__": "__doc_example__"})
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out == output
