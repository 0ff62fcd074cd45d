"""DeepSeek-V4's ops (docs/ops.md): mhc/pre, mhc/post, mhc/head, swiglu_mlp/clamped, moe/clamped,
dsa_indexer/deepseek_v4 and dsa_attention/deepseek_v4.

- The fp32 references (`opslot.reference`) against upstream's modules (the installed Transformers'
  `modeling_deepseek_v4`): bit for bit on the CPU, and so are the `torch` kernels, but two that
  organise the work differently and are close: moe/clamped (sorted per-expert matmuls) and
  dsa_attention/deepseek_v4 (the heads of a row as one product against the shared K=V head).
- The `torch` kernels against the references (kernel_harness.compare): outputs and the gradients of
  every input and parameter (mHC's `fn`, `base`, `scale`; the sinks), fp32 and bf16, odd sizes, a
  single token and empty inputs, non-contiguous inputs; the clamped SwiGLU with pre-activations
  beyond the limit on both sides.
- The indexer without a cache, with one (a prefill, then token by token: the cache's state as
  upstream leaves it), keys not yet complete (-1), no key at all, the query chunking.
- Refusals: a non-SiLU MLP, attention without sinks or with more than one K=V head.
"""

import copy
import types

import pytest
import torch
import torch.nn as nn

from kernel_harness import DTYPES, compare
from opslot import KERNEL_REGISTRY, reference
from opslot.kernels import torch_ops

v4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=gen(seed)) * scale


def kernel(op, variant):
    return KERNEL_REGISTRY.resolve(op, variant, "torch")


def config(hidden=24, hc_mult=3, **kwargs):
    """A tiny DeepseekV4Config: odd widths (hidden 24, hc_mult 3, 3 heads of 8)."""
    from transformers import DeepseekV4Config

    base = dict(
        vocab_size=64,
        hidden_size=hidden,
        moe_intermediate_size=10,
        num_hidden_layers=2,
        num_attention_heads=3,
        head_dim=8,
        q_lora_rank=12,
        n_routed_experts=5,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "compressed_sparse_attention"],
        mlp_layer_types=["moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        hc_mult=hc_mult,
        hc_sinkhorn_iters=4,
        sliding_window=6,
        o_groups=3,
        o_lora_rank=4,
        index_n_heads=3,
        index_head_dim=8,
        index_topk=3,
        partial_rotary_factor=0.5,
        swiglu_limit=0.7,
        max_position_embeddings=256,
    )
    base.update(kwargs)
    return DeepseekV4Config(**base)


def randomized(module, seed):
    """`module` with every parameter N(0, 0.3) (norm weights around 1), in fp32, in train mode."""
    g = gen(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            centre = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(centre + 0.3 * torch.randn(p.shape, generator=g))
    return module


def hyper_connection(seed=1, **kwargs):
    return randomized(v4.DeepseekV4HyperConnection(config(**kwargs)), seed)


def hyper_head(seed=2, **kwargs):
    return randomized(v4.DeepseekV4HyperHead(config(**kwargs)), seed)


# -- references and torch kernels against upstream's modules, bit for bit (CPU fp32) ------------------
@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (3, 0)], ids=["2x5", "single", "empty"])
def test_mhc_equals_upstream(shape):
    hc = hyper_connection()
    head = hyper_head()
    x = randn(*shape, 3, 24, seed=3)
    expected = hc(x)
    for fn in (reference.mhc_pre, kernel("mhc", "pre")):
        got = fn(hc, x)
        assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, expected)), fn
    assert [t.shape for t in expected] == [(*shape, 3), (*shape, 3, 3), (*shape, 24)]
    for fn in (reference.mhc_head, kernel("mhc", "head")):
        assert torch.equal(fn(head, x), head(x))
    post, comb, _ = expected
    block = randn(*shape, 24, seed=4)
    upstream = post.unsqueeze(-1) * block.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)
    for fn in (reference.mhc_post, kernel("mhc", "post")):
        assert torch.equal(fn(post, comb, block, x), upstream)


def test_mhc_pre_is_doubly_stochastic():
    """The Sinkhorn iterations make comb's rows and columns sum to about 1 (a property of upstream's math
    that a kernel must keep), and post lies in (0, 2)."""
    post, comb, _ = kernel("mhc", "pre")(hyper_connection(hc_sinkhorn_iters=20), randn(2, 4, 3, 24, seed=5))
    ones = torch.ones(2, 4, 3)
    torch.testing.assert_close(comb.sum(-1), ones, atol=1e-3, rtol=0)
    torch.testing.assert_close(comb.sum(-2), ones, atol=1e-5, rtol=0)
    assert bool((post > 0).all() and (post < 2).all())


def test_clamped_swiglu_equals_upstream():
    cfg = config()
    mlp = randomized(v4.DeepseekV4MLP(cfg), 6)
    experts = randomized(v4.DeepseekV4Experts(cfg), 7)
    x = randn(2, 5, 24, seed=8, scale=3.0)
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    assert bool((gate > cfg.swiglu_limit).any() and (up < -cfg.swiglu_limit).any() and (up > cfg.swiglu_limit).any())
    for fn in (reference.swiglu_mlp_clamped, kernel("swiglu_mlp", "clamped")):
        assert torch.equal(fn(mlp, x), mlp(x))
    index, weights = _routing(10, 5, 2, seed=9)
    flat = x.view(-1, 24)
    assert torch.equal(reference.moe_clamped(experts, flat, index, weights), experts(flat, index, weights))
    torch.testing.assert_close(
        kernel("moe", "clamped")(experts, flat, index, weights), experts(flat, index, weights), rtol=1e-6, atol=1e-6
    )


def attention_module(seed=10):
    return randomized(v4.DeepseekV4Attention(config(), 1), seed)


def attention_inputs(batch=2, heads=3, seq=5, keys=9, dim=8, seed=11):
    q = randn(batch, heads, seq, dim, seed=seed)
    kv = randn(batch, 1, keys, dim, seed=seed + 1)
    mask = torch.zeros(batch, 1, seq, keys)
    mask[..., keys - 2 :] = float("-inf")  # masked keys (compressed entries not selected)
    mask[0, :, 0, :] = torch.finfo(torch.float32).min  # a query that sees no key: the sink takes it all
    return q, kv, mask


def test_dsa_attention_equals_upstream():
    """The reference is upstream's eager attention bit for bit; the torch kernel, whose products take the
    heads of a row as one matrix against the shared head, is close (another GEMM blocking)."""
    attn = attention_module()
    q, kv, mask = attention_inputs()
    for m in (mask, None):
        expected = v4.eager_attention_forward(attn, q, kv, kv, m, scaling=attn.scaling, dropout=0.0)
        kwargs = dict(dropout=0.0, scaling=attn.scaling, sliding_window=6, s_aux=attn.sinks)
        got = reference.dsa_attention_deepseek_v4(attn, q, kv, m, **kwargs)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        got = kernel("dsa_attention", "deepseek_v4")(attn, q, kv, m, **kwargs)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert expected[0].shape == (2, 5, 3, 8) and expected[1].shape == (2, 3, 5, 9)


def indexer_module(seed=12, **kwargs):
    return randomized(v4.DeepseekV4Indexer(config(**kwargs)), seed)


def indexer_inputs(batch, seq, seed, start=0):
    hidden = randn(batch, seq, 24, seed=seed)
    q_residual = randn(batch, seq, 12, seed=seed + 1)
    return hidden, q_residual, torch.arange(start, start + seq)[None].expand(batch, -1)


@pytest.mark.parametrize("seq", [13, 4, 3, 1], ids=["odd", "one_window", "no_window", "single"])
def test_dsa_indexer_equals_upstream(seq):
    ind = indexer_module()
    hidden, q_res, pos = indexer_inputs(2, seq, seed=13)
    expected = ind(hidden, q_res, pos, None, 0)
    windows = seq // 4
    assert expected.dtype == torch.int64 and expected.shape == (2, seq, min(3, windows))
    for fn in (reference.dsa_indexer_deepseek_v4, kernel("dsa_indexer", "deepseek_v4")):
        assert torch.equal(fn(ind, hidden, q_res, pos, None, 0), expected)
    if windows:  # queries before the first full window select nothing: -1
        assert bool((expected[:, :3] == -1).all()) and bool((expected[:, -1] >= 0).any())


def test_dsa_indexer_with_a_cache_equals_upstream():
    """A prefill of 6 tokens (one window, two left over), then token by token: the cache's buffers,
    overlap state and keys end as upstream leaves them, and every step's indices are upstream's."""
    from transformers import DynamicCache

    cfg = config()
    ind = indexer_module()
    hidden, q_res, pos = indexer_inputs(2, 11, seed=14)
    caches = [DynamicCache(config=cfg) for _ in range(3)]
    fns = [
        lambda *args: ind(*args),
        lambda *args: reference.dsa_indexer_deepseek_v4(ind, *args),
        lambda *args: kernel("dsa_indexer", "deepseek_v4")(ind, *args),
    ]
    steps = [(0, 6)] + [(t, t + 1) for t in range(6, 11)]
    for start, end in steps:
        part = (hidden[:, start:end], q_res[:, start:end], pos[:, start:end])
        outs = [fn(*part, cache, 1) for fn, cache in zip(fns, caches)]
        assert all(torch.equal(o, outs[0]) for o in outs[1:]), (start, end)
    layers = [c.layers[1] for c in caches]
    assert layers[0].entry_count["indexer"] == 2
    for layer in layers[1:]:
        assert layer.entry_count == layers[0].entry_count
        for state in ("compressed_kv", "buffer_kv", "buffer_gate", "overlap_kv", "overlap_gate"):
            assert torch.equal(getattr(layer, state)["indexer"], getattr(layers[0], state)["indexer"]), state


def test_dsa_indexer_chunks_the_queries(monkeypatch):
    """The torch kernel's scores in query chunks of any size give the same indices."""
    ind = indexer_module()
    hidden, q_res, pos = indexer_inputs(2, 17, seed=15)
    expected = reference.dsa_indexer_deepseek_v4(ind, hidden, q_res, pos, None, 0)
    for elements in (1, 2 * 3 * 4 * 5, 1 << 26):  # one query per chunk, 5 queries per chunk, all at once
        monkeypatch.setattr(torch_ops, "INDEX_SCORE_CHUNK", elements)
        assert torch.equal(torch_ops.dsa_indexer_deepseek_v4(ind, hidden, q_res, pos, None, 0), expected)


def test_dsa_indexer_bf16_equals_upstream(device):
    ind = copy.deepcopy(indexer_module()).to(device=device, dtype=torch.bfloat16)
    hidden, q_res, pos = (t.to(device) for t in indexer_inputs(2, 13, seed=16))
    hidden, q_res = hidden.bfloat16(), q_res.bfloat16()
    expected = ind(hidden, q_res, pos, None, 0)
    assert torch.equal(kernel("dsa_indexer", "deepseek_v4")(ind, hidden, q_res, pos, None, 0), expected)


def test_dsa_indexer_gives_no_gradient():
    ind = indexer_module()
    hidden, q_res, pos = indexer_inputs(1, 9, seed=17)
    hidden.requires_grad_()
    out = kernel("dsa_indexer", "deepseek_v4")(ind, hidden, q_res, pos, None, 0)
    assert not out.requires_grad and out.grad_fn is None


def test_torch_kernels_are_deterministic():
    """Two runs give the same bits, outputs and gradients."""
    hc, head, ind, attn = hyper_connection(), hyper_head(), indexer_module(), attention_module()
    mlp, experts = ClampedMLP(), ClampedExperts()
    x = randn(2, 5, 3, 24, seed=18)
    hidden, q_res, pos = indexer_inputs(2, 9, seed=19)
    q, kv, mask = attention_inputs()
    index, weights = _routing(10, 5, 2, seed=9)
    calls = [
        lambda: kernel("mhc", "pre")(hc, x),
        lambda: kernel("mhc", "head")(head, x),
        lambda: kernel("swiglu_mlp", "clamped")(mlp, x[:, :, 0] * 3),
        lambda: kernel("moe", "clamped")(experts, x[:, :, 0].reshape(10, 24), index, weights),
        lambda: kernel("dsa_attention", "deepseek_v4")(attn, q, kv, mask, scaling=0.3, s_aux=attn.sinks),
    ]
    for call in calls:
        runs = []
        for _ in range(2):
            for m in (hc, head, mlp, experts, attn):
                m.zero_grad(set_to_none=True)
            out = call()
            out = out if isinstance(out, tuple) else (out,)
            sum((o.float() * randn(*o.shape, seed=i)).sum() for i, o in enumerate(out)).backward()
            grads = [p.grad for m in (hc, head, mlp, experts, attn) for p in m.parameters() if p.grad is not None]
            runs.append([o.detach() for o in out] + grads)
        assert len(runs[0]) == len(runs[1]) and all(torch.equal(a, b) for a, b in zip(*runs))
    ind_out = [kernel("dsa_indexer", "deepseek_v4")(ind, hidden, q_res, pos, None, 0) for _ in range(2)]
    assert torch.equal(*ind_out)


# -- torch kernels against the fp32 references: outputs and gradients ------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (2, 0)], ids=["2x5", "single", "empty"])
def test_mhc_pre_kernel(device, dtype, shape):
    def call(f, t, m):
        return f(m[0], t["x"])

    k_out, _ = compare(
        kernel("mhc", "pre"),
        reference.mhc_pre,
        {"x": randn(*shape, 3, 24, seed=20)},
        call,
        device,
        dtype,
        modules=[hyper_connection()],
    )
    assert [o.dtype for o in k_out] == [torch.float32, torch.float32, dtype]  # post, comb fp32 as upstream


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_mhc_pre_kernel_gradients_reach_fn_base_scale(dtype):
    """Every parameter gets a non-zero gradient, and close to the reference's (compare checks it)."""
    hc = hyper_connection()
    _, grads = _kernel_grads(kernel("mhc", "pre"), hc, randn(2, 4, 3, 24, seed=21), dtype)
    assert set(grads) == {"fn", "base", "scale"} and all(float(g.abs().max()) > 0 for g in grads.values())


def _kernel_grads(fn, module, x, dtype):
    module = copy.deepcopy(module).to(dtype)
    x = x.to(dtype).requires_grad_()
    out = fn(module, x)
    out = out if isinstance(out, tuple) else (out,)
    sum((o.float() * randn(*o.shape, seed=40 + i)).sum() for i, o in enumerate(out)).backward()
    return x.grad, {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_mhc_pre_kernel_non_contiguous(device, dtype):
    """Streams given as a non-contiguous view (the streams axis last in memory) compute the same: bit for
    bit on the CPU; on CUDA the collapse's sum over the streams reduces in another order for another
    layout (as upstream's does), so within fp32 rounding there."""
    hc = copy.deepcopy(hyper_connection()).to(device=device, dtype=dtype)
    x = randn(2, 4, 3, 24, seed=22).to(device=device, dtype=dtype)
    view = x.transpose(2, 3).contiguous().transpose(2, 3)
    assert not view.is_contiguous()
    got, expected = kernel("mhc", "pre")(hc, view), kernel("mhc", "pre")(hc, x)
    if torch.device(device).type == "cpu":
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    else:
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (2, 0)], ids=["2x5", "single", "empty"])
def test_mhc_post_kernel(device, dtype, shape):
    post, comb, _ = reference.mhc_pre(hyper_connection(), randn(*shape, 3, 24, seed=23))
    t = {"post": post.detach(), "comb": comb.detach(), "block": randn(*shape, 24, seed=24), "x": randn(*shape, 3, 24)}

    def call(f, t, m):
        return f(t["post"].float(), t["comb"].float(), t["block"], t["x"])  # post/comb stay fp32, as upstream's

    compare(kernel("mhc", "post"), reference.mhc_post, t, call, device, dtype, out_dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (2, 0)], ids=["2x5", "single", "empty"])
def test_mhc_head_kernel(device, dtype, shape):
    compare(
        kernel("mhc", "head"),
        reference.mhc_head,
        {"x": randn(*shape, 3, 24, seed=25)},
        lambda f, t, m: f(m[0], t["x"]),
        device,
        dtype,
        modules=[hyper_head()],
        out_dtype=dtype,
    )


class ClampedMLP(nn.Module):
    def __init__(self, hidden=24, inter=10, limit=0.7, act="silu"):
        super().__init__()
        torch.manual_seed(26)
        self.config = types.SimpleNamespace(hidden_act=act)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.limit = limit


def limit_between(values: torch.Tensor) -> float:
    """A clamp limit that some of `values` exceed and some do not (in magnitude), in the widest gap
    between them of the middle half: no value lies within bf16's rounding of the limit, whose clamp
    (and gradient) would then flip between a bf16 kernel and the fp32 reference."""
    v = values.detach().abs().flatten().sort().values
    lo, hi = len(v) // 4, max(len(v) // 4 + 1, (3 * len(v)) // 4)
    gaps = v[lo + 1 : hi + 1] - v[lo:hi]
    i = int(gaps.argmax())
    limit = float(v[lo + i] + v[lo + i + 1]) / 2
    assert float(gaps[i]) > 0.02 * limit, "no gap wide enough: choose other data"
    return limit


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [7, 1, 0], ids=["odd", "single", "empty"])
def test_swiglu_mlp_clamped_kernel(device, dtype, rows):
    mlp = ClampedMLP()
    x = randn(2, rows, 24, seed=27, scale=4.0)  # pre-activations beyond +-limit on both sides
    if rows:
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        mlp.limit = limit_between(torch.cat([gate, up], dim=-1))
        assert bool((gate > mlp.limit).any() and (up.abs() > mlp.limit).any() and (gate.abs() < mlp.limit).any())
    compare(
        kernel("swiglu_mlp", "clamped"),
        reference.swiglu_mlp_clamped,
        {"x": x},
        lambda f, t, m: f(m[0], t["x"]),
        device,
        dtype,
        modules=[mlp],
        out_dtype=dtype,
    )


def test_swiglu_mlp_clamped_kernel_gradients_stop_at_the_clamps():
    """Beyond the limit a pre-activation gets no gradient (clamp's), within it the SwiGLU's."""
    mlp = ClampedMLP(hidden=2, inter=2, limit=1.0)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(torch.eye(2))
        mlp.up_proj.weight.copy_(torch.eye(2))
        mlp.down_proj.weight.copy_(torch.eye(2))
    x = torch.tensor([[3.0, 0.5]], requires_grad=True)  # gate 3 > 1 (clamped), up 3 > 1 (clamped); 0.5 free
    kernel("swiglu_mlp", "clamped")(mlp, x).sum().backward()
    half = torch.tensor(0.5)
    free = torch.sigmoid(half) * (1 + half * (1 - torch.sigmoid(half))) * half + torch.nn.functional.silu(half)
    torch.testing.assert_close(x.grad, torch.stack([torch.tensor(0.0), free])[None])


def test_swiglu_mlp_clamped_refuses_other_activation():
    with pytest.raises(
        ValueError, match=r"^swiglu_mlp computes SiLU gating but the model's hidden_act is 'gelu'; use 'eager'$"
    ):
        kernel("swiglu_mlp", "clamped")(ClampedMLP(act="gelu"), randn(1, 2, 24))


class ClampedExperts(nn.Module):
    def __init__(self, experts=5, hidden=24, inter=10, limit=0.7):
        super().__init__()
        torch.manual_seed(28)
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inter, hidden) * 0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, inter) * 0.3)
        self.act_fn = nn.SiLU()
        self.limit = limit


def _routing(tokens, experts, top_k, seed, unused=(), masked_rows=()):
    scores = torch.rand(tokens, experts, generator=gen(seed))
    scores[:, list(unused)] = -1  # experts nobody routes to
    weights, index = torch.topk(scores.softmax(-1), top_k, dim=-1)
    for row in masked_rows:
        index[row, -1] = experts  # the masking index: upstream skips it
    return index, weights / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens,masking", [(11, False), (11, True), (1, False), (0, False)])
def test_moe_clamped_kernel(device, dtype, tokens, masking):
    experts = ClampedExperts()
    index, weights = _routing(tokens, 5, 2, seed=29, unused=(3,), masked_rows=(1, 7) if masking else ())
    x = randn(tokens, 24, seed=30, scale=2.0)
    if tokens:
        routed = index.clamp(max=4)  # the pre-activations the routed experts compute (masked rows: any)
        h = torch.einsum("th,tkih->tki", x, experts.gate_up_proj[routed])
        experts.limit = limit_between(h)
        assert bool((h > experts.limit).any() and (h < -experts.limit).any() and (h.abs() < experts.limit).any())

    def call(f, t, m):
        return f(m[0], t["x"], index.to(t["x"].device), t["w"])

    compare(
        kernel("moe", "clamped"),
        reference.moe_clamped,
        {"x": x, "w": weights},
        call,
        device,
        dtype,
        modules=[experts],
        out_dtype=dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "batch,seq,keys,masked", [(2, 5, 9, True), (1, 1, 7, True), (2, 3, 4, False)], ids=["mask", "single", "nomask"]
)
def test_dsa_attention_kernel(device, dtype, batch, seq, keys, masked):
    attn = attention_module()
    q, kv, mask = attention_inputs(batch=batch, seq=seq, keys=keys)
    t = {"q": q, "kv": kv, "sinks": attn.sinks.detach()}
    if masked:
        t["mask"] = mask

    def call(f, t, m):
        mask_t = t.get("mask")
        if mask_t is not None:
            mask_t = mask_t.detach().to(t["q"].dtype)
        return f(m[0], t["q"], t["kv"], mask_t, dropout=0.0, scaling=0.35, sliding_window=6, s_aux=t["sinks"])

    k_out, _ = compare(
        kernel("dsa_attention", "deepseek_v4"),
        reference.dsa_attention_deepseek_v4,
        t,
        call,
        device,
        dtype,
        modules=[nn.Module().eval()],  # what the kernels read of the attention module: `training`
        out_dtype=dtype,
    )
    assert k_out[0].shape == (batch, seq, 3, 8) and k_out[1].shape == (batch, 3, seq, keys)


def test_dsa_attention_kernel_dropout_follows_the_module():
    """Dropout acts only in training (`module.training`), drawing what upstream draws."""
    attn = attention_module()
    q, kv, mask = attention_inputs()
    fn = kernel("dsa_attention", "deepseek_v4")
    outs = {}
    for training in (False, True):
        attn.train(training)
        torch.manual_seed(5)
        got = fn(attn, q, kv, mask, dropout=0.5, scaling=0.3, s_aux=attn.sinks)
        torch.manual_seed(5)
        expected = v4.eager_attention_forward(attn, q, kv, kv, mask, scaling=0.3, dropout=0.5)
        for a, b in zip(got, expected):  # the same elements dropped: the same random draws
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        outs[training] = got[1]
    dropped = (outs[True] == 0) & (outs[False] != 0)
    assert bool(dropped.any()) and torch.equal(outs[True][~dropped], 2 * outs[False][~dropped])


def test_dsa_attention_kernel_refusals():
    attn = attention_module()
    q, kv, mask = attention_inputs()
    fn = kernel("dsa_attention", "deepseek_v4")
    with pytest.raises(ValueError, match=r"^dsa_attention/deepseek_v4 needs the attention sinks"):
        fn(attn, q, kv, mask, scaling=0.3)
    with pytest.raises(
        ValueError,
        match=r"^dsa_attention/deepseek_v4 takes one shared K=V head \[B, 1, T, D\], got kv \(2, 3, 9, 8\)$",
    ):
        fn(attn, q, kv.expand(-1, 3, -1, -1), mask, scaling=0.3, s_aux=attn.sinks)
