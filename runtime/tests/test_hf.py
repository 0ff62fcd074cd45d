"""opslot.hf: strict loading (PartialLoadError), the load report in Transformers' own refusals, and,
with Transformers 5 installed, the checkpoint fix on a small generated-style Qwen3-MoE module
(root cause reproduced without it), auto-class registration and `opslot.hf.from_pretrained`.
The real generated models are covered by tests/models/test_hf_parity.py."""

import logging
import textwrap
import uuid

import pytest
import torch

from opslot.hf import PartialLoadError, check_loading_info, strict_from_pretrained


class FakeModel:
    pass


def fake_loader(info, calls=None):
    def load(*args, **kwargs):
        if calls is not None:
            calls.append((args, kwargs))
        return FakeModel(), info

    return load


def info(missing=(), unexpected=(), mismatched=()):
    return {
        "missing_keys": set(missing),
        "unexpected_keys": set(unexpected),
        "mismatched_keys": set(mismatched),
        "error_msgs": [],
    }


def test_partial_load_error_names_every_kind_of_key():
    err = PartialLoadError("M", "/ckpt", ["b", "a"], ["x"], [("w", (2, 3), (3, 3))])
    assert err.missing == ["a", "b"] and err.unexpected == ["x"] and err.mismatched == [("w", (2, 3), (3, 3))]
    text = str(err)
    assert "M.from_pretrained('/ckpt')" in text
    for needle in (
        "2 missing from the checkpoint",
        "    a",
        "    b",
        "1 unexpected",
        "    x",
        "w: (2, 3) vs (3, 3)",
        "strict=False",
    ):
        assert needle in text


def test_partial_load_error_summarises_long_lists():
    err = PartialLoadError("M", "p", [f"k{i:03d}" for i in range(120)], [])
    assert len(err.missing) == 120 and "k049" in str(err) and "k050" not in str(err)
    assert "... and 70 more" in str(err)


def test_strict_from_pretrained_passes_a_clean_load_through():
    calls = []
    model = strict_from_pretrained(fake_loader(info(), calls), "/ckpt", dtype="x")
    assert isinstance(model, FakeModel)
    assert calls == [(("/ckpt",), {"output_loading_info": True, "dtype": "x"})]
    model, got = strict_from_pretrained(fake_loader(info()), "/ckpt", output_loading_info=True)
    assert got == info()


@pytest.mark.parametrize("kind", ["missing", "unexpected", "mismatched"])
def test_strict_from_pretrained_refuses_a_partial_load(kind):
    key = ("w", (1,), (2,)) if kind == "mismatched" else "model.w"
    with pytest.raises(PartialLoadError) as exc:
        strict_from_pretrained(fake_loader(info(**{kind: [key]})), "/ckpt")
    assert getattr(exc.value, kind) == [key]
    # the explicit opt-outs
    model, got = strict_from_pretrained(
        fake_loader(info(**{kind: [key]})), "/ckpt", strict=False, output_loading_info=True
    )
    assert got[f"{kind}_keys"] == {key}
    if kind == "mismatched":
        assert isinstance(
            strict_from_pretrained(fake_loader(info(mismatched=[key])), "/c", ignore_mismatched_sizes=True), FakeModel
        )


def test_check_loading_info_reports_the_model_class_and_source():
    with pytest.raises(PartialLoadError, match=r"FakeModel.from_pretrained\('src'\)"):
        check_loading_info(FakeModel(), info(missing=["a"]), "src")


def test_transformers_refusal_gets_the_load_report():
    def load(*args, **kwargs):
        logging.getLogger("transformers.modeling_utils").warning(
            "\x1b[1mM LOAD REPORT\x1b[0m from: p\nmodel.layers.1.mlp.experts.gate_up_proj | CONVERSION |"
        )
        raise RuntimeError("We encountered some issues during automatic conversion of the weights.")

    with pytest.raises(RuntimeError) as exc:
        strict_from_pretrained(load, "p")
    assert "model.layers.1.mlp.experts.gate_up_proj | CONVERSION" in str(exc.value)
    assert "\x1b" not in str(exc.value) and isinstance(exc.value.__cause__, RuntimeError)
    assert not any(
        type(h).__name__ == "_LoadReportCapture" for h in logging.getLogger("transformers.modeling_utils").handlers
    )


def test_other_errors_pass_unchanged():
    def load(*args, **kwargs):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="^boom$"):
        strict_from_pretrained(load, "p")


# -- with Transformers: a generated-style Qwen3-MoE module ------------------------------------------------
transformers = pytest.importorskip("transformers")
needs_moe = pytest.mark.skipif(not hasattr(transformers, "Qwen3MoeConfig"), reason="needs Qwen3-MoE (transformers 5)")

MODULE = textwrap.dedent("""
    # A generated module in miniature: upstream's classes, defined outside `transformers.`, with the
    # two methods the real-model specs add (is_custom_code, from_pretrained) unless PLAIN.
    from transformers.models.qwen3_moe import modeling_qwen3_moe as up
    from opslot import OpSlot
    from opslot.hf import strict_from_pretrained

    rms_norm_slot = OpSlot("rms_norm", "standard")

    class Qwen3MoePreTrainedModel(up.Qwen3MoePreTrainedModel):
        if not PLAIN:
            @classmethod
            def is_custom_code(cls):
                return cls.is_remote_code()

            @classmethod
            def from_pretrained(cls, *args, **kwargs):
                return strict_from_pretrained(super().from_pretrained, *args, **kwargs)

    class Qwen3MoeModel(Qwen3MoePreTrainedModel, up.Qwen3MoeModel):
        pass

    class Qwen3MoeForCausalLM(Qwen3MoePreTrainedModel, up.Qwen3MoeForCausalLM):
        def __init__(self, config):
            super().__init__(config)
            self.model = Qwen3MoeModel(config)  # this module's base model, as in a generated file
            self.post_init()
""")


def make_module(tmp_path, monkeypatch, plain):
    import importlib

    name = f"tiny_generated_moe_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(f"PLAIN = {plain}\n" + MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An upstream tiny Qwen3-MoE written by save_pretrained (per-expert layout on disk)."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config)
    path = tmp_path_factory.mktemp("qwen3_moe")
    model.save_pretrained(path)
    return str(path), {k: v.clone() for k, v in model.state_dict().items()}


@needs_moe
def test_root_cause_custom_code_skips_the_conversion_mapping(checkpoint, tmp_path, monkeypatch):
    path, state = checkpoint
    mod = make_module(tmp_path, monkeypatch, plain=True)
    assert mod.Qwen3MoeForCausalLM.is_custom_code()
    model, got = mod.Qwen3MoeForCausalLM.from_pretrained(path, output_loading_info=True)
    assert type(model.model) is mod.Qwen3MoeModel
    assert any(".experts.0.gate_proj.weight" in k for k in got["unexpected_keys"])
    assert not torch.equal(
        model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"], state["model.layers.0.mlp.experts.gate_up_proj"]
    )  # random experts


@needs_moe
def test_the_two_methods_load_the_experts(checkpoint, tmp_path, monkeypatch):
    path, state = checkpoint
    mod = make_module(tmp_path, monkeypatch, plain=False)
    assert not mod.Qwen3MoeForCausalLM.is_custom_code()
    model, got = mod.Qwen3MoeForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not (got["missing_keys"] or got["unexpected_keys"] or got["mismatched_keys"])
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    # a base model from a causal-LM checkpoint: lm_head is unexpected -> refused unless strict=False
    with pytest.raises(PartialLoadError, match="lm_head.weight"):
        mod.Qwen3MoeModel.from_pretrained(path)
    assert type(mod.Qwen3MoeModel.from_pretrained(path, strict=False)) is mod.Qwen3MoeModel


@needs_moe
def test_register_auto_classes_and_undo(checkpoint, tmp_path, monkeypatch):
    from transformers import AutoModel, AutoModelForCausalLM

    from opslot.hf import register_auto_classes

    path, _ = checkpoint
    mod = make_module(tmp_path, monkeypatch, plain=False)
    with register_auto_classes(mod) as reg:
        assert reg.classes["AutoModelForCausalLM"] == {"Qwen3MoeConfig": mod.Qwen3MoeForCausalLM}
        assert reg.classes["AutoModel"] == {"Qwen3MoeConfig": mod.Qwen3MoeModel}
        assert type(AutoModelForCausalLM.from_pretrained(path)) is mod.Qwen3MoeForCausalLM
        assert "AutoModelForCausalLM" in repr(reg)
    assert type(AutoModelForCausalLM.from_pretrained(path)) is transformers.Qwen3MoeForCausalLM
    assert AutoModel._model_mapping[transformers.Qwen3MoeConfig] is transformers.Qwen3MoeModel


@needs_moe
def test_register_auto_classes_refuses_a_module_without_model_classes(tmp_path, monkeypatch):
    from opslot.hf import register_auto_classes

    (tmp_path / "nothing_here_x.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="no class that a Transformers auto class produces"):
        register_auto_classes("nothing_here_x")


@needs_moe
def test_from_pretrained_binds_a_private_copy(checkpoint, tmp_path, monkeypatch):
    import opslot.hf
    from opslot import module_slots

    path, state = checkpoint
    mod = make_module(tmp_path, monkeypatch, plain=False)
    model = opslot.hf.from_pretrained(path, mod, ops={"rms_norm_implementation": "torch"})
    copy = __import__("sys").modules[type(model).__module__]
    assert copy is not mod and type(model).__name__ == "Qwen3MoeForCausalLM"  # from config.architectures
    assert copy.rms_norm_slot.impl == "torch" and mod.rms_norm_slot.impl == "eager"
    assert model.config.ops_implementation == {"rms_norm_implementation": "torch"}
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert model in module_slots(copy)["rms_norm_slot"]._users
    with pytest.raises(ValueError, match="contradicts the ops config"):
        opslot.hf.from_pretrained(path, mod, ops={"attn_implementation": "eager"}, attn_implementation="sdpa")


@needs_moe
def test_tied_embeddings_are_not_a_partial_load(tmp_path, monkeypatch):
    """A tied lm_head is not in the checkpoint (safetensors drops it) and is not missing."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        tie_word_embeddings=True,
    )
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(tmp_path / "tied")
    mod = make_module(tmp_path, monkeypatch, plain=False)
    model = mod.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "tied")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
