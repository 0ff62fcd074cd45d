"""Generated real models behave like upstream under what Hugging Face users do (issue #11).

For every real model of tests/models/e2e.py (same tiny configs and weights), the spec is generated
with patchgen into a temporary folder and its `*ForCausalLM` is compared with upstream's, fp32:

- checkpoints: `from_pretrained` of what upstream `save_pretrained` writes, and of the original Hub
  layout (hf_checkpoints.py: per-expert MoE weights, Qwen3.5's `model.language_model.` prefix, ...),
  loads with no missing/unexpected key and weights equal to upstream's; `save_pretrained` of the
  generated model writes the same tensors under the same names as upstream, and upstream loads them;
- a checkpoint that would load partially (a key missing, one too many, an expert missing) is an
  error naming the keys (`opslot.hf.PartialLoadError`); `strict=False` gives Transformers' behaviour;
- logits after `from_pretrained` equal, and greedy `generate` gives equal tokens with and without
  the KV cache, with `attn_implementation` eager and sdpa;
- a training step with gradient checkpointing: equal loss, gradients and updated weights;
- `AutoModelForCausalLM` produces the generated class after `opslot.hf.register_auto_classes`;
- `opslot.hf.from_pretrained` with every slot on opslot's `torch` kernels: every slot dispatches,
  logits/loss/gradients within the e2e tolerance, greedy tokens equal.

Run: `python -m pytest tests/models/test_hf_parity.py [--device cuda] [--patchgen BIN] [-k qwen3_moe]`
(ctest: `hf_parity`). Equality is `torch.equal` for the eager paths: the generated code is
upstream's, so on a deterministic device it computes the same bits.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

import e2e  # tests/models/e2e.py: the cases, configs and weights (conftest puts it on sys.path)
import hf_checkpoints as ckpt

CASES = {c.key: c for c in e2e.CASES}
GEN_TOKENS = 6


@dataclasses.dataclass
class World:
    """One model: the generated module, both classes, the upstream weights and checkpoints on disk."""

    case: Any
    config: Any
    module: types.ModuleType
    gen_cls: type
    up_cls: type
    state: Dict[str, torch.Tensor]  # upstream state dict (CPU)
    up_dir: str  # upstream save_pretrained
    hub_dir: str  # original Hub layout
    tmp: Path


@pytest.fixture(scope="session")
def worlds(patchgen, source_root, tmp_path_factory):
    cache: Dict[str, World] = {}

    def get(key: str) -> World:
        if key not in cache:
            case = CASES[key]
            tmp = tmp_path_factory.mktemp(key)
            gen_py, _ = e2e.generate(
                patchgen, case.spec("gpu"), source_root, tmp / "generated", case.output_name("gpu")
            )
            module = e2e.import_generated(gen_py)
            config = e2e.make_config(case)
            up_cls = getattr(importlib.import_module(case.upstream_module), case.causal_lm)
            torch.manual_seed(0)
            upstream = up_cls(config)
            e2e.randomize_(upstream, case.offset_norm)
            state = {k: v.detach().clone() for k, v in upstream.state_dict().items()}
            up_dir = str(tmp / "upstream_saved")
            upstream.save_pretrained(up_dir)
            hub_dir = ckpt.write_hub_layout(str(tmp / "hub_layout"), key, upstream.config, state)
            cache[key] = World(
                case, config, module, getattr(module, case.causal_lm), up_cls, state, up_dir, hub_dir, tmp
            )
        return cache[key]

    return get


def load(cls, path, device, **kwargs):
    return cls.from_pretrained(path, dtype=torch.float32, **kwargs).to(device)


def assert_clean(info, what):
    bad = {k: sorted(map(str, info[k])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info[k]}
    assert not bad and not info["error_msgs"], f"{what}: {bad} {info['error_msgs']}"


def assert_state_equal(model, expected: Dict[str, torch.Tensor], what):
    got = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    assert sorted(got) == sorted(expected), f"{what}: keys differ: {sorted(set(got) ^ set(expected))}"
    differ = [k for k in expected if not torch.equal(got[k], expected[k])]
    assert not differ, f"{what}: weights differ from upstream: {differ}"


def prompt(vocab: int, device) -> Dict[str, torch.Tensor]:
    """Two left-padded prompts (decoder-only generation pads on the left)."""
    gen = torch.Generator().manual_seed(99)
    ids = torch.randint(1, vocab, (2, 7), generator=gen)
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def greedy(model, inputs, use_cache: bool) -> torch.Tensor:
    # The MoE configs of e2e.py set output_router_logits=True (to reach the load-balancing loss); upstream
    # generate with the KV cache then fails in load_balancing_loss_func (router logits of the new
    # token against the full attention mask), so generation turns it off, as Hub configs do.
    extra = {"output_router_logits": False} if getattr(model.config, "output_router_logits", False) else {}
    with torch.no_grad():
        return model.generate(
            **inputs,
            max_new_tokens=GEN_TOKENS,
            do_sample=False,
            use_cache=use_cache,
            pad_token_id=0,
            eos_token_id=None,
            **extra,
        )


PER_MODEL = pytest.mark.parametrize("key", list(CASES))


# -- checkpoints ---------------------------------------------------------------------------------------
@PER_MODEL
def test_checkpoints_load_and_save_like_upstream(key, worlds, device):
    w = worlds(key)
    assert w.gen_cls.is_custom_code() is False and w.gen_cls.__module__ == w.module.__name__
    for source in (w.up_dir, w.hub_dir):
        label = "upstream save_pretrained" if source == w.up_dir else "Hub layout"
        up, up_info = w.up_cls.from_pretrained(source, output_loading_info=True)
        assert_clean(up_info, f"upstream from {label}")  # the checkpoint itself is right
        gen, info = w.gen_cls.from_pretrained(source, output_loading_info=True)
        assert type(gen) is w.gen_cls
        assert_clean(info, f"generated from {label}")
        assert_state_equal(gen, w.state, f"generated from {label}")

        # save_pretrained writes what upstream writes, and upstream loads it back
        up_out, gen_out = str(w.tmp / f"resave_up_{label[:3]}"), str(w.tmp / f"resave_gen_{label[:3]}")
        up.save_pretrained(up_out)
        gen.save_pretrained(gen_out)
        written_up, written_gen = ckpt.read_safetensors(up_out), ckpt.read_safetensors(gen_out)
        assert sorted(written_gen) == sorted(written_up), (
            f"saved keys differ: {sorted(set(written_gen) ^ set(written_up))}"
        )
        assert all(torch.equal(written_gen[k], written_up[k]) for k in written_up)
        back, back_info = w.up_cls.from_pretrained(gen_out, output_loading_info=True)
        assert_clean(back_info, f"upstream from the generated model's save ({label})")
        assert_state_equal(back, w.state, f"upstream from the generated model's save ({label})")


@pytest.mark.parametrize("key", [k for k, c in CASES.items() if c.npu_removes is not None])
def test_npu_sibling_loads_checkpoints_like_upstream(key, worlds, patchgen, source_root):
    """The NPU specs `extends` the GPU ones: they inherit the checkpoint methods."""
    w = worlds(key)
    npu_py, _ = e2e.generate(
        patchgen, w.case.spec("npu"), source_root, w.tmp / "generated_npu", w.case.output_name("npu")
    )
    cls = getattr(e2e.import_generated(npu_py), w.case.causal_lm)
    assert cls.is_custom_code() is False
    model, info = cls.from_pretrained(w.hub_dir, output_loading_info=True)
    assert_clean(info, "NPU sibling from the Hub layout")
    assert_state_equal(model, w.state, "NPU sibling from the Hub layout")


@PER_MODEL
def test_partial_load_is_an_error(key, worlds):
    from opslot.hf import PartialLoadError

    w = worlds(key)
    saved = ckpt.read_safetensors(w.up_dir)
    dropped = "model.norm.weight"
    assert dropped in saved
    missing_dir = ckpt.write_checkpoint(
        str(w.tmp / "missing"), w.config, {k: v for k, v in saved.items() if k != dropped}
    )
    with pytest.raises(PartialLoadError) as exc:
        w.gen_cls.from_pretrained(missing_dir)
    assert exc.value.missing == [dropped] and exc.value.unexpected == [] and dropped in str(exc.value)

    extra = "model.layers.0.mlp.extra_proj.weight"
    extra_dir = ckpt.write_checkpoint(str(w.tmp / "extra"), w.config, dict(saved, **{extra: torch.zeros(2, 2)}))
    with pytest.raises(PartialLoadError) as exc:
        w.gen_cls.from_pretrained(extra_dir)
    assert exc.value.unexpected == [extra] and exc.value.missing == [] and extra in str(exc.value)

    # strict=False: Transformers' own behaviour (a logged report), and the info says what happened
    model, info = w.gen_cls.from_pretrained(missing_dir, strict=False, output_loading_info=True)
    assert info["missing_keys"] == {dropped} and type(model) is w.gen_cls

    if key in ckpt.EXPERTS_SPLIT:  # one expert's tensor missing from a Hub-layout checkpoint
        hub = ckpt.read_safetensors(w.hub_dir)
        gone = sorted(k for k in hub if ".mlp.experts.3.up_proj." in k)[0]
        expert_dir = ckpt.write_checkpoint(
            str(w.tmp / "expert_missing"), w.config, {k: v for k, v in hub.items() if k != gone}
        )
        with pytest.raises(RuntimeError) as exc:  # Transformers refuses it (conversion error); we add the keys
            w.gen_cls.from_pretrained(expert_dir)
        fused = re.sub(r"^model\.language_model\.", "model.", gone.rsplit(".", 3)[0]) + ".gate_up_proj"
        assert fused in str(exc.value), str(exc.value)


# -- behaviour ------------------------------------------------------------------------------------------
@PER_MODEL
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_logits_and_greedy_generation_equal(key, attn, worlds, device):
    w = worlds(key)
    try:
        up = load(w.up_cls, w.up_dir, device, attn_implementation=attn).eval()
    except ValueError as refused:  # e.g. GPT-OSS (attention sinks) has no sdpa: the same refusal
        with pytest.raises(ValueError) as exc:
            load(w.gen_cls, w.up_dir, device, attn_implementation=attn)
        assert str(exc.value) == str(refused)
        return
    gen = load(w.gen_cls, w.up_dir, device, attn_implementation=attn).eval()
    assert gen.config._attn_implementation == up.config._attn_implementation == attn
    inputs = e2e.make_inputs(w.config.vocab_size, device)
    with torch.no_grad():
        ref = up(**e2e.forward_kwargs(inputs, w.case.moe))
        out = gen(**e2e.forward_kwargs(inputs, w.case.moe))
    assert torch.equal(out.logits, ref.logits), f"logits differ by {e2e.max_abs_diff(out.logits, ref.logits):.3g}"
    assert torch.equal(out.loss, ref.loss)
    p = prompt(w.config.vocab_size, device)
    for use_cache in (True, False):
        expected = greedy(up, p, use_cache)
        assert expected.shape[1] == p["input_ids"].shape[1] + GEN_TOKENS
        assert torch.equal(greedy(gen, p, use_cache), expected), f"greedy tokens differ (use_cache={use_cache})"


@PER_MODEL
def test_training_step_with_gradient_checkpointing_equal(key, worlds, device):
    w = worlds(key)
    inputs = e2e.make_inputs(w.config.vocab_size, device)
    results = []
    for cls in (w.up_cls, w.gen_cls):
        model = load(cls, w.up_dir, device, attn_implementation="eager")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        assert model.is_gradient_checkpointing
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        out = model(**e2e.forward_kwargs(inputs, w.case.moe))
        out.loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        with torch.no_grad():
            after = model(**e2e.forward_kwargs(inputs, w.case.moe)).loss
        results.append((out.loss.detach(), grads, {n: p.detach().clone() for n, p in model.named_parameters()}, after))
    (l0, g0, p0, a0), (l1, g1, p1, a1) = results
    assert torch.equal(l1, l0)
    assert sorted(g1) == sorted(g0) and len(g0) > 0
    assert not [n for n in g0 if not torch.equal(g1[n], g0[n])], "gradients differ"
    assert not [n for n in p0 if not torch.equal(p1[n], p0[n])], "weights after the step differ"
    assert torch.equal(a1, a0) and torch.isfinite(a0)


@PER_MODEL
def test_auto_model_for_causal_lm_produces_the_generated_class(key, worlds, device):
    from transformers import AutoModelForCausalLM

    from opslot.hf import register_auto_classes

    w = worlds(key)
    with register_auto_classes(w.module) as reg:
        assert reg.classes["AutoModelForCausalLM"][type(w.config).__name__] is w.gen_cls
        model = AutoModelForCausalLM.from_pretrained(w.hub_dir, dtype=torch.float32).to(device).eval()
        assert type(model) is w.gen_cls
        assert_state_equal(model, w.state, "AutoModelForCausalLM from the Hub layout")
    assert type(AutoModelForCausalLM.from_pretrained(w.up_dir)) is w.up_cls  # unregistered again


@PER_MODEL
def test_torch_kernels_close_to_upstream(key, worlds, device):
    import opslot.hf

    w = worlds(key)
    e2e.register_counted_kernels()
    slots = e2e.guarded_slots(w.module)  # a slot the spec guards only for other releases is not bound
    kwargs = dict(attn_implementation="eager")
    if hasattr(w.config, "_experts_implementation") and w.config._experts_implementation:
        kwargs["experts_implementation"] = "eager"  # the moe guards live in the eager experts forward
    up = load(w.up_cls, w.up_dir, device, **kwargs).train()
    model = (
        opslot.hf.from_pretrained(
            w.up_dir, w.module, ops=e2e.ops_for(slots, e2e.COUNTED_IMPL), dtype=torch.float32, **kwargs
        )
        .to(device)
        .train()
    )
    assert type(model).__module__ != w.module.__name__, "kernels must be bound in a private copy"
    assert all(s.impl == "eager" for s in slots.values()), "the shared module must stay unbound"
    assert_state_equal(model, w.state, "opslot.hf.from_pretrained")

    inputs = e2e.make_inputs(w.config.vocab_size, device)
    e2e.CALLS.clear()
    ref_logits, ref_loss, ref_grads = e2e.run_model(up, inputs, w.case.moe)
    logits, loss, grads = e2e.run_model(model, inputs, w.case.moe)
    # every slot a *ForCausalLM can run (not the sequence-classification loss: e2e.py's stage 4c)
    fired = {
        f"{s.op}/{s.variant}": e2e.CALLS.get((s.op, s.variant), 0) for s in e2e.causal_lm_slots(slots, w.case).values()
    }
    assert all(fired.values()), f"slots that never dispatched: {fired}"
    tol = lambda ref: e2e.ATOL + e2e.RTOL * float(ref.abs().max())  # noqa: E731
    assert e2e.max_abs_diff(logits, ref_logits) <= tol(ref_logits)
    assert e2e.max_abs_diff(loss, ref_loss) <= tol(ref_loss)
    assert sorted(grads) == sorted(ref_grads)
    bad = {
        n: e2e.max_abs_diff(grads[n], ref_grads[n])
        for n in ref_grads
        if e2e.max_abs_diff(grads[n], ref_grads[n]) > tol(ref_grads[n])
    }
    assert not bad, f"gradients not close: {bad}"

    up.eval(), model.eval()
    p = prompt(w.config.vocab_size, device)
    assert torch.equal(greedy(model, p, True), greedy(up, p, True)), "greedy tokens differ with the torch kernels"
