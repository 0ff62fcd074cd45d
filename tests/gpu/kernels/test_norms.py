"""RMSNorm (standard, offset, unweighted, unweighted_cast) and gated RMSNorm: outputs and all gradients vs the fp32
references, dtypes, widths, empty/single/odd/huge row counts, strided inputs, determinism, batch
invariance."""

import pytest
import torch

from conftest import DTYPES, assert_close, bench_library, fp32_leaf, knob, requires_cuda

pytestmark = requires_cuda


@pytest.fixture(autouse=True, scope="module")
def kernel_version():
    """OPSLOT_RMS_TEST_VERSION=1, 2 or 3 runs this file against the version-1, -2 or -3 kernels for
    every variant, where the version applies (the default, 0, picks per input, on the production
    library). A forced version runs on the bench library (opslot_rms_norm_set_tuning), which must
    then be built."""
    import os

    version = int(os.environ.get("OPSLOT_RMS_TEST_VERSION", "0"))
    if version == 0:
        yield version
        return
    from opslot.kernels.cuda import _lib

    with _lib.using_library(_lib.bench_library_path()) as lib:
        f = knob(lib, "opslot_rms_norm_set_tuning", 3)
        assert f(2, 1, version) == 0
        try:
            yield version
        finally:
            f(2, 1, 0)


WIDTHS = [1, 7, 127, 2048, 4096, 5120, 16384]
ROWS = [0, 1, 3]
VARIANTS = ["standard", "offset", "unweighted", "unweighted_cast", "gated"]


def _ops():
    from opslot import reference as R
    from opslot.kernels.cuda import norms as N

    return {
        "standard": (lambda x, g, w: N.rms_norm_standard(x, w, 1e-6), lambda x, g, w: R.rms_norm_standard(x, w, 1e-6)),
        "offset": (lambda x, g, w: N.rms_norm_offset(x, w, 1e-6), lambda x, g, w: R.rms_norm_offset(x, w, 1e-6)),
        "unweighted": (
            lambda x, g, w: N.rms_norm_unweighted(x, None, 1e-6),
            lambda x, g, w: R.rms_norm_unweighted(x, None, 1e-6),
        ),
        "unweighted_cast": (
            lambda x, g, w: N.rms_norm_unweighted_cast(x, None, 1e-6),
            lambda x, g, w: R.rms_norm_unweighted_cast(x, None, 1e-6),
        ),
        "gated": (lambda x, g, w: N.rms_norm_gated(x, g, w, 1e-6), lambda x, g, w: R.rms_norm_gated(x, g, w, 1e-6)),
    }


def _inputs(variant, rows, width, dtype, w_dtype=None, x=None):
    x = torch.randn(rows, width, device="cuda", dtype=dtype) if x is None else x
    g = torch.randn(x.shape, device="cuda", dtype=dtype) * 2 if variant == "gated" else None
    w = None if variant.startswith("unweighted") else (1 + 0.3 * torch.randn(width, device="cuda")).to(w_dtype or dtype)
    return x, g, w


def check(variant, x, g, w, dtype, scale=1.0):
    ours, ref = _ops()[variant]
    xs = [t.detach().requires_grad_(True) if t is not None else None for t in (x, g, w)]
    y = ours(*xs)
    dy = torch.randn(y.shape, device="cuda", dtype=y.dtype)
    y.backward(dy)
    rs = [fp32_leaf(t) if t is not None else None for t in (x, g, w)]
    yr = ref(*rs)
    yr.backward(dy.float())
    assert y.dtype == ref(*[t.detach().to(t.dtype) if t is not None else None for t in (x, g, w)]).dtype
    assert_close(y, yr, dtype, f"{variant} y", scale)
    for name, a, b in zip(("dx", "dgate", "dw"), xs, rs):
        if a is not None:
            # dx = r (dt - n mean(dt n)) cancels to ~0 for very narrow rows (width 1: n = ±1): there
            # the error is measured against the size of r * dt, not of dx itself.
            floor = None
            if name == "dx" and x.shape[-1] <= 2 and x.numel():
                floor = (dy.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6)).norm().item()
            assert_close(a.grad, b.grad, dtype, f"{variant} {name}", scale * (4 if name == "dw" else 1), floor=floor)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
def test_against_reference(variant, dtype, width, rows):
    check(variant, *_inputs(variant, rows, width, dtype), dtype)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_million_rows(variant):
    check(variant, *_inputs(variant, 1_000_003, 7, torch.bfloat16), torch.bfloat16)


@pytest.mark.parametrize("variant", ["standard", "offset", "gated"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_weight(variant, dtype):  # autocast-style: fp32 parameters, half activations
    check(variant, *_inputs(variant, 5, 256, dtype, w_dtype=torch.float32), dtype)


@pytest.mark.parametrize("variant", VARIANTS)
def test_strided_inputs(variant):
    wide = torch.randn(3, 9, 2 * 512, device="cuda", dtype=torch.bfloat16)
    check(variant, *_inputs(variant, 0, 512, torch.bfloat16, x=wide[..., :512]), torch.bfloat16)  # row stride 1024
    check(
        variant, *_inputs(variant, 0, 96, torch.bfloat16, x=wide[:, :, ::2][..., :96]), torch.bfloat16
    )  # inner stride 2
    t = torch.randn(64, 40, device="cuda", dtype=torch.float16).t()  # transposed
    check(variant, *_inputs(variant, 0, 64, torch.float16, x=t), torch.float16)


def _run(variant, x, g, w, dy):
    ours, _ = _ops()[variant]
    xs = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, g, w)]
    y = ours(*xs)
    y.backward(dy)
    return [y] + [t.grad for t in xs if t is not None]


@pytest.mark.parametrize("variant", VARIANTS)
def test_bitwise_deterministic(variant):
    x, g, w = _inputs(variant, 4099, 4096, torch.bfloat16)
    dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
    a, b = _run(variant, x, g, w, dy), _run(variant, x, g, w, dy)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("width", [7, 4096])
def test_batch_invariant(variant, width):
    x, g, w = _inputs(variant, 3001, width, torch.bfloat16)
    dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
    full = _run(variant, x, g, w, dy)
    part = _run(variant, x[5:9], g[5:9] if g is not None else None, w, dy[5:9])
    assert torch.equal(full[0][5:9], part[0])  # y
    assert torch.equal(full[1][5:9], part[1])  # dx
    if g is not None:
        assert torch.equal(full[2][5:9], part[2])  # dgate


def _set_experiment(lib, pipe_blocks_per_sm, skip_row_sums=0, backward_from_start=0):
    """The bench library's opslot_rms_norm_set_experiment's return code."""
    f = knob(lib, "opslot_rms_norm_set_experiment", 3)
    return f(pipe_blocks_per_sm, skip_row_sums, backward_from_start)


def _experiment(lib, pipe_blocks_per_sm, skip_row_sums=0, backward_from_start=0):
    assert _set_experiment(lib, pipe_blocks_per_sm, skip_row_sums, backward_from_start) == 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("blocks_per_sm,from_start", [(-1, 0), (1, 0), (3, 0), (0, 1)])
def test_version3_geometry_changes_no_row(variant, blocks_per_sm, from_start, kernel_version):
    """Version 3's benchmark geometries (a forward that is not persistent, fewer resident blocks, the
    backward in row order instead of from the last row; bench library): rows bitwise equal to the
    default's (the production library's, unless OPSLOT_RMS_TEST_VERSION forces a version), the
    weight gradient against the reference."""
    if kernel_version not in (0, 3):
        pytest.skip("version 3 only")
    x, g, w = _inputs(variant, 2051, 4096, torch.bfloat16)
    dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
    ref = _run(variant, x, g, w, dy)
    with bench_library() as lib:
        _experiment(lib, blocks_per_sm, 0, from_start)
        try:
            got = _run(variant, x, g, w, dy)
            check(variant, x, g, w, torch.bfloat16)
        finally:
            _experiment(lib, 0)
    rows = [0, 1] + ([2] if g is not None else [])  # y, dx, dgate
    assert all(torch.equal(ref[i], got[i]) for i in rows)


def test_wrong_result_diagnostic_is_not_in_the_default_bench_library():
    """The skip-the-row-sums diagnostic (wrong results on purpose) is compiled only into a bench
    library built with OPSLOT_KERNELS_DIAGNOSTICS=ON (the production library has no knobs at all):
    the default bench library refuses it and keeps its state."""
    with bench_library() as lib:
        if b"diagnostics" in lib.opslot_build_info():
            pytest.skip("this bench library was built with OPSLOT_KERNELS_DIAGNOSTICS=ON")
        assert _set_experiment(lib, 0, 1, 0) == 10002  # OPSLOT_ERR_UNSUPPORTED
        assert lib.opslot_last_error().decode() == (
            "rms_norm experiment: skip_row_sums gives wrong results and is only in a bench library "
            "built with -DOPSLOT_KERNELS_DIAGNOSTICS=ON"
        )
        x, g, w = _inputs("standard", 257, 4096, torch.bfloat16)
        check("standard", x, g, w, torch.bfloat16)


def test_production_library_has_no_knobs():
    """The library opslot loads exports none of bench.h's knobs (runtime/tests/
    test_kernel_library_symbols.py checks the build tree's; this, the library the GPU run loads)."""
    from opslot.kernels.cuda import _lib

    lib = _lib.library()
    if b"; bench" in lib.opslot_build_info():
        pytest.skip(f"the library in use is a bench library: {lib._opslot_path}")
    for name in (
        "opslot_rms_norm_set_tuning",
        "opslot_rms_norm_set_experiment",
        "opslot_rope_set_tuning",
        "opslot_silu_mul_set_tuning",
        "opslot_load_balancing_set_tuning",
    ):
        assert not hasattr(lib, name), f"{lib._opslot_path} exports {name}"


def test_backward_launches_no_fill():
    """rstd has no gradient: the backward runs the two kernels and nothing else (autograd used to
    fill a zero gradient for rstd on every call)."""
    from torch.profiler import ProfilerActivity, profile

    from opslot.kernels.cuda import norms as N

    x, _, w = _inputs("standard", 256, 4096, torch.bfloat16)
    dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
    _run("standard", x, None, w, dy)
    xs, ws = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        N.rms_norm_standard(xs, ws, 1e-6).backward(dy)
        torch.cuda.synchronize()
    assert xs.grad is not None and ws.grad is not None
    names = sorted({e.key for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0})
    opslot = [n for n in names if "opslot" in n]
    others = [n for n in names if "opslot" not in n]
    assert len(opslot) == 3, names  # forward, backward, weight-gradient reduction
    assert not others, names


UNWEIGHTED_CAST = 4  # OPSLOT_RMS_UNWEIGHTED_CAST


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [7, 512, 4096])
def test_unweighted_cast_rounds_the_scale_first(dtype, width):
    """DeepSeek-V4's `x * rsqrt(mean(x^2) + eps).to(x.dtype)`: y is x times the scale rounded to x's
    dtype, bit for bit given the kernel's fp32 scale (its rstd output); dx = to_x(r_x dy - r n
    mean(dy n)) with that rounded scale r_x in the direct term. The plain unweighted formula (the
    unrounded r) rounds a good part of the elements differently, so the test tells the two apart."""
    from opslot.kernels.cuda import norms  # noqa: F401  (loads the opslot ops)

    torch.manual_seed(width)
    x = torch.randn(301, width, device="cuda", dtype=dtype) * 3
    y, rstd = torch.ops.opslot.rms_norm_fwd(x, None, None, 1e-6, UNWEIGHTED_CAST)
    r = rstd.unsqueeze(-1)
    ref = torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(r.double(), ref, rtol=1e-5, atol=0)  # the fp32 scale itself
    assert torch.equal(y, (x.float() * r.to(dtype).float()).to(dtype))
    dy = torch.randn_like(x)
    (dx,) = torch.autograd.grad(
        torch.ops.opslot.rms_norm_fwd(x.requires_grad_(True), None, None, 1e-6, UNWEIGHTED_CAST)[0], x, dy
    )
    xd, dyd, rd = x.detach().double(), dy.double(), r.double()
    n = xd * rd
    mean = (dyd * n).mean(-1, keepdim=True)
    want = r.to(dtype).double() * dyd - rd * n * mean
    plain = rd * dyd - rd * n * mean
    # One rounding of the fp32 computation: equal to the fp64 formula rounded, but for the rare
    # element at a rounding boundary; the unrounded scale's formula rounds a good part differently.
    same = (dx == want.to(dtype)).float().mean().item()
    same_plain = (dx == plain.to(dtype)).float().mean().item()
    assert same >= 0.99, same
    assert same_plain < 0.95, same_plain


def test_unweighted_cast_keeps_a_transposed_layout():
    """q as DeepSeek-V4 normalises it: `[B, H, S, D]`, the transpose of a contiguous `[B, S, H, D]`:
    the output has x's strides (as upstream's elementwise product does) and the same values as on a
    contiguous copy."""
    from opslot.kernels.cuda import norms as N

    base = torch.randn(2, 33, 8, 512, device="cuda", dtype=torch.bfloat16)
    q = base.transpose(1, 2).requires_grad_(True)
    y = N.rms_norm_unweighted_cast(q, None, 1e-6)
    assert y.shape == q.shape and y.stride() == q.stride()
    qc = q.detach().contiguous().requires_grad_(True)
    yc = N.rms_norm_unweighted_cast(qc, None, 1e-6)
    assert torch.equal(y, yc)
    dy = torch.randn_like(yc)
    (g,) = torch.autograd.grad(y, q, dy)
    (gc,) = torch.autograd.grad(yc, qc, dy)
    assert torch.equal(g, gc)
