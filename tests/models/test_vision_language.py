"""The vision-language models (issue 31) behave like upstream where their users touch them.

For every model of tests/models/vision_language.py (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, and
the Thinkers of Qwen2.5-Omni and Qwen3-Omni-MoE, which also take audio; the
same tiny composite configs and multimodal inputs as tests/models/e2e.py, which checks one training
step against upstream: eager bit-equal logits, loss and every gradient, the `torch` kernels within
tolerance, every slot ran), the GPU spec is generated into a temporary folder and its processor-facing
`*ForConditionalGeneration` is compared with upstream's, fp32, same weights:

- the towers: the model builds the generated text model, vision tower (and audio tower), never
  Transformers' own; run alone, the vision tower dispatches exactly the slots the spec guards in it
  (Qwen2.5-VL, Qwen2.5-Omni: its RMSNorms and gated MLPs, counted per call; the vision RoPE where a
  spec guards it) and no other (the rest
  stays upstream), the audio tower none; their output is upstream's bit for bit on `eager`, close on
  the `torch` kernels;
- inputs the e2e step does not use: two images in one batch, text only (no pixel values), and the 3-D
  mrope position ids given explicitly (they are not taken for packed documents: their temporal row is
  constant inside an image): eager logits and loss equal upstream's, the kernels' loss close;
- greedy `generate()` with an image prompt (two rows, one left-padded), 4 new tokens, with and without
  the KV cache: the same tokens as upstream on `eager`, and on the `torch` kernels;
- checkpoints: what upstream `save_pretrained` writes (for Qwen2-VL and Qwen2.5-VL the original Hub
  layout, `model.layers.*` and `visual.*` at the top: Transformers' conversion mapping renames it on
  load) loads strictly into the generated class (no missing, unexpected or mismatched key, weights
  equal), the generated model saves the same tensors under the same names, and upstream loads that
  back; the other layout these checkpoints come in (hf_checkpoints.vl_hub_layout: Qwen2-VL /
  Qwen2.5-VL the module's own parameter names, Qwen3-VL-MoE the Hub's transposed experts) loads
  the same way (upstream too: it checks the writer); a checkpoint that lacks a tensor or has one too
  many is an error; `AutoModelForImageTextToText` gives the generated class once registered; the NPU
  siblings load the same checkpoints;
- packed rows (opslot.packing): two multimodal documents (each text + an image + text; for an omni
  model the first also holds an audio) in one row,
  with the [4, 1, seq] position ids whose first row restarts per document, give each document's logits
  and the summed loss of the documents run alone (`opslot_varlen`, opslot's kernels; fp32 on the CPU
  with tolerances only summation order meets, bf16 on a GPU); a text-only packed row (2-D position
  ids) likewise; a packed row with an attention mask is refused.

Run: `python -m pytest tests/models/test_vision_language.py [--device cuda] [-k qwen3_vl]`
(ctest `real_models_vision_language`; on a GPU the kernels are opslot's `cuda` ones where they exist).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import types
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
import transformers
from packaging.version import Version

import e2e  # tests/models/e2e.py (conftest puts it on sys.path)
import hf_checkpoints as ckpt
import vision_language as vl

CASES = {c.key: c for c in vl.VL_CASES}
KEYS = list(CASES)
GEN_TOKENS = 4


@dataclasses.dataclass
class World:
    case: Any
    config: Any
    module: types.ModuleType
    slots: Dict[str, Any]
    gen_cls: type
    up_cls: type
    upstream: torch.nn.Module  # random weights (CPU, fp32)
    state: Dict[str, torch.Tensor]
    up_dir: str  # upstream save_pretrained
    tmp: Path


@pytest.fixture(scope="session")
def worlds(patchgen, source_root, tmp_path_factory):
    from opslot import module_slots

    cache: Dict[str, World] = {}

    def get(key: str) -> World:
        if key not in cache:
            case = CASES[key]
            tmp = tmp_path_factory.mktemp(f"vl_{key}")
            gen_py, _ = e2e.generate(
                patchgen, case.spec("gpu"), source_root, tmp / "generated", case.output_name("gpu")
            )
            module = e2e.import_generated(gen_py)
            config = vl.make_config(case)
            up_cls = getattr(importlib.import_module(case.upstream_module), case.causal_lm)
            torch.manual_seed(0)
            upstream = up_cls(copy.deepcopy(config))
            e2e.randomize_(upstream, case.offset_norm)
            state = {k: v.detach().clone() for k, v in upstream.state_dict().items()}
            up_dir = str(tmp / "upstream_saved")
            upstream.save_pretrained(up_dir)
            cache[key] = World(
                case, config, module, module_slots(module), getattr(module, case.causal_lm), up_cls, upstream, state,
                up_dir, tmp,
            )  # fmt: skip
        return cache[key]

    return get


def kernel_impl(device: torch.device) -> str:
    """opslot's kernels of the device: `cuda` on a GPU, else `torch`."""
    return "cuda" if device.type == "cuda" else "torch"


def varlen(device: torch.device) -> Dict[str, Any]:
    """Packed rows: `opslot_varlen` attention, fp32 on the CPU (only the summation order differs from the
    documents run alone: tight tolerances), bf16 on a GPU (PyTorch's FlashAttention takes no fp32): the
    tolerances of tests/models/test_packing.py."""
    if device.type == "cuda":
        return dict(dtype=torch.bfloat16, rtol=5e-2, atol=5e-2)
    return dict(dtype=torch.float32, rtol=1e-5, atol=1e-5)


def ops_of(w: World, impl: str) -> Dict[str, str]:
    """Every slot on `impl` (for `cuda`, `torch` where an op has no cuda kernel)."""
    from opslot.registry import KERNEL_REGISTRY

    ops = e2e.ops_for(w.slots, impl)
    if impl == "cuda":
        available = KERNEL_REGISTRY.list_available(include_unsupported=True)
        for slot in w.slots.values():
            if "cuda" not in available.get((slot.op, slot.variant), ()):
                ops[f"{slot.op}_implementation"] = "fused_torch" if slot.op == "moe" else "torch"
    return ops


def build(w: World, impl: str, device: torch.device, **ops):
    """The generated head with every slot on `impl` ("eager", "torch", "cuda", or e2e's counted kernel);
    the other ops settings in `ops`. No proof-of-dispatch error: the tests here run parts of the model
    (the vision tower alone, generation without a backward) and assert on what ran themselves."""
    from opslot import build_model

    model = build_model(
        copy.deepcopy(w.config),
        ops=dict(ops_of(w, impl), **ops),
        module=w.module,
        model_class=w.case.causal_lm,
        allow_unreached=True,
    )
    model.load_state_dict(w.state, strict=True)
    return model.to(device)


def reference(w: World, device: torch.device):
    return copy.deepcopy(w.upstream).to(device)


def close(got, want, what):
    tol = e2e.ATOL + e2e.RTOL * float(want.abs().max())
    err = e2e.max_abs_diff(got, want)
    assert err <= tol, f"{what}: max abs err {err:.3g} > {tol:.3g}"


# -- the towers -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", KEYS)
def test_the_multimodal_model_builds_the_generated_towers(key, worlds):
    """Upstream's Qwen3-VL builds both towers with AutoModel.from_config (Transformers' own classes,
    without a dispatch point); the spec makes them the generated module's, as the Qwen2-VL family's are."""
    w = worlds(key)
    model = build(w, "eager", torch.device("cpu"))
    generated = type(model).__module__  # build_model's private copy of the generated module
    assert not generated.startswith("transformers.")
    mine, theirs = vl.towers(model), vl.towers(w.upstream)
    assert sorted(mine) == sorted(theirs) == sorted(["language", "visual"] + (["audio"] if w.case.audio else []))
    assert {name: type(t).__module__ for name, t in mine.items()} == dict.fromkeys(mine, generated)
    assert {name: type(t).__name__ for name, t in mine.items()} == {n: type(t).__name__ for n, t in theirs.items()}
    assert type(mine["language"]).__name__ == w.case.causal_lm.replace("ForConditionalGeneration", "TextModel")


def image_features(model, inputs):
    out = model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True)
    return torch.cat(out.pooler_output), out.last_hidden_state


def audio_features(model, inputs):
    out = model.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"], return_dict=True)
    return (out.last_hidden_state,)


@pytest.mark.parametrize("key", KEYS)
def test_the_towers_dispatch_exactly_their_slots(key, worlds, device):
    """The vision tower alone on the image of the e2e inputs (`get_image_features`), and an omni model's
    audio tower alone on its audio (`get_audio_features`): with every slot on the counted `torch`
    kernels, the calls are exactly those of the slots the spec guards in the tower (one per call of a
    guarded module: Qwen2.5-VL's and Qwen2.5-Omni's RMSNorms and gated MLPs; the vision RoPE once per
    attention call where a spec guards it; none in the audio tower, which stays upstream), and the
    output is close to upstream's; with every slot on `eager`, it is upstream's bit for bit."""
    w = worlds(key)
    e2e.register_counted_kernels()
    inputs = vl.make_inputs(w.case, w.config, device)
    runs = [("visual", image_features)] + ([("audio", audio_features)] if w.case.audio else [])
    up, eager, counted = reference(w, device), build(w, "eager", device), build(w, e2e.COUNTED_IMPL, device)
    calls = {}
    for tower, run in runs:
        expected: Dict[Any, int] = {}
        if tower == "visual":
            modules = [type(m).__name__ for m in vl.towers(counted)["visual"].modules()]
            for op, variant, cls in w.case.vision_ops:
                expected[(op, variant)] = modules.count(cls)
            for slot in w.slots.values():  # the vision RoPE, where a spec guards it: once per attention call
                if slot.op == "rotary_pos_emb_vision":
                    expected[(slot.op, slot.variant)] = sum(m.endswith("VisionAttention") for m in modules)
        with torch.no_grad():
            want, same = run(up, inputs), run(eager, inputs)
            e2e.CALLS.clear()
            got = run(counted, inputs)
        assert dict(e2e.CALLS) == expected, tower
        calls[tower] = expected
        for a, b in zip(same, want):
            assert torch.equal(a, b), tower
        close(got[0], want[0], f"{tower} tower output on the torch kernels")
    if w.case.vision_ops:  # 2 blocks x (norm1, norm2) + the merger's ln_q; 2 blocks x the MLP
        assert [calls["visual"][op[:2]] for op in w.case.vision_ops] == [5, 2]
    assert calls.get("audio", {}) == {}


# -- inputs the e2e step does not use ------------------------------------------------------------------------
def two_images(w: World, device):
    return vl.make_inputs(w.case, w.config, device, video=False)


def text_only(w: World, device):
    inputs = vl.make_inputs(w.case, w.config, device)
    ids = inputs["input_ids"].clone()
    ids[ids >= vl.TEXT_TOKENS] = 7  # placeholders and their delimiters become text
    labels = ids.masked_fill(inputs["attention_mask"] == 0, -100)
    return dict(input_ids=ids, attention_mask=inputs["attention_mask"], labels=labels)


def explicit_mrope_positions(w: World, device):
    """The e2e inputs with the 3-D position ids given explicitly ([3, batch, seq], what get_rope_index
    computes): their temporal row is constant inside an image and jumps after it. Taken for document
    boundaries they would mask labels after every image (and refuse the attention mask): they are not."""
    inputs = vl.make_inputs(w.case, w.config, device)
    positions = vl.rope_index(w.case, reference(w, device), inputs)
    assert positions.shape[0] == 3 and bool((positions[0, 0, 1:] == positions[0, 0, :-1]).any())
    return dict(inputs, position_ids=positions)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("inputs", [two_images, text_only, explicit_mrope_positions])
def test_more_inputs_equal_upstream(key, inputs, worlds, device):
    w = worlds(key)
    batch = inputs(w, device)
    kwargs = e2e.forward_kwargs(batch, w.case.moe)
    with torch.no_grad():
        want = reference(w, device)(**kwargs)
        got = build(w, "eager", device)(**kwargs)
        # opslot_varlen serves padded batches too (rows are documents); fp32 on a GPU: sdpa
        attn = "opslot_varlen" if device.type == "cpu" else "sdpa"
        kernels = build(w, kernel_impl(device), device, attn_implementation=attn)(**kwargs)
    assert torch.equal(got.logits, want.logits), e2e.max_abs_diff(got.logits, want.logits)
    assert torch.equal(got.loss, want.loss), (float(got.loss), float(want.loss))
    close(kernels.loss, want.loss, f"loss on the kernels with {attn}")


# -- generation --------------------------------------------------------------------------------------------
def greedy(model, prompt, use_cache: bool) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            **prompt,
            max_new_tokens=GEN_TOKENS,
            do_sample=False,
            use_cache=use_cache,
            pad_token_id=0,
            eos_token_id=None,
        )


@pytest.mark.parametrize("key", KEYS)
def test_greedy_generation_with_an_image_equals_upstream(key, worlds, device):
    w = worlds(key)
    prompt = vl.image_prompt(w.case, w.config, device)
    up = reference(w, device).eval()
    eager = build(w, "eager", device).eval()
    kernels = build(w, kernel_impl(device), device).eval()
    for use_cache in (True, False):
        expected = greedy(up, prompt, use_cache)
        assert expected.shape == (2, prompt["input_ids"].shape[1] + GEN_TOKENS)
        assert torch.equal(greedy(eager, prompt, use_cache), expected), f"eager tokens differ (use_cache={use_cache})"
        assert torch.equal(greedy(kernels, prompt, use_cache), expected), (
            f"kernel tokens differ (use_cache={use_cache})"
        )
    # the image decides: the same prompt with other pixels generates other tokens (the test can fail)
    other = dict(prompt, pixel_values=torch.flip(prompt["pixel_values"], dims=[0]))
    assert not torch.equal(greedy(up, other, True), greedy(up, prompt, True))


# -- checkpoints ---------------------------------------------------------------------------------------------
def assert_clean(info, what):
    bad = {k: sorted(map(str, info[k])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info[k]}
    assert not bad and not info["error_msgs"], f"{what}: {bad} {info['error_msgs']}"


def assert_state_equal(model, expected: Dict[str, torch.Tensor], what):
    got = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    assert sorted(got) == sorted(expected), f"{what}: keys differ: {sorted(set(got) ^ set(expected))}"
    differ = [k for k in expected if not torch.equal(got[k], expected[k])]
    assert not differ, f"{what}: weights differ from upstream: {differ}"


@pytest.mark.parametrize("key", KEYS)
def test_checkpoints_load_and_save_like_upstream(key, worlds):
    w = worlds(key)
    assert w.gen_cls.is_custom_code() is False and w.gen_cls.__module__ == w.module.__name__
    sources = {"upstream save_pretrained": w.up_dir}
    if key in ckpt.VL_HUB_LAYOUT:
        saved = ckpt.read_safetensors(w.up_dir)
        hub = ckpt.vl_hub_layout(key, w.state)
        assert sorted(hub) != sorted(saved) or any(not torch.equal(hub[k], saved[k]) for k in hub), (
            "the other layout must differ from what save_pretrained writes, else it tests nothing"
        )
        sources["other layout"] = ckpt.write_checkpoint(str(w.tmp / "other_layout"), w.config, hub)
    for label, source in sources.items():
        up, up_info = w.up_cls.from_pretrained(source, output_loading_info=True)
        others = ckpt.VL_OTHER_PARTS.get(key, ()) if label == "other layout" else ()
        if others:  # before 5.23 upstream lists the other parts' tensors as unexpected; the spec ignores them
            listed = {k for k in ckpt.read_safetensors(source) if k.startswith(others)}
            old = Version(transformers.__version__) < Version("5.23")
            assert listed and set(up_info["unexpected_keys"]) == (listed if old else set())
            up_info = dict(up_info, unexpected_keys=set())
        assert_clean(up_info, f"upstream from {label}")  # the checkpoint itself is right
        assert_state_equal(up, w.state, f"upstream from {label}")
        gen, info = w.gen_cls.from_pretrained(source, output_loading_info=True)
        assert type(gen) is w.gen_cls
        assert_clean(info, f"generated from {label}")
        assert_state_equal(gen, w.state, f"generated from {label}")

        up_out, gen_out = str(w.tmp / f"resave_up_{label[:3]}"), str(w.tmp / f"resave_gen_{label[:3]}")
        up.save_pretrained(up_out)
        gen.save_pretrained(gen_out)
        written_up, written_gen = ckpt.read_safetensors(up_out), ckpt.read_safetensors(gen_out)
        assert sorted(written_gen) == sorted(written_up), sorted(set(written_gen) ^ set(written_up))
        assert all(torch.equal(written_gen[k], written_up[k]) for k in written_up)
        back, back_info = w.up_cls.from_pretrained(gen_out, output_loading_info=True)
        assert_clean(back_info, f"upstream from the generated model's save ({label})")
        assert_state_equal(back, w.state, f"upstream from the generated model's save ({label})")


@pytest.mark.parametrize("key", KEYS)
def test_a_checkpoint_missing_a_tensor_is_an_error(key, worlds):
    from opslot.hf import PartialLoadError

    w = worlds(key)
    saved = ckpt.read_safetensors(w.up_dir)
    # the language model's final norm: `model.norm.weight` in the Qwen2-VL family's saved (Hub) layout and
    # in Qwen2.5-Omni's Thinker before 5.23 (its text model is `model` there)
    dropped = "model.norm.weight" if "model.norm.weight" in saved else "model.language_model.norm.weight"
    (missing,) = [k for k in ("model.norm.weight", "model.language_model.norm.weight") if k in w.state]
    assert dropped in saved
    path = ckpt.write_checkpoint(str(w.tmp / "missing"), w.config, {k: v for k, v in saved.items() if k != dropped})
    with pytest.raises(PartialLoadError) as exc:
        w.gen_cls.from_pretrained(path)
    assert exc.value.missing == [missing] and exc.value.unexpected == [] and missing in str(exc.value)
    extra = "model.visual.blocks.0.extra_proj.weight"
    path = ckpt.write_checkpoint(str(w.tmp / "extra"), w.config, dict(saved, **{extra: torch.zeros(2, 2)}))
    with pytest.raises(PartialLoadError) as exc:
        w.gen_cls.from_pretrained(path)
    assert exc.value.unexpected == [extra] and exc.value.missing == [] and extra in str(exc.value)


@pytest.mark.parametrize("key", KEYS)
def test_auto_model_for_image_text_to_text_produces_the_generated_class(key, worlds):
    from transformers import AutoModelForImageTextToText

    from opslot.hf import register_auto_classes

    w = worlds(key)
    with register_auto_classes(w.module) as reg:
        assert reg.classes["AutoModelForImageTextToText"][type(w.config).__name__] is w.gen_cls
        model = AutoModelForImageTextToText.from_pretrained(w.up_dir, dtype=torch.float32)
        assert type(model) is w.gen_cls
        assert_state_equal(model, w.state, "AutoModelForImageTextToText")
    assert type(AutoModelForImageTextToText.from_pretrained(w.up_dir)) is w.up_cls  # unregistered again


@pytest.mark.parametrize("key", [k for k, c in CASES.items() if c.npu_removes is not None])
def test_npu_sibling_loads_checkpoints_like_upstream(key, worlds, patchgen, source_root):
    w = worlds(key)
    npu_py, _ = e2e.generate(
        patchgen, w.case.spec("npu"), source_root, w.tmp / "generated_npu", w.case.output_name("npu")
    )
    cls = getattr(e2e.import_generated(npu_py), w.case.causal_lm)
    assert cls.is_custom_code() is False
    model, info = cls.from_pretrained(w.up_dir, output_loading_info=True)
    assert_clean(info, "NPU sibling")
    assert_state_equal(model, w.state, "NPU sibling")


# -- packed rows -----------------------------------------------------------------------------------------
#: Inputs whose first dimension counts images or audios (concatenated along it when packing).
PER_ITEM = ("pixel_values", "image_grid_thw", "input_features", "feature_attention_mask")


def targets(labels: torch.Tensor) -> int:
    """The number of label positions the causal-LM loss trains (shifted: a row's first label never)."""
    return int((labels[:, 1:] != -100).sum())


def _logits(model, batch):
    """The logits of `batch` without its labels: with labels, a fused loss kernel (the `cuda` default of
    cross_entropy_loss) returns no logits (docs/ops.md)."""
    return model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits


@pytest.mark.parametrize("key", KEYS)
def test_packed_multimodal_documents_equal_the_documents_alone(key, worlds, device):
    """Two documents (text + an image + text) in one row: position ids [4, 1, seq], the text row
    restarting per document (what upstream's text model reads packed masks from), the 3-D rows each
    document's own get_rope_index; the labels are the ids (vision placeholders -100), not masked at the
    boundary: the head masks the second document's first token."""
    w = worlds(key)
    tol = varlen(device)
    model = build(w, kernel_impl(device), device, attn_implementation="opslot_varlen").to(tol["dtype"]).eval()
    audio = [("audio", 0), ("text", 2)] if w.case.audio else []
    docs = [
        vl.document(w.case, w.config, [("text", 3), ("image", 0), ("text", 5), *audio], device, 31),
        vl.document(w.case, w.config, [("text", 2), ("image", 0), ("text", 2)], device, 41),
    ]
    for doc in docs:
        positions = vl.rope_index(w.case, model, doc)  # (Qwen3-Omni's needs the attention mask)
        del doc["attention_mask"]  # one document per row: nothing to mask
        text = torch.arange(doc["input_ids"].shape[1], device=device)[None, None]
        doc["position_ids"] = torch.cat([text, positions])
        for k in ("pixel_values", "input_features"):
            if k in doc:
                doc[k] = doc[k].to(tol["dtype"])
    # the audio is the first document's only: its features pack as they are
    packed = {k: torch.cat([d[k] for d in docs if k in d], dim=0 if k in PER_ITEM else -1) for k in docs[0]}
    counts = [targets(d["labels"]) for d in docs]
    # the second document's first label is a target of the packed row unless the head masks it
    assert targets(packed["labels"]) == sum(counts) + 1
    with torch.no_grad():
        out, out_logits = model(**packed, use_cache=False), _logits(model, packed)
        start, alone = 0, torch.zeros((), device=device)
        for doc, count in zip(docs, counts):
            one = model(**doc, use_cache=False)
            n = doc["input_ids"].shape[1]
            doc_logits = out_logits[:, start : start + n].float()
            torch.testing.assert_close(doc_logits, _logits(model, doc).float(), rtol=tol["rtol"], atol=tol["atol"])
            alone, start = alone + one.loss.float() * count, start + n
    # fp32: the summation order is all that differs (a boundary label left in moves the mean by about
    # |its loss - the mean| / the number of targets, far above the tolerance)
    torch.testing.assert_close(out.loss.float() * sum(counts), alone, rtol=tol["rtol"], atol=tol["atol"])


@pytest.mark.parametrize("key", KEYS)
def test_packed_text_row_equals_the_documents_alone_and_a_masked_one_is_refused(key, worlds, device):
    from opslot.packing import PackedSequenceError

    w = worlds(key)
    tol = varlen(device)
    model = build(w, kernel_impl(device), device, attn_implementation="opslot_varlen").to(tol["dtype"]).eval()
    lengths = [7, 1, 5]
    ids = torch.randint(1, vl.TEXT_TOKENS, (1, sum(lengths)), generator=torch.Generator().manual_seed(3)).to(device)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False)
        out_logits = _logits(model, {"input_ids": ids, "position_ids": positions})
        packed = out.loss.float() * sum(n - 1 for n in lengths)
        alone, start = torch.zeros((), device=device), 0
        for n in lengths:
            doc = ids[:, start : start + n]
            one = model(input_ids=doc, labels=doc if n > 1 else None, use_cache=False)
            doc_logits = out_logits[:, start : start + n].float()
            torch.testing.assert_close(
                doc_logits, _logits(model, {"input_ids": doc}).float(), rtol=tol["rtol"], atol=tol["atol"]
            )
            if n > 1:
                alone = alone + one.loss.float() * (n - 1)
            start += n
        torch.testing.assert_close(packed, alone, rtol=tol["rtol"], atol=tol["atol"])
        with pytest.raises(PackedSequenceError, match="attention_mask"):
            model(input_ids=ids, position_ids=positions, attention_mask=torch.ones_like(ids), use_cache=False)
