"""Issue #16: nothing a user asks for is dropped. Each test names the "Why" bullet it covers; each
failed on the code before the change (a silent eager model, `{}` or a raw KeyError)."""

import importlib
import logging
import sys

import pytest

import opslot
from example_models import TOY, TOY_MOE, moe_config, toy_config
from opslot import OpsImplementationConfig, bind_ops, binding_plan, build_model


@pytest.fixture(autouse=True)
def _cpu_defaults():
    """The device defaults of a CPU whatever the machine (on a CUDA machine with opslot's kernel
    library, unset fields would take the cuda kernels); conftest restores detection afterwards."""
    opslot.set_device_detector(lambda: opslot.DeviceInfo("cpu"))
    yield


def toy(ops=None, **config):
    return build_model(toy_config(**config), ops=ops, module=TOY, model_class="ToyForCausalLM")


def moe(ops=None, **config):
    return build_model(moe_config(**config), ops=ops, module=TOY_MOE, model_class="ToyMoeForCausalLM")


# -- a kernel asked for an op that the model has no slot for --------------------------------------
def test_choice_for_an_op_without_slot_is_an_error():
    with pytest.raises(ValueError) as err:
        moe({"rms_norm_implementation": "anything"})
    assert str(err.value) == (
        "rms_norm_implementation='anything' binds no slot: module patched_modeling_toy_moe_gpu has no rms_norm slot "
        "(its slots: cross_entropy_loss/causal, load_balancing_loss/standard, moe/standard). Remove the field, or, "
        "if this model keeps rms_norm upstream on purpose, say so with ops_implementation.allow_unbound: [rms_norm]"
    )


def test_allow_unbound_relaxes_one_op_explicitly():
    model = moe(
        {"rms_norm_implementation": "torch", "moe_implementation": "fused_torch", "allow_unbound": ["rms_norm"]}
    )
    assert binding_plan(model).as_dict()["model.layers.*.mlp.experts.moe_experts_slot"] == "torch"
    with pytest.raises(ValueError, match=r"^swiglu_mlp_implementation='torch' binds no slot"):
        moe({"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch", "allow_unbound": ["rms_norm"]})
    with pytest.raises(ValueError, match=r"allow_unbound: 'rope' is not an op with slots"):
        OpsImplementationConfig(allow_unbound=("rope",))
    # explicit eager is honoured by every model: not an error
    moe({"rms_norm_implementation": "eager"})


# -- targets without slots -----------------------------------------------------------------------
def test_build_model_on_an_upstream_module_is_an_error():
    with pytest.raises(
        ValueError,
        match=r"^build_model: module 'toyformers.models.toy.modeling_toy' declares no "
        r"OpSlot, so there is nothing to bind \(an upstream module\? generate",
    ):
        build_model(toy_config(), module="toyformers.models.toy.modeling_toy", model_class="ToyForCausalLM")


def test_bind_ops_on_a_model_or_an_upstream_module_is_an_error():
    model = toy()
    with pytest.raises(
        TypeError,
        match=r"^bind_ops binds the module-level slots of a generated module, not a model "
        r"\(ToyForCausalLM\); build the model with opslot.build_model",
    ):
        bind_ops(model, {"rms_norm_implementation": "torch"})
    with pytest.raises(ValueError, match=r"^bind_ops: module 'toyformers.models.toy.modeling_toy' declares no OpSlot"):
        bind_ops(importlib.import_module("toyformers.models.toy.modeling_toy"), {"rms_norm_implementation": "torch"})


def test_bind_ops_refuses_choices_for_instance_scoped_slots():
    copy = opslot.load_private_copy(importlib.import_module(TOY_MOE))
    with pytest.raises(
        ValueError,
        match=r"^moe_implementation='fused_torch': the moe slots of .* are instance-scoped "
        r"and bind from config.ops_implementation",
    ):
        bind_ops(copy, {"moe_implementation": "fused_torch"})


# -- the section that holds the ops config -------------------------------------------------------
def test_misspelt_section_and_misplaced_fields_are_errors():
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"model": {"ops_implmentation": {"rms_norm_implementation": "torch"}}})
    assert str(err.value) == (
        "misplaced ops settings in the training config: 'model.ops_implmentation': "
        "the ops section is 'model.ops_implementation'"
    )
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"model": {"name_or_path": "x", "rms_norm_implementation": "torch"}})
    assert str(err.value) == (
        "misplaced ops settings in the training config: 'model.rms_norm_implementation': "
        "ops fields go under 'model.ops_implementation' (model.ops_implementation."
        "rms_norm_implementation)"
    )
    with pytest.raises(ValueError, match=r"'ops_implementation': the ops section is 'model.ops_implementation'"):
        OpsImplementationConfig.from_dict({"model": {}, "ops_implementation": {"rms_norm_implementation": "torch"}})
    with pytest.raises(ValueError, match=r"unknown ops_implementation field 'ops_implmentation'; did you mean"):
        OpsImplementationConfig.from_dict({"ops_implmentation": {"rms_norm_implementation": "torch"}})


def test_full_training_yaml_is_read(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(
        "model:\n  name_or_path: Qwen/Qwen3-0.6B\n  ops_implementation:\n"
        "    rms_norm_implementation: torch\ntrain:\n  lr: 1.0e-4\ndata:\n  path: x\n"
    )
    expected = OpsImplementationConfig(rms_norm_implementation="torch")
    assert OpsImplementationConfig.from_yaml(str(path)) == expected
    assert OpsImplementationConfig.coerce(path) == expected  # a pathlib.Path
    assert binding_plan(toy(str(path))).as_dict()["rms_norm_slot"] == "torch"


def test_string_configs(tmp_path):
    assert OpsImplementationConfig.coerce('{"rms_norm_implementation": "torch"}') == OpsImplementationConfig(
        rms_norm_implementation="torch"
    )
    assert OpsImplementationConfig.coerce("rms_norm_implementation: torch") == OpsImplementationConfig(
        rms_norm_implementation="torch"
    )
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.coerce("torch")
    assert str(err.value) == (
        "ops='torch' is neither a YAML/JSON file nor a mapping; give a mapping such as "
        "{'rms_norm_implementation': 'torch'}, its JSON text, or the path of a (training) YAML "
        "file"
    )
    # a string where the section belongs (was "unknown field 't'")
    with pytest.raises(
        TypeError,
        match=r"^model.ops_implementation must be a mapping of <op>_implementation "
        r"fields, got str$",
    ):
        OpsImplementationConfig.from_dict({"model": {"ops_implementation": "torch"}})
    with pytest.raises(TypeError, match=r"^ops_implementation must be a mapping"):
        OpsImplementationConfig.coerce("ops_implementation: torch")
    json_file = tmp_path / "ops.json"
    json_file.write_text('{"model": {"ops_implementation": {"swiglu_mlp_implementation": "torch"}}}')
    assert OpsImplementationConfig.coerce(str(json_file)).swiglu_mlp_implementation == "torch"


# -- saved-config round trips ----------------------------------------------------------------------
def test_model_rebuilt_from_its_saved_config_binds_every_slot_the_same_way():
    ops = {"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"}
    first = toy(ops)
    again = build_model(first.config, module=TOY, model_class="ToyForCausalLM")
    assert binding_plan(again) == binding_plan(first)
    assert binding_plan(again).as_dict()["rms_norm_slot"] == "torch"
    first_moe = moe({"moe_implementation": "fused_torch", "cross_entropy_loss_implementation": "torch"})
    again_moe = build_model(first_moe.config, module=TOY_MOE, model_class="ToyMoeForCausalLM")
    assert binding_plan(again_moe) == binding_plan(first_moe)


def test_build_model_without_ops_keeps_the_config_choice():
    config = toy_config()
    config.ops_implementation = {"rms_norm_implementation": "torch"}
    model = build_model(config, ops=None, module=TOY, model_class="ToyForCausalLM")
    assert model.config.ops_implementation == {"rms_norm_implementation": "torch"}
    assert binding_plan(model).as_dict()["rms_norm_slot"] == "torch"


def test_direct_construction_from_a_saved_config_refuses_unbound_module_slots():
    first = moe({"moe_implementation": "fused_torch", "cross_entropy_loss_implementation": "torch"})
    generated = importlib.import_module(TOY_MOE)
    with pytest.raises(
        ValueError,
        match=r"module-level slots do not follow: causal_lm_loss_slot "
        r"\(cross_entropy_loss/causal\) runs 'eager', the config chooses 'torch'",
    ):
        generated.ToyMoeForCausalLM(first.config)


def test_rebinding_a_module_after_direct_construction_warns(tmp_path, monkeypatch):
    source = importlib.import_module(TOY).__file__
    (tmp_path / "toy_direct_copy.py").write_text(open(source).read())
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toy_direct_copy")
    try:
        model = module.ToyForCausalLM(toy_config())
        with pytest.warns(
            RuntimeWarning,
            match=r"^rebinding module 'toy_direct_copy' changes 1 live model\(s\) "
            r"built from it directly \(ToyForCausalLM\): rms_norm_slot "
            r"'eager'->'torch'",
        ):
            bind_ops(module, {"rms_norm_implementation": "torch"})
        del model
    finally:
        sys.modules.pop("toy_direct_copy", None)


# -- attention implementation ----------------------------------------------------------------------
def test_attn_implementation_is_checked():
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig(attn_implementation="sdap")
    assert str(err.value).startswith(
        "ops_implementation.attn_implementation='sdap' is not an attention "
        "implementation; did you mean 'sdpa'? (known: eager, sdpa, flash_attention_2"
    )
    for ok in ("sdpa", "flash_attention_2", "paged|sdpa", "kernels-community/flash-attn3"):
        OpsImplementationConfig(attn_implementation=ok)


# -- instance-slot errors and model-dependent refusals ---------------------------------------------
def test_instance_slot_errors_are_config_errors_before_construction():
    with pytest.raises(ValueError) as err:
        moe({"moe_implementation": "fused_torhc"})
    assert str(err.value) == (
        "invalid ops_implementation:\n  moe/standard (moe_implementation='fused_torhc'): "
        "no kernel 'torhc' for moe/standard; available: eager, fused_cuda [needs cuda sm_80+], "
        "fused_npu [needs npu], fused_torch; did you mean 'fused_torch'?"
    )
    config = moe_config()
    config.ops_implementation = {"moe_implementation": "fused_torhc"}
    generated = importlib.import_module(TOY_MOE)
    with pytest.raises(
        ValueError,
        match=r"^cannot bind instance-scoped OpSlot \(moe/standard\) from "
        r"config.ops_implementation: invalid ops_implementation:\n.*did you mean "
        r"'fused_torch'\?$",
    ):
        generated.ToyMoeForCausalLM(config)


def test_silu_and_softcapping_refusals_come_at_bind_time():
    with pytest.raises(ValueError) as err:
        toy({"swiglu_mlp_implementation": "torch"}, hidden_act="gelu")
    assert str(err.value) == (
        "the model refuses these kernels:\n  swiglu_mlp/standard kernel 'torch' computes SiLU "
        "gating but the model's hidden_act is 'gelu'; set swiglu_mlp_implementation: eager for "
        "this model"
    )
    with pytest.raises(
        ValueError,
        match=r"cross_entropy_loss/causal kernel 'torch_chunked' does not apply the model's "
        r"final_logit_softcapping \(30.0\)",
    ):
        toy({"cross_entropy_loss_implementation": "torch_chunked"}, final_logit_softcapping=30.0)
    toy({"swiglu_mlp_implementation": "eager"}, hidden_act="gelu")  # eager is the upstream code: fine


# -- visibility --------------------------------------------------------------------------------------
def test_binding_plan_and_its_repr():
    model = moe({"moe_implementation": "fused_torch", "attn_implementation": "sdpa"})
    plan = binding_plan(model)
    assert [(e.slot, e.scope, e.op, e.variant, e.impl, e.why, e.count) for e in plan] == [
        ("causal_lm_loss_slot", "module", "cross_entropy_loss", "causal", "eager", "default", 1),
        ("load_balancing_loss_slot", "module", "load_balancing_loss", "standard", "eager", "default", 1),
        ("model.layers.*.mlp.experts.moe_experts_slot", "instance", "moe", "standard", "torch", "explicit", 2),
    ]
    text = repr(plan).splitlines()
    assert text[0] == "BindingPlan of ToyMoeForCausalLM (module patched_modeling_toy_moe_gpu__opslot__eager-eager):"
    assert text[1].split() == ["slot", "op/variant", "impl", "why"]
    assert text[4].split() == [
        "model.layers.*.mlp.experts.moe_experts_slot",
        "moe/standard",
        "(x2)",
        "torch",
        "explicit",
    ]
    assert text[5] == "  attention: sdpa (config._attn_implementation)"


def test_binding_logs_the_plan_once(caplog):
    with caplog.at_level(logging.INFO, logger="opslot"):
        model = toy({"rms_norm_implementation": "torch"})
    records = [r for r in caplog.records if r.name == "opslot"]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert records[0].getMessage() == repr(binding_plan(model))


def test_fallback_is_shown(monkeypatch):
    with opslot.use_device(opslot.DeviceInfo("npu")):
        config = OpsImplementationConfig()
        assert config.choose("moe", "gpt_oss") == ("eager", "fallback (default 'npu' has no kernel for moe/gpt_oss)")
        assert config.choose("rms_norm", "standard") == ("npu", "default")


def test_environment_variable_forces_eager_or_a_kernel(monkeypatch):
    ops = {"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"}
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "eager")
    plan = binding_plan(toy(ops))
    assert {e.impl for e in plan} == {"eager"} and {e.why for e in plan} == {"forced (OPSLOT_FORCE_IMPL=eager)"}
    assert not hasattr(moe({"moe_implementation": "fused_torch"}).config, "_experts_implementation")
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "torch")
    model = moe()
    assert binding_plan(model).as_dict() == {
        "causal_lm_loss_slot": "torch",
        "load_balancing_loss_slot": "torch",
        "model.layers.*.mlp.experts.moe_experts_slot": "torch",
    }
    assert model.config._experts_implementation == "eager"  # Transformers' experts dispatch reaches the guard
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "torch_chunked")  # only cross_entropy has it: the rest eager, said so
    plan = {e.slot: (e.impl, e.why) for e in binding_plan(toy())}
    assert plan["causal_lm_loss_slot"] == ("torch_chunked", "forced (OPSLOT_FORCE_IMPL=torch_chunked)")
    assert plan["rms_norm_slot"] == (
        "eager",
        "forced (OPSLOT_FORCE_IMPL=torch_chunked; no usable 'torch_chunked' for rms_norm/standard: eager)",
    )
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "rms_norm=torch,moe=fused_torch")
    plan = binding_plan(moe())
    assert plan.as_dict()["model.layers.*.mlp.experts.moe_experts_slot"] == "torch"
    assert binding_plan(toy()).as_dict() == {
        "causal_lm_loss_slot": "eager",
        "rms_norm_slot": "torch",
        "rope_slot": "eager",
        "swiglu_mlp_slot": "eager",
    }
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "rms_norm=nope")
    with pytest.raises(ValueError, match=r"rms_norm/standard \(OPSLOT_FORCE_IMPL='rms_norm=nope'\): no kernel 'nope'"):
        toy()
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "rope=torch")
    with pytest.raises(
        ValueError,
        match=r"'rope=torch' is not op=kernel; did you mean "
        r"'rotary_pos_emb_implementation'",
    ):
        toy()


def test_explicit_ops_replace_the_config_choice_with_a_warning(caplog):
    config = toy_config()
    config.ops_implementation = {"rms_norm_implementation": "torch"}
    with caplog.at_level(logging.WARNING, logger="opslot"):
        model = build_model(
            config, ops={"swiglu_mlp_implementation": "torch"}, module=TOY, model_class="ToyForCausalLM"
        )
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "build_model: ops={'swiglu_mlp_implementation': 'torch'} replaces the config's ops_implementation "
        "{'rms_norm_implementation': 'torch'}"
    ]
    assert binding_plan(model).as_dict()["rms_norm_slot"] == "eager"
    assert model.config.ops_implementation == {"swiglu_mlp_implementation": "torch"}
