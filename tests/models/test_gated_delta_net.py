"""Qwen3.5 / Qwen3.5-MoE Gated DeltaNet layers in generated models (issue 27), on the CPU (`torch`
kernels) or, with `--device cuda`, on the GPU (`cuda` kernels).

The specs guard the linear-attention ops at their call sites in `*GatedDeltaNet.forward` (prefill
and decode conv, chunked and recurrent delta rule), not at the entry of the upstream helpers that
Transformers wraps with `use_kernel_func_from_hub_with_fallback`. Checked here, with opslot's `torch`
kernels wrapped in a recording spy:

- packed sequences: a row of documents with `cu_seq_lens_q/k`, `max_length_q/k` and position ids
  restarting per document reaches both slots with `cu_seqlens`, and the conv and delta-rule outputs
  (and the logits) of every document equal those of the document run alone; with the slots on
  eager (upstream's code, which mixes the documents in 5.17) the packed row is refused;
- decode: `generate()` with the cache reaches the decode call sites (conv with `conv_state`, the
  delta rule with one token and a state) and gives upstream's tokens;
- with a fake `fla` and `causal_conv1d` importable when the generated module is imported, the hub
  wrapper picks them (the eager model calls them), and a bound kernel still runs instead: the fakes
  are never called.

Run: `python -m pytest tests/models/test_gated_delta_net.py --source-root .upstream/transformers-5.23.0`
(ctest: `real_models_gated_delta_net`, `real_models_gated_delta_net_5_23`).
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

import e2e  # tests/models/e2e.py (conftest puts it on sys.path; it sets USE_HUB_KERNELS=0)

SPY = "gdn_spy"
OPS = ("causal_conv1d", "chunk_gated_delta_rule")
RECORDS: List[Dict[str, Any]] = []
FAKE_CALLS: List[str] = []
KEYS = ["qwen3_5", "qwen3_5_moe"]
LENGTHS = [5, 1, 7, 3]  # a length-1 document among them


def register_spies(base: str) -> None:
    """Impl `gdn_spy` of both ops: opslot's `base` kernel (`torch` on the CPU, `cuda` on a CUDA
    device), recording what the guard passed."""
    from opslot.hardware import ANY
    from opslot.registry import KERNEL_REGISTRY, KernelSpec

    for op in OPS:
        if KERNEL_REGISTRY.get(op, "standard", SPY) is not None:
            continue

        def factory(op=op):
            inner = KERNEL_REGISTRY.get(op, "standard", base).load()

            def spy(*args, **kwargs):
                rec = {
                    "op": op,
                    "T": args[0].shape[-1] if op == "causal_conv1d" else args[0].shape[1],
                    "cu_seqlens": kwargs.get("cu_seqlens"),
                    "conv_state": kwargs.get("conv_state") is not None,
                    "initial_state": kwargs.get("initial_state") is not None,
                }
                out = inner(*args, **kwargs)
                rec["out"] = (out if op == "causal_conv1d" else out[0]).detach().clone()
                RECORDS.append(rec)
                return out

            return spy

        KERNEL_REGISTRY.register(KernelSpec(SPY, op, "standard", factory, ANY, description=f"test: recording {base}"))


def tiny_case(key: str) -> e2e.Case:
    """e2e's case with three layers (linear, full, linear): the second linear layer's input has been
    through attention, so the packed attention mask matters too."""
    case = next(c for c in e2e.CASES if c.key == key)
    kwargs = dict(
        case.config_kwargs, num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"]
    )
    return dataclasses.replace(case, config_kwargs=kwargs)


class World:
    def __init__(self, key, patchgen, source_root, tmp: Path, suffix=""):
        from opslot import module_slots

        self.case = tiny_case(key)
        gen_py, _ = e2e.generate(
            patchgen, self.case.spec("gpu"), source_root, tmp / "generated", self.case.output_name("gpu")
        )
        self.module = e2e.import_generated(gen_py, f"{gen_py.stem}_gdn{suffix}")
        self.slots = module_slots(self.module)
        assert {s.op for s in self.slots.values()} >= set(OPS)
        self.config = e2e.make_config(self.case)
        model = self.build("eager")
        e2e.randomize_(model, self.case.offset_norm)
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def build(self, impl: str, device="cpu"):
        from opslot import build_model

        ops = e2e.ops_for(self.slots, "eager")
        if impl != "eager":
            ops.update({f"{op}_implementation": impl for op in OPS})
        model = build_model(self.config, ops=ops, module=self.module, model_class=self.case.causal_lm)
        if hasattr(self, "state"):
            model.load_state_dict(self.state, strict=True)
        return model.to(device).eval()


@pytest.fixture(scope="module")
def worlds(patchgen, source_root, tmp_path_factory, device):
    register_spies("cuda" if device.type == "cuda" else "torch")
    cache: Dict[str, World] = {}

    def get(key):
        if key not in cache:
            cache[key] = World(key, patchgen, source_root, tmp_path_factory.mktemp(key))
        return cache[key]

    return get


def packed_inputs(vocab: int, device) -> Dict[str, Any]:
    gen = torch.Generator().manual_seed(7)
    T = sum(LENGTHS)
    ids = torch.randint(1, vocab, (1, T), generator=gen)
    cu = torch.tensor([0] + torch.tensor(LENGTHS).cumsum(0).tolist(), dtype=torch.int32)
    position_ids = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    return dict(
        input_ids=ids.to(device),
        position_ids=position_ids.to(device),
        cu_seq_lens_q=cu.to(device),
        cu_seq_lens_k=cu.to(device),
        max_length_q=max(LENGTHS),
        max_length_k=max(LENGTHS),
        use_cache=False,
    )


def run(model, **inputs):
    RECORDS.clear()
    with torch.no_grad():
        logits = model(**inputs).logits
    return logits, list(RECORDS)


@pytest.mark.parametrize("key", KEYS)
def test_packed_documents_equal_separate_documents(key, worlds, device):
    w = worlds(key)
    model = w.build(SPY, device)
    inputs = packed_inputs(w.config.vocab_size, device)
    cu = inputs["cu_seq_lens_q"]
    packed_logits, packed = run(model, **inputs)
    # every Gated DeltaNet layer (2) ran both ops once, each with the packed boundaries
    assert [r["op"] for r in packed] == list(OPS) * 2, [r["op"] for r in packed]
    for r in packed:
        assert r["cu_seqlens"] is not None, f"{r['op']} got no cu_seqlens"
        assert torch.equal(r["cu_seqlens"].cpu(), cu.cpu()), r["cu_seqlens"]
        assert not r["conv_state"] and not r["initial_state"]

    start = 0
    for d, n in enumerate(LENGTHS):
        ids = inputs["input_ids"][:, start : start + n]
        alone_logits, alone = run(model, input_ids=ids, use_cache=False)
        assert all(r["cu_seqlens"] is None for r in alone)
        for r_packed, r_alone in zip(packed, alone):
            part = (
                r_packed["out"][:, :, start : start + n]
                if r_packed["op"] == "causal_conv1d"
                else r_packed["out"][:, start : start + n]
            )
            torch.testing.assert_close(
                part, r_alone["out"], rtol=1e-5, atol=1e-5, msg=lambda m: f"document {d}, {r_packed['op']}: {m}"
            )
        torch.testing.assert_close(
            packed_logits[:, start : start + n],
            alone_logits,
            rtol=1e-4,
            atol=1e-4,
            msg=lambda m: f"document {d} logits: {m}",
        )
        start += n

    # upstream's eager code without `fla` ignores cu_seqlens in 5.17 (the state runs on across documents)
    # and refuses packed rows from 5.23; the generated model refuses them first, in both
    from opslot.packing import PackedSequenceError

    with pytest.raises(
        PackedSequenceError,
        match="^a packed row reaches causal_conv1d_implementation, chunk_gated_delta_rule_implementation = eager",
    ):
        run(w.build("eager", device), **inputs)


@pytest.mark.parametrize("key", KEYS)
def test_generate_reaches_the_decode_call_sites(key, worlds, device):
    w = worlds(key)
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(1, w.config.vocab_size, (2, 6), generator=gen).to(device)
    kwargs = dict(max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
    if getattr(w.config, "output_router_logits", False):
        kwargs["output_router_logits"] = False
    with torch.no_grad():
        eager_tokens = w.build("eager", device).generate(ids, **kwargs)
        RECORDS.clear()
        spy_tokens = w.build(SPY, device).generate(ids, **kwargs)
    assert torch.equal(spy_tokens, eager_tokens)
    seen = {(r["op"], r["T"] > 1, r["conv_state"], r["initial_state"]) for r in RECORDS}
    assert seen == {
        ("causal_conv1d", True, False, False),  # prefill conv
        ("chunk_gated_delta_rule", True, False, False),  # chunked prefill
        ("causal_conv1d", False, True, False),  # one-token conv update
        ("chunk_gated_delta_rule", False, False, True),  # one-token recurrent step with the state
    }, seen


# -- a fake `fla` / `causal_conv1d` installed -------------------------------------------------------------
def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__dict__.update(attrs)
    return mod


def _heads(q, k, v):
    if q.shape[2] != v.shape[2]:  # grouped value heads (5.23 passes key heads through)
        q = q.repeat_interleave(v.shape[2] // q.shape[2], dim=2)
        k = k.repeat_interleave(v.shape[2] // k.shape[2], dim=2)
    return q, k


def fake_chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
    **kwargs,
):
    from opslot import reference

    FAKE_CALLS.append("fla.chunk_gated_delta_rule")
    q, k = _heads(q, k, v)
    return reference.chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
    )


def fake_fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
    **kwargs,
):
    from opslot import reference

    FAKE_CALLS.append("fla.fused_recurrent_gated_delta_rule")
    q, k = _heads(q, k, v)
    return reference.chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
    )


def fake_causal_conv1d_fn(
    x,
    weight,
    bias=None,
    seq_idx=None,
    initial_states=None,
    return_final_states=False,
    final_states_out=None,
    activation=None,
):
    from opslot import reference

    FAKE_CALLS.append("causal_conv1d.causal_conv1d_fn")
    return reference.causal_conv1d(x, weight, bias, activation)


def fake_causal_conv1d_update(
    x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None
):
    from opslot import reference

    FAKE_CALLS.append("causal_conv1d.causal_conv1d_update")
    return reference.causal_conv1d(x, weight, bias, activation, conv_state=conv_state)


@pytest.fixture
def fake_kernel_packages(monkeypatch):
    """`fla` (with `fla.ops.gated_delta_rule`) and `causal_conv1d` as importable stand-ins."""
    fns = dict(
        chunk_gated_delta_rule=fake_chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule=fake_fused_recurrent_gated_delta_rule,
    )
    gdr = _module("fla.ops.gated_delta_rule", **fns)
    ops = _module("fla.ops", gated_delta_rule=gdr)
    fla = _module("fla", ops=ops, **fns)
    conv = _module(
        "causal_conv1d", causal_conv1d_fn=fake_causal_conv1d_fn, causal_conv1d_update=fake_causal_conv1d_update
    )
    for mod in (fla, ops, gdr, conv):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    FAKE_CALLS.clear()
    yield


@pytest.mark.parametrize("key", KEYS)
def test_guards_are_reached_when_fla_is_installed(key, patchgen, source_root, tmp_path, device, fake_kernel_packages):
    register_spies("cuda" if device.type == "cuda" else "torch")
    w = World(key, patchgen, source_root, tmp_path, suffix="_fakefla")  # imported with the fakes present
    gen = torch.Generator().manual_seed(13)
    ids = torch.randint(1, w.config.vocab_size, (1, 6), generator=gen).to(device)
    kwargs = dict(max_new_tokens=3, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
    if getattr(w.config, "output_router_logits", False):
        kwargs["output_router_logits"] = False

    # slots unbound: upstream's code, which the hub wrapper sends to the (fake) packages
    with torch.no_grad():
        eager_tokens = w.build("eager", device).generate(ids, **kwargs)
    assert set(FAKE_CALLS) == {
        "fla.chunk_gated_delta_rule",
        "fla.fused_recurrent_gated_delta_rule",
        "causal_conv1d.causal_conv1d_fn",
        "causal_conv1d.causal_conv1d_update",
    }, FAKE_CALLS

    # an explicit kernel: every call site runs it, the packages never
    FAKE_CALLS.clear()
    RECORDS.clear()
    with torch.no_grad():
        spy_tokens = w.build(SPY, device).generate(ids, **kwargs)
    assert FAKE_CALLS == []
    assert {(r["op"], r["T"] > 1) for r in RECORDS} == {(op, t) for op in OPS for t in (True, False)}
    assert torch.equal(spy_tokens, eager_tokens)
