"""opslot.hf.from_pretrained on a checkpoint that a bound model saved: every slot binds as in the
first build (the saved config carries ops_implementation), without passing ops again."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import opslot  # noqa: E402
import opslot.hf  # noqa: E402
from test_hf import checkpoint, make_module, needs_moe  # noqa: E402,F401  (the fixture, reused)


@needs_moe
def test_saved_model_loads_with_the_same_plan(checkpoint, tmp_path, monkeypatch):  # noqa: F811
    path, _ = checkpoint
    mod = make_module(tmp_path, monkeypatch, plain=False)
    first = opslot.hf.from_pretrained(path, mod, ops={"rms_norm_implementation": "torch"})
    out = tmp_path / "saved"
    first.save_pretrained(out)
    again = opslot.hf.from_pretrained(str(out), mod)
    assert again.config.ops_implementation == {"rms_norm_implementation": "torch"}
    assert opslot.binding_plan(again) == opslot.binding_plan(first)
    assert opslot.binding_plan(again).as_dict()["rms_norm_slot"] == "torch"
    ids = torch.randint(0, 64, (1, 4))
    assert torch.equal(again(input_ids=ids).logits, first(input_ids=ids).logits)


@needs_moe
def test_loading_a_saved_bound_model_with_the_plain_class_is_refused(checkpoint, tmp_path, monkeypatch):  # noqa: F811
    path, _ = checkpoint
    mod = make_module(tmp_path, monkeypatch, plain=False)
    first = opslot.hf.from_pretrained(path, mod, ops={"rms_norm_implementation": "torch"})
    out = tmp_path / "saved"
    first.save_pretrained(out)
    # the module's own class: its module-level slots are not bound as the saved config says
    with pytest.raises(
        ValueError,
        match=r"module-level slots do not follow: rms_norm_slot \(rms_norm/standard\) "
        r"runs 'eager', the config chooses 'torch'\. Build it with opslot.build_model",
    ):
        mod.Qwen3MoeForCausalLM.from_pretrained(str(out))
    assert type(mod.Qwen3MoeForCausalLM.from_pretrained(path)) is mod.Qwen3MoeForCausalLM  # nothing saved: fine
