"""The `dsa_attention` slots of GLM-MoE-DSA and DeepSeek-V4 under `generate()` (issue 35), on the CPU
(`torch` kernels) or, with `--device cuda`, on the GPU (`cuda` kernels), each wrapped in a recording spy;
every other op eager.

- From Transformers 5.23 upstream caches the latents before the slot's guards: the slot gets no cache and
  the latents of every token so far, the new queries last (T > S while decoding). Both kernels give
  upstream's greedy tokens, and the decode steps reach the slot with one query over the cached latents.
- Under 5.17 the slot gets the cache of the expanded per-head keys and values: both kernels give upstream's
  tokens (the `cuda` kernel attends over the latents while the cache is empty, then over the cached keys
  and values).
- DeepSeek-V4 (eager attention, which builds the mask of the window and the compressed entries): both
  kernels give upstream's greedy tokens, every decode step reaching the slot with one query over the
  cached keys.
- With no field set, a simulated H200 binds both models' slots to `cuda` (their variants' default).

Run: `python -m pytest tests/models/test_dsa_generation.py --source-root .upstream/transformers-5.23.0`
with that tree first on PYTHONPATH (ctest: `real_models_dsa_generation`, `real_models_dsa_generation_5_23`).
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

import e2e  # tests/models/e2e.py (conftest puts it on sys.path)

SPY = "dsa_spy"
RECORDS: List[Dict[str, Any]] = []


def register_spy(variant: str, base: str) -> None:
    """Impl `dsa_spy` of dsa_attention/<variant>: opslot's `base` kernel, recording the shapes it was given
    (the queries and keys: GLM's q_pass [B, H, S, .] and k_pass [B, 1, T, .], V4's q [B, H, S, D] and
    kv [B, 1, T, D])."""
    from opslot.hardware import ANY
    from opslot.registry import KERNEL_REGISTRY, KernelSpec

    if KERNEL_REGISTRY.get("dsa_attention", variant, SPY) is not None:
        return

    def factory():
        inner = KERNEL_REGISTRY.get("dsa_attention", variant, base).load()

        def spy(module, q, *args, **kwargs):
            keys = args[1] if variant == "glm" else args[0]
            RECORDS.append({"S": q.shape[2], "T": keys.shape[2], "cache": kwargs.get("past_key_values") is not None})
            return inner(module, q, *args, **kwargs)

        return spy

    KERNEL_REGISTRY.register(
        KernelSpec(SPY, "dsa_attention", variant, factory, ANY, description=f"test: recording {base}")
    )


VARIANT = {"glm_moe_dsa": "glm", "deepseek_v4": "deepseek_v4"}


@pytest.fixture(scope="module")
def worlds(patchgen, source_root, tmp_path_factory, device):
    from opslot import module_slots

    base = "cuda" if device.type == "cuda" else "torch"
    cache = {}

    def get(key):
        if key in cache:
            return cache[key]
        register_spy(VARIANT[key], base)
        case = next(c for c in e2e.CASES if c.key == key)
        gen_py, _ = e2e.generate(
            patchgen, case.spec("gpu"), source_root, tmp_path_factory.mktemp(key), case.output_name("gpu")
        )
        module = e2e.import_generated(gen_py, f"{gen_py.stem}_dsa_generation")
        slots = module_slots(module)
        config = e2e.make_config(case)

        def build(impl: str, state=None):
            from opslot import build_model

            ops = e2e.ops_for(slots, "eager")
            ops["dsa_attention_implementation"] = impl
            model = build_model(config, ops=ops, module=module, model_class=case.causal_lm)
            if state is not None:
                model.load_state_dict(state, strict=True)
            return model.to(device).eval()

        def build_defaults():  # no field set: the device's defaults
            from opslot import build_model

            return build_model(config, ops={}, module=module, model_class=case.causal_lm)

        model = build("eager")
        e2e.randomize_(model, case.offset_norm)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        cache[key] = (base, config, lambda impl: build(impl, state), build_defaults)
        return cache[key]

    return get


def greedy(config, device):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, config.vocab_size, (2, 6), generator=gen).to(device)
    kwargs = dict(max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
    if getattr(config, "output_router_logits", False):
        kwargs["output_router_logits"] = False
    return ids, kwargs


def greedy_tokens(build, impl, ids, kwargs):
    """The model on `impl` generates greedily; RECORDS then holds what the spy saw of it."""
    RECORDS.clear()
    with torch.no_grad():
        return build(impl).generate(ids, **kwargs)


def upstream_caches_latents() -> bool:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return (major, minor) >= (5, 23)


def test_glm_generate_gives_upstreams_tokens(worlds, device):
    _, config, build, _ = worlds("glm_moe_dsa")
    ids, kwargs = greedy(config, device)
    eager_tokens = greedy_tokens(build, "eager", ids, kwargs)
    assert torch.equal(greedy_tokens(build, SPY, ids, kwargs), eager_tokens)
    layers = config.num_hidden_layers
    seen = [(r["S"], r["T"], r["cache"]) for r in RECORDS]
    if upstream_caches_latents():  # the slot gets every latent so far, the new query last
        want = [(6, 6, False)] * layers + [(1, 6 + step, False) for step in range(1, 4) for _ in range(layers)]
    else:  # the slot gets this step's latents and the cache of the expanded keys and values
        want = [(6, 6, True)] * layers + [(1, 1, True)] * (3 * layers)
    assert seen == want, seen


def test_deepseek_v4_generate_gives_upstreams_tokens(worlds, device):
    _, config, build, _ = worlds("deepseek_v4")
    ids, kwargs = greedy(config, device)
    eager_tokens = greedy_tokens(build, "eager", ids, kwargs)
    assert torch.equal(greedy_tokens(build, SPY, ids, kwargs), eager_tokens)
    layers = config.num_hidden_layers
    queries = [r["S"] for r in RECORDS]
    assert queries == [6] * layers + [1] * (3 * layers), queries
    keys = [r["T"] for r in RECORDS]
    assert all(t >= 6 for t in keys[:layers]) and all(t > 6 for t in keys[layers:]), keys  # cached keys seen


@pytest.mark.parametrize("key,impl,why", [("deepseek_v4", "cuda", "default"), ("glm_moe_dsa", "cuda", "default")])
def test_defaults_on_an_h200(worlds, key, impl, why):
    """With no field set, a (simulated) H200 whose kernel library loads binds both models' sparse attention
    to `cuda` (their variants' own default; the field's is `eager`)."""
    from opslot import DeviceInfo, binding_plan, use_device
    from opslot.device_defaults import set_cuda_kernels_check

    build_defaults = worlds(key)[3]
    try:
        set_cuda_kernels_check(lambda: None)
        with use_device(DeviceInfo("cuda", (9, 0))):  # bound and constructed, not run
            plan = binding_plan(build_defaults())
    finally:
        set_cuda_kernels_check(None)
    entries = [e for e in plan.entries if e.op == "dsa_attention"]
    assert [(e.impl, e.why) for e in entries] == [(impl, why)], repr(plan)
