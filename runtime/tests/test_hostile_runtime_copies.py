"""Issue #28, hostile input round 2 (runtime): private module copies under threads and across
pickle / torch.load / deepcopy. Each test failed on the code before the change (a bare KeyError from
the import machinery, unpicklable models, a released copy, a copy whose name lies)."""

import copy
import gc
import importlib
import io
import itertools
import pickle
import sys
import threading

import pytest
import torch

import opslot
from example_models import TOY, TOY_MOE, moe_config, toy_config
from opslot import bind_ops, binding_plan, build_model

FIELDS = (
    "cross_entropy_loss_implementation",
    "rms_norm_implementation",
    "rotary_pos_emb_implementation",
    "swiglu_mlp_implementation",
)
#: Every binding of the toy's four module-level slots with eager/torch: 16 copies.
COMBOS = [dict(zip(FIELDS, impls)) for impls in itertools.product(("eager", "torch"), repeat=4)]


@pytest.fixture(autouse=True)
def _cpu_defaults():
    opslot.set_device_detector(lambda: opslot.DeviceInfo("cpu"))
    yield


def ids():
    return torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))


def run_threads(work, count=8):
    errors, barrier = [], threading.Barrier(count)

    def target(i):
        barrier.wait()
        try:
            work(i)
        except Exception as exc:  # noqa: BLE001  (collected, reported by the test)
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


# -- item 4: build_model from several threads --------------------------------------------------------
def test_threads_building_models_get_picklable_models_with_their_binding():
    built = []

    def work(i):
        for j in range(3):
            ops = COMBOS[(3 * i + j) % len(COMBOS)]
            built.append((ops, build_model(toy_config(), ops=ops, module=TOY, model_class="ToyForCausalLM")))
        built.append(
            (
                None,
                build_model(
                    moe_config(),
                    ops={"moe_implementation": "fused_torch"},
                    module=TOY_MOE,
                    model_class="ToyMoeForCausalLM",
                ),
            )
        )

    assert run_threads(work) == []
    assert len(built) == 32
    for ops, model in built:
        if ops is not None:
            assert type(model).__module__ == f"{TOY}__opslot__" + "-".join(ops[f] for f in FIELDS)
        again = pickle.loads(pickle.dumps(model))
        assert binding_plan(again) == binding_plan(model)


def test_threads_unpickling_while_others_build():
    blobs = [
        pickle.dumps(build_model(toy_config(), ops=ops, module=TOY, model_class="ToyForCausalLM")) for ops in COMBOS[:8]
    ]
    gc.collect()
    opslot.release_unused_copies()  # every copy is imported again by the unpickling threads
    restored = []

    def work(i):
        for j in range(3):
            if i % 2:
                restored.append(pickle.loads(blobs[(i + j) % len(blobs)]))
            else:
                build_model(toy_config(), ops=COMBOS[8 + (i + j) % 8], module=TOY, model_class="ToyForCausalLM")

    assert run_threads(work) == []
    for model in restored:  # each restored model's class is the one its copy's name imports
        assert vars(sys.modules[type(model).__module__])["ToyForCausalLM"] is type(model)
        pickle.dumps(model)


# -- item 5: restored models are users of their copy ------------------------------------------------
def _pickle(model, tmp_path):
    return pickle.loads(pickle.dumps(model))


def _torch_load(model, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(model, path)
    return torch.load(path, weights_only=False)


def _deepcopy(model, tmp_path):
    return copy.deepcopy(model)


@pytest.mark.parametrize(
    "restore, impls",
    [
        (_pickle, ("torch_chunked", "eager", "torch", "torch")),
        (_torch_load, ("torch_chunked", "torch", "torch", "eager")),
        (_deepcopy, ("torch_chunked", "torch", "eager", "torch")),
    ],
    ids=["pickle", "torch.load", "deepcopy"],
)
def test_restored_model_keeps_its_copy_and_saves_again(tmp_path, restore, impls):
    model = build_model(toy_config(), ops=dict(zip(FIELDS, impls)), module=TOY, model_class="ToyForCausalLM").eval()
    expected = model(input_ids=ids()).logits
    plan = binding_plan(model)
    restored = restore(model, tmp_path)
    del model
    gc.collect()
    build_model(toy_config(), module=TOY, model_class="ToyForCausalLM")  # releases the copies nobody uses
    name = type(restored).__module__
    assert name == f"{TOY}__opslot__" + "-".join(impls)
    assert sys.modules.get(name) is importlib.import_module(name) and vars(sys.modules[name])["ToyForCausalLM"] is type(
        restored
    )
    buffer = io.BytesIO()
    torch.save(restored, buffer)  # the second save
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    assert binding_plan(again) == binding_plan(restored) == plan
    assert torch.equal(again(input_ids=ids()).logits, expected)
    assert torch.equal(restored(input_ids=ids()).logits, expected)


def test_a_restored_model_survives_a_release_in_another_module():
    model = build_model(
        moe_config(),
        ops={"cross_entropy_loss_implementation": "torch_chunked"},
        module=TOY_MOE,
        model_class="ToyMoeForCausalLM",
    )
    restored = copy.deepcopy(model)
    del model
    gc.collect()
    assert opslot.release_unused_copies() == []
    pickle.loads(pickle.dumps(restored))


# -- item 5: a copy's name always says its binding ---------------------------------------------------
def test_bind_ops_refuses_to_rebind_a_copy_and_unpickling_restores_its_binding():
    ops = {"rms_norm_implementation": "torch", "cross_entropy_loss_implementation": "torch_chunked"}
    model = build_model(toy_config(), ops=ops, module=TOY, model_class="ToyForCausalLM")
    name = type(model).__module__
    assert name == f"{TOY}__opslot__torch_chunked-torch-eager-eager"
    with pytest.raises(ValueError) as err:
        bind_ops(sys.modules[name], {"rms_norm_implementation": "torch", "swiglu_mlp_implementation": "torch"})
    assert str(err.value) == (
        f"module '{name}' is a private copy named after its binding (torch_chunked-torch-eager-eager), which pickled "
        f"models are restored with; binding it to eager-torch-eager-torch would make its name lie. Build another "
        f"model with opslot.build_model(config, ops, module=..., model_class=...) (its copy is named after its own "
        f"binding), or bind a copy of your own: opslot.bind_ops(opslot.load_private_copy(sys.modules['{TOY}']), ops)"
    )
    assert binding_plan(model).as_dict()["swiglu_mlp_slot"] == "eager"  # nothing was bound
    assert bind_ops(sys.modules[name], ops)["rms_norm_slot"] == "torch"  # the binding its name says: fine
    assert binding_plan(pickle.loads(pickle.dumps(model))) == binding_plan(model)
