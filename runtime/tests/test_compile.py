"""torch.compile over the generated example models with slots bound: slot dispatch adds no graph
break. The dense toy model compiles with fullgraph=True; the MoE one cannot (upstream's expert loop
is data-dependent), so none of its graph breaks may be in opslot.
Dynamo only (backend="eager"): what is checked is the tracing, and it stays fast on a CPU."""

import pytest
import torch

import opslot
from example_models import TOY, TOY_MOE, moe_config, toy_config
from opslot import binding_plan, build_model

torch._dynamo.config.cache_size_limit = 64


@pytest.fixture(autouse=True)
def _cpu_defaults():
    """The device defaults of a CPU whatever the machine (on a CUDA machine with opslot's kernel
    library, unset fields would take the cuda kernels); conftest restores detection afterwards."""
    opslot.set_device_detector(lambda: opslot.DeviceInfo("cpu"))
    yield


def inputs(vocab=64):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 7), generator=gen)
    return {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("ce", ["torch", "torch_chunked"])
def test_dense_model_compiles_fullgraph_with_every_slot_bound(ce):
    ops = {
        "rms_norm_implementation": "torch",
        "rotary_pos_emb_implementation": "torch",
        "swiglu_mlp_implementation": "torch",
        "cross_entropy_loss_implementation": ce,
    }
    torch.manual_seed(0)
    model = build_model(toy_config(), ops=ops, module=TOY, model_class="ToyForCausalLM")
    assert set(binding_plan(model).as_dict().values()) == {"torch", ce}
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    out = compiled(**inputs())
    ref = model(**inputs())
    assert torch.allclose(out.loss, ref.loss, atol=1e-6)
    out.loss.backward()


def test_moe_model_dispatch_adds_no_graph_break():
    ops = {"cross_entropy_loss_implementation": "torch", "load_balancing_loss_implementation": "torch"}
    config = moe_config(output_router_logits=True, num_hidden_layers=1, num_experts=2, num_experts_per_tok=1)
    generated = build_model(config, ops=ops, module=TOY_MOE, model_class="ToyMoeForCausalLM")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(generated)(**inputs())
    assert explained.graph_break_count > 0  # upstream's data-dependent expert loop
    in_opslot = [r for r in explained.break_reasons if any("opslot" in (f.filename or "") for f in r.user_stack)]
    assert not in_opslot, in_opslot


def test_generated_qwen3_compiles_fullgraph_with_every_slot_bound():
    """A real generated model (Transformers' Qwen3 patched by specs/qwen3), where one was generated:
    `make run` writes generated/qwen3 (git-ignored), the real_models test build/real_models/generated."""
    transformers = pytest.importorskip("transformers")
    import os
    import sys

    from example_models import REPO

    candidates = [
        os.path.join(REPO, "generated", "qwen3"),
        os.path.join(REPO, "build", "real_models", "generated", "qwen3"),
    ]
    found = [f for f in candidates if os.path.isfile(os.path.join(f, "patched_modeling_qwen3_gpu.py"))]
    if not found:
        pytest.skip("no generated Qwen3 (make run)")
    if found[0] not in sys.path:
        sys.path.append(found[0])
    config = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    ops = {
        "rms_norm_implementation": "torch",
        "rotary_pos_emb_implementation": "torch",
        "swiglu_mlp_implementation": "torch",
        "cross_entropy_loss_implementation": "torch",
        "attn_implementation": "sdpa",
    }
    model = build_model(config, ops=ops, module="patched_modeling_qwen3_gpu", model_class="Qwen3ForCausalLM")
    assert set(binding_plan(model).as_dict().values()) == {"torch"}
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    batch = inputs()
    assert torch.allclose(compiled(**batch).loss, model(**batch).loss, atol=1e-6)
