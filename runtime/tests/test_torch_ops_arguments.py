"""The argument checks every op of libopslot_torch.so (kernels/torch/*.cc) makes before a kernel reads
memory: tensors of one op on one device, and each argument whose shape follows from the others
(incoming gradients, the forward's saved statistics) of that shape. A kernel given a pointer to
another device's memory, or fewer elements than it reads, would fault or read past the tensor; each
case here is refused with a message naming the op and the argument.

Without a GPU the cases run on meta tensors (the ops' Meta kernels run the same check functions as
their CUDA kernels), the tensor on the wrong device a CPU one; with a GPU the same cases run on CUDA
tensors, so the CUDA kernels' checks are the ones tested. Last, seeded random calls of the DeepSeek
and GLM ops (whose CPU kernels compute) with hostile arguments: each runs or is refused by name."""

from __future__ import annotations

import random

import pytest
import torch

from test_kernel_library_symbols import _library

O = torch.ops.opslot  # noqa: E741
F32, BF16, I32, I64 = torch.float32, torch.bfloat16, torch.int32, torch.int64
DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])
SHARE = " (an op's tensors share one device)"


@pytest.fixture(scope="module", autouse=True)
def lib():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import _lib

    _lib.torch_ops()


@pytest.fixture(params=DEVICES)
def on(request):
    """`on(*shape, dtype=bf16)`: an uninitialised tensor on the device under test."""
    return lambda *shape, dtype=BF16: torch.zeros(shape, dtype=dtype, device=request.param)


def cpu(*shape, dtype=BF16):
    return torch.zeros(shape, dtype=dtype)


def expect(on, exc, message, call):
    """`call()` raises `exc` whose first line is `message`, with `DEV` the device under test."""
    with pytest.raises(exc) as info:
        call()
    assert str(info.value).splitlines()[0] == message.replace("DEV", str(on(1).device))


# -- SiLU·mul ------------------------------------------------------------------------------------
def test_silu_mul(on):
    expect(on, ValueError, "silu_mul: up is on cpu, gate on DEV" + SHARE, lambda: O.silu_mul(on(4, 8), cpu(4, 8)))
    expect(
        on, ValueError, "silu_mul_bwd: grad must be (4, 8), got (4,)", lambda: O.silu_mul_bwd(on(4), on(4, 8), on(4, 8))
    )
    expect(
        on,
        ValueError,
        "silu_mul_bwd: grad is on cpu, gate on DEV" + SHARE,
        lambda: O.silu_mul_bwd(cpu(4, 8), on(4, 8), on(4, 8)),
    )
    expect(
        on,
        ValueError,
        "silu_mul_clamped_bwd: grad must be (4, 8), got (4, 7)",
        lambda: O.silu_mul_clamped_bwd(on(4, 7), on(4, 8), on(4, 8), 7.0),
    )


# -- RMSNorm -------------------------------------------------------------------------------------
def test_rms_norm(on):
    rstd = on(4, dtype=F32)
    expect(
        on,
        ValueError,
        "rms_norm/standard: weight is on cpu, x on DEV" + SHARE,
        lambda: O.rms_norm_fwd(on(4, 8), None, cpu(8), 1e-6, 0),
    )
    expect(
        on,
        ValueError,
        "rms_norm_bwd: dy must be (4, 8), got (4, 7)",
        lambda: O.rms_norm_bwd(on(4, 7), on(4, 8), None, on(8), rstd, 0),
    )
    expect(
        on,
        ValueError,
        "rms_norm_bwd: rstd must be (4,), got (3,)",
        lambda: O.rms_norm_bwd(on(4, 8), on(4, 8), None, on(8), on(3, dtype=F32), 0),
    )
    expect(
        on,
        TypeError,
        "rms_norm_bwd: rstd must be torch.float32, got torch.bfloat16",
        lambda: O.rms_norm_bwd(on(4, 8), on(4, 8), None, on(8), on(4), 0),
    )
    expect(
        on,
        ValueError,
        "rms_norm/standard: weight is on cpu, x on DEV" + SHARE,
        lambda: O.rms_norm_bwd(on(4, 8), on(4, 8), None, cpu(8), rstd, 0),
    )
    expect(
        on,
        ValueError,
        "rms_norm_bwd: rstd is on cpu, x on DEV" + SHARE,
        lambda: O.rms_norm_bwd(on(4, 8), on(4, 8), None, on(8), cpu(4, dtype=F32), 0),
    )


# -- RoPE ----------------------------------------------------------------------------------------
def test_rope(on):
    q, k = on(2, 4, 8, 16), on(2, 1, 8, 16)
    expect(
        on,
        ValueError,
        "rotary_pos_emb: cos is on cpu, q on DEV" + SHARE,
        lambda: O.rope_fwd(q, k, cpu(2, 8, 16), cpu(2, 8, 16), 1),
    )
    expect(
        on,
        ValueError,
        "rotary_pos_emb: k is on cpu, q on DEV" + SHARE,
        lambda: O.rope_bwd(q, cpu(2, 1, 8, 16), on(2, 8, 16), on(2, 8, 16), 1),
    )
    expect(
        on,
        ValueError,
        "rotary_pos_emb/interleaved: k is on cpu, q on DEV" + SHARE,
        lambda: O.rope_interleaved_fwd(q, cpu(2, 1, 8, 16), on(2, 8, 16), on(2, 8, 16), 1),
    )
    expect(
        on,
        ValueError,
        "rotary_pos_emb_vision: cos is on cpu, q on DEV" + SHARE,
        lambda: O.rope_vision_fwd(on(8, 4, 16), on(8, 4, 16), cpu(8, 16, dtype=F32), on(8, 16, dtype=F32)),
    )
    expect(
        on,
        ValueError,
        "rotary_pos_emb/deepseek_v4: sin is on cpu, x on DEV" + SHARE,
        lambda: O.rope_deepseek_v4_fwd(on(2, 8, 4, 16), on(2, 8, 4), cpu(2, 8, 4), 2),
    )


# -- the load-balancing loss ---------------------------------------------------------------------
def test_load_balancing(on):
    logits, coef = [on(6, 4)], on(4, dtype=F32)
    expect(
        on,
        ValueError,
        "load_balancing_loss: mask is on cpu, router logits on DEV" + SHARE,
        lambda: O.load_balancing_loss_fwd(logits, cpu(6, dtype=F32), 4, 2),
    )
    expect(
        on,
        ValueError,
        "load_balancing_loss: no router logits",
        lambda: O.load_balancing_loss_bwd(on(dtype=F32), [], None, coef),
    )
    expect(
        on,
        ValueError,
        "load_balancing_loss_bwd: grad must be (), got (2,)",
        lambda: O.load_balancing_loss_bwd(on(2, dtype=F32), logits, None, coef),
    )
    expect(
        on,
        ValueError,
        "load_balancing_loss_bwd: coef must be (4,), got (3,)",
        lambda: O.load_balancing_loss_bwd(on(dtype=F32), logits, None, on(3, dtype=F32)),
    )
    expect(
        on,
        TypeError,
        "load_balancing_loss_bwd: coef must be torch.float32, got torch.bfloat16",
        lambda: O.load_balancing_loss_bwd(on(dtype=F32), logits, None, on(4)),
    )
    expect(
        on,
        ValueError,
        "load_balancing_loss_bwd: coef is on cpu, router logits on DEV" + SHARE,
        lambda: O.load_balancing_loss_bwd(on(dtype=F32), logits, None, cpu(4, dtype=F32)),
    )


# -- the gated delta rule ------------------------------------------------------------------------
def test_gated_delta_rule(on):
    B, T, H, D = 1, 70, 2, 16  # two 64-token chunks
    q, g = on(B, T, H, D), on(B, T, H, dtype=F32)
    saved = [on(2, H, 128, 128), on(2, H, 64, 128), on(2, H, 64, 128), on(2, H, 64, dtype=F32)]

    def bwd(dout, dfinal=None, hs=saved):
        return lambda: O.gdr_bwd(dout, dfinal, q, q, q, g, g, *hs, None, True, 0.25)

    expect(
        on,
        ValueError,
        "chunk_gated_delta_rule: beta is on cpu, query on DEV" + SHARE,
        lambda: O.gdr_fwd(q, q, q, g, cpu(B, T, H, dtype=F32), None, None, True, 0.25),
    )
    expect(
        on,
        ValueError,
        "chunk_gated_delta_rule: initial_state is on cpu, query on DEV" + SHARE,
        lambda: O.gdr_fwd(q, q, q, g, g, cpu(B, H, D, D, dtype=F32), None, True, 0.25),
    )
    expect(on, ValueError, "gdr_bwd: dout must be (1, 70, 2, 16), got (1, 64, 2, 16)", bwd(on(B, 64, H, D)))
    expect(
        on,
        ValueError,
        "gdr_bwd: dfinal must be (1, 2, 16, 16), got (1, 2, 16)",
        bwd(on(B, T, H, D), on(B, H, D, dtype=F32)),
    )
    expect(
        on,
        ValueError,
        "gdr_bwd: h must be (2, 2, 128, 128), got (1, 2, 128, 128)",
        bwd(on(B, T, H, D), hs=[on(1, H, 128, 128)] + saved[1:]),
    )
    expect(
        on,
        TypeError,
        "gdr_bwd: gamma must be torch.float32, got torch.bfloat16",
        bwd(on(B, T, H, D), hs=saved[:3] + [on(2, H, 64)]),
    )
    expect(
        on,
        TypeError,
        "gdr_bwd: w must be torch.bfloat16 (the query's dtype), got torch.float32",
        bwd(on(B, T, H, D), hs=saved[:2] + [on(2, H, 64, 128, dtype=F32)] + saved[3:]),
    )
    expect(on, ValueError, "gdr_bwd: dout is on cpu, query on DEV" + SHARE, bwd(cpu(B, T, H, D)))


# -- DeepSeek-V4's hyper-connections -------------------------------------------------------------
def test_mhc(on):
    B, S, N, D = 2, 3, 4, 8
    M = (2 + N) * N
    x, fn, base, scale = on(B, S, N, D), on(M, N * D, dtype=F32), on(M, dtype=F32), on(3, dtype=F32)
    mix, rstd = on(B * S, M, dtype=F32), on(B * S, dtype=F32)
    post, comb = on(B, S, N, dtype=F32), on(B, S, N, N, dtype=F32)

    def pre_bwd(gp=None, gc=None, gx=None, mix=mix, iters=20):
        return lambda: O.mhc_pre_bwd(gp, gc, gx, x, fn, base, scale, mix, rstd, iters, 1e-6, 1e-6)

    expect(
        on,
        ValueError,
        "mhc/pre: fn is on cpu, x on DEV" + SHARE,
        lambda: O.mhc_pre_fwd(x, cpu(M, N * D, dtype=F32), base, scale, 20, 1e-6, 1e-6),
    )
    expect(
        on,
        ValueError,
        "mhc/pre: hc_sinkhorn_iters -1 is not supported by the cuda kernels (0 to 1048576); use "
        "mhc_implementation 'torch' or 'eager'",
        lambda: O.mhc_pre_fwd(x, fn, base, scale, -1, 1e-6, 1e-6),
    )
    expect(
        on,
        ValueError,
        "mhc/pre: hc_sinkhorn_iters 1601 is not supported by the cuda kernels (0 to 1600; the backward "
        "keeps every step); use mhc_implementation 'torch' or 'eager'",
        pre_bwd(iters=1601),
    )
    expect(on, ValueError, "mhc/pre: mix must be (6, 24), got (2, 3, 24)", pre_bwd(mix=on(B, S, M, dtype=F32)))
    expect(on, ValueError, "mhc/pre: grad_post must be (2, 3, 4), got (6, 4)", pre_bwd(gp=on(B * S, N, dtype=F32)))
    expect(
        on,
        ValueError,
        "mhc/pre: grad_comb must be (2, 3, 4, 4), got (2, 3, 16)",
        pre_bwd(gc=on(B, S, N * N, dtype=F32)),
    )
    expect(on, ValueError, "mhc/pre: grad_collapsed must be (2, 3, 8), got (2, 3, 4)", pre_bwd(gx=on(B, S, 4)))
    expect(on, ValueError, "mhc/pre: grad_collapsed is on cpu, x on DEV" + SHARE, pre_bwd(gx=cpu(B, S, D)))
    expect(
        on,
        ValueError,
        "mhc/head: grad must be (2, 3, 8), got (2, 3, 4, 8)",
        lambda: O.mhc_head_bwd(x, x, fn[:N], base[:N], scale[:1], on(B * S, N, dtype=F32), rstd, 1e-6, 1e-6),
    )
    expect(
        on,
        ValueError,
        "mhc/head: the streams' hidden size is 0, got shape (2, 3, 4, 0)",
        lambda: O.mhc_head_fwd(on(B, S, N, 0), on(N, 0, dtype=F32), base[:N], scale[:1], 1e-6, 1e-6),
    )
    expect(
        on,
        ValueError,
        "mhc/post: comb is on cpu, hidden_states on DEV" + SHARE,
        lambda: O.mhc_post(post, cpu(B, S, N, N, dtype=F32), on(B, S, D), x),
    )
    expect(
        on,
        ValueError,
        "mhc/post: grad must be (2, 3, 4, 8), got (2, 3, 8)",
        lambda: O.mhc_post_bwd(on(B, S, D), post, comb, on(B, S, D), x),
    )


def test_mhc_cpu_kernels_refuse_what_the_cuda_kernels_refuse():
    """The CPU kernels (the CPU tests' stand-in for the GPU) check hc_sinkhorn_iters as the CUDA
    kernels do, before any work."""
    B, S, N, D = 1, 2, 2, 4
    M = (2 + N) * N
    x = torch.randn(B, S, N, D)
    fn, base, scale = torch.randn(M, N * D), torch.zeros(M), torch.ones(3)
    with pytest.raises(ValueError, match=r"^mhc/pre: hc_sinkhorn_iters 1601 is not supported"):
        O.mhc_pre_bwd(None, None, None, x, fn, base, scale, torch.zeros(B * S, M), torch.ones(B * S), 1601, 1e-6, 1e-6)
    with pytest.raises(ValueError, match=r"^mhc/pre: hc_sinkhorn_iters 1048577 is not supported"):
        O.mhc_pre_fwd(x, fn, base, scale, 2**20 + 1, 1e-6, 1e-6)
    post, comb, _, mix, rstd = O.mhc_pre_fwd(x, fn, base, scale, 1600, 1e-6, 1e-6)
    dx = O.mhc_pre_bwd(post, comb, None, x, fn, base, scale, mix, rstd, 1600, 1e-6, 1e-6)[0]
    assert dx.shape == x.shape and torch.isfinite(dx).all()


# -- the MoE experts -----------------------------------------------------------------------------
def test_moe(on):
    T, K, H, E, N = 3, 2, 8, 2, 16
    inv, offs, rexp = on(T * K, dtype=I32), on(E, dtype=I32), on(T * K, dtype=I32)
    w = on(T, K, dtype=F32)
    expect(
        on,
        ValueError,
        "moe_gather: offs is on cpu, x on DEV" + SHARE,
        lambda: O.moe_gather(on(T, H), inv, cpu(E, dtype=I32), K),
    )
    expect(
        on,
        ValueError,
        "moe_gather_backward: grad's 3 rows are not top_k (2) per token",
        lambda: O.moe_gather_backward(on(T, H), inv, offs, K),
    )
    expect(
        on,
        ValueError,
        "moe_gather_backward: inv must be (4,), got (6,)",
        lambda: O.moe_gather_backward(on(4, H), inv, offs, K),
    )
    expect(on, ValueError, "moe_gather: inv must be (4,), got (6,)", lambda: O.moe_gather(on(2, H), inv, offs, K))
    expect(
        on,
        TypeError,
        "moe_gather: inv must be torch.int32, got torch.int64",
        lambda: O.moe_gather(on(T, H), on(T * K, dtype=I64), offs, K),
    )
    expect(
        on,
        ValueError,
        "moe_gather: inv must be contiguous",
        lambda: O.moe_gather(on(T, H), on(T * K * 2, dtype=I32)[::2], offs, K),
    )
    expect(on, ValueError, "moe_gather: top_k must be at least 1, got 0", lambda: O.moe_gather(on(T, H), inv, offs, 0))
    expect(
        on,
        TypeError,
        "moe_combine: weights must be torch.float32, got torch.bfloat16",
        lambda: O.moe_combine(on(T * K, H), inv, offs, on(T, K), rexp, None),
    )
    expect(
        on,
        ValueError,
        "moe_combine: row_expert must be (6,), got (3,)",
        lambda: O.moe_combine(on(T * K, H), inv, offs, w, on(T, dtype=I32), None),
    )
    expect(
        on,
        TypeError,
        "moe_combine: bias must be torch.bfloat16 (the rows' dtype), got torch.float32",
        lambda: O.moe_combine(on(T * K, H), inv, offs, w, rexp, on(E, H, dtype=F32)),
    )
    expect(
        on,
        ValueError,
        "moe_act: bias must be (2, 32), got (3, 32)",
        lambda: O.moe_act(on(T * K, 2 * N), offs, rexp, on(3, 2 * N), 1, 1.702, 7.0),
    )
    expect(
        on,
        TypeError,
        "moe_grouped_mm: w must be torch.bfloat16 (a's dtype), got torch.float32",
        lambda: O.moe_grouped_mm(on(T * K, H), on(E, H, N, dtype=F32), offs, False),
    )
    expect(
        on,
        ValueError,
        "moe_grouped_mm: w must be [experts, out, 8] for a of shape (6, 8), got (2, 8, 16)",
        lambda: O.moe_grouped_mm(on(T * K, H), on(E, H, N), offs, True),
    )
    expect(
        on,
        ValueError,
        "moe_grouped_mm: offs must be (3,), got (2,)",
        lambda: O.moe_grouped_mm(on(T * K, H), on(3, H, N), offs, False),
    )
    expect(
        on,
        ValueError,
        "moe_combine: row_expert is on cpu, rows on DEV" + SHARE,
        lambda: O.moe_combine(on(T * K, H), inv, offs, w, cpu(T * K, dtype=I32), None),
    )
    expect(
        on,
        ValueError,
        "moe_combine_backward: grad must be (3, 8), got (6, 8)",
        lambda: O.moe_combine_backward(on(T * K, H), on(T * K, H), inv, offs, w, rexp, None),
    )
    expect(
        on,
        ValueError,
        "moe_act_backward: grad must be (6, 16), got (6, 32)",
        lambda: O.moe_act_backward(on(T * K, 2 * N), on(T * K, 2 * N), offs, rexp, None, 0, 1.0, 7.0),
    )
    expect(
        on,
        ValueError,
        "moe_grouped_mm: w is on cpu, a on DEV" + SHARE,
        lambda: O.moe_grouped_mm(on(T * K, H), cpu(E, H, N), offs, False),
    )
    expect(
        on,
        ValueError,
        "moe_grouped_mm_backward: grad must be (6, 16), got (6, 8)",
        lambda: O.moe_grouped_mm_backward(on(T * K, H), on(T * K, H), on(E, H, N), offs, False),
    )


# -- cross-entropy -------------------------------------------------------------------------------
def test_cross_entropy(on):
    logits, targets = on(6, 10), on(6, dtype=I64)
    expect(
        on,
        ValueError,
        "ce_logits_fwd: targets must be (6,), got (5,)",
        lambda: O.ce_logits_fwd(logits, on(5, dtype=I64), None, 1.0, 1, -100, False),
    )
    expect(
        on,
        TypeError,
        "ce_logits_fwd: targets must be torch.int64, got torch.int32",
        lambda: O.ce_logits_fwd(logits, on(6, dtype=I32), None, 1.0, 1, -100, False),
    )
    expect(
        on,
        ValueError,
        "ce_logits_fwd: targets is on cpu, logits on DEV" + SHARE,
        lambda: O.ce_logits_fwd(logits, cpu(6, dtype=I64), None, 1.0, 1, -100, False),
    )
    expect(
        on,
        ValueError,
        "ce_linear_fwd: weight must be [vocab, 8], got shape (10, 4)",
        lambda: O.ce_linear_fwd(on(6, 8), on(10, 4), targets, None, 1.0, 1, -100, 4, False, False),
    )
    expect(
        on,
        ValueError,
        "ce_linear_fwd: weight is on cpu, hidden on DEV" + SHARE,
        lambda: O.ce_linear_fwd(on(6, 8), cpu(10, 8), targets, None, 1.0, 1, -100, 4, False, False),
    )


# -- DeepSeek sparse attention -------------------------------------------------------------------
def test_sparse_attention(on):
    q, kv, idx = on(1, 4, 2, 64), on(1, 8, 64), on(1, 4, 3, dtype=I32)
    out, lse = on(1, 4, 2, 64), on(1, 4, 2, dtype=F32)
    expect(
        on,
        ValueError,
        "sparse_mqa_attention_bwd: lse is on cpu, q on DEV" + SHARE,
        lambda: O.sparse_mqa_attention_bwd(out, q, kv, idx, None, out, cpu(1, 4, 2, dtype=F32), 0.1, 64),
    )
    expect(
        on,
        ValueError,
        "sparse_mqa_attention_bwd: dout is on cpu, q on DEV" + SHARE,
        lambda: O.sparse_mqa_attention_bwd(cpu(1, 4, 2, 64), q, kv, idx, None, out, lse, 0.1, 64),
    )
    k, v = on(1, 2, 8, 64), on(1, 2, 8, 32)
    expect(
        on,
        ValueError,
        "sparse_mha_attention: v is on cpu, q on DEV" + SHARE,
        lambda: O.sparse_mha_attention(q, k, cpu(1, 2, 8, 32), idx, 0.1),
    )
    expect(
        on,
        ValueError,
        "sparse_mha_attention: indices is on cpu, q on DEV" + SHARE,
        lambda: O.sparse_mha_attention(q, k, v, cpu(1, 4, 3, dtype=I32), 0.1),
    )


# -- hostile arguments, at random ----------------------------------------------------------------
def _hostile_call(rng: random.Random, gen: torch.Generator):
    """One call of a DeepSeek/GLM op (their CPU kernels compute on CPU tensors) with shapes, dtypes,
    layouts and scalars drawn to be often inconsistent: (the op name its refusals start with, call)."""
    dtype = rng.choice([F32, BF16, torch.float16])

    def dim():
        return rng.choice([0, 1, 2, 3, 5, 8])

    def t(*shape, dt=None):
        dt = dt or dtype
        if dt == torch.bool:
            x = torch.rand(shape, generator=gen) > 0.5
        elif dt.is_floating_point:
            x = torch.randn(shape, generator=gen).to(dt)
        else:
            x = torch.randint(-3, 40, shape, generator=gen).to(dt)
        if rng.random() < 0.1 and x.dim() >= 2:
            x = x.transpose(-1, -2)
        return x

    def maybe(shape, other):
        return shape if rng.random() < 0.8 else other

    b, s, h, n = dim(), dim(), dim(), dim()
    kind = rng.choice(["topk", "mask_limit", "scores", "attn", "attn_bwd", "mha", "mask_idx", "pre", "head", "post"])
    if kind == "topk":
        scores = t(*[dim() for _ in range(rng.randint(0, 3))], dt=rng.choice([F32, F32, BF16]))
        lim = t(*scores.shape[:-1], dt=rng.choice([I32, I64])) if rng.random() < 0.3 and scores.dim() else None
        mask = t(*scores.shape, dt=rng.choice([torch.bool, F32, BF16])) if rng.random() < 0.3 else None
        return "topk_indices", lambda: O.topk_indices(scores, rng.choice([-1, 0, 1, 5, 2048]), lim, mask)
    if kind == "mask_limit":
        m = t(*[dim() for _ in range(rng.randint(0, 3))], dt=rng.choice([torch.bool, F32, I32]))
        return "mask_limit", lambda: O.mask_limit(m)
    if kind == "scores":
        d = rng.choice([0, 1, 32])
        q, k, w = t(b, s, h, d), t(*maybe([b, n, d], [b, n, 1, d])), t(*maybe([b, s, h], [s, h]), dt=F32)
        return "dsa_index_scores", lambda: O.dsa_index_scores(q, k, w, 0.1, None)
    if kind in ("attn", "attn_bwd"):
        d = rng.choice([0, 1, 16, 64])
        dv = rng.choice([-1, 0, 1, d, d + 1])
        q, kv = t(b, s, h, d), t(*maybe([b, n, d], [b, n, 1, d]))
        idx = torch.randint(-2, n + 3, (b, s, dim()), generator=gen).to(rng.choice([I32, I32, I64]))
        sinks = t(h, dt=F32) if rng.random() < 0.3 else None
        if kind == "attn":
            return "sparse_mqa_attention", lambda: O.sparse_mqa_attention(q, kv, idx, sinks, 0.1, dv)
        out, lse = t(b, s, h, max(dv, 0)), t(*maybe([b, s, h], [b, s]), dt=F32)
        return "sparse_mqa_attention", lambda: O.sparse_mqa_attention_bwd(out, q, kv, idx, sinks, out, lse, 0.1, dv)
    if kind == "mha":
        d, hk = rng.choice([0, 1, 16, 513]), rng.choice([0, 1, 2, 3])
        q, k, v = (
            t(b, s, h, d),
            t(*maybe([b, hk, n, d], [b, n, d])),
            t(*maybe([b, hk, n, rng.choice([1, 8])], [b, hk, n])),
        )
        idx = torch.randint(-2, n + 3, (b, s, dim()), generator=gen).to(rng.choice([I32, I32, I64]))
        return "sparse_mha_attention", lambda: O.sparse_mha_attention(q, k, v, idx, 0.1)
    if kind == "mask_idx":
        m = t(*[dim() for _ in range(rng.randint(1, 4))], dt=rng.choice([torch.bool, F32]))
        return "sparse_mqa_mask_indices", lambda: O.sparse_mqa_mask_indices(m, rng.choice([-1, 0, 1, 3]))
    hc, d = rng.choice([0, 1, 2, 4, 5]), rng.choice([0, 1, 8])
    x = t(b, s, hc, d)
    if kind == "post":
        post, comb = t(*maybe([b, s, hc], [b, s]), dt=F32), t(*maybe([b, s, hc, hc], [b, s, hc]), dt=F32)
        bo, grad = t(*maybe([b, s, d], [b, s, d + 1])), t(*maybe([b, s, hc, d], [b, s, d]))
        if rng.random() < 0.5:
            return "mhc/post", lambda: O.mhc_post(post, comb, bo, x)
        return "mhc/post", lambda: O.mhc_post_bwd(grad, post, comb, bo, x)
    mixes = (2 + hc) * hc if kind == "pre" else hc
    fn, base = t(*maybe([mixes, hc * d], [mixes]), dt=F32), t(*maybe([mixes], [mixes + 1]), dt=F32)
    scale = t(3 if kind == "pre" else 1, dt=F32)
    mix, rstd = t(*maybe([b * s, mixes], [b, s, mixes]), dt=F32), t(b * s, dt=F32)
    grad = t(*maybe([b, s, d], [b, s, hc, d]))
    iters = rng.choice([-1, 0, 3, 1601])
    if kind == "pre":
        calls = [
            lambda: O.mhc_pre_fwd(x, fn, base, scale, iters, 1e-6, 1e-6),
            lambda: O.mhc_pre_bwd(None, None, grad, x, fn, base, scale, mix, rstd, iters, 1e-6, 1e-6),
        ]
        return "mhc/pre", rng.choice(calls)
    calls = [
        lambda: O.mhc_head_fwd(x, fn, base, scale, 1e-6, 1e-6),
        lambda: O.mhc_head_bwd(grad, x, fn, base, scale, mix, rstd, 1e-6, 1e-6),
    ]
    return "mhc/head", rng.choice(calls)


def test_hostile_arguments_are_refused_by_name():
    """600 calls with arguments drawn at random: each one runs (the CPU kernels on empty, one-element
    and odd shapes) or raises ValueError/TypeError whose message starts with the op's name; none
    crashes or reaches a kernel with what it cannot read."""
    rng, gen = random.Random(20261205), torch.Generator().manual_seed(20261205)
    ran, refused = 0, 0
    for _ in range(600):
        name, call = _hostile_call(rng, gen)
        try:
            call()
            ran += 1
        except (ValueError, TypeError) as e:
            assert str(e).startswith(name), (name, str(e).splitlines()[0])
            refused += 1
    assert ran >= 30 and refused >= 300, (ran, refused)  # both sides exercised
