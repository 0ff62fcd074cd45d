"""Private module copies (build_model): named after their binding, shared by models with the same
module-level binding, picklable whole (also into a new process), released with their models, and
`opslot.is_instance` against the generated classes."""

import gc
import importlib
import os
import pickle
import subprocess
import sys
import weakref

import pytest
import torch

import opslot
from example_models import REPO, TOY, TOY_MOE, moe_config, toy_config
from opslot import binding_plan, build_model

OPS = {"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"}


@pytest.fixture(autouse=True)
def _cpu_defaults():
    """The device defaults of a CPU whatever the machine (on a CUDA machine with opslot's kernel
    library, unset fields would take the cuda kernels); conftest restores detection afterwards."""
    opslot.set_device_detector(lambda: opslot.DeviceInfo("cpu"))
    yield


def batch():
    return torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))


def test_copies_are_named_after_their_binding_and_shared():
    a = build_model(toy_config(), ops=OPS, module=TOY, model_class="ToyForCausalLM")
    b = build_model(toy_config(), ops=OPS, module=TOY, model_class="ToyForCausalLM")
    c = build_model(toy_config(), ops=None, module=TOY, model_class="ToyForCausalLM")
    assert type(a).__module__ == "patched_modeling_toy_gpu__opslot__eager-torch-eager-torch"
    assert type(a) is type(b) and type(c) is not type(a)


def test_whole_model_pickles_in_process_and_in_a_new_process(tmp_path):
    model = build_model(
        moe_config(),
        ops={"moe_implementation": "fused_torch", "cross_entropy_loss_implementation": "torch"},
        module=TOY_MOE,
        model_class="ToyMoeForCausalLM",
    ).eval()
    ids = batch()
    expected = model(input_ids=ids).logits
    again = pickle.loads(pickle.dumps(model))
    assert torch.equal(again(input_ids=ids).logits, expected)
    assert binding_plan(again) == binding_plan(model)

    path = tmp_path / "model.pt"
    torch.save(model, path)
    torch.save({"ids": ids, "logits": expected.detach()}, tmp_path / "io.pt")
    script = (
        "import opslot, torch\n"
        f"m = torch.load({str(path)!r}, weights_only=False)\n"
        f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
        "assert torch.equal(m(input_ids=io['ids']).logits, io['logits'])\n"
        "print(opslot.binding_plan(m).as_dict())\n"
    )
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join(
            [
                os.path.join(REPO, "runtime"),
                os.path.join(REPO, "examples", "upstream"),
                os.path.join(REPO, "generated", "example"),
            ]
        ),
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(
        {
            "causal_lm_loss_slot": "torch",
            "load_balancing_loss_slot": "eager",
            "model.layers.*.mlp.experts.moe_experts_slot": "torch",
        }
    )


def test_is_instance_against_the_generated_classes():
    generated = importlib.import_module(TOY)
    model = build_model(toy_config(), ops=OPS, module=TOY, model_class="ToyForCausalLM")
    assert not isinstance(model, generated.ToyForCausalLM)  # another class object: see docs/runtime.md
    assert opslot.is_instance(model, generated.ToyForCausalLM)
    assert opslot.is_instance(model, generated.ToyPreTrainedModel)
    assert not opslot.is_instance(model, generated.ToyModel)


def test_copies_are_released_with_their_models():
    ops = {"rotary_pos_emb_implementation": "torch", "cross_entropy_loss_implementation": "torch_chunked"}
    model = build_model(toy_config(), ops=ops, module=TOY, model_class="ToyForCausalLM")
    name = type(model).__module__
    module_ref = weakref.ref(sys.modules[name])
    build_model(toy_config(), ops=ops, module=TOY, model_class="ToyForCausalLM")  # the model lives: kept
    assert name in sys.modules
    del model
    gc.collect()
    build_model(toy_config(), ops=None, module=TOY, model_class="ToyForCausalLM")
    assert name not in sys.modules
    gc.collect()
    assert module_ref() is None
