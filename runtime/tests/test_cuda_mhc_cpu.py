"""CPU-checkable parts of the `cuda` hyper-connection ops of DeepSeek-V4 (runtime/opslot/kernels/cuda/
mhc.py, kernels/torch/mhc.cc) and of the clamped SwiGLU op (kernels/torch/swiglu.cc):

- the schemas, the Meta kernels (shapes, dtypes, symbolic sizes), torch.library.opcheck;
- the ops' CPU kernels, which run the CUDA composition with each launch done in ATen and the
  kernels' own per-token math (kernels/src/mhc_math.h: Sinkhorn forward and backward, the collapse
  weights' backward), against Transformers' own DeepseekV4HyperConnection / DeepseekV4HyperHead and
  the decoder layer's expansion: outputs and the gradients of the streams, fn, base and scale;
- the argument checks and their messages; the refusal of CPU tensors by the `cuda` functions.
The CUDA kernels themselves are tested on a GPU in tests/gpu/kernels/test_mhc.py.
"""

import types

import pytest
import torch

from opslot.kernels.cuda import _lib

try:
    _lib.torch_ops()
except _lib.KernelLibraryError as exc:  # pragma: no cover - KERNELS=OFF builds
    pytest.skip(f"libopslot_torch.so unavailable: {exc}", allow_module_level=True)
if not hasattr(torch.ops.opslot, "mhc_pre_fwd"):  # pragma: no cover
    pytest.skip("libopslot_torch.so was built without the mhc ops", allow_module_level=True)

from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config  # noqa: E402
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (  # noqa: E402
    DeepseekV4HyperConnection,
    DeepseekV4HyperHead,
)

from opslot.kernels.cuda import mhc, swiglu  # noqa: E402

OPS = torch.ops.opslot


def _config(hidden, hc=4, iters=20):
    return DeepseekV4Config(hidden_size=hidden, hc_mult=hc, hc_sinkhorn_iters=iters, rms_norm_eps=1e-6)


def _init(module, seed=0):
    """Parameters that make every branch matter: mixes of order one, sigmoids off centre, a comb
    far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in ("fn", "hc_fn"):
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif name in ("base", "hc_base"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:
                p.copy_(1 + torch.rand(p.shape, generator=g))
    return module


def hyper_connection(hidden, hc=4, iters=20, seed=0):
    return _init(DeepseekV4HyperConnection(_config(hidden, hc, iters)), seed)


def hyper_head(hidden, hc=4, seed=0):
    return _init(DeepseekV4HyperHead(_config(hidden, hc)), seed)


def streams(b, s, hc, d, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, s, hc, d, generator=g) * 2).to(dtype)


def pre_op(module, x):
    post, comb, collapsed, _, _ = OPS.mhc_pre_fwd(
        x, module.fn, module.base, module.scale, module.hc_sinkhorn_iters, module.hc_eps, module.input_norm.eps
    )
    return post, comb, collapsed


def head_op(module, x):
    return OPS.mhc_head_fwd(x, module.hc_fn, module.hc_base, module.hc_scale, module.eps, module.input_norm.eps)[0]


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    den = float(b.norm())
    return float((a - b).norm()) / den if den > 0 else float((a - b).norm())


def run(fn, module, x, params, seed=3):
    """Outputs and the gradients of x and `params` for random output gradients."""
    x = x.detach().clone().requires_grad_(True)
    for p in params:
        p.grad = None
    outs = fn(module, x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator().manual_seed(seed)
    gos = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, [x] + params, gos)
    return [o.detach() for o in outs], list(grads)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("shape", [(2, 3, 4, 40), (1, 1, 4, 33), (1, 5, 2, 16), (1, 2, 1, 8), (2, 1, 3, 24)])
def test_pre_matches_transformers(dtype, tol, shape):
    b, s, hc, d = shape
    m = hyper_connection(d, hc)
    x = streams(b, s, hc, d, dtype)
    params = [m.fn, m.base, m.scale]
    out, grads = run(pre_op, m, x, params)
    ref, ref_grads = run(lambda mod, t: mod(t), m, x, params)
    for name, a, r in zip(["post", "comb", "collapsed"], out, ref):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        assert rel(a, r) <= (2e-5 if name != "collapsed" else tol), name
    for name, a, r in zip(["x", "fn", "base", "scale"], grads, ref_grads):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        assert rel(a, r) <= (tol if name == "x" else 2e-5), (name, rel(a, r))  # fp32 math either way


@pytest.mark.parametrize("iters", [1, 2, 7])
def test_pre_sinkhorn_iterations(iters):
    m = hyper_connection(16, 4, iters)
    x = streams(1, 6, 4, 16)
    params = [m.fn, m.base, m.scale]
    out, grads = run(pre_op, m, x, params)
    ref, ref_grads = run(lambda mod, t: mod(t), m, x, params)
    for a, r in zip(out + grads, ref + ref_grads):
        assert rel(a, r) <= 5e-5


def test_pre_gradient_of_each_output_alone():
    """Only one of post / comb / collapsed used: the others' gradients are absent (zero)."""
    m = hyper_connection(24, 4)
    x = streams(1, 4, 4, 24)
    for i in range(3):
        xa, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        a = pre_op(m, xa)[i]
        r = m(xr)[i]
        go = torch.randn_like(a)
        ga = torch.autograd.grad(a, [xa, m.fn, m.base, m.scale], go)
        gr = torch.autograd.grad(r, [xr, m.fn, m.base, m.scale], go, allow_unused=True)
        for u, v in zip(ga, gr):
            v = torch.zeros_like(u) if v is None else v
            assert float((u - v).abs().max()) <= 1e-5 * max(1.0, float(v.abs().max())), i


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(2, 3, 4, 40), (1, 1, 4, 33), (1, 3, 3, 8)])
def test_head_matches_transformers(dtype, tol, shape):
    b, s, hc, d = shape
    m = hyper_head(d, hc)
    x = streams(b, s, hc, d, dtype)
    params = [m.hc_fn, m.hc_base, m.hc_scale]
    out, grads = run(head_op, m, x, params)
    ref, ref_grads = run(lambda mod, t: mod(t), m, x, params)
    assert out[0].dtype == dtype and rel(out[0], ref[0]) <= tol
    for name, a, r in zip(["x", "fn", "base", "scale"], grads, ref_grads):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        assert rel(a, r) <= (tol if name == "x" else 2e-5), (name, rel(a, r))  # fp32 math either way


def upstream_post(post, comb, block_output, hidden_states):
    """DeepseekV4DecoderLayer.forward's expansion, verbatim."""
    dtype = hidden_states.dtype
    return post.to(dtype).unsqueeze(-1) * block_output.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), hidden_states
    )


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(2, 3, 4, 40), (1, 1, 4, 33), (1, 2, 2, 8)])
def test_post_matches_upstream(dtype, tol, shape):
    b, s, hc, d = shape
    g = torch.Generator().manual_seed(4)
    post = (torch.rand(b, s, hc, generator=g) * 2).requires_grad_(True)
    comb = torch.rand(b, s, hc, hc, generator=g).requires_grad_(True)
    bo = torch.randn(b, s, d, generator=g).to(dtype).requires_grad_(True)
    h = torch.randn(b, s, hc, d, generator=g).to(dtype).requires_grad_(True)
    out = OPS.mhc_post(post, comb, bo, h)
    ref = upstream_post(post, comb, bo, h)
    assert out.dtype == ref.dtype and out.shape == ref.shape and rel(out, ref) <= tol
    go = torch.randn(out.shape, generator=g).to(dtype)
    ga = torch.autograd.grad(out, [post, comb, bo, h], go)
    gr = torch.autograd.grad(ref, [post, comb, bo, h], go)
    for name, a, r in zip(["post", "comb", "block_output", "hidden_states"], ga, gr):
        assert a.dtype == r.dtype and a.shape == r.shape, name
        assert rel(a, r) <= max(tol, 1e-5), (name, rel(a, r))


def test_empty_and_single_token():
    m = hyper_connection(16, 4)
    for b, s in [(0, 3), (2, 0), (1, 1)]:
        x = streams(b, s, 4, 16).requires_grad_(True)
        post, comb, col = pre_op(m, x)
        assert post.shape == (b, s, 4) and comb.shape == (b, s, 4, 4) and col.shape == (b, s, 16)
        (post.sum() + comb.sum() + col.sum()).backward()
        assert x.grad.shape == x.shape
        if b * s == 0:
            assert float(m.fn.grad.abs().sum()) == 0
        m.zero_grad()
    h = hyper_head(16, 4)
    out = head_op(h, streams(0, 2, 4, 16))
    assert out.shape == (0, 2, 16)
    out = OPS.mhc_post(torch.zeros(0, 2, 4), torch.zeros(0, 2, 4, 4), torch.zeros(0, 2, 16), torch.zeros(0, 2, 4, 16))
    assert out.shape == (0, 2, 4, 16)


def test_non_contiguous_streams():
    m = hyper_connection(16, 4)
    base = streams(1, 6, 4, 32)
    x = base[..., 8:24]  # a view of a wider tensor
    assert not x.is_contiguous()
    out, grads = run(pre_op, m, x, [m.fn])
    ref, ref_grads = run(lambda mod, t: mod(t), m, x.contiguous(), [m.fn])
    for a, r in zip(out + grads, ref + ref_grads):
        assert rel(a, r) <= 2e-5


def test_deterministic():
    m = hyper_connection(24, 4)
    x = streams(2, 5, 4, 24, torch.bfloat16)
    a = run(pre_op, m, x, [m.fn, m.base, m.scale])
    b = run(pre_op, m, x, [m.fn, m.base, m.scale])
    assert all(torch.equal(u, v) for u, v in zip(a[0] + a[1], b[0] + b[1]))


# -- schemas, Meta kernels, opcheck ----------------------------------------------------------------
def test_schemas():
    expect = {
        "mhc_pre_fwd": "opslot::mhc_pre_fwd(Tensor x, Tensor fn, Tensor base, Tensor scale, int sinkhorn_iters, "
        "float hc_eps, float norm_eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        "mhc_pre_bwd": "opslot::mhc_pre_bwd(Tensor? grad_post, Tensor? grad_comb, Tensor? grad_collapsed, Tensor x, "
        "Tensor fn, Tensor base, Tensor scale, Tensor mix, Tensor rstd, int sinkhorn_iters, float hc_eps, "
        "float norm_eps) -> (Tensor, Tensor, Tensor, Tensor)",
        "mhc_head_fwd": "opslot::mhc_head_fwd(Tensor x, Tensor fn, Tensor base, Tensor scale, float hc_eps, "
        "float norm_eps) -> (Tensor, Tensor, Tensor)",
        "mhc_head_bwd": "opslot::mhc_head_bwd(Tensor grad, Tensor x, Tensor fn, Tensor base, Tensor scale, "
        "Tensor mix, Tensor rstd, float hc_eps, float norm_eps) -> (Tensor, Tensor, Tensor, Tensor)",
        "mhc_post": "opslot::mhc_post(Tensor post, Tensor comb, Tensor block_output, Tensor hidden_states) -> Tensor",
        "mhc_post_bwd": "opslot::mhc_post_bwd(Tensor grad, Tensor post, Tensor comb, Tensor block_output, "
        "Tensor hidden_states) -> (Tensor, Tensor, Tensor, Tensor)",
        "silu_mul_clamped": "opslot::silu_mul_clamped(Tensor gate, Tensor up, float limit) -> Tensor",
        "silu_mul_clamped_bwd": "opslot::silu_mul_clamped_bwd(Tensor grad, Tensor gate, Tensor up, float limit) "
        "-> (Tensor, Tensor)",
    }
    for name, schema in expect.items():
        assert str(getattr(OPS, name).default._schema) == schema


def test_meta_shapes_and_dtypes():
    m = hyper_connection(16, 4)
    x = torch.empty(2, 3, 4, 16, dtype=torch.bfloat16, device="meta")
    fn, base, scale = (p.detach().to("meta") for p in (m.fn, m.base, m.scale))
    post, comb, col, mix, rstd = OPS.mhc_pre_fwd(x, fn, base, scale, 20, 1e-6, 1e-6)
    assert (post.shape, comb.shape, col.shape, mix.shape, rstd.shape) == (
        (2, 3, 4),
        (2, 3, 4, 4),
        (2, 3, 16),
        (6, 24),
        (6,),
    )
    assert post.dtype == comb.dtype == mix.dtype == rstd.dtype == torch.float32 and col.dtype == torch.bfloat16
    dx, dfn, dbase, dscale = OPS.mhc_pre_bwd(None, None, col, x, fn, base, scale, mix, rstd, 20, 1e-6, 1e-6)
    assert dx.shape == x.shape and dx.dtype == x.dtype and dfn.shape == fn.shape and dscale.shape == (3,)
    out = OPS.mhc_post(post, comb, col, x)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    out = OPS.silu_mul_clamped(col, col, 7.0)
    assert out.shape == col.shape and out.dtype == col.dtype


def test_fake_tensors_and_symbolic_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    m = hyper_connection(16, 4)
    real = [streams(2, 3, 4, 16)] + [p.detach() for p in (m.fn, m.base, m.scale)]
    mode = FakeTensorMode(shape_env=ShapeEnv())
    x, fn, base, scale = (mode.from_tensor(t, static_shapes=False) for t in real)
    with mode:
        post, comb, col, mix, rstd = OPS.mhc_pre_fwd(x, fn, base, scale, 20, 1e-6, 1e-6)
        assert col.shape[-1] == 16 and comb.shape[-2:] == (4, 4) and mix.shape[-1] == 24
        assert isinstance(mix.shape[0], torch.SymInt)  # batch * seq stays symbolic


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    m = hyper_connection(16, 4)
    h = hyper_head(16, 4)
    x = streams(1, 3, 4, 16, dtype).requires_grad_(True)
    fn, base, scale = (p.detach().clone().requires_grad_(True) for p in (m.fn, m.base, m.scale))
    torch.library.opcheck(OPS.mhc_pre_fwd.default, (x, fn, base, scale, 5, 1e-6, 1e-6))
    hfn, hbase, hscale = (p.detach().clone().requires_grad_(True) for p in (h.hc_fn, h.hc_base, h.hc_scale))
    torch.library.opcheck(OPS.mhc_head_fwd.default, (x, hfn, hbase, hscale, 1e-6, 1e-6))
    post, comb, col, mix, rstd = (t.detach() for t in OPS.mhc_pre_fwd(x, fn, base, scale, 5, 1e-6, 1e-6))
    torch.library.opcheck(
        OPS.mhc_pre_bwd.default,
        (post, comb, col, x.detach(), fn.detach(), base.detach(), scale.detach(), mix, rstd, 5, 1e-6, 1e-6),
    )
    torch.library.opcheck(
        OPS.mhc_post.default,
        (post.requires_grad_(True), comb.requires_grad_(True), col.clone().requires_grad_(True), x),
    )
    torch.library.opcheck(OPS.mhc_post_bwd.default, (x.detach(), post.detach(), comb.detach(), col, x.detach()))


# -- argument checks ------------------------------------------------------------------------------
def test_errors_name_the_op_and_what_to_do():
    m = hyper_connection(16, 4)
    args = (m.fn, m.base, m.scale, 20, 1e-6, 1e-6)
    with pytest.raises(
        ValueError, match=r"^mhc/pre: the streams must be \[batch, seq, hc_mult, hidden\], got shape \(3, 4, 16\)$"
    ):
        OPS.mhc_pre_fwd(torch.zeros(3, 4, 16), *args)
    with pytest.raises(
        ValueError, match=r"^mhc/pre: fn must be \[24, 64\] for streams of shape \(1, 2, 4, 16\), got \(24, 80\)$"
    ):
        OPS.mhc_pre_fwd(torch.zeros(1, 2, 4, 16), torch.zeros(24, 80), m.base, m.scale, 20, 1e-6, 1e-6)
    with pytest.raises(
        ValueError,
        match=r"hc_mult 5 is not supported by the cuda kernels \(1 to 4\); use mhc_implementation 'torch' or 'eager'",
    ):
        OPS.mhc_pre_fwd(torch.zeros(1, 2, 5, 16), torch.zeros(35, 80), torch.zeros(35), torch.zeros(3), 20, 1e-6, 1e-6)
    with pytest.raises(
        TypeError, match=r"mhc/pre: opslot cuda kernels take float32, float16 or bfloat16 tensors, got torch.int32"
    ):
        OPS.mhc_pre_fwd(torch.zeros(1, 2, 4, 16, dtype=torch.int32), *args)
    with pytest.raises(ValueError, match=r"^mhc/head: hc_scale must be \[1\], got \(3,\)$"):
        OPS.mhc_head_fwd(torch.zeros(1, 2, 4, 16), torch.zeros(4, 64), torch.zeros(4), torch.zeros(3), 1e-6, 1e-6)
    with pytest.raises(TypeError, match=r"^mhc/post: block_output is torch.float32 and hidden_states torch.bfloat16"):
        OPS.mhc_post(
            torch.zeros(1, 2, 4),
            torch.zeros(1, 2, 4, 4),
            torch.zeros(1, 2, 16),
            torch.zeros(1, 2, 4, 16, dtype=torch.bfloat16),
        )
    with pytest.raises(
        ValueError, match=r"^mhc/post: comb must be \[batch, seq, hc_mult, hc_mult\] = \(1, 2, 4, 4\), got \(1, 2, 4\)$"
    ):
        OPS.mhc_post(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(1, 2, 16), torch.zeros(1, 2, 4, 16))
    with pytest.raises(ValueError, match=r"^silu_mul_clamped: limit must be a number >= 0, got -1$"):
        OPS.silu_mul_clamped(torch.zeros(2, device="meta"), torch.zeros(2, device="meta"), -1.0)


def test_cuda_functions_refuse_cpu_tensors():
    m = hyper_connection(16, 4)
    with pytest.raises(_lib.KernelLibraryError):
        mhc.mhc_pre(m, streams(1, 2, 4, 16))
    with pytest.raises(_lib.KernelLibraryError):
        mhc.mhc_head(hyper_head(16, 4), streams(1, 2, 4, 16))
    with pytest.raises(_lib.KernelLibraryError):
        mhc.mhc_post(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 16), torch.zeros(1, 2, 4, 16))
    # the clamped SiLU-mul has no CPU kernel (only CUDA tensors)
    with pytest.raises(RuntimeError, match=r"^opslot's cuda kernels run on CUDA tensors, got a tensor on cpu"):
        swiglu.silu_mul_clamped(torch.zeros(4), torch.zeros(4), 7.0)


def test_swiglu_mlp_clamped_checks_the_module():
    mod = types.SimpleNamespace(config=types.SimpleNamespace(hidden_act="gelu"), limit=7.0)
    with pytest.raises(ValueError, match="hidden_act is 'gelu'"):
        swiglu.swiglu_mlp_clamped(mod, torch.zeros(2, 4))
    mod = types.SimpleNamespace(config=types.SimpleNamespace(hidden_act="silu"), limit=None)
    with pytest.raises(ValueError, match=r"swiglu_mlp/clamped \(cuda\) needs the module's clamp limit"):
        swiglu.swiglu_mlp_clamped(mod, torch.zeros(2, 4))
