"""GLM-MoE-DSA's DeepSeek sparse attention ops (docs/ops.md): `dsa_indexer/glm` and `dsa_attention/glm`.

- the `torch` kernels are upstream's code: the indexer's top-k bit for bit against
  `GlmMoeDsaIndexer.forward` (boolean and float masks, padding, a packed row, odd sizes, its scores a
  few query rows at a time, a cache), the attention's output and weights bit for bit against
  upstream's lines of `GlmMoeDsaAttention.forward`, and a cache written as Transformers 5.17 writes it;
- the fp32 references (opslot.reference, written in the form a kernel computes: per-key scores,
  attention on the latents with kv_b_proj absorbed) against the `torch` kernels: the indexer picks the
  same visible keys; the attention's output, weights and the gradients of q_pass, q_rot, k_pass, k_rot
  and kv_b_proj.weight agree (fp32, and the kernel in bf16);
- reruns are bitwise equal; what the references cannot compute is refused with its message.
"""

import copy

import pytest
import torch

from kernel_harness import TOLERANCES, assert_close, forward_backward, leaf
from opslot import reference
from opslot.kernels import torch_ops

transformers = pytest.importorskip("transformers")
glm = pytest.importorskip("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa")

FP32, BF16 = torch.float32, torch.bfloat16

#: (name, batch, query lengths per row (padding after), packed document lengths or None)
SHAPES = [
    ("padded", 2, [9, 6], None),
    ("odd", 1, [13], None),
    ("packed", 1, [11], [5, 1, 4, 1]),
]


def make_config(attn="eager", topk=5):
    config = transformers.GlmMoeDsaConfig(
        vocab_size=32,
        hidden_size=24,
        num_hidden_layers=1,
        num_attention_heads=3,
        num_key_value_heads=3,
        q_lora_rank=12,
        kv_lora_rank=10,
        qk_rope_head_dim=6,
        qk_nope_head_dim=7,
        v_head_dim=5,
        index_n_heads=3,
        index_head_dim=10,
        index_topk=topk,
        attention_dropout=0.0,
    )
    config._attn_implementation = attn
    return config


def randomize(module, seed=7):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return module


def visible(batch, lengths, docs, seq, past=0):
    """bool `[B, S, T]` (T = past + seq): causal, padding after each row's length, documents apart."""
    t = torch.arange(past + seq)
    s = torch.arange(seq) + past
    allowed = (t.view(1, -1) <= s.view(-1, 1)).expand(batch, -1, -1).clone()
    for b, n in enumerate(lengths):
        allowed[b, :, past + n :] = False  # padded keys
    if docs is not None:
        doc = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))
        doc = torch.cat([doc, torch.full((seq - len(doc),), -1)])
        allowed &= (doc.view(-1, 1) == doc.view(1, -1)).unsqueeze(0)
    return allowed


def as_mask(allowed, kind, dtype):
    """The mask upstream's attention gets: bool for sdpa, float (0 / the dtype's min) for eager."""
    if kind == "bool":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def position_embeddings(config, batch, seq, dtype=FP32):
    rotary = glm.GlmMoeDsaRotaryEmbedding(config)
    x = torch.zeros(batch, seq, 1, dtype=dtype)
    return rotary(x, torch.arange(seq).unsqueeze(0).expand(batch, -1))


def seq_of(lengths, docs=None):
    """A packed row is its documents, no padding; other rows are padded by two positions at least."""
    return sum(docs) if docs else max(lengths) + 2


# -- dsa_indexer/glm ----------------------------------------------------------------------------
def indexer_inputs(config, batch, seq, seed=3):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, config.hidden_size, generator=gen)
    q_resid = torch.randn(batch, seq, config.q_lora_rank, generator=gen)
    return hidden, q_resid, position_embeddings(config, batch, seq)


@pytest.mark.parametrize("name, batch, lengths, docs", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("rows", [None, 1], ids=["all_rows", "row_by_row"])
def test_indexer_torch_kernel_is_upstream_bit_for_bit(name, batch, lengths, docs, kind, rows, monkeypatch):
    if rows is not None:  # the scores one query row at a time
        monkeypatch.setattr(torch_ops, "_INDEX_SCORE_ELEMENTS", rows)
    config = make_config()
    indexer = randomize(glm.GlmMoeDsaIndexer(config, 0))
    seq = seq_of(lengths, docs)
    hidden, q_resid, pe = indexer_inputs(config, batch, seq)
    mask = as_mask(visible(batch, lengths, docs, seq), kind, FP32)
    expected = indexer(hidden, q_resid, pe, mask, None)
    got = torch_ops.dsa_indexer_glm(indexer, hidden, q_resid, pe, mask, None)
    assert got.dtype == torch.int32 and got.shape == (batch, seq, config.index_topk)
    assert torch.equal(got, expected)
    assert torch.equal(torch_ops.dsa_indexer_glm(indexer, hidden, q_resid, pe, mask, None), got)  # rerun


def visible_picks(indices, allowed):
    """Per row, the sorted picked keys the row may see."""
    seen = allowed.gather(-1, indices.long())
    return [
        sorted(i for i, ok in zip(row.tolist(), vis.tolist()) if ok)
        for row, vis in zip(indices.flatten(0, 1), seen.flatten(0, 1))
    ]


@pytest.mark.parametrize("name, batch, lengths, docs", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_indexer_reference_picks_the_same_visible_keys(name, batch, lengths, docs, kind):
    config = make_config()
    indexer = randomize(glm.GlmMoeDsaIndexer(config, 0))
    seq = seq_of(lengths, docs)
    hidden, q_resid, pe = indexer_inputs(config, batch, seq)
    allowed = visible(batch, lengths, docs, seq)
    mask = as_mask(allowed, kind, FP32)
    got = torch_ops.dsa_indexer_glm(indexer, hidden, q_resid, pe, mask, None)
    ref = reference.dsa_indexer_glm(indexer, hidden, q_resid, pe, mask, None)
    assert ref.dtype == torch.int32 and ref.shape == got.shape
    picks = visible_picks(got, allowed)
    assert picks == visible_picks(ref, allowed)
    # a row that sees at most k keys picks every one of them, else exactly k
    counts = allowed.sum(-1).flatten().tolist()
    assert [len(p) for p in picks] == [min(c, config.index_topk) for c in counts]


def test_indexer_keeps_every_key_when_there_are_fewer_than_topk():
    config = make_config(topk=64)
    indexer = randomize(glm.GlmMoeDsaIndexer(config, 0))
    hidden, q_resid, pe = indexer_inputs(config, 1, 7)
    mask = as_mask(visible(1, [7], None, 7), "bool", FP32)
    got = torch_ops.dsa_indexer_glm(indexer, hidden, q_resid, pe, mask, None)
    assert got.shape == (1, 7, 7)
    assert torch.equal(got.sort(-1).values, torch.arange(7, dtype=torch.int32).expand(1, 7, 7))


@pytest.mark.parametrize("seq", [0, 1])
def test_indexer_of_no_query_and_of_one_is_upstreams(seq):
    config = make_config()
    indexer = randomize(glm.GlmMoeDsaIndexer(config, 0))
    hidden, q_resid, pe = indexer_inputs(config, 2, seq)
    mask = visible(2, [seq, seq], None, seq)
    expected = indexer(hidden, q_resid, pe, mask, None)
    for fn in (torch_ops.dsa_indexer_glm, reference.dsa_indexer_glm):
        got = fn(indexer, hidden, q_resid, pe, mask, None)
        assert got.dtype == torch.int32 and got.shape == expected.shape == (2, seq, seq)
        assert torch.equal(got, expected)


def test_indexer_with_a_cache_is_upstream_bit_for_bit():
    """Prefill, then one token: the cache's indexer keys grow as upstream's do, the picks are equal."""
    from transformers import DynamicCache

    config = make_config()
    indexer = randomize(glm.GlmMoeDsaIndexer(config, 0))
    hidden, q_resid, _ = indexer_inputs(config, 1, 9)
    caches = DynamicCache(config=config), DynamicCache(config=config)
    for start, stop in ((0, 8), (8, 9)):
        pos = torch.arange(start, stop).unsqueeze(0)
        pe = glm.GlmMoeDsaRotaryEmbedding(config)(hidden, pos)
        mask = visible(1, [stop], None, stop - start, past=start)
        args = (hidden[:, start:stop], q_resid[:, start:stop], pe, mask, pos)
        expected = indexer(*args, past_key_values=caches[0])
        got = torch_ops.dsa_indexer_glm(indexer, *args, past_key_values=caches[1])
        assert torch.equal(got, expected)
    assert torch.equal(caches[0].layers[0].indexer_keys, caches[1].layers[0].indexer_keys)
    assert caches[1].layers[0].indexer_keys.shape == (1, 9, config.index_head_dim)


# -- dsa_attention/glm --------------------------------------------------------------------------
def attention_inputs(config, batch, seq, allowed, seed=5):
    """q_pass, q_rot, k_pass, k_rot (random, rotated or not: the op does not care) and distinct top-k
    indices per row that always include the row's own position (so every row sees a key), the rest
    random, visible or not."""
    gen = torch.Generator().manual_seed(seed)
    heads = config.num_attention_heads
    q_pass = torch.randn(batch, heads, seq, config.qk_nope_head_dim, generator=gen)
    q_rot = torch.randn(batch, heads, seq, config.qk_rope_head_dim, generator=gen)
    k_pass = torch.randn(batch, 1, seq, config.kv_lora_rank, generator=gen)
    k_rot = torch.randn(batch, 1, seq, config.qk_rope_head_dim, generator=gen)
    order = torch.rand(batch, seq, seq, generator=gen)
    order[:, torch.arange(seq), torch.arange(seq)] = 2.0  # the diagonal first
    topk = order.argsort(dim=-1, descending=True)[..., : config.index_topk].to(torch.int32)
    assert bool(allowed.gather(-1, topk.long()).any(-1).all())
    return dict(q_pass=q_pass, q_rot=q_rot, k_pass=k_pass, k_rot=k_rot, topk=topk)


def upstream_attention(module, q_pass, q_rot, k_pass, k_rot, topk_indices, attention_mask):
    """Upstream's lines of GlmMoeDsaAttention.forward from the latents on (no cache), as written."""
    batch_size, _, seq_length, _ = q_pass.shape
    query_states = torch.cat((q_pass, q_rot), dim=-1)
    key_states, value_states = module.expand_kv(k_pass, k_rot)
    index_mask = (
        topk_indices.new_ones((batch_size, seq_length, key_states.shape[2]), dtype=torch.bool)
        .scatter(-1, topk_indices.long(), False)
        .unsqueeze(1)
    )
    if attention_mask.dtype == torch.bool:
        attention_mask = attention_mask & ~index_mask
    else:
        attention_mask = attention_mask.masked_fill(index_mask, torch.finfo(q_pass.dtype).min)
    interface = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS.get_interface(
        module.config._attn_implementation, glm.eager_attention_forward
    )
    return interface(
        module, query_states, key_states, value_states, attention_mask, dropout=0.0, scaling=module.scaling
    )


ATTENTIONS = [("eager", "float"), ("sdpa", "bool")]


@pytest.mark.parametrize("name, batch, lengths, docs", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("attn, kind", ATTENTIONS, ids=[a for a, _ in ATTENTIONS])
def test_attention_torch_kernel_is_upstream_bit_for_bit(name, batch, lengths, docs, attn, kind):
    config = make_config(attn)
    module = randomize(glm.GlmMoeDsaAttention(config, 0))
    seq = seq_of(lengths, docs)
    allowed = visible(batch, lengths, docs, seq)
    t = attention_inputs(config, batch, seq, allowed)
    mask = as_mask(allowed, kind, FP32).unsqueeze(1)
    args = (t["q_pass"], t["q_rot"], t["k_pass"], t["k_rot"], t["topk"], mask)
    expected = upstream_attention(module, *args)
    got = torch_ops.dsa_attention_glm(module, *args, past_key_values=None)
    assert torch.equal(got[0], expected[0]) and got[0].shape == (batch, seq, config.num_attention_heads, 5)
    assert (got[1] is None) == (attn == "sdpa") and (got[1] is None or torch.equal(got[1], expected[1]))


@pytest.mark.parametrize("name, batch, lengths, docs", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("attn, kind", ATTENTIONS, ids=[a for a, _ in ATTENTIONS])
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_attention_reference_and_torch_kernel_agree_with_gradients(name, batch, lengths, docs, attn, kind, dtype):
    """Outputs, eager's weights, and the gradients of q_pass, q_rot, k_pass, k_rot and kv_b_proj.weight:
    the kernel in `dtype`, the absorbed-form reference in fp32."""
    config = make_config(attn)
    module = randomize(glm.GlmMoeDsaAttention(config, 0))
    seq = seq_of(lengths, docs)
    allowed = visible(batch, lengths, docs, seq)
    t = attention_inputs(config, batch, seq, allowed)
    names = ("q_pass", "q_rot", "k_pass", "k_rot")

    def run(fn, tdtype):
        mod = copy.deepcopy(module).to(tdtype)
        leaves = [leaf(t[n], "cpu", tdtype) for n in names]
        mask = as_mask(allowed, kind, tdtype).unsqueeze(1)
        outs, grads = forward_backward(lambda: fn(mod, *leaves, t["topk"], mask, past_key_values=None), leaves, [mod])
        return outs, grads + [mod.kv_b_proj.weight.grad], mod

    k_out, k_grads, k_mod = run(torch_ops.dsa_attention_glm, dtype)
    r_out, r_grads, r_mod = run(reference.dsa_attention_glm, FP32)
    assert len(k_out) == len(r_out) == (2 if attn == "eager" else 1)
    for i, (a, b) in enumerate(zip(k_out, r_out)):
        assert a.dtype == dtype
        assert_close(a, b, dtype, f"output {i}")
    for what, a, b in zip(names + ("kv_b_proj.weight",), k_grads[:4] + k_grads[-1:], r_grads[:4] + r_grads[-1:]):
        assert a is not None and b is not None and float(b.abs().max()) > 0, what
        assert_close(a, b, dtype, f"grad of {what}")
    # the projections before the latents get no gradient from this op
    assert k_mod.q_a_proj.weight.grad is None and r_mod.q_a_proj.weight.grad is None


def test_attention_on_strided_views_and_a_single_token():
    """As the model calls it: q_pass/q_rot split from the transposed q_b_proj output, k_pass/k_rot views of
    the compressed KV (not contiguous), and one token (S = T = 1); the torch kernel is upstream's bit for
    bit, the reference agrees."""
    config = make_config("eager")
    module = randomize(glm.GlmMoeDsaAttention(config, 0))
    gen = torch.Generator().manual_seed(9)
    for seq in (7, 1):
        heads, nope, rope, rank = 3, config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank
        q = torch.randn(2, seq, heads * (nope + rope), generator=gen).view(2, seq, heads, nope + rope).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
        kv = torch.randn(2, seq, rank + rope + 3, generator=gen)[..., : rank + rope]
        k_pass, k_rot = (x.unsqueeze(1) for x in torch.split(kv, [rank, rope], dim=-1))
        assert not (q_pass.is_contiguous() or q_rot.is_contiguous() or k_pass.is_contiguous() or k_rot.is_contiguous())
        allowed = visible(2, [seq, seq], None, seq)
        k = min(config.index_topk, seq)  # row s picks s, s-1, ... (wrapping round to hidden keys)
        topk = (torch.arange(seq).view(-1, 1) - torch.arange(k)).remainder(seq).to(torch.int32).expand(2, -1, -1)
        mask = as_mask(allowed, "float", FP32).unsqueeze(1)
        args = (q_pass, q_rot, k_pass, k_rot, topk, mask)
        expected = upstream_attention(module, *args)
        got = torch_ops.dsa_attention_glm(module, *args)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        ref = reference.dsa_attention_glm(module, *args)
        assert_close(got[0], ref[0], FP32, f"output, S={seq}")
        assert_close(got[1], ref[1], FP32, f"weights, S={seq}")


def test_attention_torch_kernel_reruns_are_bitwise_equal():
    config = make_config("eager")
    module = randomize(glm.GlmMoeDsaAttention(config, 0))
    allowed = visible(2, [9, 6], None, 11)
    t = attention_inputs(config, 2, 11, allowed)
    mask = as_mask(allowed, "float", FP32).unsqueeze(1)

    def run():
        leaves = [leaf(t[n], "cpu", FP32) for n in ("q_pass", "q_rot", "k_pass", "k_rot")]
        module.zero_grad(set_to_none=True)
        return forward_backward(lambda: torch_ops.dsa_attention_glm(module, *leaves, t["topk"], mask), leaves, [module])

    (out1, grads1), (out2, grads2) = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(out1, out2))
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(grads1, grads2))


def test_attention_torch_kernel_writes_the_expanded_cache_as_transformers_5_17():
    """`past_key_values` given: the kernel caches the expanded K/V (what 5.17's forward does after
    expand_kv) and attends over the cached keys; a second call (one token) sees all of them."""
    from transformers import DynamicCache

    config = make_config("eager")
    module = randomize(glm.GlmMoeDsaAttention(config, 0))
    t = attention_inputs(config, 1, 9, visible(1, [9], None, 9))
    ours, theirs = DynamicCache(config=config), DynamicCache(config=config)
    for start, stop in ((0, 8), (8, 9)):
        part = {n: t[n][:, :, start:stop] for n in ("q_pass", "q_rot", "k_pass", "k_rot")}
        topk = torch.arange(stop, dtype=torch.int32).flip(0)[: config.index_topk].expand(1, stop - start, -1)
        mask = as_mask(visible(1, [stop], None, stop - start, past=start), "float", FP32).unsqueeze(1)
        got = torch_ops.dsa_attention_glm(
            module, part["q_pass"], part["q_rot"], part["k_pass"], part["k_rot"], topk, mask, past_key_values=ours
        )
        key_states, value_states = module.expand_kv(part["k_pass"], part["k_rot"])
        theirs.update(key_states, value_states, 0)
        assert torch.equal(ours.layers[0].keys, theirs.layers[0].keys)
        assert torch.equal(ours.layers[0].values, theirs.layers[0].values)
        assert ours.layers[0].keys.shape[2] == stop and got[0].shape == (1, stop - start, 3, 5)


def test_attention_reference_gives_zeros_where_a_row_sees_no_selected_key():
    config = make_config("sdpa")
    module = randomize(glm.GlmMoeDsaAttention(config, 0))
    allowed = visible(1, [6], None, 6)
    t = attention_inputs(config, 1, 6, allowed)
    topk = t["topk"].clone()
    topk[0, 2] = torch.tensor([3, 4, 5, 0, 1], dtype=torch.int32)
    allowed[0, 2, :2] = False  # row 2 sees keys 0..2, of which only 0 and 1 are picked: hide them
    out, _ = reference.dsa_attention_glm(
        module, t["q_pass"], t["q_rot"], t["k_pass"], t["k_rot"], topk, allowed.unsqueeze(1)
    )
    assert torch.equal(out[0, 2], torch.zeros_like(out[0, 2])) and bool(out[0, 3].abs().sum() > 0)


def test_references_refuse_what_they_do_not_compute():
    config = make_config("eager")
    module = randomize(glm.GlmMoeDsaAttention(config, 0))
    t = attention_inputs(config, 1, 6, visible(1, [6], None, 6))
    args = (t["q_pass"], t["q_rot"], t["k_pass"], t["k_rot"], t["topk"], torch.zeros(1, 1, 6, 6))
    with pytest.raises(ValueError) as err:
        reference.dsa_attention_glm(module, *args, past_key_values=object())
    assert str(err.value) == ("reference.dsa_attention_glm: no cache of expanded K/V (Transformers < 5.23 generation)")
    module.attention_dropout = 0.1
    with pytest.raises(ValueError) as err:
        reference.dsa_attention_glm(module.train(), *args)
    assert str(err.value) == "reference.dsa_attention_glm: attention dropout in training is not computed"
    module.kv_b_proj.bias = torch.nn.Parameter(torch.zeros(module.kv_b_proj.out_features))
    with pytest.raises(ValueError) as err:
        reference.glm_absorbed_weights(module)
    assert str(err.value) == (
        "dsa_attention/glm: kv_b_proj has a bias, which the latent form does not fold in; use 'eager'"
    )


def test_index_scores_reference_is_the_indexer_formula():
    """`reference.dsa_index_scores` (also the reference of a native scores kernel) against the
    formula written out with loops, and its `limit`."""
    gen = torch.Generator().manual_seed(11)
    q, k, w = torch.randn(2, 3, 4, 5, generator=gen), torch.randn(2, 7, 5, generator=gen), torch.rand(2, 3, 4)
    limit = torch.tensor([[1, 4, 7], [0, 2, 6]])
    got = reference.dsa_index_scores(q, k, w, 0.5, limit)
    for b in range(2):
        for s in range(3):
            for t in range(7):
                want = sum(float(w[b, s, h]) * max(float(q[b, s, h] @ k[b, t]), 0.0) * 0.5 for h in range(4))
                if t >= limit[b, s]:
                    assert got[b, s, t] == float("-inf")
                else:
                    assert abs(float(got[b, s, t]) - want) <= 1e-5 * max(1.0, abs(want))
    assert TOLERANCES[FP32]  # the harness's tolerances are the ones used above
