"""Issue #28, hostile input round 2 (runtime): a real generated model (Qwen3-MoE, generated here by
patchgen from the installed Transformers) built again from a config that was saved and loaded back
runs the kernels its saved `ops_implementation` says, every way Transformers builds one; or, for the
plain generated class whose slots nobody bound, is refused. On the code before the change the moe
kernel never ran (Transformers' default experts dispatch) and the plain class ran eager silently.
Issue #34: the generated `__init__` names its owner (`bind_from(config, owner=self)`), so none of this
looks at the call stack; a file of an earlier patchgen (`bind_from(config)`) is refused alike through
opslot.legacy_caller.

Needs the built binary: PATCHGEN_BIN=/path/to/patchgen (skipped when unset)."""

import importlib
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import opslot  # noqa: E402
import opslot.hf  # noqa: E402
from opslot import KERNEL_REGISTRY, KernelSpec, binding_plan, build_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATCHGEN = os.environ.get("PATCHGEN_BIN")
MODULE = "patched_modeling_qwen3_moe_gpu"
CLASS = "Qwen3MoeForCausalLM"
COUNTED = "hostile_counted"
CALLS = {}

pytestmark = pytest.mark.skipif(not PATCHGEN, reason="set PATCHGEN_BIN to the built patchgen binary")


@pytest.fixture(autouse=True)
def _cpu_defaults():
    opslot.set_device_detector(lambda: opslot.DeviceInfo("cpu"))
    yield


@pytest.fixture
def frame_lookups(monkeypatch):
    """The calls of opslot.legacy_caller.caller_namespace, answered as it answers (bind_from's caller)."""
    import opslot.legacy_caller

    looked = []

    def spy():
        looked.append(sys._getframe(1).f_code.co_name)
        return sys._getframe(2).f_globals

    monkeypatch.setattr(opslot.legacy_caller, "caller_namespace", spy)
    return looked


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The Qwen3-MoE module patchgen generates from the installed Transformers, imported."""
    out = tmp_path_factory.mktemp("generated")
    site = os.path.dirname(os.path.dirname(transformers.__file__))
    proc = subprocess.run(
        [PATCHGEN, "specs/qwen3_moe/qwen3_moe_gpu.yaml", "--source-root", site, "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"patchgen failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
    (path,) = out.rglob(f"{MODULE}.py")
    sys.path.insert(0, str(path.parent))
    sys.modules.pop(MODULE, None)  # e.g. one generated elsewhere, imported earlier
    _register_counted_kernels()
    yield importlib.import_module(MODULE)
    for op in ("moe", "rms_norm"):  # other tests list the registry's kernels
        KERNEL_REGISTRY.unregister(op, "standard", COUNTED)
    sys.path.remove(str(path.parent))
    sys.modules.pop(MODULE, None)


def _register_counted_kernels():
    """Impl `hostile_counted` for moe/standard and rms_norm/standard: the torch kernel, counted."""
    for op in ("moe", "rms_norm"):

        def factory(op=op):
            inner = KERNEL_REGISTRY.get(op, "standard", "torch").load()

            def counted(*args, **kwargs):
                CALLS[op] = CALLS.get(op, 0) + 1
                return inner(*args, **kwargs)

            return counted

        KERNEL_REGISTRY.register(KernelSpec(COUNTED, op, "standard", factory, description="counted torch"))


OPS = {"moe_implementation": f"fused_{COUNTED}", "rms_norm_implementation": COUNTED}


def tiny_config():
    return transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=64,
    )


def kernel_calls(model):
    CALLS.clear()
    with torch.no_grad():
        model(input_ids=torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0)))
    return dict(CALLS)


@pytest.fixture
def saved(generated, tmp_path):
    """(the model build_model made, the folder it was saved to)."""
    model = build_model(tiny_config(), ops=OPS, module=generated, model_class=CLASS)
    assert kernel_calls(model) == {"moe": 2, "rms_norm": 9}
    model.save_pretrained(tmp_path / "saved")
    return model, tmp_path / "saved"


def loaded_config(path):
    return transformers.AutoConfig.from_pretrained(path)


REBUILDS = {
    "the bound class's from_pretrained": lambda cls, mod, path: cls.from_pretrained(path),
    "the bound class on the loaded config": lambda cls, mod, path: cls(loaded_config(path)),
    "the bound class's _from_config": lambda cls, mod, path: cls._from_config(loaded_config(path)),
    "opslot.hf.from_pretrained": lambda cls, mod, path: opslot.hf.from_pretrained(path, mod),
    "build_model on the loaded config": lambda cls, mod, path: build_model(
        loaded_config(path), module=mod, model_class=CLASS
    ),
}


@pytest.mark.parametrize("how", sorted(REBUILDS))
def test_a_model_rebuilt_from_its_saved_config_runs_its_kernels(generated, saved, how, frame_lookups):
    model, path = saved
    again = REBUILDS[how](type(model), generated, path)
    assert binding_plan(again) == binding_plan(model)
    assert kernel_calls(again) == {"moe": 2, "rms_norm": 9}  # was {"rms_norm": 9}: experts dispatched elsewhere
    assert again.config._experts_implementation == "eager"
    assert frame_lookups == []


def test_a_loaded_model_saved_again_still_carries_its_dispatch(saved, tmp_path):
    model, path = saved
    loaded = type(model).from_pretrained(path)
    loaded.save_pretrained(tmp_path / "again")
    assert kernel_calls(type(model)(loaded_config(tmp_path / "again"))) == {"moe": 2, "rms_norm": 9}


def test_an_explicit_experts_implementation_still_wins(saved):
    model, path = saved
    assert (
        type(model).from_pretrained(path, experts_implementation="batched_mm").config._experts_implementation
        == "batched_mm"
    )


def refusal(module_name):
    return (
        f"a model of {module_name} is being built from a config whose ops_implementation its module-level slots "
        f"do not follow: moe_slot (moe/standard) runs 'eager', the config chooses '{COUNTED}'; rms_norm_slot "
        f"(rms_norm/standard) runs 'eager', the config chooses '{COUNTED}'. Build it with "
        f"opslot.build_model(config, module=..., model_class=...) or opslot.hf.from_pretrained(path, module), "
        f"which bind every slot"
    )


def test_the_generated_config_slot_names_its_owner(generated):
    with open(generated.__file__, encoding="utf-8") as f:
        source = f.read()
    assert (
        'self.router_implementation = ConfigSlot("Qwen3MoeTopKRouter.router_implementation", "router_implementation", '
        '("eager", "fp32"), default="eager").bind_from(config, owner=self)\n'
    ) in source
    assert ".bind_from(config)" not in source


def test_the_plain_class_built_from_a_saved_config_is_refused(generated, saved, frame_lookups):
    _, path = saved
    message = refusal(MODULE)
    cls = getattr(generated, CLASS)
    with pytest.raises(ValueError) as err:
        cls(loaded_config(path))  # was: an all-eager model, silently
    assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        cls._from_config(loaded_config(path))
    assert str(err.value) == message
    with opslot.hf.register_auto_classes(generated):
        with pytest.raises(ValueError) as err:
            transformers.AutoModelForCausalLM.from_config(loaded_config(path))
    assert str(err.value) == message
    assert type(cls(tiny_config())) is cls  # a config without a saved choice: the plain class as upstream's
    assert frame_lookups == []


LEGACY = MODULE + "_legacy"


@pytest.fixture
def legacy_module(generated, tmp_path):
    """The generated Qwen3-MoE module as an earlier patchgen wrote it: `bind_from(config)`, no owner."""
    with open(generated.__file__, encoding="utf-8") as f:
        source = f.read()
    assert source.count(".bind_from(config, owner=self)") == 1  # the router's config slot
    (tmp_path / f"{LEGACY}.py").write_text(source.replace(".bind_from(config, owner=self)", ".bind_from(config)"))
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop(LEGACY, None)
    yield importlib.import_module(LEGACY)
    sys.path.remove(str(tmp_path))
    sys.modules.pop(LEGACY, None)


def test_a_file_of_an_earlier_patchgen_is_refused_alike_through_the_call_stack(legacy_module, saved, frame_lookups):
    _, path = saved
    with pytest.raises(ValueError) as err:
        getattr(legacy_module, CLASS)(loaded_config(path))
    assert str(err.value) == refusal(LEGACY)
    assert frame_lookups == ["bind_from"]  # the first layer's router: refused there
    again = build_model(loaded_config(path), module=legacy_module, model_class=CLASS)
    assert kernel_calls(again) == {"moe": 2, "rms_norm": 9}
    assert frame_lookups == ["bind_from"] * 3  # and one per layer's router (2 layers) when it is built
