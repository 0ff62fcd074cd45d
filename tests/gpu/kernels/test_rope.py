"""RoPE full and partial: q/k as HF passes them (transposed views), GQA, unsqueeze_dim 1 and 2,
cos/sin in q's dtype or fp32, odd head dims, empty and single-token inputs; outputs and the
gradients of q and k vs the fp32 reference; determinism; layout kept."""

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
