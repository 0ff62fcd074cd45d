"""opslot::sparse_mqa_attention / _bwd / sparse_mqa_mask_indices (kernels/torch/sparse_attention.cc) and
the `cuda` glue of dsa_attention (opslot.kernels.cuda.sparse_attention) on a machine without a GPU: the
dispatch keys, opcheck on meta and CPU tensors, the CPU kernels (the ops' fp32 reference math) against an
independent dense fp64 reference (outputs, lse and every gradient; sinks, odd sizes, K = 1, T = 1, rows
without keys, indices out of range), the mask-to-index lists, the argument checks' exact messages, and the
GLM / DeepSeek-V4 glue against upstream's eager attention on tiny modules (and its refusals). The CUDA
kernels: tests/gpu/kernels/test_sparse_attention.py."""

from __future__ import annotations

import types

import pytest
import torch

from test_kernel_library_symbols import _library

O = torch.ops.opslot  # noqa: E741
TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")
INF = float("inf")


@pytest.fixture(scope="module")
def sa():
    _library("libopslot_torch.so")
    from opslot.kernels.cuda import sparse_attention

    return sparse_attention


def dense_reference(q, kv, idx, sinks, scale, dv):
    """fp64 attention over all T keys with every key not listed for the query masked (a dense mask built
    from the index lists: the definition the sparse op must meet)."""
    q, kv = q.double(), kv.double()
    B, S, H, _ = q.shape
    T = kv.shape[1]
    idx = idx.long()
    allowed = torch.zeros(B, S, T + 1, dtype=torch.bool, device=q.device)
    valid = (idx >= 0) & (idx < T)
    allowed.scatter_(-1, torch.where(valid, idx, T), True)
    allowed = allowed[..., :T]
    scores = torch.einsum("bshd,btd->bsht", q, kv) * scale
    scores = scores.masked_fill(~allowed[:, :, None, :], -INF)
    logits = scores
    if sinks is not None:
        logits = torch.cat([scores, sinks.double().view(1, 1, H, 1).expand(B, S, H, 1)], -1)
    lse = torch.logsumexp(logits, -1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(scores - safe.unsqueeze(-1))
    return torch.einsum("bsht,btd->bshd", p, kv[..., :dv]), lse


def distinct_indices(B, S, T, K, skip=0.0, oob=False, gen=None):
    """int32 [B, S, K]: distinct keys per row (a random permutation), some slots -1 (all where K > T), optionally
    slot 0 past T; B * S or K may be 0."""
    rows = [torch.randperm(max(T, K), generator=gen)[:K] for _ in range(B * S)]
    idx = torch.stack(rows).view(B, S, K) if rows else torch.zeros(B, S, K, dtype=torch.long)
    idx = torch.where(idx < T, idx, torch.full_like(idx, -1))
    if skip:
        idx = torch.where(torch.rand(B, S, K, generator=gen) < skip, torch.full_like(idx, -1), idx)
    if oob and K:
        idx[..., 0] = T + 3
    return idx.to(torch.int32)


def test_ops_are_registered_from_cpp(sa):
    for op in ("sparse_mqa_attention", "sparse_mqa_attention_bwd", "sparse_mqa_mask_indices"):
        name = f"opslot::{op}"
        for key in ("CUDA", "Meta", "CPU"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch._library.custom_ops.OPDEFS.get(name) is None
    assert torch._C._dispatch_has_kernel_for_dispatch_key("opslot::sparse_mqa_attention", "Autograd")


def _meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.randn(*shape, dtype=dtype, device="meta", requires_grad=grad)


def _opcheck_cases(device):
    def t(*shape, dtype=torch.bfloat16, grad=False):
        if device == "meta":
            return _meta(*shape, dtype=dtype, grad=grad)
        return torch.randn(*shape, dtype=dtype).requires_grad_(grad)

    idx = distinct_indices(2, 5, 9, 4, skip=0.3).to(device)
    q, kv, sinks = t(2, 5, 3, 40, grad=True), t(2, 9, 40, grad=True), t(3, dtype=torch.float32, grad=True)
    out, lse = O.sparse_mqa_attention(q.detach(), kv.detach(), idx, sinks.detach(), 0.2, 24)
    mask = torch.zeros(2, 5, 9, device=device)
    return [
        ("fwd with sinks", O.sparse_mqa_attention.default, (q, kv, idx, sinks, 0.2, 24)),
        ("fwd without sinks", O.sparse_mqa_attention.default, (q, kv, idx, None, 0.2, 40)),
        (
            "bwd",
            O.sparse_mqa_attention_bwd.default,
            (out.detach(), q.detach(), kv.detach(), idx, sinks.detach(), out, lse, 0.2, 24),
        ),
        ("mask indices", O.sparse_mqa_mask_indices.default, (mask, 6)),
    ]


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("index", range(4))
def test_opcheck(sa, device, index):
    name, op, args = _opcheck_cases(device)[index]
    torch.library.opcheck(op, args, test_utils=TEST_UTILS)


CASES = [
    # B, S, H, Dqk, T, K, dv, sinks, skip, out-of-range
    (1, 7, 3, 40, 11, 5, 24, False, 0.2, False),
    (2, 5, 17, 64, 9, 9, 64, True, 0.3, True),
    (2, 3, 4, 24, 1, 1, 8, True, 0.0, False),  # T = 1, K = 1
    (1, 4, 1, 576, 6, 3, 512, True, 0.0, False),  # GLM-5's absorbed head dims
    (3, 2, 5, 16, 4, 6, 16, False, 0.5, False),  # K > T (the tail of every row is -1)
    (2, 3, 4, 24, 5, 0, 8, True, 0.0, False),  # K = 0: every row without keys
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_cpu_kernels_match_a_dense_reference(sa, case):
    B, S, H, D, T, K, dv, with_sinks, skip, oob = case
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(B, S, H, D, generator=gen, dtype=torch.float64).float()
    kv = torch.randn(B, T, D, generator=gen, dtype=torch.float64).float()
    sinks = torch.randn(H, generator=gen) if with_sinks else None
    idx = distinct_indices(B, S, T, K, skip, oob, gen)
    scale = D**-0.5
    leaves = [x.clone().requires_grad_(True) for x in (q, kv)] + (
        [sinks.clone().requires_grad_(True)] if with_sinks else []
    )
    out, lse = sa.sparse_mqa_attention(leaves[0], leaves[1], idx, leaves[2] if with_sinks else None, scale, dv)
    refs = [x.double().requires_grad_(True) for x in (q, kv)] + (
        [sinks.double().requires_grad_(True)] if with_sinks else []
    )
    rout, rlse = dense_reference(refs[0], refs[1], idx, refs[2] if with_sinks else None, scale, dv)
    torch.testing.assert_close(out.double(), rout, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), rlse, rtol=1e-5, atol=1e-5)
    dout = torch.randn(B, S, H, dv, generator=gen)
    (out * dout).sum().backward()
    (rout * dout.double()).sum().backward()
    for a, r, name in zip(leaves, refs, ("dq", "dkv", "dsinks")):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_rows_without_keys_give_zero_and_minus_inf(sa):
    q = torch.randn(2, 3, 4, 32, requires_grad=True)
    kv = torch.randn(2, 5, 32, requires_grad=True)
    idx = torch.full((2, 3, 4), -1, dtype=torch.int32)
    idx[1, 2, 0] = 3  # one row has a key
    out, lse = sa.sparse_mqa_attention(q, kv, idx, None, 0.1, 32)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all() and torch.isfinite(lse[1, 2]).all()
    torch.testing.assert_close(out[1, 2], kv[1, 3].detach().expand(4, 32))  # one key: its value
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(kv.grad).all()
    sinks = torch.randn(4, requires_grad=True)
    out, lse = sa.sparse_mqa_attention(q, kv, idx, sinks, 0.1, 32)
    assert (out[0] == 0).all()
    torch.testing.assert_close(lse[0], sinks.detach().expand(3, 4))  # only the sink: lse = sink
    out.sum().backward()
    assert torch.isfinite(sinks.grad).all()


def test_scale_and_dv_defaults(sa):
    q, kv = torch.randn(1, 2, 2, 16), torch.randn(1, 3, 16)
    idx = torch.tensor([[[0, 1, 2], [2, -1, 0]]], dtype=torch.int32)
    out, lse = sa.sparse_mqa_attention(q, kv, idx)
    rout, rlse = dense_reference(q, kv, idx, None, 16**-0.5, 16)
    torch.testing.assert_close(out.double(), rout, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), rlse, rtol=1e-5, atol=1e-5)
    assert out.shape == (1, 2, 2, 16)


def test_meta_shapes_and_dtypes(sa):
    q, kv = _meta(2, 7, 5, 96, grad=True), _meta(2, 11, 96, grad=True)
    idx = torch.empty(2, 7, 3, dtype=torch.int32, device="meta")
    sinks = _meta(5, dtype=torch.float32, grad=True)
    out, lse = O.sparse_mqa_attention(q, kv, idx, sinks, 0.1, 64)
    assert out.shape == (2, 7, 5, 64) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert lse.shape == (2, 7, 5) and lse.dtype == torch.float32 and not lse.requires_grad
    out.float().sum().backward()
    assert q.grad.shape == q.shape and kv.grad.shape == kv.shape and sinks.grad.shape == (5,)
    dq, dkv, dsinks = O.sparse_mqa_attention_bwd(out, q, kv, idx, None, out, lse, 0.1, 64)
    assert (dq.shape, dkv.shape, dsinks.shape) == (q.shape, kv.shape, (0,))
    indices, status = O.sparse_mqa_mask_indices(torch.empty(2, 7, 11, device="meta"), 4)
    assert indices.shape == (2, 7, 4) and indices.dtype == torch.int32 and status.shape == (1,)


def _expect(error, message, fn):
    with pytest.raises(error) as err:
        fn()
    assert str(err.value).split("\n\nWhile executing")[0] == message


def _args(**over):
    args = dict(
        q=_meta(2, 5, 3, 64),
        kv=_meta(2, 9, 64),
        indices=torch.empty(2, 5, 4, dtype=torch.int32, device="meta"),
        sinks=None,
        scale=0.1,
        dv=32,
    )
    args.update(over)
    return list(args.values())


MESSAGES = [
    (
        TypeError,
        "sparse_mqa_attention: q: opslot cuda kernels take float32, float16 or bfloat16 tensors, got torch.int32",
        dict(q=torch.empty(2, 5, 3, 64, dtype=torch.int32, device="meta")),
    ),
    (ValueError, "sparse_mqa_attention: q must be [batch, seq, heads, dim], got (2, 5, 64)", dict(q=_meta(2, 5, 64))),
    (
        TypeError,
        "sparse_mqa_attention: q and kv must share a dtype, got torch.bfloat16 and torch.float16",
        dict(kv=_meta(2, 9, 64, dtype=torch.float16)),
    ),
    (
        ValueError,
        "sparse_mqa_attention: kv must be [batch, kv_len, dim] (one head), got (2, 1, 9, 64)",
        dict(kv=_meta(2, 1, 9, 64)),
    ),
    (
        ValueError,
        "sparse_mqa_attention: q (2, 5, 3, 64) and kv (2, 9, 48) must agree in batch and head dim",
        dict(kv=_meta(2, 9, 48)),
    ),
    (
        TypeError,
        "sparse_mqa_attention: indices must be int32, got torch.int64",
        dict(indices=torch.empty(2, 5, 4, dtype=torch.int64, device="meta")),
    ),
    (
        ValueError,
        "sparse_mqa_attention: indices must be [batch, seq, topk] with batch and seq of q (2, 5), got (2, 6, 4)",
        dict(indices=torch.empty(2, 6, 4, dtype=torch.int32, device="meta")),
    ),
    (
        TypeError,
        "sparse_mqa_attention: sinks must be float32, got torch.bfloat16",
        dict(sinks=_meta(3)),
    ),
    (
        ValueError,
        "sparse_mqa_attention: sinks must be [heads] = (3,), got (4,)",
        dict(sinks=_meta(4, dtype=torch.float32)),
    ),
    (
        ValueError,
        "sparse_mqa_attention: q and kv have no features (head dim 0), got q (2, 5, 3, 0)",
        dict(q=_meta(2, 5, 3, 0), kv=_meta(2, 9, 0), dv=1),
    ),
    (ValueError, "sparse_mqa_attention: dv must be in 1..64 (V = kv[..., :dv]), got 65", dict(dv=65)),
    (ValueError, "sparse_mqa_attention: dv must be in 1..64 (V = kv[..., :dv]), got 0", dict(dv=0)),
    (
        ValueError,
        "sparse_mqa_attention: the kernels take head dims Dqk <= 576 and dv <= 512, got Dqk 640 and dv 32",
        dict(q=_meta(2, 5, 3, 640), kv=_meta(2, 9, 640)),
    ),
    (
        ValueError,
        "sparse_mqa_attention: the kernels take head dims Dqk <= 576 and dv <= 512, got Dqk 576 and dv 576",
        dict(q=_meta(2, 5, 3, 576), kv=_meta(2, 9, 576), dv=576),
    ),
]


@pytest.mark.parametrize("index", range(len(MESSAGES)))
def test_argument_checks_have_clear_messages(sa, index):
    error, message, over = MESSAGES[index]
    _expect(error, message, lambda: O.sparse_mqa_attention(*_args(**over)))


def test_devices_must_agree(sa):
    q, kv = torch.randn(1, 2, 2, 16), torch.randn(1, 3, 16, device="meta")
    idx = torch.zeros(1, 2, 1, dtype=torch.int32)
    _expect(
        ValueError,
        "sparse_mqa_attention: q, kv, indices and sinks must be on one device, got cpu, meta, cpu",
        lambda: O.sparse_mqa_attention(q, kv, idx, None, 0.1, 16),
    )


def test_backward_checks_its_extra_arguments(sa):
    q, kv = _meta(2, 5, 3, 64), _meta(2, 9, 64)
    idx = torch.empty(2, 5, 4, dtype=torch.int32, device="meta")
    out, lse = _meta(2, 5, 3, 32), _meta(2, 5, 3, dtype=torch.float32)
    _expect(
        ValueError,
        "sparse_mqa_attention_bwd: dout must be (2, 5, 3, 32), got (2, 5, 3, 64)",
        lambda: O.sparse_mqa_attention_bwd(_meta(2, 5, 3, 64), q, kv, idx, None, out, lse, 0.1, 32),
    )
    _expect(
        ValueError,
        "sparse_mqa_attention_bwd: lse must be float32 (2, 5, 3), got torch.bfloat16 (2, 5, 3)",
        lambda: O.sparse_mqa_attention_bwd(out, q, kv, idx, None, out, _meta(2, 5, 3), 0.1, 32),
    )


# --- mask -> index lists ---


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool])
def test_mask_indices_lists_valid_columns_in_order(sa, dtype):
    gen = torch.Generator().manual_seed(3)
    valid = torch.rand(2, 6, 13, generator=gen) < 0.4
    valid[0, 0] = False  # a row without keys
    if dtype == torch.bool:
        mask = valid
    else:
        fill = torch.finfo(dtype).min if dtype != torch.float32 else -INF
        mask = torch.zeros(2, 6, 13, dtype=dtype).masked_fill(~valid, fill)
    topk = int(valid.sum(-1).max()) + 2
    indices, status = O.sparse_mqa_mask_indices(mask, topk)
    assert indices.dtype == torch.int32 and indices.shape == (2, 6, topk) and status.tolist() == [0]
    for b in range(2):
        for s in range(6):
            cols = valid[b, s].nonzero().flatten().tolist()
            assert indices[b, s].tolist() == cols + [-1] * (topk - len(cols))


def test_mask_indices_flags_overflow_and_bias(sa):
    mask = torch.zeros(1, 2, 5)
    indices, status = O.sparse_mqa_mask_indices(mask, 3)
    assert status.tolist() == [1] and indices[0, 0].tolist() == [0, 1, 2]
    mask[0, 1, 4] = -3.0  # an additive bias: neither 0 nor masked
    _, status = O.sparse_mqa_mask_indices(mask, 5)
    assert status.tolist() == [2]
    mask[0, 1, 4] = torch.finfo(torch.bfloat16).min  # any dtype's minimum counts as masked
    indices, status = O.sparse_mqa_mask_indices(mask, 5)
    assert status.tolist() == [0] and indices[0, 1].tolist() == [0, 1, 2, 3, -1]


def test_mask_indices_reads_strided_and_broadcast_masks(sa):
    base = torch.zeros(1, 4, 16).masked_fill(torch.rand(1, 4, 16) < 0.5, -INF)
    mask = base[..., ::2].expand(3, 4, 8)  # stride 2 columns, batch broadcast
    indices, _ = O.sparse_mqa_mask_indices(mask, 8)
    ref, _ = O.sparse_mqa_mask_indices(mask.contiguous(), 8)
    assert torch.equal(indices, ref)
    _expect(
        TypeError,
        "sparse_mqa_mask_indices: the mask must be bool, float32, float16 or bfloat16, got torch.int64",
        lambda: O.sparse_mqa_mask_indices(torch.zeros(1, 2, 3, dtype=torch.long), 2),
    )
    _expect(
        ValueError,
        "sparse_mqa_mask_indices: the mask must be [batch, seq, kv_len], got (1, 1, 2, 3)",
        lambda: O.sparse_mqa_mask_indices(torch.zeros(1, 1, 2, 3), 2),
    )


# --- the dsa_attention glue against upstream's eager attention (tiny modules, fp32, CPU) ---


def _upstream(name):
    transformers = pytest.importorskip("transformers")
    import importlib

    try:
        return importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")


def glm_module(heads=4):
    mod = _upstream("glm_moe_dsa")
    from transformers import GlmMoeDsaConfig

    config = GlmMoeDsaConfig(
        hidden_size=64,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        q_lora_rank=32,
        kv_lora_rank=48,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=24,
        num_hidden_layers=1,
        index_topk=6,
        index_n_heads=2,
        index_head_dim=16,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = mod.GlmMoeDsaAttention(config, 0).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.2)
    return mod, attn


def glm_inputs(attn, B=2, S=9, pad=2, gen=None, past=0):
    """The slot's inputs for S queries over T = past + S latents: the queries are the last S positions (from
    Transformers 5.23 the cached latents of earlier steps come first)."""
    H, nope, rope, lora = attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.kv_lora_rank
    T = past + S
    q_pass = torch.randn(B, H, S, nope, generator=gen)
    q_rot = torch.randn(B, H, S, rope, generator=gen)
    k_pass = torch.randn(B, 1, T, lora, generator=gen)
    k_rot = torch.randn(B, 1, T, rope, generator=gen)
    visible = torch.ones(S, T).tril(past).bool().expand(B, S, T).clone()
    visible[1, :, :pad] = False  # batch row 1 is left-padded: its first `pad` keys are padding
    # the top 6 of random scores, the visible keys first (the indexer puts the invisible ones at -inf; here
    # they are below every visible key in a random order, so that any of them, e.g. the next one, may be picked)
    scores = torch.rand(B, S, T, generator=gen) - 2.0 * (~visible)
    topk = scores.topk(min(6, T), dim=-1).indices.to(torch.int32)
    mask = torch.zeros(B, 1, S, T).masked_fill(~visible[:, None], torch.finfo(torch.float32).min)
    return q_pass, q_rot, k_pass, k_rot, topk, mask


def glm_upstream(mod, attn, q_pass, q_rot, k_pass, k_rot, topk, mask, cache=None):
    """GlmMoeDsaAttention.forward's lines from the latents on (eager; with `cache`, 5.17's update of the
    expanded keys and values)."""
    B, _, S, _ = q_pass.shape
    query = torch.cat((q_pass, q_rot), dim=-1)
    key, value = attn.expand_kv(k_pass, k_rot)
    if cache is not None:
        key, value = cache.update(key, value, attn.layer_idx)
    index_mask = topk.new_ones((B, S, key.shape[2]), dtype=torch.bool).scatter(-1, topk.long(), False).unsqueeze(1)
    if mask.dtype == torch.bool:
        mask = mask & ~index_mask
    else:
        mask = mask.masked_fill(index_mask, torch.finfo(q_pass.dtype).min)
    out, _ = mod.eager_attention_forward(attn, query, key, value, mask, scaling=attn.scaling)
    return out


def test_glm_glue_matches_upstream_eager(sa):
    mod, attn = glm_module()
    gen = torch.Generator().manual_seed(5)
    ins = glm_inputs(attn, gen=gen)
    with torch.no_grad():
        ref = glm_upstream(mod, attn, *ins)
        out, weights = sa.dsa_attention_glm(attn, *ins)
    assert weights is None and out.shape == ref.shape == (2, 9, attn.num_heads, attn.v_head_dim)
    real = torch.ones(2, 9, dtype=torch.bool)
    real[1, :2] = False  # padded queries: upstream averages every key, the kernel gives 0 (docs)
    torch.testing.assert_close(out[real], ref[real], rtol=1e-4, atol=1e-5)
    assert (out[1, :2] == 0).all()
    # a bool mask and no mask (causal) select the same keys
    q_pass, q_rot, k_pass, k_rot, topk, mask = ins
    with torch.no_grad():
        out_bool, _ = sa.dsa_attention_glm(attn, q_pass, q_rot, k_pass, k_rot, topk, mask == 0)
        out_none, _ = sa.dsa_attention_glm(attn, q_pass, q_rot, k_pass, k_rot, topk, None)
    torch.testing.assert_close(out_bool, out)
    torch.testing.assert_close(out_none[0], out[0])


@pytest.mark.parametrize("S,past", [(1, 12), (4, 9)])  # a decoding step; a chunk after a cached prompt
def test_glm_glue_after_cached_latents_matches_upstream_eager(sa, S, past):
    """Transformers 5.23's generation: the slot gets no cache, the latents of earlier steps first (T > S)."""
    mod, attn = glm_module()
    gen = torch.Generator().manual_seed(7 + S)
    ins = glm_inputs(attn, S=S, pad=2, gen=gen, past=past)
    assert ins[2].shape[2] == S + past
    with torch.no_grad():
        ref = glm_upstream(mod, attn, *ins)
        out, _ = sa.dsa_attention_glm(attn, *ins)
        out_bool, _ = sa.dsa_attention_glm(attn, *ins[:5], ins[5] == 0)
        out_none, _ = sa.dsa_attention_glm(attn, *ins[:5], None)  # no mask: causal, queries last
    assert out.shape == (2, S, attn.num_heads, attn.v_head_dim)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)  # every query sees keys (past >= pad)
    torch.testing.assert_close(out_bool, out)
    torch.testing.assert_close(out_none[0], out[0])  # batch row 0 has no padding


def test_glm_glue_gradients_match_upstream(sa):
    mod, attn = glm_module()
    gen = torch.Generator().manual_seed(11)
    ins = list(glm_inputs(attn, pad=0, gen=gen))
    leaves = [x.clone().requires_grad_(True) for x in ins[:4]]
    ref_leaves = [x.clone().requires_grad_(True) for x in ins[:4]]
    dout = torch.randn(2, 9, attn.num_heads, attn.v_head_dim, generator=gen)
    out, _ = sa.dsa_attention_glm(attn, *leaves, *ins[4:])
    (out * dout).sum().backward()
    grads = [x.grad for x in leaves] + [attn.kv_b_proj.weight.grad.clone()]
    attn.kv_b_proj.weight.grad = None
    ref = glm_upstream(mod, attn, *ref_leaves, *ins[4:])
    (ref * dout).sum().backward()
    ref_grads = [x.grad for x in ref_leaves] + [attn.kv_b_proj.weight.grad]
    for a, b, name in zip(grads, ref_grads, ("q_pass", "q_rot", "k_pass", "k_rot", "kv_b_proj")):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_glm_glue_refusals_and_cache(sa):
    _, attn = glm_module()
    ins = glm_inputs(attn)
    attn.train()
    attn.attention_dropout = 0.1
    _expect(
        ValueError,
        "dsa_attention/glm: the cuda kernel has no attention dropout (got dropout=0.1 in training); set the "
        "config's attention_dropout to 0 or use dsa_attention_implementation 'torch' or 'eager'",
        lambda: sa.dsa_attention_glm(attn, *ins),
    )
    attn.eval()
    _expect(
        ValueError,
        "dsa_attention/glm: the cuda kernel does not compute attention weights (output_attentions was "
        "requested); use dsa_attention_implementation 'torch' or 'eager' to get them",
        lambda: sa.dsa_attention_glm(attn, *ins, output_attentions=True),
    )
    from transformers import DynamicCache

    cache = DynamicCache(config=attn.config)
    with torch.no_grad():
        out, _ = sa.dsa_attention_glm(attn, *ins, past_key_values=cache)
        key, value = attn.expand_kv(ins[2], ins[3])
    assert cache.get_seq_length(0) == 9  # upstream's cache contents: the expanded keys and values
    torch.testing.assert_close(cache.layers[0].keys, key)
    torch.testing.assert_close(cache.layers[0].values, value)
    attn.v_head_dim = 576 - attn.qk_head_dim + 1  # the cached rows [v | k] must fit the kernel's head size
    _expect(
        ValueError,
        f"dsa_attention/glm: attending over Transformers 5.17's cache (the expanded keys and values) needs "
        f"qk_head_dim + v_head_dim <= 576 and each <= 512, got {attn.qk_head_dim} + 553; use "
        "dsa_attention_implementation 'torch' or 'eager'",
        lambda: sa.dsa_attention_glm(attn, *ins, past_key_values=cache),
    )
    assert cache.get_seq_length(0) == 9  # refused before the cache update


def glm_over_expanded_cache(sa, mod, attn, ins, past, dout, dtype=None):
    """Transformers 5.17's generation: a DynamicCache of the expanded keys and values of the first `past`
    latents, then S queries with the latents of the S new tokens, through the `cuda` glue (`sa`) or, with
    `sa` None, upstream's code (cache update, index mask, eager attention). Returns the output, the cache's
    keys and values after the call, and the gradients of (q_pass, q_rot, the new k_pass, k_rot, kv_b_proj)
    for the cotangent `dout` (None: the call runs under torch.no_grad, as generate() does, and there are no
    gradients); the inputs are cast to `dtype` (default: kept)."""
    from transformers import DynamicCache

    q_pass, q_rot, k_pass, k_rot, topk, mask = ins
    cast = (lambda x: x) if dtype is None else (lambda x: x.to(dtype))
    leaves = [
        cast(x).detach().clone().requires_grad_() for x in (q_pass, q_rot, k_pass[:, :, past:], k_rot[:, :, past:])
    ]
    cache = DynamicCache(config=attn.config)
    with torch.no_grad():
        cache.update(*attn.expand_kv(cast(k_pass[:, :, :past]), cast(k_rot[:, :, :past])), attn.layer_idx)
    mask = cast(mask)
    with torch.set_grad_enabled(dout is not None):
        if sa is not None:
            out, _ = sa.dsa_attention_glm(attn, *leaves, topk, mask, past_key_values=cache)
        else:
            out = glm_upstream(mod, attn, *leaves, topk, mask, cache=cache)
    grads = None
    if dout is not None:
        attn.kv_b_proj.weight.grad = None
        (out.float() * dout).sum().backward()
        grads = [x.grad for x in leaves] + [attn.kv_b_proj.weight.grad.clone()]
    layer = cache.layers[attn.layer_idx]
    return out.detach(), layer.keys, layer.values, grads


# a decoding step and a 2-query chunk (S * K < T: the selected rows gathered with autograd); a chunk after a
# short prompt (all); a decoding step whose padded batch row sees 4 keys (2 of the 6 selected rows hidden); with
# autograd (sparse_mqa_attention over [v | k]) and under no_grad (sparse_mha_attention over the cache itself)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("S,past,pad", [(1, 12, 2), (2, 30, 2), (4, 9, 2), (1, 12, 9)])
def test_glm_glue_over_the_expanded_cache_matches_upstream_eager(sa, S, past, pad, grad, monkeypatch):
    """Transformers 5.17's generation: outputs, the cache after the call and the gradients of the queries, the
    new latents and kv_b_proj are upstream's (eager attention over the same cache). With autograd the kernel
    gets one key head a (batch, head) pair, of the S * K selected rows where fewer than the cache's T; without,
    the forward-only op gets the queries and the layer's cached keys and values as they are."""
    mod, attn = glm_module()
    gen = torch.Generator().manual_seed(11 + S)
    ins = glm_inputs(attn, S=S, pad=pad, gen=gen, past=past)
    dout = torch.randn(2, S, attn.num_heads, attn.v_head_dim, generator=gen) if grad else None
    calls = []
    fwd, mha = sa._FWD, sa._MHA
    monkeypatch.setattr(sa, "_FWD", lambda q, kv, *a: calls.append(("mqa", q.shape, kv.shape)) or fwd(q, kv, *a))
    monkeypatch.setattr(
        sa, "_MHA", lambda q, k, v, *a: calls.append(("mha", q.shape, k.shape, v.shape)) or mha(q, k, v, *a)
    )
    out, keys, values, grads = glm_over_expanded_cache(sa, mod, attn, ins, past, dout)
    T, K, H, dk, dv = past + S, ins[4].shape[-1], attn.num_heads, attn.qk_head_dim, attn.v_head_dim
    if grad:
        assert calls == [("mqa", (2 * H, S, 1, dk + dv), (2 * H, S * K if S * K < T else T, dk + dv))]
    else:
        assert calls == [("mha", (2, S, H, dk), (2, H, T, dk), (2, H, T, dv))]
    ref, ref_keys, ref_values, ref_grads = glm_over_expanded_cache(None, mod, attn, ins, past, dout)
    assert out.shape == (2, S, attn.num_heads, attn.v_head_dim) and keys.shape[2] == past + S
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)  # every query sees keys (past >= pad)
    assert torch.equal(keys, ref_keys) and torch.equal(values, ref_values)
    for a, b, name in zip(grads or [], ref_grads or [], ("q_pass", "q_rot", "k_pass", "k_rot", "kv_b_proj")):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert (grads is None) == (not grad)


@pytest.mark.parametrize("cached", [False, True], ids=["latents", "expanded_cache"])
def test_glm_glue_skips_selections_outside_the_keys(sa, cached):
    """A selected index outside [0, T) (-1, or T and beyond) is skipped, like one the mask hides: the glue's
    output with such indices is upstream's with a padding key (hidden) in their place. A decoding step over
    T = 13 keys, in the latent form and over 5.17's expanded cache (the selected rows gathered)."""
    mod, attn = glm_module()
    S, past = 1, 12
    ins = glm_inputs(attn, S=S, pad=2, gen=torch.Generator().manual_seed(23), past=past)
    topk, hidden = ins[4].clone(), ins[4].clone()
    T = past + S
    topk[1, :, 0], topk[1, :, 1] = -1, T + 3  # batch row 1's two best selections, out of range ...
    hidden[1, :, :2] = 0  # ... and in the reference its padding key 0, which the mask hides

    def glue(sel):
        if cached:
            return glm_over_expanded_cache(sa, mod, attn, (*ins[:4], sel, ins[5]), past, None)[0]
        with torch.no_grad():
            return sa.dsa_attention_glm(attn, *ins[:4], sel, ins[5])[0]

    if cached:
        ref = glm_over_expanded_cache(None, mod, attn, (*ins[:4], hidden, ins[5]), past, None)[0]
    else:
        with torch.no_grad():
            ref = glm_upstream(mod, attn, *ins[:4], hidden, ins[5])
    torch.testing.assert_close(glue(topk), ref, rtol=1e-4, atol=1e-5)
    assert (glue(ins[4])[1] - ref[1]).abs().max() > 1e-3  # the two selections counted before they moved out


def v4_inputs(B=2, H=3, S=12, D=32, window=4, comp=3, topk=2, gen=None):
    """q, kv and upstream's mask: the sliding-window causal mask over S keys (finfo.min) with a block bias over
    `comp` compressed entries (-inf; at most `topk` visible per query) concatenated."""
    q = torch.randn(B, H, S, D, generator=gen)
    kv = torch.randn(B, 1, S + comp, D, generator=gen)
    i = torch.arange(S).view(S, 1)
    j = torch.arange(S).view(1, S)
    sliding = (j <= i) & (i - j < window)
    mask = torch.zeros(B, 1, S, S).masked_fill(~sliding, torch.finfo(torch.float32).min)
    score = torch.rand(B, S, comp, generator=gen)
    ready = torch.arange(comp).view(1, 1, comp) < ((torch.arange(S) + 1) // 4).view(1, S, 1)
    pick = torch.zeros(B, S, comp, dtype=torch.bool).scatter(-1, score.topk(min(topk, comp), -1).indices, True)
    block = torch.zeros(B, 1, S, comp).masked_fill(~(pick & ready)[:, None], -INF)
    return q, kv, torch.cat([mask, block], dim=-1)


def v4_module(H=3, topk=2, compressor=True):
    indexer = types.SimpleNamespace(index_topk=topk)
    return types.SimpleNamespace(
        sinks=torch.nn.Parameter(torch.randn(H)),
        num_key_value_groups=H,
        training=False,
        config=types.SimpleNamespace(output_attentions=False),
        compressor=types.SimpleNamespace(indexer=indexer) if compressor else None,
    )


def test_deepseek_v4_glue_matches_upstream_eager(sa):
    mod = _upstream("deepseek_v4")
    gen = torch.Generator().manual_seed(2)
    module = v4_module()
    q, kv, mask = v4_inputs(gen=gen)
    leaves = [x.clone().requires_grad_(True) for x in (q, kv)]
    out, weights = sa.dsa_attention_deepseek_v4(
        module, *leaves, mask, dropout=0.0, scaling=0.2, sliding_window=4, s_aux=module.sinks
    )
    assert weights is None
    ref_leaves = [x.clone().requires_grad_(True) for x in (q, kv)]
    ref, _ = mod.eager_attention_forward(module, ref_leaves[0], ref_leaves[1], ref_leaves[1], mask, scaling=0.2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    dout = torch.randn(out.shape, generator=gen)
    (out * dout).sum().backward()
    sink_grad = module.sinks.grad.clone()
    module.sinks.grad = None
    (ref * dout).sum().backward()
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sink_grad, module.sinks.grad, rtol=1e-4, atol=1e-5)


def test_deepseek_v4_glue_without_a_mask_is_causal_within_the_window(sa):
    mod = _upstream("deepseek_v4")
    module = v4_module(compressor=False)
    q, kv, mask = v4_inputs(comp=0)
    with torch.no_grad():
        out, _ = sa.dsa_attention_deepseek_v4(module, q, kv, None, scaling=0.2, sliding_window=4, s_aux=module.sinks)
        ref, _ = mod.eager_attention_forward(module, q, kv, kv, mask, scaling=0.2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_deepseek_v4_glue_refusals(sa):
    module = v4_module()
    q, kv, mask = v4_inputs()
    call = sa.dsa_attention_deepseek_v4
    _expect(
        ValueError,
        "dsa_attention/deepseek_v4: the cuda kernel has no attention dropout (got dropout=0.5 in training); set "
        "the config's attention_dropout to 0 or use dsa_attention_implementation 'torch' or 'eager'",
        lambda: call(module, q, kv, mask, dropout=0.5, scaling=0.2, sliding_window=4, s_aux=module.sinks),
    )
    _expect(
        ValueError,
        "dsa_attention/deepseek_v4: without an attention mask the keys each query sees are not known (15 keys for "
        "12 queries: a cache or compressed entries); use attn_implementation 'eager' (which always builds the "
        "mask) or dsa_attention_implementation 'torch'",
        lambda: call(module, q, kv, None, scaling=0.2, sliding_window=4, s_aux=module.sinks),
    )
    _expect(
        ValueError,
        "dsa_attention/deepseek_v4: the cuda kernel shares one key list by all heads; a per-head attention mask "
        "of shape (2, 3, 12, 15) cannot be served (use dsa_attention_implementation 'torch')",
        lambda: call(module, q, kv, mask.expand(2, 3, 12, 15), scaling=0.2, sliding_window=4, s_aux=module.sinks),
    )
    bias = mask.clone()
    bias[0, 0, 5, 5] = -2.0
    not_built = (
        "dsa_attention/deepseek_v4: the mask is not DeepseekV4Attention's: a query with more valid keys than the "
        "window plus the compressor's entries, or values other than 0 and the dtype's minimum (a bias); use "
        "dsa_attention_implementation 'torch'"
    )
    _expect(
        RuntimeError, not_built, lambda: call(module, q, kv, bias, scaling=0.2, sliding_window=4, s_aux=module.sinks)
    )
    # a window wider than the module's
    _expect(
        RuntimeError, not_built, lambda: call(module, q, kv, mask, scaling=0.2, sliding_window=2, s_aux=module.sinks)
    )
    call(module, q, kv, mask, scaling=0.2, sliding_window=4, s_aux=module.sinks)  # the mask it builds passes
