"""The multimodal heads the public checkpoints load into — Qwen3.5's, Qwen3.5-MoE's and Gemma3's
`*ForConditionalGeneration` — run opslot's kernels (issue 31 item 2, issue 28's "multimodal heads").

Upstream builds their language model with `AutoModel.from_config`, i.e. Transformers' own text model,
which has no dispatch point; the specs make it the generated one, and guard the head's causal-LM
loss, whose vocabulary lives in the text config. For each head (tiny text config as
tests/models/e2e.py, a tiny vision tower, text-only inputs, fp32, CPU; `--device cuda` for the cuda
kernels):

- every slot on `eager`: logits, loss and every parameter gradient torch.equal to upstream's head
  with the same weights;
- every slot on opslot's `torch` (or `cuda`) kernels: within e2e's tolerance, and the proof of
  dispatch says every text-model slot and the loss slot "ran";
- Qwen3.5 / Qwen3.5-MoE: a packed row through the head gives the documents' summed loss (the head
  masks the label at each document's first token, as `*ForCausalLM` does).

Run: `python -m pytest tests/models/test_multimodal_heads.py` (ctest `real_models_multimodal_heads`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

import e2e

VISION = {
    "qwen3_5": (
        "Qwen3_5Config",
        dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=2,
            spatial_merge_size=1,
            temporal_patch_size=1,
            in_channels=3,
        ),
    ),
    "qwen3_5_moe": (
        "Qwen3_5MoeConfig",
        dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=2,
            spatial_merge_size=1,
            temporal_patch_size=1,
            in_channels=3,
        ),
    ),
    "gemma3": (
        "Gemma3Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=16,
            patch_size=4,
            vision_use_head=False,
        ),
    ),
}
HEAD = {
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "gemma3": "Gemma3ForConditionalGeneration",
}
CASES = {c.key: c for c in e2e.CASES}


def composite_config(key: str):
    import transformers

    case = CASES[key]
    text = e2e.make_config(case).to_dict()
    name, vision = VISION[key]
    extra = dict(mm_tokens_per_image=4) if key == "gemma3" else {}
    config = getattr(transformers, name)(text_config=text, vision_config=vision, **extra)
    config._attn_implementation = "eager"
    return config


@pytest.fixture(scope="module")
def heads(patchgen, source_root, tmp_path_factory):
    cache: Dict[str, Any] = {}

    def get(key: str):
        if key not in cache:
            import importlib

            from opslot import module_slots

            case = CASES[key]
            tmp: Path = tmp_path_factory.mktemp(f"mm_{key}")
            gen_py, _ = e2e.generate(patchgen, case.spec("gpu"), source_root, tmp, case.output_name("gpu"))
            module = e2e.import_generated(gen_py)
            config = composite_config(key)
            upstream_cls = getattr(importlib.import_module(case.upstream_module), HEAD[key])
            torch.manual_seed(0)
            upstream = upstream_cls(copy.deepcopy(config))
            e2e.randomize_(upstream, case.offset_norm)
            cache[key] = (module, module_slots(module), config, upstream)
        return cache[key]

    return get


def step(model, ids, device):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    logits = model(input_ids=ids, use_cache=False).logits.detach()  # no labels: the fused loss keeps none
    return logits, out.loss.detach(), grads


@pytest.mark.parametrize("key", list(HEAD))
@pytest.mark.parametrize("impl", ["eager", "kernels"])
def test_multimodal_head_runs_the_kernels(key, impl, heads, device):
    from opslot import build_model
    from opslot.dispatch import check_dispatch

    module, slots, config, upstream = heads(key)
    kernel = "cuda" if device.type == "cuda" else "torch"
    ops = e2e.ops_for(slots, "eager" if impl == "eager" else kernel)
    # heads without labels in their own forward: the sequence-classification slot is another head's
    model = build_model(
        copy.deepcopy(config),
        ops=ops,
        module=module,
        model_class=HEAD[key],
        allow_unreached=["load_balancing_loss"] if CASES[key].moe else None,
    )
    model.load_state_dict(upstream.state_dict(), strict=True)
    model.to(device)
    ref = copy.deepcopy(upstream).to(device)
    ids = torch.randint(1, config.get_text_config().vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    want = step(ref, ids, device)
    got = step(model, ids, device)
    assert got[2].keys() == want[2].keys()
    if impl == "eager":
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for name in want[2]:
            assert torch.equal(got[2][name], want[2][name]), name
        return
    torch.testing.assert_close(got[0], want[0], rtol=e2e.RTOL, atol=e2e.ATOL)
    torch.testing.assert_close(got[1], want[1], rtol=e2e.RTOL, atol=e2e.ATOL)
    for name in want[2]:
        torch.testing.assert_close(
            got[2][name], want[2][name], rtol=e2e.RTOL, atol=e2e.ATOL, msg=lambda m: f"{key}: grad {name}: {m}"
        )
    report = check_dispatch(model, allow_unreached=True)
    status = {e.slot: e.status for e in report.entries}
    expected_unused = {"sequence_classification_loss_slot"}
    if CASES[key].moe:
        expected_unused.add("load_balancing_loss_slot")  # output_router_logits is off in these configs
    for slot, st in status.items():
        if slot in expected_unused:
            continue
        assert st == "ran", f"{key}: {slot} is {st!r}"
    assert status["causal_lm_loss_slot"] == "ran"


@pytest.mark.parametrize("key", ["qwen3_5", "qwen3_5_moe"])
def test_packed_row_through_the_multimodal_head(key, heads, device):
    """A packed row (position ids restarting per document, labels the ids themselves) through the
    multimodal head: the loss summed over targets equals the documents' summed losses — the head masks
    the label at each document's first token, the text model keeps the documents apart."""
    from opslot import build_model

    module, slots, config, upstream = heads(key)
    ops = dict(e2e.ops_for(slots, "cuda" if device.type == "cuda" else "torch"), attn_implementation="opslot_varlen")
    model = build_model(copy.deepcopy(config), ops=ops, module=module, model_class=HEAD[key], allow_unreached=True)
    model.load_state_dict(upstream.state_dict(), strict=True)
    model.to(device)
    lengths = [7, 1, 5]
    ids = torch.randint(
        1, config.get_text_config().vocab_size, (1, sum(lengths)), generator=torch.Generator().manual_seed(3)
    )
    ids = ids.to(device)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss * sum(
            n - 1 for n in lengths
        )
        alone, start = torch.zeros((), device=device), 0
        for n in lengths:
            if n > 1:
                doc = ids[:, start : start + n]
                alone = alone + model(input_ids=doc, labels=doc, use_cache=False).loss * (n - 1)
            start += n
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4)
