"""dsa_index_scores (the lightning indexer's scores of DeepSeek sparse attention), impl `cuda`, and the
`cuda` kernels of dsa_indexer/glm and dsa_indexer/deepseek_v4.

- The scores against a float64 reference of the same (rounded) inputs: the -inf pattern exactly, every
  finite score within fp32 accumulation error of its magnitude (`scale * sum_h |w| sum_d |q k|`), and
  the relative L2 error; float32, float16 and bfloat16; odd sizes (heads, head dims and keys that are
  not multiples of the tiles, a head dim that is not a multiple of 8, heads 1 to 128), T = 1, S = 1,
  B > 1, empty inputs, no heads; limits (none, causal, random, negative, past T, all hidden);
  non-contiguous q (upstream V4's transposed view), k and weights; every element written (the caching
  allocator poisoned first); bitwise-equal reruns; opcheck; CUDA-graph capture; torch.compile; the bench
  library's warpgroup-MMA kernel (Hopper) against the mma.sync kernel, bit for bit.
- The slot kernels against upstream's own modules (the installed Transformers') and opslot's `torch`
  kernels: picked sets checked with a tolerance (a pick's reference score is at least the k-th best
  visible score minus the fp32 accumulation error; exactly min(k, visible) visible picks), bool and
  additive masks with padding, a cache (prefill then decode), determinism.
"""

import math

import pytest
import torch

from conftest import assert_close, bench_library, knob, launched, requires_cuda

DEV = "cuda"
pytestmark = requires_cuda


@pytest.fixture(autouse=True)
def _register_ops():
    from opslot.kernels.cuda import dsa_indexer  # noqa: F401  (registers torch.ops.opslot.dsa_index_scores)


def op(q, k, w, scale, limit=None):
    return torch.ops.opslot.dsa_index_scores(q, k, w, scale, limit)


def ref64(q, k, w, scale, limit=None):
    """(scores, magnitude) in float64: the exact scores of the given values and the bound of their
    terms, `scale * sum_h |w| sum_d |q k|` (fp32 accumulation error is a small multiple of it)."""
    qd, kd, wd = q.double(), k.double(), w.double()
    dots = torch.einsum("bshd,btd->bsht", qd, kd)
    scores = (torch.relu(dots) * wd.unsqueeze(-1)).sum(2) * scale
    mag = (torch.einsum("bshd,btd->bsht", qd.abs(), kd.abs()) * wd.abs().unsqueeze(-1)).sum(2) * abs(scale)
    if limit is not None:
        t = torch.arange(k.shape[1], device=k.device)
        scores = scores.masked_fill(t.view(1, 1, -1) >= limit.long().unsqueeze(-1), float("-inf"))
    return scores, mag


def check_scores(out, q, k, w, scale, limit=None, what=""):
    ref, mag = ref64(q, k, w, scale, limit)
    assert out.shape == ref.shape and out.dtype == torch.float32, what
    assert not torch.isnan(out).any(), f"{what}: NaN (an element not written?)"
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), f"{what}: -inf pattern differs"
    fin = torch.isfinite(ref)
    err = (out.double() - ref).abs()[fin]
    bound = (3e-5 * mag + 1e-30)[fin]
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{what}: error {worst:.3g} x the fp32 accumulation bound"
    if fin.any():
        assert_close(out[fin], ref[fin].float(), torch.float32, what)


def poison_allocator(numel):
    """Leaves a NaN-filled block in the caching allocator, which the op's output then likely reuses:
    an unwritten element shows as NaN."""
    torch.full((numel + 1024,), float("nan"), device=DEV)
    torch.cuda.synchronize()


def inputs(b, s, h, d, t, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(b, s, h, d, device=DEV, generator=g).to(dtype)
    k = torch.randn(b, t, d, device=DEV, generator=g).to(dtype)
    w = torch.randn(b, s, h, device=DEV, generator=g)
    return q, k, w


def causal(b, s, t):
    """Upstream's causal limit for the last s of t positions: query i sees keys <= t - s + i."""
    return (torch.arange(s, device=DEV, dtype=torch.int32) + (t - s + 1)).expand(b, s).contiguous()


SHAPES = [  # (B, S, H, D, T)
    (1, 300, 32, 128, 300),  # GLM-5's heads, several key tiles
    (2, 37, 64, 128, 91),  # DeepSeek-V4's heads, B > 1
    (1, 19, 5, 72, 1),  # odd heads, head dim a multiple of 8 but not of 16, one key
    (2, 33, 48, 24, 130),  # 3 m-tiles per query (two queries per block, a warp across them)
    (1, 7, 80, 8, 65),  # 5 m-tiles per query
    (1, 11, 90, 40, 77),  # 6 m-tiles per query: three warps a query, the block's fourth warp idle
    (1, 5, 3, 20, 9),  # head dim not a multiple of 8 (copied, zero-padded)
    (1, 9, 128, 128, 70),  # the most heads the 16-bit kernel takes
    (3, 1, 16, 32, 17),  # one query
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_scores_match_the_fp64_reference(shape, dtype):
    b, s, h, d, t = shape
    q, k, w = inputs(b, s, h, d, t, dtype, seed=sum(shape))
    scale = d**-0.5
    for limit in (None, causal(b, s, t), torch.randint(-2, t + 3, (b, s), device=DEV, dtype=torch.int32)):
        poison_allocator(b * s * t)
        out = op(q, k, w, scale, limit)
        check_scores(out, q, k, w, scale, limit, f"{shape} {dtype} limit={'none' if limit is None else 'given'}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_glm_shape_causal_2048(dtype):
    """GLM-5's indexer shape (32 heads of 128) at 2048 tokens, causal: many key tiles per block, the
    tiles past every query's limit skipped."""
    q, k, w = inputs(1, 2048, 32, 128, 2048, dtype, seed=5)
    limit = causal(1, 2048, 2048)
    poison_allocator(2048 * 2048)
    check_scores(op(q, k, w, 128**-0.5, limit), q, k, w, 128**-0.5, limit, "glm 2048")


def test_limit_edge_cases():
    q, k, w = inputs(2, 20, 32, 128, 100, torch.bfloat16, seed=7)
    cases = {
        "all hidden": torch.zeros(2, 20, dtype=torch.int32, device=DEV),
        "negative": torch.full((2, 20), -5, dtype=torch.int32, device=DEV),
        "past T": torch.full((2, 20), 1000, dtype=torch.int32, device=DEV),
        "exactly T": torch.full((2, 20), 100, dtype=torch.int32, device=DEV),
        "tile edges": torch.tensor([63, 64, 65, 1] * 5, dtype=torch.int32, device=DEV).expand(2, 20).contiguous(),
        "per batch": torch.stack([causal(1, 20, 100)[0], torch.arange(20, dtype=torch.int32, device=DEV) * 5]),
    }
    for name, limit in cases.items():
        out = op(q, k, w, 0.1, limit)
        check_scores(out, q, k, w, 0.1, limit, name)
    assert bool(torch.isneginf(op(q, k, w, 0.1, cases["all hidden"])).all())


def test_empty_and_degenerate_inputs():
    for b, s, h, d, t in [(2, 0, 32, 128, 5), (2, 5, 32, 128, 0), (0, 5, 32, 128, 5)]:
        for dtype in (torch.float32, torch.bfloat16):
            q, k, w = inputs(b, s, h, d, t, dtype)
            out = op(q, k, w, 0.5)
            assert out.shape == (b, s, t) and out.dtype == torch.float32
    for dtype in (torch.float32, torch.bfloat16):  # no heads: every visible score is 0
        q, k, w = inputs(2, 5, 0, 128, 7, dtype)
        out = op(q, k, w, 0.5, causal(2, 5, 7))
        assert torch.equal(out, ref64(q, k, w, 0.5, causal(2, 5, 7))[0].float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_inputs(dtype):
    b, s, h, d, t = 2, 40, 64, 128, 77
    g = torch.Generator(device=DEV).manual_seed(3)
    q = torch.randn(b, h, s, d, device=DEV, generator=g).to(dtype).transpose(1, 2)  # upstream V4's view
    k_wide = torch.randn(b, t, d + 8, device=DEV, generator=g).to(dtype)
    k_odd = torch.randn(b, t, d + 3, device=DEV, generator=g).to(dtype)  # a pitch not a multiple of 8
    w = torch.randn(b, h, s, device=DEV, generator=g).transpose(1, 2)
    limit = causal(b, s, t)
    for k in (k_wide[..., :d], k_odd[..., 3:]):
        out = op(q, k, w, 0.2, limit)
        check_scores(out, q, k, w, 0.2, limit, f"strides q {q.stride()} k {k.stride()}")
        assert torch.equal(out, op(q.contiguous(), k.contiguous(), w.contiguous(), 0.2, limit))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bitwise_deterministic(dtype):
    q, k, w = inputs(2, 700, 64, 128, 900, dtype, seed=11)
    limit = torch.randint(0, 901, (2, 700), device=DEV, dtype=torch.int32)
    first = op(q, k, w, 0.3, limit)
    for _ in range(2):
        assert torch.equal(op(q, k, w, 0.3, limit), first)


def _scores_kernels(q, k, w, limit=None):
    """Names of the scores kernels one call launches."""
    return launched(lambda: op(q, k, w, 0.5, limit), "scores_")


def _where_they_differ(a, b):
    """How two score tensors differ, for a failure message: how many elements, the first (b, s, t), the largest
    difference among finite ones, and NaNs."""
    bad = ~((a == b) | (a.isnan() & b.isnan()))
    first = tuple(bad.nonzero()[0].tolist())
    both = bad & a.isfinite() & b.isfinite()
    worst = (a - b).abs()[both].max().item() if both.any() else float("nan")
    return (
        f"{int(bad.sum())} of {a.numel()} elements, the first at {first} ({a[first].item()} against "
        f"{b[first].item()}), largest finite difference {worst:.3g}, NaNs {int(a.isnan().sum())}"
    )


WGMMA_SHAPES = [  # (B, S, H, D, T): Hp 16 / 32 / 64 / 128 (8, 4, 2, 1 queries a warpgroup), head dims 128 and 120
    (1, 300, 32, 128, 300),  # GLM-5's heads; 75 query blocks: a CTA of 2 or 4 warpgroups with one without queries
    (2, 37, 64, 128, 91),  # DeepSeek-V4's heads, B > 1, a partial key tile; 19 query blocks: the same for 3
    (1, 50, 16, 128, 200),
    (1, 9, 128, 120, 70),  # the most heads; a head dim of 120 (its last k-step half zero)
    (1, 17, 5, 128, 130),  # padding heads
    (1, 64, 30, 128, 1),  # one key
    (3, 1, 32, 128, 17),  # one query
    (1, 2048, 32, 128, 2048),  # many key tiles: every stage of the ring reused
]


def _wgmma_cases():
    """(q, k, w, limit) over WGMMA_SHAPES x four kinds of limit (none, causal, random with negative and past-T
    rows, all hidden: CTAs without a key tile), fp16 and bf16, and V4's strided q view."""
    cases = []
    for i, (b, s, h, d, t) in enumerate(WGMMA_SHAPES):
        dtype = torch.float16 if i % 3 == 1 else torch.bfloat16
        q, k, w = inputs(b, s, h, d, t, dtype, seed=40 + i)
        limits = [None, causal(b, s, t), torch.randint(-3, t + 4, (b, s), device=DEV, dtype=torch.int32)]
        limits.append(torch.zeros(b, s, dtype=torch.int32, device=DEV))
        cases += [(q, k, w, lim) for lim in limits]
    g = torch.Generator(device=DEV).manual_seed(9)
    qt = torch.randn(2, 64, 40, 128, device=DEV, generator=g).to(torch.bfloat16).transpose(1, 2)  # V4's view
    kt = torch.randn(2, 77, 136, device=DEV, generator=g).to(torch.bfloat16)[..., :128]
    cases.append((qt, kt, torch.randn(2, 40, 64, device=DEV, generator=g), causal(2, 40, 77)))
    return cases


def _probe():
    """GLM-5's heads: the warpgroup-MMA kernel's shape."""
    return inputs(1, 8, 32, 128, 70, torch.bfloat16)


def _production_kernel():
    """The scores kernel production runs on _probe(): the warpgroup-MMA one on compute capability 9.0."""
    return "scores_wgmma_kernel" if torch.cuda.get_device_capability() == (9, 0) else "scores_mma_kernel"


def test_wgmma_scores_kernel():
    """On compute capability 9.0 the 16-bit scores run the warpgroup-MMA kernel where it applies (head dims
    113-128, Hp 16/32/64/128), the mma.sync kernel elsewhere and on other GPUs; the scores match the fp64
    reference for every kind of limit and rerun bit for bit."""
    assert _scores_kernels(*_probe()) == {_production_kernel()}
    for h, d in ((48, 128), (32, 64), (32, 112)):  # Hp 48, fewer than 8 k-steps: the mma.sync kernel
        assert _scores_kernels(*inputs(1, 8, h, d, 70, torch.bfloat16)) == {"scores_mma_kernel"}
    cases = _wgmma_cases()
    got = [op(q, k, w, 0.3, lim) for q, k, w, lim in cases]
    for (q, k, w, lim), a in zip(cases, got):
        check_scores(a, q, k, w, 0.3, lim, f"q {tuple(q.shape)} {q.dtype} limit={'none' if lim is None else 'given'}")
    assert all(torch.equal(op(q, k, w, 0.3, lim), a) for (q, k, w, lim), a in zip(cases, got)), "reruns differ"


def test_wgmma_scores_kernel_gives_the_mma_sync_kernels_bits():
    """The bench library's opslot_dsa_scores_set_tuning(1) runs the mma.sync kernel where production runs the
    warpgroup-MMA one, 2 to 4 the warpgroup-MMA kernel with that many warpgroups a CTA: the same products added in
    the same order and the same epilogue, so the same bits for every shape and limit of _wgmma_cases (on GPUs other
    than Hopper all are the mma.sync kernel)."""
    cases = _wgmma_cases()
    hopper = torch.cuda.get_device_capability() == (9, 0)
    with bench_library() as lib:
        default = [op(q, k, w, 0.3, lim) for q, k, w, lim in cases]
        assert _scores_kernels(*_probe()) == {_production_kernel()}
        set_kernel = knob(lib, "opslot_dsa_scores_set_tuning", 1)
        assert set_kernel(5) != 0 and set_kernel(-1) != 0
        for kernel in (1, 2, 3, 4):
            assert set_kernel(kernel) == 0
            try:
                name = "scores_wgmma_kernel" if hopper and kernel > 1 else "scores_mma_kernel"
                assert _scores_kernels(*_probe()) == {name}
                for (q, k, w, lim), ref in zip(cases, default):
                    a = op(q, k, w, 0.3, lim)
                    what = (
                        f"kernel {kernel}: q {tuple(q.shape)} {q.dtype} k {tuple(k.shape)} "
                        f"limit={'none' if lim is None else 'given'}"
                    )
                    assert torch.equal(a, ref), f"{what}: the kernels differ: {_where_they_differ(a, ref)}"
            finally:
                assert set_kernel(0) == 0
        assert _scores_kernels(*_probe()) == {_production_kernel()}


def test_opcheck_graph_capture_and_compile():
    q, k, w = inputs(2, 33, 32, 128, 50, torch.bfloat16, seed=2)
    limit = causal(2, 33, 50)
    for args in ((q, k, w, 0.25, limit), (q.float(), k.float(), w, 0.25, None)):
        torch.library.opcheck(torch.ops.opslot.dsa_index_scores.default, args)
    expected = op(q, k, w, 0.25, limit)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op(q, k, w, 0.25, limit)  # warm-up on the side stream
        with torch.cuda.graph(graph, stream=stream):
            captured = op(q, k, w, 0.25, limit)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)
    compiled = torch.compile(lambda *a: op(*a).topk(8, dim=-1).values, fullgraph=True)
    assert torch.equal(compiled(q, k, w, 0.25, limit), expected.topk(8, dim=-1).values)


def test_refusals():
    q, k, w = inputs(1, 4, 32, 128, 6, torch.bfloat16)
    with pytest.raises(ValueError, match="forward only"):
        op(q.clone().requires_grad_(), k, w, 0.5)
    with torch.no_grad():
        op(q.clone().requires_grad_(), k, w, 0.5)  # fine under no_grad
    with pytest.raises(ValueError, match="up to 128 heads of dim up to 128"):
        op(*inputs(1, 4, 32, 136, 6, torch.bfloat16), 0.5)
    with pytest.raises(ValueError, match="up to 128 heads of dim up to 128"):
        op(*inputs(1, 4, 129, 64, 6, torch.float16), 0.5)
    q, k, w = inputs(1, 4, 129, 136, 6, torch.float32)  # the fp32 kernel takes them
    check_scores(op(q, k, w, 0.5), q, k, w, 0.5, None, "fp32 wide")


# -- the slot kernels against upstream's modules ------------------------------------------------------


def check_picks(picks, ref, mag, visible, top_k, what):
    """Tolerance-aware top-k check of int `picks [B, S, K']` (-1 = none) against float64 reference
    scores `ref [B, S, T]`: exactly min(top_k, visible) visible picks per row, all distinct, each with a
    reference score at least the row's min(top_k, visible)-th best visible score minus the fp32
    accumulation error of the row."""
    picks = picks.long()
    valid = picks >= 0
    safe = picks.clamp(min=0)
    want = visible.sum(-1).clamp(max=top_k)
    picked_visible = visible.gather(-1, safe) & valid
    assert torch.equal(picked_visible.sum(-1), want), f"{what}: number of visible picks"
    srt = picks.masked_fill(~valid, -1).sort(-1).values
    dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
    assert not bool(dup.any()), f"{what}: a key picked twice"
    ranked = ref.masked_fill(~visible, float("-inf")).sort(-1, descending=True).values
    kth = ranked.gather(-1, (want - 1).clamp(min=0).unsqueeze(-1))
    tol = 3e-5 * mag.amax(-1, keepdim=True) + 1e-30
    vals = ref.gather(-1, safe)
    ok = ~picked_visible | (vals >= kth - tol)
    assert bool(ok.all()), f"{what}: {int((~ok).sum())} picks below the k-th visible score"


def overlap(a, b):
    """Fraction of rows whose valid pick sets are equal."""
    a, b = a.long().sort(-1).values, b.long().sort(-1).values
    return (a == b).all(-1).float().mean().item()


def randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return module


def glm_setup(seed=0):
    glm = pytest.importorskip("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa")
    from transformers import GlmMoeDsaConfig

    config = GlmMoeDsaConfig(
        vocab_size=64,
        hidden_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        q_lora_rank=96,
        kv_lora_rank=64,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        index_n_heads=32,
        index_head_dim=128,
        index_topk=24,
        max_position_embeddings=4096,
    )
    module = randomize(glm.GlmMoeDsaIndexer(config, 0), seed).to(DEV, torch.bfloat16).eval()
    rotary = glm.GlmMoeDsaRotaryEmbedding(config).to(DEV)
    return glm, config, module, rotary


def glm_inputs(config, rotary, batch, seq, start=0, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(batch, seq, config.hidden_size, device=DEV, generator=g).bfloat16()
    q_resid = torch.randn(batch, seq, config.q_lora_rank, device=DEV, generator=g).bfloat16()
    pos = torch.arange(start, start + seq, device=DEV)[None].expand(batch, -1)
    return hidden, q_resid, rotary(hidden, pos), pos


def glm_masks(batch, seq, keys, pad):
    """(bool, additive bf16) masks [B, S, T]: causal over the last `seq` of `keys` positions, with the
    first pad[b] keys of row b hidden (left padding)."""
    i = torch.arange(seq, device=DEV).view(1, -1, 1) + (keys - seq)
    t = torch.arange(keys, device=DEV).view(1, 1, -1)
    shown = (t <= i) & (t >= torch.tensor(pad, device=DEV).view(-1, 1, 1))
    additive = torch.zeros(shown.shape, device=DEV, dtype=torch.bfloat16).masked_fill(
        ~shown, torch.finfo(torch.bfloat16).min
    )
    return shown, additive


def glm_reference(module, hidden, q_resid, pe, cache=None):
    from opslot import reference

    with torch.no_grad():
        q, k, w = reference.glm_indexer_inputs(module, hidden, q_resid, pe, cache)
    return ref64(q, k, w, module.softmax_scale)


def test_glm_indexer_matches_upstream():
    from opslot.kernels import torch_ops
    from opslot.kernels.cuda import dsa_indexer

    glm, config, module, rotary = glm_setup()
    batch, seq = 2, 300
    hidden, q_resid, pe, pos = glm_inputs(config, rotary, batch, seq)
    ref, mag = glm_reference(module, hidden, q_resid, pe)
    for mask in glm_masks(batch, seq, seq, pad=[0, 37]):
        visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
        ours = dsa_indexer.dsa_indexer_glm(module, hidden, q_resid, pe, mask, pos)
        assert ours.dtype == torch.int32 and ours.shape == (batch, seq, config.index_topk)
        check_picks(ours, ref, mag, visible, config.index_topk, f"cuda, {mask.dtype} mask")
        assert torch.equal(dsa_indexer.dsa_indexer_glm(module, hidden, q_resid, pe, mask, pos), ours)
        upstream = module(hidden, q_resid, pe, mask, pos)
        check_picks(upstream, ref, mag, visible, config.index_topk, f"upstream, {mask.dtype} mask")
        full = visible.sum(-1) >= config.index_topk  # rows where only visible keys are picked
        agree = overlap(ours[full], upstream[full])
        print(f"glm {mask.dtype}: {agree:.4f} of the full rows pick upstream's set")
        assert agree >= 0.97
        if hasattr(torch_ops, "dsa_indexer_glm"):
            theirs = torch_ops.dsa_indexer_glm(module, hidden, q_resid, pe, mask, pos)
            check_picks(theirs, ref, mag, visible, config.index_topk, "torch kernel")


def test_glm_indexer_with_a_cache():
    from transformers import DynamicCache

    from opslot.kernels.cuda import dsa_indexer

    glm, config, module, rotary = glm_setup(seed=3)
    caches = [DynamicCache(config=config) for _ in range(3)]
    total = 70
    hidden, q_resid, pe_all, pos = glm_inputs(config, rotary, 1, total, seed=4)
    for start, end in [(0, 60), (60, 61), (61, 62), (62, 70)]:
        part = (hidden[:, start:end], q_resid[:, start:end])
        pe = tuple(x[:, start:end] for x in pe_all)
        shown, _ = glm_masks(1, end - start, end, pad=[0])
        ours = dsa_indexer.dsa_indexer_glm(module, *part, pe, shown, pos[:, start:end], past_key_values=caches[0])
        upstream = module(*part, pe, shown, pos[:, start:end], past_key_values=caches[1])
        ref, mag = glm_reference(module, *part, pe, caches[2])
        check_picks(ours, ref, mag, shown, config.index_topk, f"cuda step {start}:{end}")
        assert ours.shape == upstream.shape
    assert torch.equal(caches[0].layers[0].indexer_keys, caches[1].layers[0].indexer_keys)


def test_glm_indexer_refuses_a_missing_mask():
    from opslot.kernels.cuda import dsa_indexer

    glm, config, module, rotary = glm_setup()
    hidden, q_resid, pe, pos = glm_inputs(config, rotary, 1, 8)
    with pytest.raises(ValueError, match="attention_mask is None"):
        dsa_indexer.dsa_indexer_glm(module, hidden, q_resid, pe, None, pos)
    with pytest.raises(ValueError, match="does not broadcast"):
        dsa_indexer.dsa_indexer_glm(module, hidden, q_resid, pe, torch.ones(1, 8, 5, dtype=torch.bool, device=DEV), pos)


def v4_setup(seed=0):
    v4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    from transformers import DeepseekV4Config

    config = DeepseekV4Config(
        vocab_size=64,
        hidden_size=256,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=64,
        q_lora_rank=96,
        n_routed_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "compressed_sparse_attention"],
        mlp_layer_types=["moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        hc_mult=2,
        sliding_window=16,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=64,
        index_head_dim=128,
        index_topk=12,
        max_position_embeddings=4096,
    )
    module = randomize(v4.DeepseekV4Indexer(config), seed).to(DEV, torch.bfloat16).eval()
    return v4, config, module


def v4_inputs(config, batch, seq, start=0, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(batch, seq, config.hidden_size, device=DEV, generator=g).bfloat16()
    q_res = torch.randn(batch, seq, config.q_lora_rank, device=DEV, generator=g).bfloat16()
    return hidden, q_res, torch.arange(start, start + seq, device=DEV)[None].expand(batch, -1)


def v4_check(module, ours, hidden, q_res, pos, cache, layer_idx, what):
    """check_picks of V4 picks against the reference's keys (advancing `cache` as upstream would)."""
    from opslot import reference

    with torch.no_grad():
        keys = reference.v4_indexer_keys(module, hidden, cache, layer_idx)
        q = reference.v4_indexer_queries(module, hidden, q_res, pos)
        w = reference.v4_index_weights(module, hidden)
    ref, mag = ref64(q, keys, w, module.scorer.softmax_scale)
    visible = torch.arange(keys.shape[1], device=DEV).view(1, 1, -1) < ((pos + 1) // module.compress_rate).unsqueeze(-1)
    check_picks(ours, ref, mag, visible.expand_as(ref), module.index_topk, what)


@pytest.mark.parametrize("seq", [203, 3, 1], ids=["long", "no_window", "single"])
def test_v4_indexer_matches_upstream(seq):
    from opslot.kernels import torch_ops
    from opslot.kernels.cuda import dsa_indexer

    v4, config, module = v4_setup()
    hidden, q_res, pos = v4_inputs(config, 2, seq)
    ours = dsa_indexer.dsa_indexer_deepseek_v4(module, hidden, q_res, pos, None, 1)
    upstream = module(hidden, q_res, pos, None, 1)
    assert ours.dtype == upstream.dtype == torch.int64 and ours.shape == upstream.shape
    assert torch.equal(dsa_indexer.dsa_indexer_deepseek_v4(module, hidden, q_res, pos, None, 1), ours)
    if seq >= 4:
        v4_check(module, ours, hidden, q_res, pos, None, 1, "cuda")
        v4_check(module, upstream, hidden, q_res, pos, None, 1, "upstream")
        assert torch.equal(ours == -1, upstream == -1)
        print(f"v4: {overlap(ours, upstream):.4f} of the rows pick upstream's set")
        assert overlap(ours, upstream) >= 0.97
        if hasattr(torch_ops, "dsa_indexer_deepseek_v4"):
            theirs = torch_ops.dsa_indexer_deepseek_v4(module, hidden, q_res, pos, None, 1)
            v4_check(module, theirs, hidden, q_res, pos, None, 1, "torch kernel")


def test_v4_indexer_with_a_cache():
    from transformers import DynamicCache

    from opslot.kernels.cuda import dsa_indexer

    v4, config, module = v4_setup(seed=5)
    caches = [DynamicCache(config=config) for _ in range(3)]
    hidden, q_res, pos = v4_inputs(config, 1, 50, seed=6)
    for start, end in [(0, 41), (41, 42), (42, 43), (43, 44), (44, 50)]:
        part = (hidden[:, start:end], q_res[:, start:end], pos[:, start:end])
        ours = dsa_indexer.dsa_indexer_deepseek_v4(module, *part, caches[0], 1)
        upstream = module(*part, caches[1], 1)
        assert ours.shape == upstream.shape and torch.equal(ours == -1, upstream == -1), (start, end)
        v4_check(module, ours, *part, caches[2], 1, f"cuda step {start}:{end}")
    layers = [c.layers[1] for c in caches[:2]]
    assert torch.equal(layers[0].compressed_kv["indexer"], layers[1].compressed_kv["indexer"])
