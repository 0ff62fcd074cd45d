"""The chunked gated delta rule's CUDA kernels (opslot.kernels.cuda.gated_delta_rule) against a token-by-
token fp32 reference of the recurrence: outputs, final states and every gradient (q, k, v, g, beta,
initial state), fp32 (three tf32 products) / fp16 / bf16, odd lengths, one token, 1 and 64 heads, head dims
below 128, packed sequences equal to separate ones (bitwise), strided inputs, determinism, opcheck,
torch.compile and CUDA-graph capture."""

import pytest
import torch
import torch.nn.functional as F

from conftest import capture_graph, rel_err, requires_cuda

pytestmark = requires_cuda

#: relative L2 error allowed against the fp32 recurrence: operands of the tensor-core products are
#: rounded to the input dtype (fp32 runs as three tf32 products), accumulation and the state stay fp32.
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def _op():
    from opslot.kernels.cuda import gated_delta_rule

    return gated_delta_rule.chunk_gated_delta_rule


def reference(q, k, v, g, beta, s0=None, l2norm=True):
    """o_t = q_t S_t with S_t = e^{g_t} S_{t-1} + k_t^T beta_t (v_t - k_t e^{g_t} S_{t-1}); fp32, per token."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * q.shape[-1] ** -0.5
    B, T, H, Dk = q.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], device=q.device) if s0 is None else s0.float()
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kv = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        S = S + k[:, t, :, :, None] * ((v[:, t] - kv) * beta[:, t, :, None])[:, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    out = torch.stack(outs, 1) if T else v.new_zeros(B, 0, H, v.shape[-1]).float()
    return out, S


def make(B, T, H, Dk, Dv, dtype, state=True, l2norm=True):
    q = torch.randn(B, T, H, Dk, device="cuda")
    k = torch.randn(B, T, H, Dk, device="cuda")
    if not l2norm:  # keep the recurrence stable without the in-kernel normalisation
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = torch.randn(B, T, H, Dv, device="cuda")
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda") + 2.0)
    beta = torch.rand(B, T, H, device="cuda")
    s0 = 0.5 * torch.randn(B, H, Dk, Dv, device="cuda") if state else None
    ins = [q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype)]
    return ins, s0


def run(op, ins, s0, dout, dfinal, **kw):
    leaves = [x.detach().clone().requires_grad_(True) for x in ins]
    s = None if s0 is None else s0.detach().clone().requires_grad_(True)
    out, final = op(*leaves, initial_state=s, output_final_state=True, **kw)
    loss = (out.float() * dout).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal).sum()
    loss.backward()
    grads = [x.grad for x in leaves] + ([s.grad] if s is not None else [])
    return out, final, grads


def check_against_reference(ins, s0, dtype, l2norm=True, cu_seqlens=None):
    B, T, H, _ = ins[0].shape
    dout = torch.randn(B, T, H, ins[2].shape[-1], device="cuda")
    dfinal = torch.randn_like(s0) if s0 is not None else None
    out, final, grads = run(_op(), ins, s0, dout, dfinal, use_qk_l2norm_in_kernel=l2norm)
    ref_leaves = [x.detach().float().requires_grad_(True) for x in ins]
    rs = None if s0 is None else s0.detach().clone().requires_grad_(True)
    rout, rfinal = reference(*ref_leaves, s0=rs, l2norm=l2norm)
    loss = (rout * dout).sum() + ((rfinal * dfinal).sum() if dfinal is not None else 0)
    loss.backward()
    rgrads = [x.grad for x in ref_leaves] + ([rs.grad] if rs is not None else [])
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == rout.shape
    errs = {"out": rel_err(out, rout), "final": rel_err(final, rfinal)}
    for i, (name, a, b) in enumerate(zip(["dq", "dk", "dv", "dg", "dbeta", "ds0"], grads, rgrads)):
        assert a.shape == b.shape, name
        assert a.dtype == (ins[i].dtype if i < 5 else torch.float32), name
        errs[name] = rel_err(a, b, floor=1e-3 * b.numel() ** 0.5)
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"relative errors over {tol}: {bad} (all: {errs})"


SHAPES = [
    (2, 200, 3, 128, 128),  # several chunks and a partial last one
    (1, 1, 1, 128, 128),  # one token
    (1, 64, 2, 64, 32),  # exactly one chunk, small head dims
    (2, 130, 4, 16, 48),  # head dims below a tile
    (1, 70, 64, 32, 32),  # 64 heads
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_against_reference(dtype, shape):
    ins, s0 = make(*shape, dtype)
    check_against_reference(ins, s0, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_l2norm_and_state(dtype):
    ins, s0 = make(2, 150, 2, 128, 128, dtype, state=False, l2norm=False)
    check_against_reference(ins, s0, dtype, l2norm=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_equals_separate(dtype):
    lengths = [50, 1, 0, 130, 64, 7]
    T = sum(lengths)
    ins, _ = make(1, T, 3, 128, 128, dtype)
    s0 = 0.5 * torch.randn(len(lengths), 3, 128, 128, device="cuda")
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda", dtype=torch.int32)
    dout = torch.randn(1, T, 3, 128, device="cuda")
    dfinal = torch.randn_like(s0)
    out, final, grads = run(_op(), ins, s0, dout, dfinal, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    start = 0
    for i, n in enumerate(lengths):
        part = [x[:, start : start + n] for x in ins]
        o, f, gr = run(
            _op(), part, s0[i : i + 1], dout[:, start : start + n], dfinal[i : i + 1], use_qk_l2norm_in_kernel=True
        )
        assert torch.equal(out[:, start : start + n], o), f"output of sequence {i}"
        assert torch.equal(final[i : i + 1], f), f"final state of sequence {i}"
        for name, a, b in zip(["dq", "dk", "dv", "dg", "dbeta"], grads[:5], gr[:5]):
            assert torch.equal(a[:, start : start + n], b), f"{name} of sequence {i}"
        assert torch.equal(grads[5][i : i + 1], gr[5]), f"d initial state of sequence {i}"
        start += n


def test_packed_against_reference():
    lengths = [90, 3, 66]
    ins, _ = make(1, sum(lengths), 2, 128, 128, torch.float32)
    cu = torch.tensor([0, 90, 93, 159], device="cuda")
    out, final = _op()(*ins, cu_seqlens=cu, output_final_state=True, use_qk_l2norm_in_kernel=True)
    start = 0
    for i, n in enumerate(lengths):
        ro, rf = reference(*[x[:, start : start + n] for x in ins])
        assert rel_err(out[:, start : start + n], ro) < TOL[torch.float32]
        assert rel_err(final[i : i + 1], rf) < TOL[torch.float32]
        start += n


def test_deterministic():
    ins, s0 = make(2, 333, 4, 128, 128, torch.bfloat16)
    dout = torch.randn(2, 333, 4, 128, device="cuda")
    dfinal = torch.randn_like(s0)
    a = run(_op(), ins, s0, dout, dfinal, use_qk_l2norm_in_kernel=True)
    b = run(_op(), ins, s0, dout, dfinal, use_qk_l2norm_in_kernel=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for x, y in zip(a[2], b[2]):
        assert torch.equal(x, y)


def test_strided_views_read_in_place():
    """q, k, v as views of one [B, T, conv_dim] tensor (the model's layout): same bits as contiguous copies."""
    B, T, H, D = 2, 100, 4, 128
    mixed = torch.randn(B, T, 3 * H * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (x.reshape(B, T, H, D) for x in torch.split(mixed, H * D, dim=-1))
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda"))
    beta = torch.rand(B, T, H, device="cuda", dtype=torch.bfloat16)
    a, _ = _op()(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    b, _ = _op()(q.contiguous(), k.contiguous(), v.contiguous(), g, beta, use_qk_l2norm_in_kernel=True)
    assert not q.is_contiguous() and torch.equal(a, b)


def test_empty_inputs():
    ins, s0 = make(2, 0, 3, 64, 64, torch.bfloat16)
    out, final = _op()(*ins, initial_state=s0, output_final_state=True)
    assert out.shape == (2, 0, 3, 64) and torch.equal(final, s0)
    ins, _ = make(0, 10, 3, 64, 64, torch.bfloat16, state=False)
    out, final = _op()(*ins, output_final_state=True)
    assert out.shape == (0, 10, 3, 64) and final.shape == (0, 3, 64, 64)


def test_refusals():
    ins, _ = make(1, 10, 2, 256, 64, torch.bfloat16, state=False)
    with pytest.raises(ValueError, match="head dims 1..128"):
        _op()(*ins)
    ins, _ = make(2, 10, 2, 64, 64, torch.bfloat16, state=False)
    with pytest.raises(ValueError, match="packed sequences \\(cu_seqlens\\) need batch 1"):
        _op()(*ins, cu_seqlens=torch.tensor([0, 10], device="cuda"))


def test_opcheck():
    ins, s0 = make(1, 70, 2, 32, 32, torch.float32)
    ins = [x.requires_grad_(True) for x in ins]
    torch.library.opcheck(torch.ops.opslot.gdr_fwd.default, (*ins, s0.requires_grad_(True), None, True, 0.17))
    cu = torch.tensor([0, 30, 70], device="cuda", dtype=torch.int32)
    torch.library.opcheck(torch.ops.opslot.gdr_fwd.default, (*ins, None, cu, True, 0.17))


def test_compile_fullgraph():
    ins, s0 = make(1, 100, 2, 64, 64, torch.bfloat16)
    op = _op()

    def f(q, k, v, g, b, s):
        return op(q, k, v, g, b, initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)

    dout = torch.randn(1, 100, 2, 64, device="cuda", dtype=torch.bfloat16)
    dfinal = torch.randn_like(s0)
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        leaves = [x.detach().clone().requires_grad_(True) for x in ins] + [s0.clone().requires_grad_(True)]
        out, final = fn(*leaves)
        torch.autograd.backward([out, final], [dout, dfinal])
        results.append([out, final] + [x.grad for x in leaves])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_cuda_graph_capture():
    ins, s0 = make(2, 150, 2, 128, 128, torch.bfloat16)
    leaves = [x.detach().clone().requires_grad_(True) for x in ins]
    dout = torch.randn(2, 150, 2, 128, device="cuda", dtype=torch.bfloat16)
    op = _op()

    def step():
        for x in leaves:
            x.grad = None
        out, _ = op(*leaves, initial_state=s0, use_qk_l2norm_in_kernel=True)
        out.backward(dout)
        return out

    graph, out = capture_graph(step)
    graph.replay()
    torch.cuda.synchronize()
    eager = op(*[x.detach() for x in leaves], initial_state=s0, use_qk_l2norm_in_kernel=True)[0]
    assert torch.equal(out, eager)
