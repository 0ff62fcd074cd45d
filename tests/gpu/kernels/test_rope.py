"""RoPE full and partial: q/k as HF passes them (transposed views), GQA, unsqueeze_dim 1 and 2,
cos/sin in q's dtype or fp32, odd head dims, empty and single-token inputs; outputs and the
gradients of q and k vs the fp32 reference; determinism; layout kept.

RoPE interleaved (DeepSeek-V3's `apply_rotary_pos_emb_interleave`: q_rot a slice of the projection,
k_rot one head) and the vision RoPE (`apply_rotary_pos_emb_vision`: q/k unbound views of one qkv
projection, fp32 cos/sin): the same checks, plus opcheck, torch.compile and CUDA-graph capture of
their ops; the vision kernel is bit-equal to upstream's eager code on CUDA (outputs and gradients).

RoPE deepseek_v4 (DeepSeek-V4's `apply_rotary_pos_emb`: one tensor, half-width cos/sin, the trailing
slice's interleaved pairs turned in place): bit-equal to upstream's own function on CUDA, outputs and
gradients, for the layouts the model passes (q and the attention output as [B, H, S, D] views, kv and
the compressed keys with one head, unsqueeze_dim 1 and 2, fp32 cos/sin), odd sizes, empty and one-row
inputs; the output keeps x's layout; determinism, refusals, opcheck, torch.compile, CUDA graphs."""

import pytest
import torch

from conftest import DTYPES, assert_close, bench_library, fp32_leaf, knob, requires_cuda

pytestmark = requires_cuda


def _qk(b, s, hq, hk, d, dtype, transposed=True):
    q = torch.randn(b, s, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype)
    return (q.transpose(1, 2), k.transpose(1, 2)) if transposed else (q, k)


def _cos_sin(b, s, rd, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2, device="cuda").float() / rd))
    pos = torch.arange(s, device="cuda").float()[None].expand(b, s) + torch.arange(b, device="cuda")[:, None] * 3
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check(full, q, k, cos, sin, unsqueeze_dim, dtype):
    from opslot import reference as R
    from opslot.kernels.cuda import rope

    ours = rope.rotary_pos_emb_full if full else rope.rotary_pos_emb_partial
    ref = R.rotary_pos_emb_full if full else R.rotary_pos_emb_partial
    qa, ka = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    qe, ke = ours(qa, ka, cos, sin, unsqueeze_dim=unsqueeze_dim)
    assert qe.stride() == torch.empty_like(q).stride()
    gq, gk = torch.randn_like(qe), torch.randn_like(ke)
    (qe * gq).sum().backward(inputs=[qa], retain_graph=True)
    (ke * gk).sum().backward(inputs=[ka])
    qr, kr = fp32_leaf(q), fp32_leaf(k)
    qre, kre = ref(qr, kr, cos.float(), sin.float(), unsqueeze_dim=unsqueeze_dim)
    ((qre * gq.float()).sum() + (kre * gk.float()).sum()).backward()
    assert_close(qe, qre, dtype, "q_embed")
    assert_close(ke, kre, dtype, "k_embed")
    assert_close(qa.grad, qr.grad, dtype, "dq")
    assert_close(ka.grad, kr.grad, dtype, "dk")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,rd", [(128, 128), (64, 64), (6, 6), (80, 80), (128, 64), (80, 32), (10, 4), (128, 2)])
@pytest.mark.parametrize("s", [0, 1, 37])
def test_against_reference(dtype, d, rd, s):
    q, k = _qk(2, s, 4, 2, d, dtype)
    cos, sin = _cos_sin(2, s, rd, dtype)
    check(rd == d, q, k, cos, sin, 1, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_cos_sin_and_unsqueeze_dim_2(dtype):
    q, k = _qk(2, 33, 8, 1, 128, dtype, transposed=False)  # [B, S, H, D] with unsqueeze_dim=2
    cos, sin = _cos_sin(2, 33, 128, torch.float32)
    check(True, q, k, cos, sin, 2, dtype)
    cos, sin = _cos_sin(1, 33, 64, torch.float32)  # batch-broadcast cos/sin, partial
    q, k = _qk(2, 33, 4, 4, 128, dtype)
    check(False, q, k, cos, sin, 1, dtype)


def test_contiguous_and_odd_strides():
    q = torch.randn(2, 4, 16, 64, device="cuda", dtype=torch.bfloat16)  # contiguous [B, H, S, D]
    k = (
        torch.randn(2, 16, 3 * 64, device="cuda", dtype=torch.bfloat16)[..., 64:128]
        .reshape(2, 16, 1, 64)
        .transpose(1, 2)
    )
    cos, sin = _cos_sin(2, 16, 64, torch.bfloat16)
    check(True, q, k, cos, sin, 1, torch.bfloat16)


def test_many_rows():
    q, k = _qk(1, 70001, 2, 1, 8, torch.bfloat16)
    cos, sin = _cos_sin(1, 70001, 8, torch.bfloat16)
    check(True, q, k, cos, sin, 1, torch.bfloat16)


def test_bitwise_deterministic_and_batch_invariant():
    from opslot.kernels.cuda import rope

    q, k = _qk(4, 64, 8, 2, 128, torch.bfloat16)
    cos, sin = _cos_sin(4, 64, 128, torch.bfloat16)

    def run(q, k, cos, sin):
        qa, ka = q.detach().clone().requires_grad_(True), k.detach().clone().requires_grad_(True)
        qe, ke = rope.rotary_pos_emb_full(qa, ka, cos, sin)
        (qe.float().square().sum() + ke.float().sum()).backward()
        return qe, ke, qa.grad, ka.grad

    a, b = run(q, k, cos, sin), run(q, k, cos, sin)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    part = run(q[1:2], k[1:2], cos[1:2], sin[1:2])
    assert all(torch.equal(x[1:2], y) for x, y in zip(a, part))


def test_refusals():
    from opslot.kernels.cuda import rope

    q, k = _qk(1, 4, 2, 2, 64, torch.bfloat16)
    cos, sin = _cos_sin(1, 4, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="use the partial variant"):
        rope.rotary_pos_emb_full(q, k, cos, sin)
    with pytest.raises(ValueError, match="cos/sin require grad"):
        rope.rotary_pos_emb_partial(q, k, cos.requires_grad_(), sin)


@pytest.mark.parametrize("rd", [128, 64])
def test_head_loop_and_row_layout_agree(rd):
    """The head loop (opslot_rope_set_tuning, bench library: a thread rotates up to 8 heads of one
    position with one load of cos/sin) and the default row layout (the production library's) give
    bitwise-equal outputs and gradients, on the transposed views HF passes (forward) and contiguous
    gradients (backward), with head counts that are not a multiple of 8 (q 12 heads, k 3); bad
    tuning values are refused."""
    from opslot.kernels.cuda import rope as CR

    torch.manual_seed(rd)
    q = torch.randn(2, 37, 12, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 37, 3, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos = torch.randn(2, 37, rd, device="cuda", dtype=torch.bfloat16)
    sin = torch.randn(2, 37, rd, device="cuda", dtype=torch.bfloat16)
    fn = CR.rotary_pos_emb_full if rd == 128 else CR.rotary_pos_emb_partial

    def run():
        qq, kk = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        oq, ok = fn(qq, kk, cos, sin)
        (oq.float().square().sum() + ok.float().sum()).backward()
        return oq, ok, qq.grad, kk.grad

    with bench_library() as lib:
        f = knob(lib, "opslot_rope_set_tuning", 2)
        assert f(1, 2) != 0 and f(2, 0) != 0
        try:
            assert f(1, 1) == 0
            a = run()
        finally:
            assert f(1, 0) == 0
    b = run()
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# -- rotary_pos_emb/interleaved (DeepSeek-V3) -------------------------------------------------------------
def _deepseek(b, s, h, d, dtype, nope=128, cs_dtype=None):
    """q_rot [b, h, s, d]: the last d features of q_states [b, s, h, nope + d] (transposed view), k_rot
    [b, 1, s, d]: the last d features of compressed_kv [b, s, 16 + d]; cos/sin [b, s, d] as
    DeepseekV3RotaryEmbedding returns them (cat(freqs, freqs), in q's dtype unless `cs_dtype`)."""
    q = torch.randn(b, s, h, nope + d, device="cuda", dtype=dtype).transpose(1, 2)[..., nope:]
    k = torch.randn(b, s, 16 + d, device="cuda", dtype=dtype)[..., 16:].view(b, 1, s, d)
    cos, sin = _cos_sin(b, s, d, cs_dtype or dtype)
    return q, k, cos, sin


def check_interleaved(q, k, cos, sin, unsqueeze_dim, dtype):
    from opslot import reference as R
    from opslot.kernels.cuda import rope

    qa, ka = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    qe, ke = rope.rotary_pos_emb_interleaved(qa, ka, cos, sin, position_ids=None, unsqueeze_dim=unsqueeze_dim)
    assert qe.dtype == q.dtype and qe.stride() == torch.empty_like(q).stride()
    gq, gk = torch.randn_like(qe), torch.randn_like(ke)
    (qe * gq).sum().backward(inputs=[qa], retain_graph=True)
    (ke * gk).sum().backward(inputs=[ka])
    qr, kr = fp32_leaf(q), fp32_leaf(k)
    qre, kre = R.rotary_pos_emb_interleaved(qr, kr, cos.float(), sin.float(), unsqueeze_dim=unsqueeze_dim)
    ((qre * gq.float()).sum() + (kre * gk.float()).sum()).backward()
    assert_close(qe, qre, dtype, "q_embed")
    assert_close(ke, kre, dtype, "k_embed")
    assert_close(qa.grad, qr.grad, dtype, "dq")
    assert_close(ka.grad, kr.grad, dtype, "dk")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 2, 6, 10, 34, 80])
@pytest.mark.parametrize("s", [0, 1, 37])
def test_interleaved_against_reference(dtype, d, s):
    q, k, cos, sin = _deepseek(2, s, 4, d, dtype)
    check_interleaved(q, k, cos, sin, 1, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_interleaved_fp32_cos_sin_unsqueeze_dim_2_and_layouts(dtype):
    q, k, cos, sin = _deepseek(2, 33, 8, 64, dtype, cs_dtype=torch.float32)
    check_interleaved(q, k, cos, sin, 1, dtype)
    check_interleaved(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 2, dtype)  # [b, s, h, d]
    check_interleaved(q.contiguous(), k.contiguous(), cos[:1], sin[:1], 1, dtype)  # batch-broadcast cos/sin
    # an odd offset: no 16-byte alignment, the scalar path
    odd = torch.randn(2, 33, 4, 65, device="cuda", dtype=dtype).transpose(1, 2)[..., 1:]
    check_interleaved(odd, k, cos, sin, 1, dtype)


def test_interleaved_many_rows_and_deepseek_shape():
    q, k, cos, sin = _deepseek(1, 70001, 2, 8, torch.bfloat16, nope=8)
    check_interleaved(q, k, cos, sin, 1, torch.bfloat16)
    q, k, cos, sin = _deepseek(1, 256, 128, 64, torch.bfloat16)
    check_interleaved(q, k, cos, sin, 1, torch.bfloat16)


def test_interleaved_reads_only_the_first_half_of_cos_sin():
    """Upstream slices `cos[..., : cos.shape[-1] // 2]`: the second half never matters."""
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _deepseek(2, 17, 4, 64, torch.bfloat16)
    other_cos = torch.cat((cos[..., :32], torch.randn_like(cos[..., 32:])), dim=-1)
    other_sin = torch.cat((sin[..., :32], torch.randn_like(sin[..., 32:])), dim=-1)
    a = rope.rotary_pos_emb_interleaved(q, k, cos, sin)
    b = rope.rotary_pos_emb_interleaved(q, k, other_cos, other_sin)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_interleaved_is_close_to_upstream_eager():
    """Upstream (bf16 arithmetic, three roundings) against the kernel (fp32, one rounding)."""
    from opslot import reference as R
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _deepseek(2, 64, 16, 64, torch.bfloat16)
    for ours, theirs in zip(
        rope.rotary_pos_emb_interleaved(q, k, cos, sin), R.rotary_pos_emb_interleaved(q, k, cos, sin)
    ):
        assert_close(ours, theirs.float(), torch.bfloat16, "vs upstream bf16 eager")


def test_interleaved_bitwise_deterministic_and_batch_invariant():
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _deepseek(4, 64, 16, 64, torch.bfloat16)

    def run(q, k, cos, sin):
        qa, ka = q.detach().clone().requires_grad_(True), k.detach().clone().requires_grad_(True)
        qe, ke = rope.rotary_pos_emb_interleaved(qa, ka, cos, sin)
        (qe.float().square().sum() + ke.float().sum()).backward()
        return qe, ke, qa.grad, ka.grad

    a, b = run(q, k, cos, sin), run(q, k, cos, sin)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    part = run(q[1:2], k[1:2], cos[1:2], sin[1:2])
    assert all(torch.equal(x[1:2], y) for x, y in zip(a, part))


def test_interleaved_refusals():
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _deepseek(1, 4, 2, 64, torch.bfloat16)
    with pytest.raises(ValueError, match=r"must be even and equal to cos/sin's last dim 32"):
        rope.rotary_pos_emb_interleaved(q, k, cos[..., :32], sin[..., :32])
    with pytest.raises(ValueError, match="cos/sin require grad"):
        rope.rotary_pos_emb_interleaved(q, k, cos.clone().requires_grad_(), sin)


# -- rotary_pos_emb_vision/standard (Qwen2-VL .. Qwen3-VL-MoE vision towers) -------------------------------
def _vision(seq, heads, d, dtype, cs_dtype=torch.float32):
    """q/k [seq, heads, d]: unbound views of one qkv projection [seq, 3, heads, d] (as the vision
    attention makes them); cos/sin [seq, d] (fp32, as the vision rotary embedding returns them)."""
    qkv = torch.randn(seq, 3 * heads * d, device="cuda", dtype=dtype)
    q, k, _ = qkv.reshape(seq, 3, heads, d).permute(1, 0, 2, 3).unbind(0)
    freqs = torch.randn(seq, d // 2, device="cuda") * 4
    emb = torch.cat((freqs, freqs), dim=-1)
    return q, k, emb.cos().to(cs_dtype), emb.sin().to(cs_dtype)


def run_vision(fn, q, k, cos, sin, seed=7):
    qa, ka = q.detach().requires_grad_(True), k.detach().requires_grad_(True)  # views: strides kept
    qe, ke = fn(qa, ka, cos, sin)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    gq = torch.randn(qe.shape, device="cuda", generator=gen).to(qe.dtype)
    gk = torch.randn(ke.shape, device="cuda", generator=gen).to(ke.dtype)
    torch.autograd.backward((qe, ke), (gq, gk))
    return qe, ke, qa.grad, ka.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [80, 64, 2, 6, 10, 34])
@pytest.mark.parametrize("seq", [0, 1, 37, 1000])
def test_vision_is_bit_equal_to_upstream(dtype, d, seq):
    """Upstream's eager code (opslot.reference is it, word for word) on the same CUDA tensors: every
    product and sum rounded to fp32, then to the dtype, forward and backward."""
    from opslot import reference as R
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _vision(seq, 3, d, dtype)
    ours = run_vision(rope.rotary_pos_emb_vision, q, k, cos, sin)
    theirs = run_vision(R.rotary_pos_emb_vision, q, k, cos, sin)
    for name, a, b in zip(("q_embed", "k_embed", "dq", "dk"), ours, theirs):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: max abs difference {(a.double() - b.double()).abs().max()}"
    # The layout upstream returns, compared where it is defined (a dimension of size 0 or 1 has
    # no meaningful stride: empty_like gives it any value).
    assert _strides(ours[0]) == _strides(theirs[0])


def _strides(t):
    return [s for s, n in zip(t.stride(), t.shape) if n > 1]


@pytest.mark.parametrize(
    "q_dtype,k_dtype,cs_dtype",
    [
        (torch.bfloat16, torch.bfloat16, torch.bfloat16),  # cos/sin in q's dtype
        (torch.float16, torch.float16, torch.bfloat16),  # another 16-bit dtype: widened to fp32, exactly
        (torch.bfloat16, torch.float16, torch.float32),  # q and k of different dtypes: one launch each
        (torch.float32, torch.bfloat16, torch.float16),
    ],
)
def test_vision_mixed_dtypes_are_bit_equal_to_upstream(q_dtype, k_dtype, cs_dtype):
    from opslot import reference as R
    from opslot.kernels.cuda import rope

    q, _, cos, sin = _vision(129, 16, 80, q_dtype, cs_dtype)
    _, k, _, _ = _vision(129, 16, 80, k_dtype)
    ours = run_vision(rope.rotary_pos_emb_vision, q, k, cos, sin)
    theirs = run_vision(R.rotary_pos_emb_vision, q, k, cos, sin)
    assert [t.dtype for t in ours] == [q_dtype, k_dtype, q_dtype, k_dtype]
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("q_heads,k_heads", [(1, 1), (5, 5), (7, 7), (9, 9), (16, 4)])
def test_vision_head_counts_are_bit_equal_to_upstream(q_heads, k_heads):
    """The kernel of the vision layout gives a thread every 4th head, two per step: head counts that
    leave a step's second head missing, one head, and q and k of different head counts (the general
    kernel)."""
    from opslot import reference as R
    from opslot.kernels.cuda import rope

    q, _, cos, sin = _vision(37, q_heads, 80, torch.bfloat16)
    k = _vision(37, k_heads, 80, torch.bfloat16)[1]
    ours = run_vision(rope.rotary_pos_emb_vision, q, k, cos, sin)
    theirs = run_vision(R.rotary_pos_emb_vision, q, k, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_vision_strided_inputs_and_realistic_shape():
    from opslot import reference as R
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _vision(16384, 16, 80, torch.bfloat16)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            run_vision(rope.rotary_pos_emb_vision, q, k, cos, sin), run_vision(R.rotary_pos_emb_vision, q, k, cos, sin)
        )
    )
    # contiguous q/k, a transposed cos (last dim contiguous only after the binding's copy), an odd offset
    qc, kc = q.contiguous(), k.contiguous()
    cos_t = cos.t().contiguous().t()
    odd = torch.randn(37, 4, 81, device="cuda", dtype=torch.bfloat16)[..., 1:]
    oc, os_ = _vision(37, 4, 80, torch.bfloat16)[2:]
    for args in ((qc, kc, cos_t, sin), (odd, odd, oc, os_)):
        ours = run_vision(rope.rotary_pos_emb_vision, *args)
        theirs = run_vision(R.rotary_pos_emb_vision, *args)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_vision_bitwise_deterministic_and_batch_invariant():
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _vision(512, 16, 80, torch.bfloat16)
    a, b = (
        run_vision(rope.rotary_pos_emb_vision, q, k, cos, sin),
        run_vision(rope.rotary_pos_emb_vision, q, k, cos, sin),
    )
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    part = run_vision(rope.rotary_pos_emb_vision, q[100:200], k[100:200], cos[100:200], sin[100:200])
    full = rope.rotary_pos_emb_vision(q, k, cos, sin)
    assert torch.equal(full[0][100:200], part[0]) and torch.equal(full[1][100:200], part[1])


def test_vision_refusals():
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _vision(8, 2, 16, torch.bfloat16)
    with pytest.raises(ValueError, match=r"must be even and equal to cos/sin's last dim 8"):
        rope.rotary_pos_emb_vision(q, k, cos[..., :8], sin[..., :8])
    with pytest.raises(ValueError, match="cos/sin require grad"):
        rope.rotary_pos_emb_vision(q, k, cos.clone().requires_grad_(), sin)
    with pytest.raises(ValueError, match=r"do not broadcast to q/k"):
        rope.rotary_pos_emb_vision(q, k, cos[:4], sin[:4])


# -- the new ops: opcheck, torch.compile, CUDA graphs, the bench knobs -------------------------------------
def _new_op_cases():
    from opslot.kernels.cuda import rope  # noqa: F401  (registers the ops)

    O = torch.ops.opslot  # noqa: E741
    q, k, cos, sin = _deepseek(2, 5, 4, 32, torch.bfloat16, nope=16)
    q, k = q.requires_grad_(True), k.requires_grad_(True)
    vq, vk, vcos, vsin = _vision(9, 3, 16, torch.bfloat16)
    vq, vk = vq.requires_grad_(True), vk.requires_grad_(True)
    return [
        (O.rope_interleaved_fwd.default, (q, k, cos, sin, 1)),
        (O.rope_interleaved_fwd.default, (q, k, cos.float(), sin.float(), 1)),
        (O.rope_interleaved_bwd.default, (q.detach(), k.detach(), cos, sin, 1)),
        (O.rope_vision_fwd.default, (vq, vk, vcos, vsin)),
        (O.rope_vision_fwd.default, (vq, vk.detach().half().requires_grad_(True), vcos, vsin)),
        (O.rope_vision_bwd.default, (vq.detach(), vk.detach(), vcos, vsin)),
    ]


@pytest.mark.parametrize("index", range(6))
def test_new_ops_opcheck(index):
    op, args = _new_op_cases()[index]
    torch.library.opcheck(op, args)


def test_new_ops_compile_fullgraph_forward_and_backward():
    from opslot.kernels.cuda import rope

    def f(q, k, cos, sin, vq, vk, vcos, vsin):
        qe, ke = rope.rotary_pos_emb_interleaved(q, k, cos, sin)
        oq, ok = rope.rotary_pos_emb_vision(vq, vk, vcos, vsin)
        return qe.float().square().sum() + ke.float().sum() + oq.float().square().sum() + ok.float().sum()

    def inputs():
        torch.manual_seed(0)
        q, k, cos, sin = _deepseek(2, 5, 4, 32, torch.bfloat16, nope=16)
        vq, vk, vcos, vsin = _vision(9, 3, 16, torch.bfloat16)
        return (
            q.requires_grad_(True),
            k.requires_grad_(True),
            cos,
            sin,
            vq.requires_grad_(True),
            vk.requires_grad_(True),
            vcos,
            vsin,
        )

    eager_in, comp_in = inputs(), inputs()
    out_e = f(*eager_in)
    out_e.backward()
    out_c = torch.compile(f, fullgraph=True, backend="aot_eager")(*comp_in)
    out_c.backward()
    torch.testing.assert_close(out_e, out_c, rtol=1e-5, atol=1e-5)
    for a, b in zip(eager_in, comp_in):
        if a.requires_grad:  # the same kernels; AOT autograd may order the gradients' products differently
            torch.testing.assert_close(a.grad, b.grad, rtol=1.6e-2, atol=1e-3)


def test_new_ops_cuda_graph_capture():
    from opslot.kernels.cuda import rope  # noqa: F401

    O = torch.ops.opslot  # noqa: E741
    q, k, cos, sin = _deepseek(2, 16, 4, 64, torch.bfloat16)
    vq, vk, vcos, vsin = _vision(64, 4, 80, torch.bfloat16)

    def work():
        qe, ke = O.rope_interleaved_fwd(q, k, cos, sin, 1)
        dq, dk = O.rope_interleaved_bwd(qe, ke, cos, sin, 1)
        oq, ok = O.rope_vision_fwd(vq, vk, vcos, vsin)
        gq, gk = O.rope_vision_bwd(oq, ok, vcos, vsin)
        return [qe, ke, dq, dk, oq, ok, gq, gk]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        expected = work()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = work()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(expected, captured))


def test_new_layouts_ignore_the_head_loop_knob():
    """opslot_rope_set_tuning's head loop exists for HF's layout only: the interleaved and vision
    kernels give the same bits with it on (bench library) as the production library's."""
    from opslot.kernels.cuda import rope

    q, k, cos, sin = _deepseek(2, 37, 12, 64, torch.bfloat16)
    vq, vk, vcos, vsin = _vision(37, 12, 80, torch.bfloat16)

    def run():
        return list(rope.rotary_pos_emb_interleaved(q, k, cos, sin)) + list(
            rope.rotary_pos_emb_vision(vq, vk, vcos, vsin)
        )

    with bench_library() as lib:
        f = knob(lib, "opslot_rope_set_tuning", 2)
        try:
            assert f(1, 1) == 0
            a = run()
        finally:
            assert f(1, 0) == 0
    b = run()
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# -- rotary_pos_emb/deepseek_v4 (DeepSeek-V4's apply_rotary_pos_emb) ----------------------------------------
def _upstream_v4():
    mod = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    return mod.apply_rotary_pos_emb


def _v4(b, s, h, d, rd, dtype, cs_dtype=None, heads_first=True):
    """x as the attention passes q: [B, S, H, D] memory seen as [B, H, S, D] (heads_first), else
    [B, S, H, D] itself; cos/sin half-width [B, S, rd / 2] (one entry per pair), in x's dtype."""
    x = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
    x = x.transpose(1, 2) if heads_first else x
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2, device="cuda").float() / rd))
    pos = torch.arange(s, device="cuda").float()[None].expand(b, s) + torch.arange(b, device="cuda")[:, None] * 5
    freqs = pos[..., None] * inv
    cs = cs_dtype or dtype
    return x, freqs.cos().to(cs), freqs.sin().to(cs)


def run_v4(fn, x, cos, sin, unsqueeze_dim=1, seed=7):
    xa = x.detach().requires_grad_(True)  # a view: strides kept
    out = fn(xa, cos, sin, unsqueeze_dim=unsqueeze_dim)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    g = torch.randn(out.shape, device="cuda", generator=gen).to(out.dtype)
    out.backward(g)
    return out, xa.grad


def check_v4_bits(x, cos, sin, unsqueeze_dim=1):
    from opslot.kernels.cuda import rope

    ours = run_v4(rope.rotary_pos_emb_deepseek_v4, x, cos, sin, unsqueeze_dim)
    theirs = run_v4(_upstream_v4(), x, cos, sin, unsqueeze_dim)
    for name, a, b in zip(("out", "dx"), ours, theirs):
        assert a.dtype == b.dtype == x.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: max abs difference {(a.double() - b.double()).abs().max()}"
    assert _strides(ours[0]) == _strides(torch.empty_like(x))  # x's layout, not upstream's cat
    return ours


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,rd", [(512, 64), (128, 64), (64, 64), (6, 2), (10, 4), (34, 16), (80, 80), (24, 8)])
@pytest.mark.parametrize("s", [0, 1, 37])
def test_deepseek_v4_is_bit_equal_to_upstream(dtype, d, rd, s):
    """Upstream's function itself on the same CUDA tensors: every product and sum rounded to fp32,
    then to the dtype; the backward's per-product casts (its autograd) included."""
    x, cos, sin = _v4(2, s, 3, d, rd, dtype)
    check_v4_bits(x, cos, sin)
    check_v4_bits(x, cos, -sin)  # the attention output's inverse rotation


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_deepseek_v4_layouts_of_the_model_and_fp32_cos_sin(dtype):
    # kv / compressed keys: one head, [B, 1, T, D]; unsqueeze_dim 2 on [B, S, H, D]; fp32 cos/sin;
    # a contiguous x; an x whose rows start at an odd offset (no 16-byte vectors)
    x, cos, sin = _v4(2, 40, 1, 512, 64, dtype)
    check_v4_bits(x, cos, sin)
    x, cos, sin = _v4(2, 40, 4, 128, 64, dtype, heads_first=False)
    check_v4_bits(x, cos, sin, unsqueeze_dim=2)
    x, cos, sin = _v4(2, 40, 4, 128, 64, dtype, cs_dtype=torch.float32)
    check_v4_bits(x, cos, sin)
    check_v4_bits(x.contiguous(), cos, sin)
    odd = torch.randn(2, 4, 40, 129, device="cuda", dtype=dtype)[..., 1:]
    check_v4_bits(odd, *_v4(2, 40, 4, 128, 64, dtype)[1:])


def test_deepseek_v4_released_shape():
    """The attention's q and output at the released widths: 64 heads of 512, rope on the last 64."""
    x, cos, sin = _v4(2, 1024, 64, 512, 64, torch.bfloat16)
    check_v4_bits(x, cos, sin)


def test_deepseek_v4_bitwise_deterministic_and_batch_invariant():
    from opslot.kernels.cuda import rope

    x, cos, sin = _v4(4, 64, 8, 128, 64, torch.bfloat16)

    def run(x, cos, sin):  # a loss whose gradient does not depend on the batch's size
        xa = x.detach().requires_grad_(True)
        out = rope.rotary_pos_emb_deepseek_v4(xa, cos, sin)
        out.float().square().sum().backward()
        return out, xa.grad

    a, b = run(x, cos, sin), run(x, cos, sin)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    part = run(x[1:2], cos[1:2], sin[1:2])
    assert all(torch.equal(p[1:2], q) for p, q in zip(a, part))


def test_deepseek_v4_refusals():
    from opslot.kernels.cuda import rope

    x, cos, sin = _v4(1, 4, 2, 16, 8, torch.bfloat16)
    wide = torch.cat([cos, cos, cos], -1)  # 12 pairs: 24 features > 16
    with pytest.raises(ValueError, match=r"twice that must be at least 2 and at most x's last dim 16"):
        rope.rotary_pos_emb_deepseek_v4(x, wide, wide)
    with pytest.raises(ValueError, match="cos/sin require grad"):
        rope.rotary_pos_emb_deepseek_v4(x, cos.clone().requires_grad_(), sin)
    with pytest.raises(ValueError, match=r"do not broadcast to q/k"):
        rope.rotary_pos_emb_deepseek_v4(x, cos[:, :2], sin[:, :2])
    with pytest.raises(TypeError, match=r"cos/sin of dtype"):
        rope.rotary_pos_emb_deepseek_v4(x, cos.half(), sin.half())


def test_deepseek_v4_ops_opcheck_compile_and_graph():
    from opslot.kernels.cuda import rope

    O = torch.ops.opslot  # noqa: E741
    x, cos, sin = _v4(2, 5, 3, 24, 8, torch.bfloat16)
    xg = x.detach().requires_grad_(True)
    for op, args in (
        (O.rope_deepseek_v4_fwd.default, (xg, cos, sin, 1)),
        (O.rope_deepseek_v4_fwd.default, (xg, cos.float(), sin.float(), 1)),
        (O.rope_deepseek_v4_bwd.default, (x.detach(), cos, sin, 1)),
    ):
        torch.library.opcheck(op, args)

    def f(x, cos, sin):
        return rope.rotary_pos_emb_deepseek_v4(x, cos, sin).float().square().sum()

    xa, xb = x.detach().requires_grad_(True), x.detach().requires_grad_(True)
    f(xa, cos, sin).backward()
    torch.compile(f, fullgraph=True)(xb, cos, sin).backward()
    assert torch.equal(xa.grad, xb.grad)

    xs = x.detach().clone()
    expected = rope.rotary_pos_emb_deepseek_v4(xs, cos, sin)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rope.rotary_pos_emb_deepseek_v4(xs, cos, sin)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(expected, captured)
