"""The RoPE variants beside the rotate_half ones, on the CPU: `rotary_pos_emb/interleaved` (DeepSeek-V3's
`apply_rotary_pos_emb_interleave`), `rotary_pos_emb_vision/standard` (the VL vision towers'
`apply_rotary_pos_emb_vision`), both of issue #31 item 3, and `rotary_pos_emb/deepseek_v4` (DeepSeek-V4's
`apply_rotary_pos_emb`: one tensor, half-width cos/sin, the trailing slice's interleaved pairs turned in
place).

- the fp32 references are upstream's code: bit-equal to the function of every upstream release under
  .upstream/ (5.17.0, 5.23.0, 5.24.0; all four VL models for the vision one), outputs and gradients;
- the `torch` kernels against the references: bit-equal (they compute the same products and sums),
  fp32/bf16/fp16, odd head dims, non-contiguous views (DeepSeek's q_rot slice, the vision tower's
  unbound qkv), q and k of different dtypes;
- DeepSeek-V4's reference and `torch` kernel against upstream's function (every fetched release and the
  installed module): bit-equal outputs and x's gradient in fp32/bf16/fp16, rope dim 2, no nope part,
  odd outer sizes, transposed and sliced views, unsqueeze_dim 1 and 2, `-sin` (the attention output's
  conjugate rotation), the compressors' `x.unsqueeze(1)`;
- the NPU adapters against a fake torch_npu;
- the ops config: `rotary_pos_emb_vision_implementation` is a field (parsing, suggestions, CPU/CUDA/NPU
  defaults, the reference trainer's `eager`/`npu` as opslot's own names), the registry's kernels;
- the C++ torch ops (libopslot_torch.so) on meta tensors: opcheck's schema, autograd-registration and
  fake-tensor tests, dispatch keys, output layouts and the argument checks' messages.
The CUDA kernels themselves: tests/gpu/kernels/test_rope.py.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from fake_torch_npu import make_fake_torch_npu
from opslot import KERNEL_REGISTRY, DeviceInfo, OpsImplementationConfig, reference, use_device
from opslot.device_defaults import CPU_DEFAULTS, CUDA_DEFAULTS, NPU_DEFAULTS, set_cuda_kernels_check
from opslot.kernels import torch_ops
from opslot.ops import CONFIG_FIELDS, FIELD_FOR_OP, KNOWN_OPS

REPO = Path(__file__).resolve().parents[2]
UPSTREAMS = ("5.17.0", "5.23.0", "5.24.0")
VL_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
H200 = DeviceInfo("cuda", (9, 0))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=gen(seed)).to(dtype)


# -- upstream's functions, read from the upstream sources (not imported: one release is installed) -----
def upstream_function(version, model, name):
    """`name` (and the `rotate_half` it calls) as written in transformers-<version>'s modeling file of
    `model`, compiled on its own; skips when that release is not fetched (`make upstream`)."""
    path = REPO / ".upstream" / f"transformers-{version}" / "transformers" / "models" / model / f"modeling_{model}.py"
    if not path.is_file():
        pytest.skip(f"{path} not fetched (scripts/fetch-upstream.py {version})")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    wanted = {name, "rotate_half"}
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    assert {d.name for d in defs} == wanted, f"{path}: {wanted - {d.name for d in defs}} not found"
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def run(fn, tensors, *args, **kwargs):
    """fn(*leaves, *args, **kwargs) and the gradients of the leaves for a fixed cotangent."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    outs = fn(*leaves, *args, **kwargs)
    total = sum((o.float() * randn(*o.shape, seed=99 + i)).sum() for i, o in enumerate(outs))
    grads = torch.autograd.grad(total, [x for x in leaves if x.requires_grad][:2])
    return list(outs) + list(grads)


def assert_bit_equal(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, (i, x.dtype, y.dtype, x.shape, y.shape)
        assert torch.equal(x, y), f"tensor {i}: max abs difference {(x.double() - y.double()).abs().max()}"


def deepseek_inputs(b, h, s, d, dtype, seed=0):
    """q_rot / k_rot as DeepSeek-V3's attention makes them: slices of wider projections (q 128 nope
    features first), k one head; cos/sin [b, s, d] in q's dtype (cat(freqs, freqs), as its rotary
    embedding returns them)."""
    q_states = randn(b, s, h, 8 + d, seed=seed, dtype=dtype).transpose(1, 2)
    q_rot = q_states[..., 8:]
    k_rot = randn(b, s, 12 + d, seed=seed + 1, dtype=dtype)[..., 12:].view(b, 1, s, d)
    pos = torch.arange(s).float()[None, :, None] + randn(b, 1, 1, seed=seed + 2).abs()
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.cat([pos * inv, pos * inv], dim=-1)
    return q_rot, k_rot, ang.cos().to(dtype), ang.sin().to(dtype)


def vision_inputs(seq, heads, d, dtype, seed=0, cs_dtype=torch.float32):
    """q/k as the vision attention makes them: views of one qkv projection [seq, 3, heads, d]
    (non-contiguous), cos/sin [seq, d] in fp32 (the vision rotary embedding's)."""
    qkv = randn(seq, 3 * heads * d, seed=seed, dtype=dtype)
    q, k, _ = qkv.reshape(seq, 3, heads, d).permute(1, 0, 2, 3).unbind(0)
    freqs = randn(seq, d // 2, seed=seed + 1) * 3
    emb = torch.cat([freqs, freqs], dim=-1)
    return q, k, emb.cos().to(cs_dtype), emb.sin().to(cs_dtype)


# -- the references are upstream's code --------------------------------------------------------------
@pytest.mark.parametrize("version", UPSTREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interleaved_reference_is_upstream(version, dtype):
    upstream = upstream_function(version, "deepseek_v3", "apply_rotary_pos_emb_interleave")
    q, k, cos, sin = deepseek_inputs(2, 3, 5, 16, dtype)
    assert_bit_equal(
        run(reference.rotary_pos_emb_interleaved, (q, k), cos, sin),
        run(upstream, (q, k), cos, sin),
    )
    # unsqueeze_dim=2 ([b, s, h, d] q/k) and position_ids (unused, as upstream)
    q2, k2 = q.transpose(1, 2), k.transpose(1, 2)
    assert_bit_equal(
        run(reference.rotary_pos_emb_interleaved, (q2, k2), cos, sin, position_ids=None, unsqueeze_dim=2),
        run(upstream, (q2, k2), cos, sin, position_ids=torch.arange(5), unsqueeze_dim=2),
    )


@pytest.mark.parametrize("version", UPSTREAMS)
@pytest.mark.parametrize("model", VL_MODELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_vision_reference_is_upstream(version, model, dtype):
    upstream = upstream_function(version, model, "apply_rotary_pos_emb_vision")
    q, k, cos, sin = vision_inputs(7, 3, 10, dtype)
    assert_bit_equal(run(reference.rotary_pos_emb_vision, (q, k), cos, sin), run(upstream, (q, k), cos, sin))


def test_interleaved_is_deinterleave_then_rotate_half():
    """What upstream's docstring says, and docs/ops.md: with cos = cat(freqs, freqs), the interleaved
    rotation is the full (rotate_half) rotation of the de-interleaved q/k, bit for bit; with another
    second half, only the first half of cos/sin counts."""
    q, k, cos, sin = deepseek_inputs(2, 3, 5, 16, torch.float32)

    def deinterleave(x):
        return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)

    full = reference.rotary_pos_emb_full(deinterleave(q), deinterleave(k), cos, sin)
    assert_bit_equal(list(reference.rotary_pos_emb_interleaved(q, k, cos, sin)), list(full))
    other = torch.cat((cos[..., :8], randn(2, 5, 8, seed=5)), dim=-1)
    assert_bit_equal(
        list(reference.rotary_pos_emb_interleaved(q, k, other, sin)),
        list(reference.rotary_pos_emb_interleaved(q, k, cos, sin)),
    )


# -- the torch kernels -----------------------------------------------------------------------------
def kernel(op, variant, name="torch"):
    return KERNEL_REGISTRY.resolve(op, variant, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,d", [(2, 4, 5, 64), (1, 3, 7, 2), (2, 1, 1, 6), (1, 5, 3, 34), (2, 2, 0, 8)])
def test_interleaved_torch_kernel(dtype, b, h, s, d):
    q, k, cos, sin = deepseek_inputs(b, h, s, d, dtype)
    assert s == 0 or not (q.is_contiguous() or k.is_contiguous())
    ours = kernel("rotary_pos_emb", "interleaved")
    assert ours is torch_ops.rotary_pos_emb_interleaved
    got = run(ours, (q, k), cos, sin, position_ids=None, unsqueeze_dim=1)
    assert_bit_equal(got, run(reference.rotary_pos_emb_interleaved, (q, k), cos, sin))
    assert got[0].dtype == dtype and got[0].shape == q.shape and got[1].shape == k.shape


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interleaved_torch_kernel_unsqueeze_dim_2_and_fp32_angles(dtype):
    q, k, cos, sin = deepseek_inputs(2, 4, 5, 16, dtype)
    q2, k2 = q.transpose(1, 2), k.transpose(1, 2)  # [b, s, h, d]
    got = run(torch_ops.rotary_pos_emb_interleaved, (q2, k2), cos.float(), sin.float(), unsqueeze_dim=2)
    assert_bit_equal(
        got, run(reference.rotary_pos_emb_interleaved, (q2, k2), cos.float(), sin.float(), unsqueeze_dim=2)
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seq,heads,d", [(16, 4, 80), (7, 3, 10), (1, 1, 2), (33, 16, 64), (0, 2, 8)])
def test_vision_torch_kernel(dtype, seq, heads, d):
    q, k, cos, sin = vision_inputs(seq, heads, d, dtype)
    ours = kernel("rotary_pos_emb_vision", "standard")
    assert ours is torch_ops.rotary_pos_emb_vision
    got = run(ours, (q, k), cos, sin)
    assert_bit_equal(got, run(reference.rotary_pos_emb_vision, (q, k), cos, sin))
    assert got[0].dtype == dtype and got[1].dtype == dtype


def test_vision_torch_kernel_mixed_dtypes_and_half_angles():
    """Upstream casts q and k back to their own dtypes and computes with `cos.float()`."""
    q, _, cos, sin = vision_inputs(9, 2, 12, torch.bfloat16, cs_dtype=torch.float16)
    k = randn(9, 2, 12, seed=8, dtype=torch.float16)
    got = run(torch_ops.rotary_pos_emb_vision, (q, k), cos, sin)
    assert (got[0].dtype, got[1].dtype, got[2].dtype, got[3].dtype) == (
        torch.bfloat16,
        torch.float16,
        torch.bfloat16,
        torch.float16,
    )
    assert_bit_equal(got, run(reference.rotary_pos_emb_vision, (q, k), cos, sin))


def test_torch_kernels_are_close_to_the_fp32_reference():
    """The tolerance the GPU tests use: a 16-bit run against the reference on fp32 copies."""
    q, k, cos, sin = deepseek_inputs(2, 4, 5, 64, torch.bfloat16)
    got = run(torch_ops.rotary_pos_emb_interleaved, (q, k), cos, sin)
    ref = run(reference.rotary_pos_emb_interleaved, (q.float(), k.float()), cos.float(), sin.float())
    for a, b in zip(got, ref):
        assert (a.double() - b.double()).norm() / b.double().norm() < 1e-2
    # and the test can tell the variants apart: the full rotation of the same inputs is far off
    full = run(reference.rotary_pos_emb_full, (q.float(), k.float()), cos.float(), sin.float())
    assert (full[0] - ref[0]).norm() / ref[0].norm() > 0.5


# -- rotary_pos_emb/deepseek_v4 (DeepSeek-V4's apply_rotary_pos_emb) ---------------------------------
def installed_v4_function():
    """The installed Transformers' own `apply_rotary_pos_emb` of DeepSeek-V4 (skips without one)."""
    try:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4
    except ImportError as exc:  # a Transformers without DeepSeek-V4
        pytest.skip(f"no DeepSeek-V4 in the installed Transformers: {exc}")
    return modeling_deepseek_v4.apply_rotary_pos_emb


def single(fn):
    """fn's one tensor as the 1-tuple `run` expects."""
    return lambda *args, **kwargs: (fn(*args, **kwargs),)


def v4_inputs(b, h, s, d, rd, dtype, seed=0):
    """x [B, H, S, D] as V4's attention makes q and kv: the transposed view of a [B, S, H, D]
    projection; cos/sin half-width [B, S, rd/2] in x's dtype (`DeepseekV4RotaryEmbedding`'s)."""
    x = randn(b, s, h, d, seed=seed, dtype=dtype).transpose(1, 2)
    pos = torch.arange(s).float()[None, :, None] + randn(b, 1, 1, seed=seed + 2).abs()
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd))
    ang = pos * inv
    return x, ang.cos().to(dtype), ang.sin().to(dtype)


#: (b, h, s, d, rd): V4-like (a nope part, rope dim 64 of 512 scaled down), rope dim 2, no nope part
#: (d == rd), odd outer sizes, one token, no token.
V4_SHAPES = [(2, 4, 5, 48, 16), (1, 3, 7, 5, 2), (2, 1, 1, 6, 6), (3, 5, 7, 34, 10), (1, 2, 9, 2, 2), (2, 2, 0, 8, 4)]


def v4_cases(b, h, s, d, rd, dtype):
    """(name, x, cos, sin, kwargs): every way the model calls the function (q and kv [B, H, S, D];
    the attention output's conjugate rotation with -sin; the compressors' x.unsqueeze(1); the
    indexer's q), plus unsqueeze_dim=2 on [B, S, H, D] and a slice of a wider tensor."""
    x, cos, sin = v4_inputs(b, h, s, d, rd, dtype)
    wide = randn(b, h, s, d + 3, seed=4, dtype=dtype)[..., 3:]
    compressed = randn(b, s, d, seed=5, dtype=dtype).unsqueeze(1)
    return [
        ("q", x, cos, sin, {}),
        ("conjugate", x, cos, -sin, {}),
        ("unsqueeze_dim 2", randn(b, h, s, d, seed=3, dtype=dtype).transpose(1, 2), cos, sin, {"unsqueeze_dim": 2}),
        ("sliced", wide, cos, sin, {"unsqueeze_dim": 1}),
        ("compressed keys", compressed, cos, sin, {}),
    ]


@pytest.mark.parametrize("version", UPSTREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,d,rd", V4_SHAPES)
def test_deepseek_v4_reference_is_upstream(version, dtype, b, h, s, d, rd):
    upstream = upstream_function(version, "deepseek_v4", "apply_rotary_pos_emb")
    for name, x, cos, sin, kwargs in v4_cases(b, h, s, d, rd, dtype):
        want = run(single(upstream), (x,), cos, sin, **kwargs)
        assert_bit_equal(run(single(reference.rotary_pos_emb_deepseek_v4), (x,), cos, sin, **kwargs), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,d,rd", V4_SHAPES)
def test_deepseek_v4_torch_kernel_is_upstream(dtype, b, h, s, d, rd):
    """The kernel against the installed Transformers' own function, and against every fetched
    release's: outputs and x's gradient bit for bit (the CPU end-to-end test needs that)."""
    ours = kernel("rotary_pos_emb", "deepseek_v4")
    assert ours is torch_ops.rotary_pos_emb_deepseek_v4
    upstreams = [installed_v4_function()]
    for version in UPSTREAMS:
        if (REPO / ".upstream" / f"transformers-{version}").is_dir():
            upstreams.append(upstream_function(version, "deepseek_v4", "apply_rotary_pos_emb"))
    for name, x, cos, sin, kwargs in v4_cases(b, h, s, d, rd, dtype):
        assert min(h, s) < 2 or not x.is_contiguous() or name == "compressed keys", name
        got = run(single(ours), (x,), cos, sin, **kwargs)
        assert got[0].dtype == dtype and got[0].shape == x.shape and got[1].shape == x.shape, name
        for upstream in upstreams:
            assert_bit_equal(got, run(single(upstream), (x,), cos, sin, **kwargs))
        assert_bit_equal(got, run(single(reference.rotary_pos_emb_deepseek_v4), (x,), cos, sin, **kwargs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_deepseek_v4_torch_kernel_fp32_angles(dtype):
    """cos/sin in fp32 with 16-bit x: upstream computes in fp32 either way and returns x's dtype."""
    x, cos, sin = v4_inputs(2, 3, 5, 20, 8, dtype)
    cos32, sin32 = cos.float(), sin.float()
    got = run(single(torch_ops.rotary_pos_emb_deepseek_v4), (x,), cos32, sin32)
    assert got[0].dtype == dtype
    assert_bit_equal(got, run(single(installed_v4_function()), (x,), cos32, sin32))


def test_deepseek_v4_turns_the_trailing_pairs_in_place():
    """What docs/ops.md says: the leading features pass through untouched; the trailing rope_dim
    features are the interleaved pairs, each turned by its own angle and left where it was (not
    de-interleaved as rotary_pos_emb/interleaved returns them); the exact rotation in float64."""
    x, cos, sin = v4_inputs(2, 3, 5, 20, 8, torch.float32)
    out = reference.rotary_pos_emb_deepseek_v4(x, cos, sin)
    assert torch.equal(out[..., :12], x[..., :12])
    c, s_ = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    even, odd = x[..., 12::2].double(), x[..., 13::2].double()
    turned = torch.stack((even * c - odd * s_, odd * c + even * s_), dim=-1).flatten(-2)
    assert torch.allclose(out[..., 12:].double(), turned, rtol=1e-6, atol=1e-6)
    # -sin undoes the rotation (the attention output's conjugate rotation)
    back = reference.rotary_pos_emb_deepseek_v4(out, cos, -sin)
    assert torch.allclose(back, x, rtol=1e-5, atol=1e-5)
    # and the pairs are not those of DeepSeek-V3's de-interleaving variant
    full_cos, full_sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    v3, _ = reference.rotary_pos_emb_interleaved(x[..., 12:], x[..., 12:], full_cos, full_sin)
    assert not torch.allclose(v3, out[..., 12:])


def test_deepseek_v4_torch_kernel_close_to_the_fp32_reference():
    """The tolerance the GPU tests use: a bf16 run against the reference on fp32 copies."""
    x, cos, sin = v4_inputs(2, 4, 5, 96, 32, torch.bfloat16)
    got = run(single(torch_ops.rotary_pos_emb_deepseek_v4), (x,), cos, sin)
    ref = run(single(reference.rotary_pos_emb_deepseek_v4), (x.float(),), cos.float(), sin.float())
    for a, b in zip(got, ref):
        assert (a.double() - b.double()).norm() / b.double().norm() < 1e-2


def test_deepseek_v4_cos_sin_get_no_gradient_from_the_slot_contract():
    """x's gradient only: cos/sin come from the rotary embedding (no parameters)."""
    x, cos, sin = v4_inputs(1, 2, 3, 10, 4, torch.float32)
    leaf = x.detach().clone().requires_grad_(True)
    out = torch_ops.rotary_pos_emb_deepseek_v4(leaf, cos, sin)
    (grad,) = torch.autograd.grad(out.sum(), (leaf,))
    assert grad.shape == x.shape and cos.grad is None and sin.grad is None


# -- NPU adapters --------------------------------------------------------------------------------------
@pytest.fixture
def npu(monkeypatch):
    fake = make_fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    with use_device(DeviceInfo("npu")):
        yield fake


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_npu_interleaved(npu, dtype):
    q, k, cos, sin = deepseek_inputs(2, 4, 5, 16, dtype)
    got = kernel("rotary_pos_emb", "interleaved", "npu")(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)
    ref = reference.rotary_pos_emb_interleaved(q.float(), k.float(), cos.float(), sin.float())
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for a, b in zip(got, ref):
        assert a.dtype == dtype and a.shape == b.shape
        assert (a.float() - b).abs().max() <= tol * (1 + b.abs().max())
    assert npu.calls == [("npu_rotary_mul", (2, 4, 5, 16), dtype, {}), ("npu_rotary_mul", (2, 1, 5, 16), dtype, {})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_npu_vision(npu, dtype):
    q, k, cos, sin = vision_inputs(7, 3, 10, dtype)
    got = kernel("rotary_pos_emb_vision", "standard", "npu")(q, k, cos, sin)
    assert_bit_equal(list(got), list(reference.rotary_pos_emb_vision(q, k, cos, sin)))
    assert npu.calls == [
        ("npu_rotary_mul", (1, 7, 3, 10), torch.float32, {}),
        ("npu_rotary_mul", (1, 7, 3, 10), torch.float32, {}),
    ]
    with pytest.raises(
        ValueError,
        match=r"^npu rotary_pos_emb_vision needs q/k \[seq, heads, dim\] and cos/sin \[seq, dim\], got 4-D, 4-D "
        r"and 2-D$",
    ):
        kernel("rotary_pos_emb_vision", "standard", "npu")(q[None], k[None], cos, sin)


# -- the ops config and the registry ---------------------------------------------------------------
def test_ops_and_field():
    assert KNOWN_OPS["rotary_pos_emb"] == ("full", "partial", "interleaved", "deepseek_v4")
    assert KNOWN_OPS["rotary_pos_emb_vision"] == ("standard",)
    assert FIELD_FOR_OP["rotary_pos_emb_vision"] == "rotary_pos_emb_vision_implementation"
    assert (
        CONFIG_FIELDS.index("rotary_pos_emb_vision_implementation")
        == CONFIG_FIELDS.index("rotary_pos_emb_implementation") + 1
    )
    assert (
        CPU_DEFAULTS["rotary_pos_emb_vision_implementation"],
        NPU_DEFAULTS["rotary_pos_emb_vision_implementation"],
    ) == (
        "eager",
        "npu",
    )
    assert CUDA_DEFAULTS["rotary_pos_emb_vision_implementation"] == "cuda"
    assert CUDA_DEFAULTS["rotary_pos_emb_implementation"] == "cuda"


def test_registry_lists_the_new_kernels():
    listed = KERNEL_REGISTRY.list_available(include_unsupported=True)
    assert listed[("rotary_pos_emb", "interleaved")] == ["cuda", "npu", "torch"]
    assert listed[("rotary_pos_emb_vision", "standard")] == ["cuda", "npu", "torch"]
    spec = KERNEL_REGISTRY.get("rotary_pos_emb_vision", "standard", "cuda")
    assert spec.factory == "opslot.kernels.cuda.rope:rotary_pos_emb_vision"
    assert KERNEL_REGISTRY.get("rotary_pos_emb", "interleaved", "cuda").factory == (
        "opslot.kernels.cuda.rope:rotary_pos_emb_interleaved"
    )
    # DeepSeek-V4 has no NPU spec: no npu kernel for its variant
    assert listed[("rotary_pos_emb", "deepseek_v4")] == ["cuda", "torch"]
    assert KERNEL_REGISTRY.get("rotary_pos_emb", "deepseek_v4", "cuda").factory == (
        "opslot.kernels.cuda.rope:rotary_pos_emb_deepseek_v4"
    )
    assert KERNEL_REGISTRY.get("rotary_pos_emb", "deepseek_v4", "torch").factory == (
        "opslot.kernels.torch_ops:rotary_pos_emb_deepseek_v4"
    )


def test_field_parses_and_is_suggested():
    cfg = OpsImplementationConfig.from_dict({"rotary_pos_emb_vision_implementation": "torch"})
    assert cfg.rotary_pos_emb_vision_implementation == "torch"
    assert cfg.impl_for("rotary_pos_emb_vision") == "torch"
    assert OpsImplementationConfig().impl_for("rotary_pos_emb_vision") == "eager"  # CPU default
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"rotary_pos_emb_vison_implementation": "torch"})
    assert str(err.value) == (
        "unknown ops_implementation field 'rotary_pos_emb_vison_implementation'; did you mean "
        "'rotary_pos_emb_vision_implementation'?"
    )
    with pytest.raises(ValueError, match=r"must be a non-empty string"):
        OpsImplementationConfig(rotary_pos_emb_vision_implementation="")


def test_effective_defaults_per_device():
    set_cuda_kernels_check(lambda: None)
    try:
        with use_device(H200):
            cfg = OpsImplementationConfig()
            assert cfg.effective_impl("rotary_pos_emb_vision", "standard") == "cuda"
            assert cfg.effective_impl("rotary_pos_emb", "interleaved") == "cuda"
            assert cfg.effective_impl("rotary_pos_emb", "deepseek_v4") == "cuda"
    finally:
        set_cuda_kernels_check(None)
    with use_device(DeviceInfo("npu")):
        cfg = OpsImplementationConfig()
        assert cfg.effective_impl("rotary_pos_emb_vision", "standard") == "npu"
        assert cfg.effective_impl("rotary_pos_emb", "interleaved") == "npu"
        # the npu default has no kernel for DeepSeek-V4's variant: upstream's code
        assert cfg.effective_impl("rotary_pos_emb", "deepseek_v4") == "eager"
    cfg = OpsImplementationConfig()
    assert cfg.effective_impl("rotary_pos_emb_vision", "standard") == "eager"
    assert cfg.effective_impl("rotary_pos_emb", "deepseek_v4") == "eager"


def test_reference_trainer_values_are_opslots_own():
    """The reference trainer's values of the field (eager, npu) are opslot's names now: kept as
    written, no alias, no longer "accepted and ignored"; strict_names accepts the field."""
    for device in (DeviceInfo("cpu"), DeviceInfo("npu"), H200):
        with use_device(device):
            for value in ("eager", "npu"):
                cfg = OpsImplementationConfig.from_dict({"rotary_pos_emb_vision_implementation": value})
                assert cfg.rotary_pos_emb_vision_implementation == value and dict(cfg.aliases) == {}
            strict = OpsImplementationConfig.from_dict(
                {"strict_names": True, "rotary_pos_emb_vision_implementation": "eager"}
            )
            assert strict.rotary_pos_emb_vision_implementation == "eager"
    with use_device(DeviceInfo("npu")):
        cfg = OpsImplementationConfig.from_dict({"rotary_pos_emb_vision_implementation": "npu"})
        assert cfg.validate([("rotary_pos_emb_vision", "standard")]) == {("rotary_pos_emb_vision", "standard"): "npu"}


# -- the C++ torch ops on meta tensors -----------------------------------------------------------------
OPS = (
    "rope_interleaved_fwd",
    "rope_interleaved_bwd",
    "rope_vision_fwd",
    "rope_vision_bwd",
    "rope_deepseek_v4_fwd",
    "rope_deepseek_v4_bwd",
)
TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture(scope="module")
def cuda_rope():
    from test_kernel_library_symbols import _library

    _library("libopslot_torch.so")
    from opslot.kernels.cuda import rope

    return rope


def meta(*shape, dtype=torch.bfloat16, requires_grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta").requires_grad_(requires_grad)


def test_ops_are_registered_from_cpp(cuda_rope):
    for op in OPS:
        name = f"opslot::{op}"
        for key in ("CUDA", "Meta", "CPU"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        assert torch._library.custom_ops.OPDEFS.get(name) is None
    for op in ("rope_interleaved_fwd", "rope_vision_fwd", "rope_deepseek_v4_fwd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opslot::{op}", "Autograd")
    O = torch.ops.opslot  # noqa: E741
    assert str(O.rope_interleaved_fwd.default._schema) == (
        "opslot::rope_interleaved_fwd(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim) -> "
        "(Tensor, Tensor)"
    )
    assert str(O.rope_vision_fwd.default._schema) == (
        "opslot::rope_vision_fwd(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)"
    )
    assert str(O.rope_deepseek_v4_fwd.default._schema) == (
        "opslot::rope_deepseek_v4_fwd(Tensor x, Tensor cos, Tensor sin, int unsqueeze_dim) -> Tensor"
    )


def _cases():
    O = torch.ops.opslot  # noqa: E741
    q = meta(2, 7, 4, 8 + 64).transpose(1, 2)[..., 8:].requires_grad_(True)  # DeepSeek's q_rot slice
    k = meta(2, 7, 72)[..., 8:].view(2, 1, 7, 64).requires_grad_(True)
    cos, sin = meta(2, 7, 64), meta(2, 7, 64)
    qkv = meta(33, 3 * 5 * 80, dtype=torch.float16)
    vq, vk, _ = qkv.reshape(33, 3, 5, 80).permute(1, 0, 2, 3).unbind(0)
    vcos, vsin = meta(33, 80, dtype=torch.float32), meta(33, 80, dtype=torch.float32)
    mixed_k = meta(33, 5, 80, dtype=torch.bfloat16, requires_grad=True)
    v4x = meta(2, 7, 4, 24).transpose(1, 2).requires_grad_(True)  # DeepSeek-V4's q: [b, s, h, d] memory
    v4c = meta(2, 7, 4)  # half-width: 4 pairs, the last 8 of 24 features
    return [
        ("interleaved fwd", O.rope_interleaved_fwd.default, (q, k, cos, sin, 1)),
        ("interleaved fwd fp32 cos", O.rope_interleaved_fwd.default, (q, k, cos.float(), sin.float(), 1)),
        (
            "interleaved fwd unsqueeze 2",
            O.rope_interleaved_fwd.default,
            (q.transpose(1, 2), k.transpose(1, 2), cos, sin, 2),
        ),
        ("interleaved bwd", O.rope_interleaved_bwd.default, (meta(2, 4, 7, 64), meta(2, 1, 7, 64), cos, sin, 1)),
        ("vision fwd", O.rope_vision_fwd.default, (vq.requires_grad_(True), vk.requires_grad_(True), vcos, vsin)),
        ("vision fwd mixed dtypes", O.rope_vision_fwd.default, (vq, mixed_k, vcos.half(), vsin.half())),
        ("vision bwd", O.rope_vision_bwd.default, (meta(33, 5, 80), meta(33, 5, 80), vcos, vsin)),
        ("deepseek_v4 fwd", O.rope_deepseek_v4_fwd.default, (v4x, v4c, v4c, 1)),
        ("deepseek_v4 fwd fp32 cos", O.rope_deepseek_v4_fwd.default, (v4x, v4c.float(), v4c.float(), 1)),
        ("deepseek_v4 bwd", O.rope_deepseek_v4_bwd.default, (meta(2, 4, 7, 24), v4c, v4c, 1)),
    ]


@pytest.mark.parametrize("index", range(10))
def test_opcheck_on_meta(cuda_rope, index):
    name, op, args = _cases()[index]
    torch.library.opcheck(op, args, test_utils=TEST_UTILS)


def test_public_functions_on_meta(cuda_rope):
    """Shapes, dtypes and layouts as the CUDA kernels return them, and the autograd nodes."""
    q = meta(2, 7, 4, 72).transpose(1, 2)[..., 8:].requires_grad_(True)
    k = meta(2, 7, 72)[..., 8:].view(2, 1, 7, 64).requires_grad_(True)
    qe, ke = cuda_rope.rotary_pos_emb_interleaved(q, k, meta(2, 7, 64), meta(2, 7, 64), position_ids=None)
    assert (qe.shape, ke.shape, qe.dtype) == (q.shape, k.shape, torch.bfloat16)
    assert qe.stride() == (7 * 4 * 64, 64, 4 * 64, 1)  # q's layout, dense ([b, s, h, d] memory)
    assert "RopeInterleavedFunction" in qe.grad_fn.name()
    dq, dk = torch.autograd.grad((qe.sum(), ke.sum()), (q, k))
    assert (dq.shape, dk.shape) == (q.shape, k.shape)

    qkv = meta(9, 3 * 2 * 16, dtype=torch.float16)
    vq, vk, _ = qkv.reshape(9, 3, 2, 16).permute(1, 0, 2, 3).unbind(0)
    vq, vk = vq.requires_grad_(True), vk.to(torch.bfloat16).requires_grad_(True)
    oq, ok = cuda_rope.rotary_pos_emb_vision(vq, vk, meta(9, 16, dtype=torch.float32), meta(9, 16, dtype=torch.float32))
    assert (oq.dtype, ok.dtype, oq.shape, oq.stride()) == (torch.float16, torch.bfloat16, (9, 2, 16), (32, 16, 1))
    assert "RopeVisionFunction" in oq.grad_fn.name()
    dq, dk = torch.autograd.grad((oq.sum(), ok.sum()), (vq, vk))
    assert (dq.dtype, dk.dtype) == (torch.float16, torch.bfloat16)

    x = meta(2, 7, 4, 24).transpose(1, 2).requires_grad_(True)
    out = cuda_rope.rotary_pos_emb_deepseek_v4(x, meta(2, 7, 4), meta(2, 7, 4))
    assert (out.shape, out.dtype, out.stride()) == (x.shape, torch.bfloat16, (7 * 4 * 24, 24, 4 * 24, 1))
    assert "RopeV4Function" in out.grad_fn.name()
    (dx,) = torch.autograd.grad(out.sum(), (x,))
    assert dx.shape == x.shape


def test_argument_checks(cuda_rope):
    q, k = meta(2, 4, 7, 64), meta(2, 1, 7, 64)
    cos = meta(2, 7, 64)
    with pytest.raises(ValueError) as err:
        cuda_rope.rotary_pos_emb_interleaved(q, k, meta(2, 7, 32), meta(2, 7, 32))
    assert str(err.value).startswith(
        "rotary_pos_emb/interleaved: q and k rotate all their features in pairs: their head dims (q 64, k 64) must "
        "be even and equal to cos/sin's last dim 32"
    )
    with pytest.raises(ValueError, match=r"^rotary_pos_emb/interleaved: q and k rotate .*\(q 63, k 63\)"):
        cuda_rope.rotary_pos_emb_interleaved(meta(1, 1, 2, 63), meta(1, 1, 2, 63), meta(1, 2, 63), meta(1, 2, 63))
    with pytest.raises(TypeError, match=r"^rotary_pos_emb/interleaved: q is BFloat16 but k is Float"):
        cuda_rope.rotary_pos_emb_interleaved(q, k.float(), cos, cos)
    with pytest.raises(TypeError, match=r"^rotary_pos_emb/interleaved: cos/sin of dtype Half/Half with q of dtype"):
        cuda_rope.rotary_pos_emb_interleaved(q, k, cos.half(), cos.half())
    with pytest.raises(ValueError, match=r"^rotary_pos_emb/interleaved \(cuda\): cos/sin require grad"):
        cuda_rope.rotary_pos_emb_interleaved(q, k, cos.requires_grad_(), meta(2, 7, 64))
    vq = meta(9, 2, 16)
    with pytest.raises(ValueError) as err:
        cuda_rope.rotary_pos_emb_vision(vq, vq, meta(9, 8), meta(9, 8))
    assert str(err.value).startswith(
        "rotary_pos_emb_vision: q and k rotate their whole head dim: their head dims (q 16, k 16) must be even and "
        "equal to cos/sin's last dim 8"
    )
    with pytest.raises(TypeError, match=r"^rotary_pos_emb_vision: cos is Float but sin is BFloat16"):
        cuda_rope.rotary_pos_emb_vision(vq, vq, meta(9, 16, dtype=torch.float32), meta(9, 16))
    with pytest.raises(TypeError, match=r"rotary_pos_emb_vision: opslot cuda kernels take float32, float16 or"):
        cuda_rope.rotary_pos_emb_vision(vq.double(), vq, meta(9, 16), meta(9, 16))
    with pytest.raises(ValueError, match=r"^rotary_pos_emb_vision \(cuda\): cos/sin require grad"):
        cuda_rope.rotary_pos_emb_vision(vq, vq, meta(9, 16).requires_grad_(), meta(9, 16))
    x, c = meta(2, 4, 7, 24), meta(2, 7, 4)
    with pytest.raises(ValueError) as err:
        cuda_rope.rotary_pos_emb_deepseek_v4(x, meta(2, 7, 13), meta(2, 7, 13))
    assert str(err.value).startswith(
        "rotary_pos_emb/deepseek_v4: cos/sin hold one feature per rotated pair (13): twice that must be at least 2 "
        "and at most x's last dim 24"
    )
    with pytest.raises(TypeError, match=r"^rotary_pos_emb/deepseek_v4: cos/sin of dtype Half/Half with x of dtype"):
        cuda_rope.rotary_pos_emb_deepseek_v4(x, c.half(), c.half())
    with pytest.raises(ValueError, match=r"^rotary_pos_emb/deepseek_v4: cos and sin differ in shape"):
        cuda_rope.rotary_pos_emb_deepseek_v4(x, c, meta(2, 7, 3))
    with pytest.raises(ValueError, match=r"^rotary_pos_emb/deepseek_v4 \(cuda\): cos/sin require grad"):
        cuda_rope.rotary_pos_emb_deepseek_v4(x, c.requires_grad_(), meta(2, 7, 4))


def test_cpu_tensors_are_refused(cuda_rope):
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos = torch.randn(1, 3, 8)
    for call in (
        lambda: torch.ops.opslot.rope_interleaved_fwd(q, k, cos, cos, 1),
        lambda: torch.ops.opslot.rope_interleaved_bwd(q, k, cos, cos, 1),
        lambda: torch.ops.opslot.rope_vision_fwd(q[0], k[0], cos[0], cos[0]),
        lambda: torch.ops.opslot.rope_vision_bwd(q[0], k[0], cos[0], cos[0]),
        lambda: torch.ops.opslot.rope_deepseek_v4_fwd(q, cos[..., :2], cos[..., :2], 1),
        lambda: torch.ops.opslot.rope_deepseek_v4_bwd(q, cos[..., :2], cos[..., :2], 1),
    ):
        with pytest.raises(Exception, match=r"run on CUDA tensors|runs on CUDA tensors"):
            call()
