"""`rms_norm/unweighted_cast` on the CPU: DeepSeek-V4's `DeepseekV4UnweightedRMSNorm`,
`x * rsqrt(mean(x^2) + eps).to(x.dtype)` (the fp32 rsqrt rounded to x's dtype before the product).

- the fp32 reference is upstream's code: bit-equal to the module of every upstream release under
  .upstream/ (5.17.0, 5.23.0, 5.24.0), outputs and x's gradient, fp32/bf16/fp16, odd widths (1, 7,
  33, 513) and the released 512, one or no token, V4's q (a transposed `[B, H, S, D]` view), a
  slice of wider rows, the mHC input norms' fp32 `[B, S, N * D]`; `v4_unweighted_rms_norm` (the mhc
  references' norm) is that reference;
- the `torch` kernel: the same against the installed Transformers' module and every fetched
  release's, upstream's output strides; a weight refused;
- the rounding is not `rms_norm/unweighted`'s in bf16/fp16 (equal in fp32);
- the ops list and the registry: the variant, its `torch` and `cuda` kernels (no `npu`), the
  defaults per device;
- the `cuda` binding's row order (`rows_order`) as a pure function, and the binding over a stand-in
  for the op: a transposed view is normed as its contiguous permutation (no copy, x's strides back,
  values and gradients upstream's), anything else passed as it is;
- the C++ torch op (libopslot_torch.so) with mode 4 on meta tensors: opcheck's schema,
  autograd-registration and fake-tensor tests, output shapes, dtypes and strides, the argument
  checks' messages, CPU tensors refused.
The CUDA kernel itself: tests/gpu/kernels/.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
import torch

from opslot import KERNEL_REGISTRY, DeviceInfo, OpsImplementationConfig, reference, use_device
from opslot.device_defaults import set_cuda_kernels_check
from opslot.kernels import torch_ops
from opslot.ops import KNOWN_OPS

REPO = Path(__file__).resolve().parents[2]
UPSTREAMS = ("5.17.0", "5.23.0", "5.24.0")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
H200 = DeviceInfo("cuda", (9, 0))
WEIGHT_REFUSED = "rms_norm/unweighted_cast takes weight=None"


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    """N(0, 1) with rows of magnitudes from 1e-2 to 1e2 (the rsqrt's rounding over a wide range)."""
    x = torch.randn(*shape, generator=gen(seed))
    if x.dim() > 1:
        x = x * 10.0 ** (4 * torch.rand(*shape[:-1], 1, generator=gen(seed + 1)) - 2)
    return x.to(dtype)


# -- upstream's module, read from the upstream sources (not imported: one release is installed) -------
def upstream_module(version, eps):
    """`DeepseekV4UnweightedRMSNorm(eps)` as written in transformers-<version>'s modeling file, compiled
    on its own; skips when that release is not fetched (`make upstream`)."""
    return upstream_class(version)(eps=eps)


@functools.lru_cache(maxsize=None)
def upstream_class(version):
    path = REPO / ".upstream" / f"transformers-{version}" / "transformers" / "models" / "deepseek_v4"
    path = path / "modeling_deepseek_v4.py"
    if not path.is_file():
        pytest.skip(f"{path} not fetched (scripts/fetch-upstream.py {version})")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defs = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV4UnweightedRMSNorm"]
    assert len(defs) == 1, f"{path}: DeepseekV4UnweightedRMSNorm not found"
    namespace = {"torch": torch, "nn": torch.nn}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["DeepseekV4UnweightedRMSNorm"]


def installed_module(eps):
    """The installed Transformers' own `DeepseekV4UnweightedRMSNorm` (skips without one)."""
    try:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4
    except ImportError as exc:  # a Transformers without DeepSeek-V4
        pytest.skip(f"no DeepSeek-V4 in the installed Transformers: {exc}")
    return modeling_deepseek_v4.DeepseekV4UnweightedRMSNorm(eps=eps)


def upstreams(eps):
    """The installed module and every fetched release's."""
    mods = [installed_module(eps)]
    for version in UPSTREAMS:
        if (REPO / ".upstream" / f"transformers-{version}").is_dir():
            mods.append(upstream_module(version, eps))
    return mods


def run(fn, x):
    """fn(leaf) and the leaf's gradient for a fixed cotangent (in fp32, as a loss would give it)."""
    leaf = x.detach().clone().requires_grad_(True)
    out = fn(leaf)
    (grad,) = torch.autograd.grad((out.float() * randn(*out.shape, seed=99)).sum(), (leaf,))
    return out, grad


def assert_bit_equal(got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a, b), f"tensor {i}: max abs difference {(a.double() - b.double()).abs().max()}"


#: (b, h, s, d): odd widths, the released head_dim 512, one head and token, width 1, no token.
SHAPES = [(2, 3, 5, 33), (1, 4, 7, 7), (2, 2, 3, 512), (1, 1, 1, 1), (3, 5, 2, 513), (2, 3, 0, 8)]
EPS = (1e-6, 1e-2)


def cases(b, h, s, d, dtype):
    """(name, x): V4's q (the transpose(1, 2) of a contiguous [B, S, H, D] projection), a contiguous
    [B, H, S, D], a slice of wider rows, rows [B * S, D], and the mHC input norm's fp32 [B, S, H * D]."""
    return [
        ("q", randn(b, s, h, d, seed=1, dtype=dtype).transpose(1, 2)),
        ("contiguous", randn(b, h, s, d, seed=2, dtype=dtype)),
        ("sliced", randn(b, h, s, d + 3, seed=3, dtype=dtype)[..., 3:]),
        ("rows", randn(b * s, d, seed=4, dtype=dtype)),
        ("mhc input", randn(b, s, h * d, seed=5, dtype=dtype).float()),
    ]


# -- the reference and the torch kernel are upstream's code ---------------------------------------------
@pytest.mark.parametrize("version", UPSTREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,d", SHAPES)
def test_reference_is_upstream(version, dtype, b, h, s, d):
    for eps in EPS:
        upstream = upstream_module(version, eps)
        for name, x in cases(b, h, s, d, dtype):
            got = run(lambda t: reference.rms_norm_unweighted_cast(t, None, eps), x)
            assert_bit_equal(got, run(upstream, x))
            # the mhc references' norm is the same function
            assert_bit_equal(got, run(lambda t: reference.v4_unweighted_rms_norm(t, eps), x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,d", SHAPES)
def test_torch_kernel_is_upstream(dtype, b, h, s, d):
    """The kernel against the installed Transformers' module and every fetched release's: outputs
    (values, dtype, strides) and x's gradient bit for bit (the CPU end-to-end test needs that)."""
    ours = KERNEL_REGISTRY.resolve("rms_norm", "unweighted_cast", "torch")
    assert ours is torch_ops.rms_norm_unweighted_cast
    for eps in EPS:
        for name, x in cases(b, h, s, d, dtype):
            got = run(lambda t: ours(t, None, eps), x)
            want_dtype = torch.float32 if name == "mhc input" else dtype
            assert got[0].dtype == want_dtype and got[0].shape == x.shape and got[1].shape == x.shape, name
            for upstream in upstreams(eps):
                want = run(upstream, x)
                assert_bit_equal(got, want)
                assert got[0].stride() == want[0].stride(), name
            if name == "q" and x.numel() and min(h, s) > 1:
                assert got[0].stride() == x.stride()  # upstream's elementwise ops keep the transposed layout


def test_v4_unweighted_rms_norm_calls_the_variant(monkeypatch):
    """One formula: the mhc references' norm is `rms_norm_unweighted_cast`, not a copy of it."""
    seen = []
    monkeypatch.setattr(reference, "rms_norm_unweighted_cast", lambda x, w, eps: seen.append((w, eps)) or x)
    x = randn(2, 8)
    assert reference.v4_unweighted_rms_norm(x, 1e-5) is x and seen == [(None, 1e-5)]


def test_rounding_is_not_unweighted():
    """In bf16/fp16 the rsqrt rounded before the product differs from rms_norm/unweighted's single
    rounding after it (most elements); in fp32 the two agree."""
    for dtype in (torch.bfloat16, torch.float16):
        x = randn(64, 5, 96, seed=7, dtype=dtype)
        cast = reference.rms_norm_unweighted_cast(x, None, 1e-6)
        plain = reference.rms_norm_unweighted(x, None, 1e-6)
        assert cast.dtype == plain.dtype == dtype
        assert (cast != plain).float().mean() > 0.1
        assert (cast.double() - plain.double()).abs().max() / plain.double().abs().max() < 1e-2
    x = randn(64, 5, 96, seed=7)
    assert torch.equal(reference.rms_norm_unweighted_cast(x, None, 1e-6), reference.rms_norm_unweighted(x, None, 1e-6))


def test_torch_kernel_refuses_a_weight():
    x = randn(2, 3, 8)
    with pytest.raises(ValueError) as err:
        torch_ops.rms_norm_unweighted_cast(x, torch.ones(8), 1e-6)
    assert str(err.value) == WEIGHT_REFUSED


# -- the ops list and the registry ---------------------------------------------------------------------
def test_ops_and_registry():
    assert KNOWN_OPS["rms_norm"] == ("standard", "offset", "unweighted", "unweighted_cast")
    listed = KERNEL_REGISTRY.list_available(include_unsupported=True)
    # no npu kernel: npu_rms_norm is not known to round as upstream does here
    assert listed[("rms_norm", "unweighted_cast")] == ["cuda", "torch"]
    assert KERNEL_REGISTRY.get("rms_norm", "unweighted_cast", "torch").factory == (
        "opslot.kernels.torch_ops:rms_norm_unweighted_cast"
    )
    assert KERNEL_REGISTRY.get("rms_norm", "unweighted_cast", "cuda").factory == (
        "opslot.kernels.cuda.norms:rms_norm_unweighted_cast"
    )


def test_effective_defaults_per_device():
    set_cuda_kernels_check(lambda: None)
    try:
        with use_device(H200):
            assert OpsImplementationConfig().effective_impl("rms_norm", "unweighted_cast") == "cuda"
    finally:
        set_cuda_kernels_check(None)
    with use_device(DeviceInfo("npu")):
        cfg = OpsImplementationConfig()
        assert cfg.effective_impl("rms_norm", "unweighted") == "npu"
        # the npu default has no kernel for this variant: upstream's code
        assert cfg.effective_impl("rms_norm", "unweighted_cast") == "eager"
    assert OpsImplementationConfig().effective_impl("rms_norm", "unweighted_cast") == "eager"
    with use_device(DeviceInfo("cpu")):
        cfg = OpsImplementationConfig(rms_norm_implementation="torch")
        assert cfg.validate([("rms_norm", "unweighted_cast")]) == {("rms_norm", "unweighted_cast"): "torch"}


# -- the cuda binding: its row order, and the binding over a stand-in for the op ------------------------
@pytest.fixture
def norms():
    from opslot.kernels.cuda import norms  # imports on a CPU machine (the op raises only when called)

    return norms


def test_rows_order(norms):
    base = torch.empty(2, 7, 4, 24)
    assert norms.rows_order(base) is None  # contiguous
    assert norms.rows_order(base.transpose(1, 2)) == (0, 2, 1, 3)  # V4's q
    assert norms.rows_order(base.permute(2, 0, 1, 3)) == (1, 2, 0, 3)
    five = torch.empty(2, 3, 4, 5, 6).permute(0, 3, 1, 2, 4)
    assert norms.rows_order(five) == (0, 2, 3, 1, 4) and five.permute(0, 2, 3, 1, 4).is_contiguous()
    assert norms.rows_order(torch.empty(1, 7, 4, 24).transpose(1, 2)) == (0, 2, 1, 3)  # a batch of one
    # none helps: a slice of wider rows, a strided last dimension, a broadcast, a step over rows
    assert norms.rows_order(torch.empty(2, 4, 7, 27)[..., 3:]) is None
    assert norms.rows_order(torch.empty(2, 4, 24, 7).transpose(-1, -2)) is None
    assert norms.rows_order(torch.empty(7, 1, 24).expand(7, 4, 24)) is None
    assert norms.rows_order(torch.empty(2, 8, 7, 24)[:, ::2].transpose(1, 2)) is None
    # fewer than three dimensions: no leading order to change
    assert norms.rows_order(torch.empty(7, 24)[::2]) is None
    assert norms.rows_order(torch.empty(24)) is None
    assert norms.rows_order(torch.empty(())) is None


@pytest.fixture
def stand_in(norms, monkeypatch):
    """`opslot::rms_norm_fwd` replaced by its contract on the CPU (y contiguous in x's shape, the fp32
    rstd), recording what it was called with."""
    calls = []

    def fwd(x, gate, weight, eps, mode):
        calls.append((x, gate, weight, eps, mode))
        y = reference.rms_norm_unweighted_cast(x, None, eps).contiguous()
        return y, torch.rsqrt(x.float().square().mean(-1) + eps)

    monkeypatch.setattr(norms, "_FWD", fwd)
    return calls


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_binding_norms_a_transposed_view_in_place(norms, stand_in, dtype):
    """V4's q: the op gets the contiguous [B, S, H, D] memory itself (no copy), the result comes back
    with q's strides, and values and gradients are upstream's."""
    x = randn(2, 7, 4, 24, seed=11, dtype=dtype).transpose(1, 2).requires_grad_(True)
    out = norms.rms_norm_unweighted_cast(x, None, 1e-6)
    assert len(stand_in) == 1
    arg, gate, weight, eps, mode = stand_in[0]
    assert arg.is_contiguous() and arg.shape == (2, 7, 4, 24) and arg.data_ptr() == x.data_ptr()
    assert (gate, weight, eps, mode) == (None, None, 1e-6, norms.UNWEIGHTED_CAST) and norms.UNWEIGHTED_CAST == 4
    assert out.shape == x.shape and out.stride() == x.stride()
    (grad,) = torch.autograd.grad((out.float() * randn(*out.shape, seed=99)).sum(), (x,))
    assert_bit_equal((out, grad), run(installed_module(1e-6), x))


def test_binding_passes_other_layouts_as_they_are(norms, stand_in):
    five = randn(2, 3, 4, 5, 6, seed=12).permute(0, 3, 1, 2, 4)
    for x in (
        randn(2, 4, 7, 24, seed=13),  # contiguous
        randn(2, 4, 7, 27, seed=14)[..., 3:],  # a slice of wider rows: the op copies or views it
        randn(14, 24, seed=15),
    ):
        stand_in.clear()
        out = norms.rms_norm_unweighted_cast(x, None, 1e-5)
        assert stand_in[0][0] is x and out.shape == x.shape
        assert torch.equal(out, reference.rms_norm_unweighted_cast(x, None, 1e-5))
    stand_in.clear()
    out = norms.rms_norm_unweighted_cast(five, None, 1e-5)
    assert stand_in[0][0].is_contiguous() and stand_in[0][0].data_ptr() == five.data_ptr()
    assert out.stride() == five.stride() and torch.equal(out, reference.rms_norm_unweighted_cast(five, None, 1e-5))


def test_binding_refuses_a_weight(norms, stand_in):
    with pytest.raises(ValueError) as err:
        norms.rms_norm_unweighted_cast(randn(2, 3, 8), torch.ones(8), 1e-6)
    assert str(err.value) == WEIGHT_REFUSED and stand_in == []


# -- the C++ torch op, mode 4, on meta tensors ---------------------------------------------------------
TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture(scope="module")
def cuda_norms():
    from test_kernel_library_symbols import _library

    _library("libopslot_torch.so")
    from opslot.kernels.cuda import norms

    return norms


def meta(*shape, dtype=torch.bfloat16, requires_grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta").requires_grad_(requires_grad)


def _cases():
    O = torch.ops.opslot  # noqa: E741
    q = meta(2, 7, 4, 24).transpose(1, 2).requires_grad_(True)  # V4's q: [b, s, h, d] memory
    rstd = meta(2, 4, 7, dtype=torch.float32)
    return [
        ("fwd bf16", O.rms_norm_fwd.default, (meta(2, 7, 24, requires_grad=True), None, None, 1e-6, 4)),
        (
            "fwd fp16 odd",
            O.rms_norm_fwd.default,
            (meta(3, 5, 33, dtype=torch.float16, requires_grad=True), None, None, 1e-6, 4),
        ),
        (
            "fwd fp32 rows",
            O.rms_norm_fwd.default,
            (meta(9, 512, dtype=torch.float32, requires_grad=True), None, None, 1e-2, 4),
        ),
        ("fwd transposed", O.rms_norm_fwd.default, (q, None, None, 1e-6, 4)),
        ("bwd", O.rms_norm_bwd.default, (meta(2, 4, 7, 24), meta(2, 4, 7, 24), None, None, rstd, 4)),
    ]


@pytest.mark.parametrize("index", range(5))
def test_opcheck_on_meta(cuda_norms, index):
    name, op, args = _cases()[index]
    torch.library.opcheck(op, args, test_utils=TEST_UTILS)


def test_op_outputs_on_meta(cuda_norms):
    for dtype in DTYPES:
        x = meta(3, 5, 33, dtype=dtype)
        y, rstd = torch.ops.opslot.rms_norm_fwd(x, None, None, 1e-6, 4)
        assert (y.shape, y.dtype, y.stride()) == (x.shape, dtype, (5 * 33, 33, 1))
        assert (rstd.shape, rstd.dtype) == ((3, 5), torch.float32)
        dx, dgate, dw = torch.ops.opslot.rms_norm_bwd(y, x, None, None, rstd, 4)
        assert (dx.shape, dx.dtype) == (x.shape, dtype) and dgate.numel() == 0 and dw.numel() == 0


def test_public_function_on_meta(cuda_norms):
    """V4's q through the binding: x's shape, dtype and strides back, the op's autograd node under
    the permutation, a gradient with q's strides."""
    q = meta(2, 7, 4, 512).transpose(1, 2).requires_grad_(True)
    out = cuda_norms.rms_norm_unweighted_cast(q, None, 1e-6)
    assert (out.shape, out.dtype, out.stride()) == (q.shape, torch.bfloat16, q.stride())
    assert "Permute" in out.grad_fn.name() and "RmsNormFunction" in out.grad_fn.next_functions[0][0].name()
    (dx,) = torch.autograd.grad(out.sum(), (q,))
    assert dx.shape == q.shape and dx.stride() == q.stride()
    x = meta(3, 33, dtype=torch.float16, requires_grad=True)
    out = cuda_norms.rms_norm_unweighted_cast(x, None, 1e-6)
    assert (out.shape, out.dtype) == (x.shape, torch.float16) and "RmsNormFunction" in out.grad_fn.name()


def test_argument_checks(cuda_norms):
    fwd = torch.ops.opslot.rms_norm_fwd
    x = meta(2, 7, 24)
    with pytest.raises(ValueError) as err:
        fwd(x, None, meta(24), 1e-6, 4)
    assert str(err.value).startswith(WEIGHT_REFUSED)
    with pytest.raises(ValueError, match=r"^rms_norm/unweighted_cast takes no gate"):
        fwd(x, meta(2, 7, 24), None, 1e-6, 4)
    with pytest.raises(TypeError, match=r"^rms_norm/unweighted_cast: opslot cuda kernels take float32"):
        fwd(torch.empty(2, 24, dtype=torch.int32, device="meta"), None, None, 1e-6, 4)
    with pytest.raises(ValueError, match=r"^rms_norm/unweighted_cast: the input needs a non-empty last dimension"):
        fwd(meta(2, 0), None, None, 1e-6, 4)


def test_cpu_tensors_are_refused(cuda_norms):
    x = torch.randn(2, 7, 24)
    for call in (
        lambda: torch.ops.opslot.rms_norm_fwd(x, None, None, 1e-6, 4),
        lambda: torch.ops.opslot.rms_norm_bwd(x, x, None, None, torch.ones(2, 7), 4),
        lambda: cuda_norms.rms_norm_unweighted_cast(x.transpose(0, 1), None, 1e-6),
    ):
        with pytest.raises(Exception, match=r"run on CUDA tensors|runs on CUDA tensors"):
            call()
