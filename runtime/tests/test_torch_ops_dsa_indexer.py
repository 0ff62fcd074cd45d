"""opslot::dsa_index_scores, registered from C++ by libopslot_torch.so (kernels/torch/dsa_indexer.cc), and
the `cuda` kernels of dsa_indexer/glm and dsa_indexer/deepseek_v4 (runtime/opslot/kernels/cuda/
dsa_indexer.py), on a machine without a GPU.

The op's CPU kernel computes the reference math in fp32 with ATen ops, so the slot kernels' own logic
(the mask read into per-query limits and folded into the scores, V4's causal threshold and -1 picks,
the cache) runs here against upstream's modules. Also: the dispatch keys and schema, opcheck on CPU
and meta tensors, the CPU kernel against a float64 reference (limits of every kind, empty inputs, no
heads, views), the forward-only refusal and every argument check's exact message and exception
type. The CUDA kernel itself: tests/gpu/kernels/test_dsa_indexer.py."""

from __future__ import annotations

import pytest
import torch

from test_kernel_library_symbols import _library
from test_torch_ops_deepseek_v4 import config as v4_config

O = torch.ops.opslot  # noqa: E741


@pytest.fixture(scope="module")
def di():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import dsa_indexer

    return dsa_indexer


def ref64(q, k, w, scale, limit=None):
    dots = torch.einsum("bshd,btd->bsht", q.double(), k.double())
    out = (torch.relu(dots) * w.double().unsqueeze(-1)).sum(2) * scale
    if limit is not None:
        t = torch.arange(k.shape[1])
        out = out.masked_fill(t.view(1, 1, -1) >= limit.long().unsqueeze(-1), float("-inf"))
    return out


def rand(b, s, h, d, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, h, d, generator=g), torch.randn(b, t, d, generator=g), torch.randn(b, s, h, generator=g)


def test_op_is_registered_from_cpp(di):
    name = "opslot::dsa_index_scores"
    for key in ("CUDA", "Meta", "CPU", "Autograd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), key
    assert torch._library.custom_ops.OPDEFS.get(name) is None
    assert str(O.dsa_index_scores.default._schema) == (
        "opslot::dsa_index_scores(Tensor q, Tensor k, Tensor weights, float scale, Tensor? limit=None) -> Tensor"
    )


LIMITS = {
    "none": None,
    "causal": torch.tensor([[1, 2, 3, 4, 5], [3, 4, 5, 6, 7]], dtype=torch.int32),
    "edges": torch.tensor([[0, -4, 7, 99, 6], [7, 0, 1, 2, 3]], dtype=torch.int32),
}


@pytest.mark.parametrize("limit", LIMITS, ids=list(LIMITS))
def test_cpu_kernel_is_the_reference_math(di, limit):
    q, k, w = rand(2, 5, 3, 8, 7)
    lim = LIMITS[limit]
    out = O.dsa_index_scores(q, k, w, 0.25, lim)
    ref = ref64(q, k, w, 0.25, lim)
    assert out.dtype == torch.float32 and out.shape == (2, 5, 7) and out.is_contiguous()
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(out[fin].double(), ref[fin], rtol=1e-6, atol=1e-6)
    # 16-bit inputs: the same values, upcast
    out16 = O.dsa_index_scores(q.bfloat16(), k.bfloat16(), w, 0.25, lim)
    ref16 = ref64(q.bfloat16(), k.bfloat16(), w, 0.25, lim)
    torch.testing.assert_close(out16[fin].double(), ref16[fin], rtol=1e-6, atol=1e-6)


def test_cpu_kernel_views_empty_and_no_heads(di):
    q, k, w = rand(2, 6, 4, 8, 9, seed=1)
    qv = q.transpose(1, 2).contiguous().transpose(1, 2)
    kv = torch.cat([k, k], dim=-1)[..., 8:]
    wv = w.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(O.dsa_index_scores(qv, kv, wv, 0.5), O.dsa_index_scores(q, k, w, 0.5))
    for b, s, t in [(2, 0, 5), (2, 5, 0), (0, 5, 5)]:
        q, k, w = rand(b, s, 3, 8, t)
        assert O.dsa_index_scores(q, k, w, 0.5).shape == (b, s, t)
    q, k, w = rand(2, 5, 0, 8, 7)
    out = O.dsa_index_scores(q, k, w, 0.5, LIMITS["causal"])
    assert torch.equal(out, ref64(q, k, w, 0.5, LIMITS["causal"]).float())


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_opcheck_on_cpu_and_meta(di):
    q, k, w = rand(2, 5, 3, 8, 7)
    for args in [
        (q, k, w, 0.25, LIMITS["causal"]),
        (q.bfloat16(), k.bfloat16(), w, 0.25, None),
        (meta(2, 5, 3, 8, dtype=torch.bfloat16), meta(2, 7, 8, dtype=torch.bfloat16), meta(2, 5, 3), 0.1, None),
        (meta(1, 4, 64, 128), meta(1, 9, 128), meta(1, 4, 64), 0.1, meta(1, 4, dtype=torch.int32)),
    ]:
        torch.library.opcheck(O.dsa_index_scores.default, args)
    out = O.dsa_index_scores(
        meta(3, 4, 2, 16, dtype=torch.float16), meta(3, 11, 16, dtype=torch.float16), meta(3, 4, 2), 1.0
    )
    assert out.shape == (3, 4, 11) and out.dtype == torch.float32 and out.device.type == "meta"


def test_forward_only(di):
    q, k, w = rand(1, 3, 2, 8, 4)
    msg = (
        "dsa_index_scores is forward only (the DSA indexer runs under torch.no_grad()): call it under "
        "torch.no_grad() or with inputs that do not require grad"
    )
    for i in range(3):
        args = [q, k, w]
        args[i] = args[i].clone().requires_grad_()
        with pytest.raises(ValueError) as info:
            O.dsa_index_scores(*args, 1.0)
        assert str(info.value).splitlines()[0] == msg
        with torch.no_grad():
            out = O.dsa_index_scores(*args, 1.0)
        assert not out.requires_grad


def test_argument_checks(di):
    q, k, w = rand(2, 5, 3, 8, 7)
    lim = LIMITS["causal"]
    cases = [
        (
            (q.double(), k, w, 1.0, None),
            TypeError,
            "dsa_index_scores: opslot cuda kernels take float32, float16 or bfloat16 tensors, got torch.float64",
        ),
        (
            (q[0], k, w, 1.0, None),
            ValueError,
            "dsa_index_scores: q must be [batch, seq, heads, dim], got shape (5, 3, 8)",
        ),
        (
            (q, k.half(), w, 1.0, None),
            TypeError,
            "dsa_index_scores: k is torch.float16 but q is torch.float32 (they must match)",
        ),
        (
            (q, k[..., :4], w, 1.0, None),
            ValueError,
            "dsa_index_scores: k must be [batch, keys, dim] = [2, keys, 8], got shape (2, 7, 4)",
        ),
        (
            (q, k[:1], w, 1.0, None),
            ValueError,
            "dsa_index_scores: k must be [batch, keys, dim] = [2, keys, 8], got shape (1, 7, 8)",
        ),
        ((q, k, w.half(), 1.0, None), TypeError, "dsa_index_scores: weights must be torch.float32, got torch.float16"),
        (
            (q, k, w[:, :4], 1.0, None),
            ValueError,
            "dsa_index_scores: weights must be [batch, seq, heads] = [2, 5, 3], got shape (2, 4, 3)",
        ),
        ((q, k, w, 1.0, lim.long()), TypeError, "dsa_index_scores: limit must be torch.int32, got torch.int64"),
        (
            (q, k, w, 1.0, lim[:, :4]),
            ValueError,
            "dsa_index_scores: limit must be [batch, seq] = [2, 5], got shape (2, 4)",
        ),
        ((q, k, w, 1.0, lim[0]), ValueError, "dsa_index_scores: limit must be [batch, seq] = [2, 5], got shape (5,)"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc) as info:
            O.dsa_index_scores(*args)
        assert str(info.value).splitlines()[0] == msg
        with pytest.raises(exc):  # the Meta kernel checks the same
            O.dsa_index_scores(*[a.to("meta") if torch.is_tensor(a) else a for a in args])


def test_visible_limit(di):
    """`visible_limit` is `opslot::mask_limit` (its own tests: test_torch_ops_topk.py)."""
    mask = torch.tensor([[[True, False, True, False], [False] * 4, [True] * 4]])
    assert di.visible_limit(mask).tolist() == [[3, 0, 4]]
    assert di.visible_limit(mask).dtype == torch.int32
    lo = torch.finfo(torch.bfloat16).min
    add = torch.tensor([[[0.0, lo, -3.0, lo], [lo, lo, lo, float("-inf")], [0.0, 0.0, 0.0, float("-inf")]]])
    assert di.visible_limit(add.bfloat16()).tolist() == [[3, 0, 3]]
    assert di.visible_limit(torch.ones(2, 3, 0, dtype=torch.bool)).shape == (2, 3)
    big = torch.rand(2, 37, 11) > 0.5
    brute = torch.tensor(
        [[max([t + 1 for t in range(11) if big[b, s, t]], default=0) for s in range(37)] for b in range(2)]
    )
    assert torch.equal(di.visible_limit(big).long(), brute)


# -- the slot kernels, with the op's CPU kernel, against upstream's modules -----------------------------


def _same_sets(a, b):
    return torch.equal(a.long().sort(-1).values, b.long().sort(-1).values)


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            p.copy_((1.0 if "norm" in name else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
    return module.eval()


def glm():
    mod = pytest.importorskip("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa")
    from transformers import GlmMoeDsaConfig

    config = GlmMoeDsaConfig(
        vocab_size=32,
        hidden_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        q_lora_rank=12,
        kv_lora_rank=8,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        index_n_heads=3,
        index_head_dim=16,
        index_topk=4,
        max_position_embeddings=128,
    )
    return mod, config, _randomize(mod.GlmMoeDsaIndexer(config, 0), 3), mod.GlmMoeDsaRotaryEmbedding(config)


def glm_call(config, rotary, batch, seq, start=0, keys=None, pad=(0, 0), seed=5):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, config.hidden_size, generator=g)
    q_resid = torch.randn(batch, seq, config.q_lora_rank, generator=g)
    pos = torch.arange(start, start + seq)[None].expand(batch, -1)
    keys = keys or start + seq
    i = torch.arange(seq).view(1, -1, 1) + (keys - seq)
    t = torch.arange(keys).view(1, 1, -1)
    shown = (t <= i) & (t >= torch.tensor(pad[:batch]).view(-1, 1, 1))
    additive = torch.zeros(shown.shape).masked_fill(~shown, torch.finfo(torch.float32).min)
    return hidden, q_resid, rotary(hidden, pos), pos, shown, additive


def test_glm_kernel_picks_upstreams_keys(di):
    mod, config, ind, rotary = glm()
    hidden, q_resid, pe, pos, shown, additive = glm_call(config, rotary, 2, 13, pad=(0, 5))
    for mask in (shown, additive):
        ours = di.dsa_indexer_glm(ind, hidden, q_resid, pe, mask, pos)
        upstream = ind(hidden, q_resid, pe, mask, pos)
        assert ours.dtype == torch.int32 and ours.shape == upstream.shape == (2, 13, 4)
        full = shown.sum(-1) >= 4  # rows with k visible keys: the same set (no near ties here)
        assert _same_sets(ours[full], upstream[full])
        few = ~full  # fewer visible keys than k: all of them, then hidden ones
        assert bool(shown.gather(-1, ours.long()).sum(-1)[few].eq(shown.sum(-1)[few]).all())


def test_glm_kernel_with_a_cache(di):
    from transformers import DynamicCache

    mod, config, ind, rotary = glm()
    caches = [DynamicCache(config=config), DynamicCache(config=config)]
    hidden, q_resid, pe, pos, _, _ = glm_call(config, rotary, 1, 12, seed=6)
    for start, end in [(0, 9), (9, 10), (10, 12)]:
        _, _, _, _, shown, _ = glm_call(config, rotary, 1, end - start, start=start)
        part = (hidden[:, start:end], q_resid[:, start:end], tuple(x[:, start:end] for x in pe))
        ours = di.dsa_indexer_glm(ind, *part, shown, pos[:, start:end], past_key_values=caches[0])
        upstream = ind(*part, shown, pos[:, start:end], past_key_values=caches[1])
        full = shown.sum(-1) >= 4
        assert _same_sets(ours[full], upstream[full]), (start, end)
    assert torch.equal(caches[0].layers[0].indexer_keys, caches[1].layers[0].indexer_keys)


def test_glm_kernel_refusals(di):
    mod, config, ind, rotary = glm()
    hidden, q_resid, pe, pos, shown, _ = glm_call(config, rotary, 1, 6)
    with pytest.raises(ValueError) as info:
        di.dsa_indexer_glm(ind, hidden, q_resid, pe, None, pos)
    assert str(info.value) == (
        "dsa_indexer/glm (cuda): attention_mask is None; the indexer needs the [B, S, T] mask the model "
        "builds (upstream's indexer cannot run without one either)"
    )
    with pytest.raises(ValueError) as info:
        di.dsa_indexer_glm(ind, hidden, q_resid, pe, shown[..., :4], pos)
    assert str(info.value) == (
        "dsa_indexer/glm (cuda): attention_mask of shape (1, 6, 4) does not broadcast to the scores "
        "[batch, queries, keys] = [1, 6, 6]"
    )


def v4():
    mod = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    config = v4_config()  # test_torch_ops_deepseek_v4's tiny config (its MoE/mHC fields unused here)
    return mod, config, _randomize(mod.DeepseekV4Indexer(config), 12)


def v4_call(config, batch, seq, start=0, seed=13):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, config.hidden_size, generator=g)
    q_res = torch.randn(batch, seq, config.q_lora_rank, generator=g)
    return hidden, q_res, torch.arange(start, start + seq)[None].expand(batch, -1)


@pytest.mark.parametrize("seq", [23, 4, 3, 1], ids=["odd", "one_window", "no_window", "single"])
def test_v4_kernel_picks_upstreams_keys(di, seq):
    mod, config, ind = v4()
    hidden, q_res, pos = v4_call(config, 2, seq)
    ours = di.dsa_indexer_deepseek_v4(ind, hidden, q_res, pos, None, 1)
    upstream = ind(hidden, q_res, pos, None, 1)
    assert ours.dtype == torch.int64 and ours.shape == upstream.shape == (2, seq, min(3, seq // 4))
    assert torch.equal(ours == -1, upstream == -1)
    assert _same_sets(ours, upstream)


def test_v4_kernel_with_a_cache(di):
    from transformers import DynamicCache

    mod, config, ind = v4()
    caches = [DynamicCache(config=config), DynamicCache(config=config)]
    hidden, q_res, pos = v4_call(config, 2, 15, seed=14)
    for start, end in [(0, 6)] + [(t, t + 1) for t in range(6, 15)]:
        part = (hidden[:, start:end], q_res[:, start:end], pos[:, start:end])
        ours = di.dsa_indexer_deepseek_v4(ind, *part, caches[0], 1)
        upstream = ind(*part, caches[1], 1)
        assert torch.equal(ours == -1, upstream == -1) and _same_sets(ours, upstream), (start, end)
    assert torch.equal(caches[0].layers[1].compressed_kv["indexer"], caches[1].layers[1].compressed_kv["indexer"])


def test_slot_kernels_are_registered(di):
    from opslot import KERNEL_REGISTRY

    for variant, fn in (("glm", di.dsa_indexer_glm), ("deepseek_v4", di.dsa_indexer_deepseek_v4)):
        spec = KERNEL_REGISTRY.get("dsa_indexer", variant, "cuda")
        assert spec is not None and spec.load() is fn
        assert (spec.hardware.device_type, spec.hardware.min_cc) == ("cuda", (8, 0))
