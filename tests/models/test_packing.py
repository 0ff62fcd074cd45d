"""Packed (padding-free) batches through every real generated model (issue 29), fp32 on the CPU or,
with `--device cuda`, bf16 on the GPU's `cuda` kernels and PyTorch's FlashAttention.

For each model of tests/models/e2e.py (its tiny config, random weights, every slot on opslot's
`torch` kernels, or `cuda` ones on a GPU), one row packing four documents of different lengths
(one of a single token, two longer than the sliding window of gemma3/gpt_oss) with position ids
restarting per document, and labels that are the ids themselves (not masked at the boundaries):

- attention `opslot_varlen` (GPT-OSS: `eager`, its attention sinks are refused by `opslot_varlen`,
  checked; GLM-MoE-DSA: `sdpa`, its indexer reads the 4-D mask, `opslot_varlen` is refused, checked): the logits of every document equal the document run alone; the loss summed over the
  targets equals the sum of the documents' losses (a label at a document's first token is never
  a target); every parameter gradient equals the sum of the documents' gradients;
- packed with `sdpa` (Transformers' block-diagonal mask) gives the same logits (GPT-OSS has no sdpa;
  GLM-MoE-DSA: `eager`'s float block mask against `sdpa`'s boolean one);
- the collator recipe of docs/packing.md (`DataCollatorWithFlattening(return_flash_attn_kwargs=True)`)
  gives the same loss as position ids alone;
- MoE models: the load-balancing loss of the packed row equals that of the same documents padded in a
  batch (it is a mean over the real tokens either way);
- a packed row with an attention mask is refused (Transformers would ignore the boundaries);
- `opslot_sdpa` under torch.compile (qwen3, gemma3; CPU): rows without position ids, mask or cache get
  SDPA's is_causal instead of Transformers' traced mask in full-attention layers only; packed and
  padded rows keep the mask; loss and gradients equal the eager sdpa step;
- DeepSeek-V4 refuses packed rows (its compressors pool tokens across the row): position ids alone
  and the collator's batch are refused with opslot.packing.PackedSequenceError, whatever the kernels;
  a padded batch and a row of one document run.

Run: `python -m pytest tests/models/test_packing.py [--device cuda] [-k qwen3_5]` (ctest: `real_models_packing`).
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

import e2e  # tests/models/e2e.py (conftest puts it on sys.path)

CASES = {c.key: c for c in e2e.CASES}
LENGTHS = [11, 1, 6, 4]  # gemma3/gpt_oss tiny configs slide a window of 8
SINKS = {"gpt_oss"}  # attention sinks: opslot_varlen refuses them
DENSE_MASK = {"glm_moe_dsa"}  # the DSA indexer reads the 4-D mask: eager or sdpa only, opslot_varlen refused
#: Models that refuse packed rows (their own code cannot keep documents apart): the refusal is tested below.
REFUSED = {"deepseek_v4"}


@dataclasses.dataclass
class World:
    case: Any
    module: types.ModuleType
    slots: Dict[str, Any]
    config: Any
    state: Dict[str, torch.Tensor]


@pytest.fixture(scope="session")
def worlds(patchgen, source_root, tmp_path_factory):
    from opslot import build_model, module_slots

    cache: Dict[str, World] = {}

    def get(key: str) -> World:
        if key not in cache:
            case = CASES[key]
            tmp: Path = tmp_path_factory.mktemp(f"packing_{key}")
            gen_py, _ = e2e.generate(patchgen, case.spec("gpu"), source_root, tmp, case.output_name("gpu"))
            module = e2e.import_generated(gen_py)
            slots = module_slots(module)
            config = e2e.make_config(case)
            if getattr(config, "output_router_logits", False):
                config.output_router_logits = False  # per-document comparisons; the aux loss has its own test
            if key in DENSE_MASK:
                # top-k is discontinuous: two keys whose scores rounding orders differently in the packed
                # row and in the document alone (fp32 sums over another length; bf16 on a GPU) would be
                # picked differently. With k = the longest document every visible key is picked in both,
                # so what is compared is that each document's mask reaches the indexer and the attention
                # (keys of other documents, scored too, must never be picked in place of its own).
                config.index_topk = max(LENGTHS)
            model = build_model(config, ops={}, module=module, model_class=case.causal_lm)
            e2e.randomize_(model, case.offset_norm)
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            cache[key] = World(case, module, slots, config, state)
        return cache[key]

    return get


def build(world: World, attn: str, device: torch.device):
    from opslot import build_model

    impl = "cuda" if device.type == "cuda" else "torch"
    ops = dict(e2e.ops_for(world.slots, impl), attn_implementation=attn)
    # the aux loss runs only with output_router_logits (its own test turns it on)
    model = build_model(
        world.config,
        ops=ops,
        module=world.module,
        model_class=world.case.causal_lm,
        allow_unreached=["load_balancing_loss"] if world.case.moe else None,
    )
    model.load_state_dict(world.state, strict=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return model.to(device, dtype).eval()


def attn_for(key: str) -> str:
    return "eager" if key in SINKS else "sdpa" if key in DENSE_MASK else "opslot_varlen"


def packed_row(vocab: int, device: torch.device) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(29)
    ids = torch.randint(1, vocab, (1, sum(LENGTHS)), generator=gen)
    position_ids = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    return dict(input_ids=ids.to(device), position_ids=position_ids.to(device))


def tolerances(device: torch.device):
    # fp32: summation order only; bf16: the cuda kernels and FlashAttention against themselves
    return (1e-4, 2e-5) if device.type == "cpu" else (5e-2, 5e-2)


def grads_of(model) -> Dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


KEYS = [k for k in CASES if k not in REFUSED]


@pytest.mark.parametrize("key", KEYS)
def test_packed_row_equals_documents_run_alone(key, worlds, device):
    w = worlds(key)
    model = build(w, attn_for(key), device)
    row = packed_row(w.config.vocab_size, device)
    targets = sum(n - 1 for n in LENGTHS)

    with torch.no_grad():  # logits without labels: the fused cuda loss returns none with a loss
        packed_logits = model(**row, use_cache=False).logits.float()
    model.zero_grad(set_to_none=True)
    out = model(**row, labels=row["input_ids"].clone(), use_cache=False)
    (out.loss.float() * targets).backward()
    packed_sum, packed_grads = out.loss.detach().float() * targets, grads_of(model)

    model.zero_grad(set_to_none=True)
    alone_sum = torch.zeros((), device=device)
    rtol, atol = tolerances(device)
    start = 0
    for d, n in enumerate(LENGTHS):
        ids = row["input_ids"][:, start : start + n]
        with torch.no_grad():
            alone_logits = model(input_ids=ids, use_cache=False).logits.float()
        torch.testing.assert_close(
            packed_logits[:, start : start + n],
            alone_logits,
            rtol=rtol,
            atol=atol,
            msg=lambda m: f"{key}: document {d} logits: {m}",
        )
        if n > 1:
            alone = model(input_ids=ids, labels=ids.clone(), use_cache=False)
            part = alone.loss.float() * (n - 1)
            part.backward()
            alone_sum = alone_sum + part.detach()
        start += n
    torch.testing.assert_close(packed_sum, alone_sum, rtol=rtol, atol=atol, msg=lambda m: f"{key}: loss sum: {m}")
    alone_grads = grads_of(model)
    assert packed_grads.keys() == alone_grads.keys()
    scale = max(g.abs().max().item() for g in alone_grads.values())
    for name, grad in packed_grads.items():
        torch.testing.assert_close(
            grad, alone_grads[name], rtol=rtol, atol=atol * max(scale, 1.0), msg=lambda m: f"{key}: grad {name}: {m}"
        )


@pytest.mark.parametrize("key", KEYS)
def test_packed_sdpa_and_the_collator_agree(key, worlds, device):
    from transformers import DataCollatorWithFlattening

    w = worlds(key)
    row = packed_row(w.config.vocab_size, device)
    with torch.no_grad():
        varlen = build(w, attn_for(key), device)
        ref = varlen(**row, use_cache=False).logits.float()
        rtol, atol = tolerances(device)
        if key not in SINKS:  # GPT-OSS: no sdpa in Transformers; its packed eager is the reference above
            other = "eager" if key in DENSE_MASK else "sdpa"  # GLM-MoE-DSA: sdpa is the reference above
            logits = build(w, other, device)(**row, use_cache=False).logits.float()
            torch.testing.assert_close(logits, ref, rtol=rtol, atol=atol)

        docs, start = [], 0
        for n in LENGTHS:
            docs.append({"input_ids": row["input_ids"][0, start : start + n].tolist()})
            start += n
        batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_tensors="pt")(docs)
        assert batch["cu_seq_lens_q"].tolist() == [0, 11, 12, 18, 22]
        batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
        out = varlen(**batch, use_cache=False)
        plain = varlen(**row, labels=row["input_ids"].clone(), use_cache=False)
        torch.testing.assert_close(out.loss.float(), plain.loss.float(), rtol=rtol, atol=atol)
        del batch["labels"]  # the fused cuda loss returns no logits with a loss
        torch.testing.assert_close(varlen(**batch, use_cache=False).logits.float(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("key", [k for k in KEYS if CASES[k].moe])
def test_moe_aux_loss_of_a_packed_row_equals_the_padded_batch(key, worlds, device):
    w = worlds(key)
    model = build(w, attn_for(key), device)
    row = packed_row(w.config.vocab_size, device)
    width = max(LENGTHS)
    padded = torch.zeros(len(LENGTHS), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(padded)
    start = 0
    for d, n in enumerate(LENGTHS):
        padded[d, :n] = row["input_ids"][0, start : start + n]
        mask[d, :n] = 1
        start += n
    with torch.no_grad():
        packed = model(**row, output_router_logits=True, use_cache=False).aux_loss
        sdpa = build(w, "sdpa" if key not in SINKS else "eager", device)
        batch = sdpa(input_ids=padded, attention_mask=mask, output_router_logits=True, use_cache=False).aux_loss
    rtol, atol = tolerances(device)
    torch.testing.assert_close(packed.float(), batch.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("key", ["qwen3", "qwen3_5"])
def test_a_packed_row_with_an_attention_mask_is_refused(key, worlds, device):
    from opslot.packing import PackedSequenceError

    w = worlds(key)
    model = build(w, "opslot_varlen", device)
    row = packed_row(w.config.vocab_size, device)
    with pytest.raises(PackedSequenceError, match="came with an attention_mask"):
        model(**row, attention_mask=torch.ones_like(row["input_ids"]), use_cache=False)


def test_gpt_oss_sinks_are_refused_by_opslot_varlen(worlds, device):
    w = worlds("gpt_oss")
    model = build(w, "opslot_varlen", device)
    with pytest.raises(NotImplementedError, match="has attention sinks"):
        model(**packed_row(w.config.vocab_size, device), use_cache=False)


GLM_ATTENTION_REFUSAL = (
    "GLM-MoE-DSA runs with attn_implementation 'eager' or 'sdpa', not 'opslot_varlen': its indexer reads their 4-D "
    "causal mask (packed rows included: Transformers' block-diagonal mask), and other attentions would ignore the "
    "indexer's top-k selection. The sparse attention's kernel is chosen by dsa_attention_implementation"
)


@pytest.mark.parametrize("impl", ["eager", "torch"])
def test_glm_moe_dsa_refuses_opslot_varlen(worlds, device, impl):
    import re

    from opslot import build_model

    w = worlds("glm_moe_dsa")
    ops = dict(e2e.ops_for(w.slots, impl), attn_implementation="opslot_varlen")
    model = build_model(w.config, ops=ops, module=w.module, model_class=w.case.causal_lm, allow_unreached=True)
    model.to(device).eval()
    for batch in (packed_row(w.config.vocab_size, device), {"input_ids": torch.ones(2, 5, dtype=torch.long)}):
        with torch.no_grad(), pytest.raises(ValueError, match="^" + re.escape(GLM_ATTENTION_REFUSAL) + "$"):
            model(**{k: v.to(device) for k, v in batch.items()}, use_cache=False)


def test_qwen3_5_packed_row_on_eager_gated_deltanet_is_refused(worlds, device):
    from opslot import build_model
    from opslot.packing import PackedSequenceError

    w = worlds("qwen3_5")
    ops = dict(e2e.ops_for(w.slots, "eager"), attn_implementation="opslot_varlen")
    model = build_model(w.config, ops=ops, module=w.module, model_class=w.case.causal_lm).to(device)
    with pytest.raises(
        PackedSequenceError, match="reaches causal_conv1d_implementation, chunk_gated_delta_rule_implementation = eager"
    ):
        model(**packed_row(w.config.vocab_size, device), use_cache=False)


DEEPSEEK_V4_REFUSAL = (
    "DeepSeek-V4 does not take packed rows (documents restarting their position ids inside a row): its "
    "CSA/HCA compressors pool every `compress_rate` tokens of a row into one entry and decide which entries a "
    "query sees from its position id, so the documents of a packed row would read each other's entries; pad "
    "the documents into a batch instead"
)


@pytest.mark.parametrize("impl", ["eager", "torch"])
def test_deepseek_v4_refuses_packed_rows(worlds, device, impl):
    import re

    from transformers import DataCollatorWithFlattening

    from opslot import build_model
    from opslot.packing import PackedSequenceError

    w = worlds("deepseek_v4")
    ops = e2e.ops_for(w.slots, "cuda" if impl == "torch" and device.type == "cuda" else impl)
    model = build_model(w.config, ops=ops, module=w.module, model_class=w.case.causal_lm, allow_unreached=True)
    model.load_state_dict(w.state, strict=True)
    model.to(device).eval()
    row = packed_row(w.config.vocab_size, device)
    refusal = "^" + re.escape(DEEPSEEK_V4_REFUSAL) + "$"
    with torch.no_grad():
        with pytest.raises(PackedSequenceError, match=refusal):
            model(**row, use_cache=False)
        docs, start = [], 0
        for n in LENGTHS:
            docs.append({"input_ids": row["input_ids"][0, start : start + n].tolist()})
            start += n
        batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_tensors="pt")(docs)
        batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
        with pytest.raises(PackedSequenceError, match=refusal):
            model(**batch, use_cache=False)
        # not packed: one document per row (explicit positions), a padded batch
        ids = row["input_ids"][:, :11]
        alone = model(input_ids=ids, use_cache=False).logits
        explicit = model(input_ids=ids, position_ids=torch.arange(11, device=device)[None], use_cache=False).logits
        assert torch.equal(alone, explicit)
        padded = torch.zeros(2, 11, dtype=torch.long, device=device)
        mask = torch.zeros_like(padded)
        padded[0], mask[0] = ids[0], 1
        padded[1, :6], mask[1, :6] = ids[0, :6], 1
        logits = model(input_ids=padded, attention_mask=mask, use_cache=False).logits
        rtol, atol = tolerances(device)
        torch.testing.assert_close(logits[0], alone[0].to(logits.dtype), rtol=rtol, atol=atol)


@pytest.mark.parametrize("key", ["qwen3"])
def test_binding_plan_names_the_attention(key, worlds, device):
    from opslot import binding_plan

    model = build(worlds(key), "opslot_varlen", device)
    assert "attention: opslot_varlen" in str(binding_plan(model))


def test_the_recipe_in_the_docs_runs_as_written():
    import os
    import re
    import subprocess
    import sys

    text = (e2e.ROOT / "docs" / "packing.md").read_text(encoding="utf-8")
    section = text.split("## Recipe", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    output = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=str(e2e.ROOT / "runtime"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code], cwd=e2e.ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == output


# -- opslot_sdpa under torch.compile: rows without documents get SDPA's is_causal, not a mask --------
def sdpa_calls(run) -> list:
    """(mask dims, is_causal) of every aten::scaled_dot_product_attention that `run()` makes, from the
    profiler (torch.compile with backend="eager" runs the traced graph's torch calls)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    return [
        (list(e.input_shapes[3]), e.concrete_inputs[5])
        for e in prof.events()
        if e.name == "aten::scaled_dot_product_attention"
    ]


def compiled_loss_and_grads(model, batch):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    model.zero_grad(set_to_none=True)
    out = {}
    calls = sdpa_calls(lambda: out.update(loss=compiled(**batch).loss))
    out["loss"].backward()
    torch._dynamo.reset()
    return out["loss"].detach(), grads_of(model), calls


@pytest.mark.parametrize("key", ["qwen3", "gemma3"])
def test_opslot_sdpa_under_compile_drops_the_mask_only_of_plain_causal_rows(key, worlds, device):
    """Transformers builds a full mask under torch.compile (the problem, asserted on `sdpa`);
    `opslot_sdpa` hands SDPA is_causal instead, for rows the caller gave no position ids, mask or
    cache, in full-attention layers only (gemma3's sliding layers keep theirs); loss and gradients
    equal the eager sdpa step. Packed position ids or a padding mask keep the mask."""
    if device.type != "cpu":
        pytest.skip("CPU test (fp32); the GPU timing is bench/compile_breaks.py's")
    world = worlds(key)
    ids = torch.randint(1, world.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    batch = dict(input_ids=ids, labels=ids)

    ref = build(world, "sdpa", device).train()
    ref.zero_grad(set_to_none=True)
    ref_loss = ref(**batch).loss
    ref_loss.backward()
    _, _, upstream_calls = compiled_loss_and_grads(ref, batch)
    assert upstream_calls and all(mask == [2, 1, 12, 12] and causal is False for mask, causal in upstream_calls)

    model = build(world, "opslot_sdpa", device).train()
    loss, grads, calls = compiled_loss_and_grads(model, batch)
    # the profiler records each layer's call per pass of the traced graph the same number of times
    per_layer = len(upstream_calls) // world.config.num_hidden_layers
    sliding = sum(1 for t in getattr(world.config, "layer_types", None) or [] if t == "sliding_attention")
    assert len(upstream_calls) == per_layer * world.config.num_hidden_layers
    assert sorted(calls) == sorted(
        [([], True)] * (world.config.num_hidden_layers - sliding) * per_layer
        + [([2, 1, 12, 12], False)] * sliding * per_layer
    )
    rtol, atol = tolerances(device)
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=rtol, atol=atol)
    want = grads_of(ref)
    assert grads.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(grads[name], want[name], rtol=rtol, atol=atol, msg=name)

    # a packed row and a padded batch keep Transformers' mask under compile (and give eager's loss)
    row = packed_row(world.config.vocab_size, device)
    pad = torch.ones_like(ids)
    pad[0, :4] = 0
    for extra in (dict(row, labels=row["input_ids"]), dict(batch, attention_mask=pad)):
        ref.zero_grad(set_to_none=True)
        want_loss = ref(**extra).loss.detach()
        got_loss, _, calls = compiled_loss_and_grads(model, extra)
        assert calls and all(mask != [] and causal is False for mask, causal in calls), calls
        torch.testing.assert_close(got_loss, want_loss, rtol=rtol, atol=atol)
