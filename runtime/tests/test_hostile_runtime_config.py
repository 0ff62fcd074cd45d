"""Issue #28, hostile input round 2 (runtime): the ops config and OPSLOT_FORCE_IMPL never drop what
was asked for silently, and their messages say where things go. Each test failed on the code
before the change (a silently ignored section, an all-eager model, a suggestion of something that
does not exist, a raw AttributeError)."""

import pytest

import opslot
from example_models import TOY, toy_config
from opslot import OpsImplementationConfig, binding_plan, build_model

SECTION = {"rms_norm_implementation": "torch"}


@pytest.fixture(autouse=True)
def _cpu_defaults():
    opslot.set_device_detector(lambda: opslot.DeviceInfo("cpu"))
    yield


def refused(data):
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict(data)
    return str(err.value)


# -- item 1: an ops section anywhere but model.ops_implementation ----------------------------------
@pytest.mark.parametrize(
    "data, where",
    [
        ({"model": {"name_or_path": "x"}, "train": {"ops_implementation": SECTION}}, "train.ops_implementation"),
        ({"model": {}, "data": {"ops_implementation": SECTION}}, "data.ops_implementation"),
        ({"model": {"model": {"ops_implementation": SECTION}}}, "model.model.ops_implementation"),
        (
            {"model": {"ops_implementation": SECTION}, "train": {"optim": {"ops_implementation": SECTION}}},
            "train.optim.ops_implementation",
        ),
        (
            {"model": {}, "data": {"sources": [{"path": "a"}, {"ops_implementation": SECTION}]}},
            "data.sources[1].ops_implementation",
        ),
        ({"model": {}, "train": {"Ops_Implementations": SECTION}}, "train.Ops_Implementations"),
        ({"train": {"ops_implementation": SECTION}}, "train.ops_implementation"),  # no model: section at all
        ({"ops_implementation": SECTION, "train": {"ops_implementation": SECTION}}, "train.ops_implementation"),
    ],
)
def test_ops_section_in_an_unexpected_place_is_an_error(data, where):
    assert refused(data) == (
        f"misplaced ops settings in the training config: {where!r}: the ops section is 'model.ops_implementation'"
    )


def test_every_misplaced_section_is_listed_and_nothing_is_bound(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(
        "model:\n  model:\n    ops_implementation:\n      rms_norm_implementation: torch\n"
        "train:\n  ops_implementation:\n    rms_norm_implementation: torch\n"
    )
    with pytest.raises(ValueError) as err:
        build_model(toy_config(), ops=path, module=TOY, model_class="ToyForCausalLM")
    assert str(err.value) == (
        f"{path}: misplaced ops settings in the training config: 'model.model.ops_implementation': the ops "
        f"section is 'model.ops_implementation'; 'train.ops_implementation': the ops section is "
        f"'model.ops_implementation'"
    )


def test_other_implementation_keys_elsewhere_are_not_sections():
    data = {
        "model": {"ops_implementation": SECTION},
        "train": {"attn_implementation": "sdpa", "router_implementation": "fp32"},
    }
    assert OpsImplementationConfig.from_dict(data) == OpsImplementationConfig(rms_norm_implementation="torch")


# -- item 2: OPSLOT_FORCE_IMPL values that bind nothing ---------------------------------------------
@pytest.mark.parametrize(
    "value, hint",
    [
        ("torhc", "; did you mean 'torch'?"),
        ("Torch", "; did you mean 'torch'?"),
        ("fused_torch", "; did you mean 'torch'?"),
        ("eagr", "; did you mean 'eager'?"),
        ("xyzzy", ""),
    ],
)
def test_force_value_naming_no_kernel_is_an_error(monkeypatch, value, hint):
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", value)
    with pytest.raises(ValueError) as err:
        build_model(toy_config(), module=TOY, model_class="ToyForCausalLM")
    assert str(err.value) == (
        f"invalid ops_implementation:\n  every slot (OPSLOT_FORCE_IMPL={value!r}): no kernel "
        f"{value!r} for any op{hint} (values: eager, cuda, npu, torch, torch_chunked)"
    )


def test_force_value_with_no_kernel_usable_here_is_an_error(monkeypatch):
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "cuda")  # the tests pretend to be a CPU machine
    with pytest.raises(ValueError) as err:
        build_model(toy_config(), module=TOY, model_class="ToyForCausalLM")
    assert str(err.value) == (
        "invalid ops_implementation:\n  every slot (OPSLOT_FORCE_IMPL='cuda'): no kernel "
        "'cuda' can run on this machine, so every slot would run eager (usable here: eager, "
        "torch, torch_chunked)"
    )


def test_both_forms_go_through_one_check(monkeypatch):
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "rms_norm=torhc")
    with pytest.raises(ValueError) as err:
        build_model(toy_config(), module=TOY, model_class="ToyForCausalLM")
    assert str(err.value) == (
        "invalid ops_implementation:\n  rms_norm/standard (OPSLOT_FORCE_IMPL='rms_norm=torhc'): "
        "no kernel 'torhc' for rms_norm; did you mean 'torch'? (values: eager, cuda, npu, "
        "torch)"
    )
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "rms_norm=torch,torhc")
    with pytest.raises(
        ValueError,
        match=r"^invalid ops_implementation:\n  every slot \(OPSLOT_FORCE_IMPL="
        r"'rms_norm=torch,torhc'\): no kernel 'torhc' for any op; did you mean",
    ):
        build_model(toy_config(), module=TOY, model_class="ToyForCausalLM")
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "torch")  # a kernel that exists still binds where it can
    model = build_model(toy_config(), module=TOY, model_class="ToyForCausalLM")
    assert set(binding_plan(model).as_dict().values()) == {"torch"}


def test_force_op_suggestion_never_names_what_the_variable_refuses(monkeypatch):
    monkeypatch.setenv("OPSLOT_FORCE_IMPL", "attn=sdpa")  # was: did you mean 'attn_implementation'? (refused too)
    with pytest.raises(ValueError) as err:
        build_model(toy_config(), module=TOY, model_class="ToyForCausalLM")
    assert str(err.value) == "OPSLOT_FORCE_IMPL='attn=sdpa': 'attn=sdpa' is not op=kernel"


# -- item 3: messages ----------------------------------------------------------------------------
def test_router_implementation_is_a_model_config_attribute():
    note = (
        "router_implementation is a model-config attribute, not an ops field (a config slot of the generated "
        "model reads config.router_implementation); set it on the model config (config.router_implementation = "
        "..., or in its config.json)"
    )
    assert refused({"router_implementation": "fp32"}) == (
        f"unknown ops_implementation field 'router_implementation': {note}"
    )
    assert refused({"model": {"router_implementation": "fp32"}}) == (
        f"misplaced ops settings in the training config: 'model.router_implementation': {note}"
    )


def test_the_attribute_of_any_config_slot_is_recognised():
    assert (
        refused({"hostile_attention_kernel": "sdpa"}) == "unknown ops_implementation field 'hostile_attention_kernel'"
    )
    opslot.ConfigSlot("HostileAttention.kernel", "hostile_attention_kernel", ("eager", "sdpa"), default="eager")
    from opslot.config_slot import CONFIG_ATTRIBUTES

    try:
        assert refused({"hostile_attention_kernel": "sdpa"}).startswith(
            "unknown ops_implementation field 'hostile_attention_kernel': hostile_attention_kernel is a model-config "
            "attribute, not an ops field"
        )
    finally:
        CONFIG_ATTRIBUTES.pop("hostile_attention_kernel")


@pytest.mark.parametrize(
    "value, message",
    [
        ("torhc", "got 'torhc'; did you mean 'fused_torch'?"),  # was 'fused_torhc'
        ("Torch", "got 'Torch'; did you mean 'fused_torch'?"),  # was 'fused_Torch'
        ("triton", "got 'triton' (values: eager, fused_cuda, fused_npu, fused_torch)"),  # was 'fused_triton'
    ],
)
def test_moe_suggestion_is_a_value_that_exists(value, message):
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig(moe_implementation=value)
    assert str(err.value) == f"ops_implementation.moe_implementation must be 'eager' or 'fused_<impl>', {message}"


def test_misspelt_section_in_a_bare_mapping_suggests_the_section():
    assert refused({"ops_implmentation": SECTION}) == (
        "unknown ops_implementation field 'ops_implmentation'; did you mean 'ops_implementation'?"
    )  # was moe_...
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig(allow_unbound=("attention",))  # was: did you mean 'attn_implementation'? (refused)
    assert str(err.value) == "ops_implementation.allow_unbound: 'attention' is not an op with slots"


@pytest.mark.parametrize(
    "config, got",
    [
        (None, "None"),
        (
            {"hidden_size": 64},
            "dict (make the config object from it: e.g. Qwen3Config(**values), or "
            "AutoConfig.for_model(model_type, **values))",
        ),
        (
            "some/dir",
            "str (for a checkpoint or config folder: opslot.hf.from_pretrained(path, module), or "
            "AutoConfig.from_pretrained(path))",
        ),
    ],
)
def test_build_model_says_what_config_it_takes(config, got):
    with pytest.raises(TypeError) as err:
        build_model(config, module=TOY, model_class="ToyForCausalLM")
    assert str(err.value) == (
        "build_model takes the model's config object (a transformers PretrainedConfig, e.g. "
        f"Qwen3Config(...) or AutoConfig.from_pretrained(path)) as hf_config, got {got}"
    )
