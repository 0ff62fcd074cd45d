"""CPU-checkable parts of the `cuda` MoE experts (runtime/opslot/kernels/cuda/moe.py):

- the device routing metadata (pure torch): offsets, permutation, inverse, masking index;
- the composition and autograd wiring of the custom ops, with every C entry point replaced by a
  torch emulation of its documented contract (kernels/include/opslot_kernels/moe.h), against the
  fp32 references (outputs and gradients of hidden states, weights, biases, routing weights),
  through the portable GEMM path and through torch._grouped_mm's CPU kernel;
- build_model making Transformers' `@use_experts_implementation` run the guarded eager forward
  when a moe slot is bound to a kernel.
The CUDA kernels themselves are tested on a GPU in tests/gpu/kernels/test_moe.py.
"""

import types

import pytest
import torch
from torch import nn

if not hasattr(torch.library, "custom_op"):
    pytest.skip("opslot's cuda kernels need torch.library.custom_op (torch >= 2.4)", allow_module_level=True)

from opslot import reference  # noqa: E402
from opslot.binding import build_model, moe_runs_kernel  # noqa: E402
from opslot.kernels.cuda import moe  # noqa: E402
from opslot.ops_config import OpsImplementationConfig  # noqa: E402


# -- routing ---------------------------------------------------------------------------------
def test_route_sorts_stably_and_drops_the_masking_index():
    idx = torch.tensor([[0, 2], [2, 4], [1, 0], [4, 4]])
    r = moe.route(idx, 4)
    assert r.offs.dtype == torch.int32 and r.offs.tolist() == [2, 3, 5, 5]
    # rows in expert order, token order inside an expert; dropped (index 4) after offs[-1]
    assert r.src_token.tolist() == [0, 2, 2, 0, 1, 1, 3, 3]
    assert r.row_expert.tolist()[:5] == [0, 0, 1, 2, 2]
    flat = idx.reshape(-1)
    for a in range(flat.numel()):
        row = int(r.inv[a])
        assert int(r.src_token[row]) == a // 2
        if flat[a] < 4:
            assert row < 5 and int(r.row_expert[row]) == int(flat[a])
        else:
            assert row >= 5


def test_route_empty_and_out_of_range():
    r = moe.route(torch.zeros(0, 3, dtype=torch.long), 5)
    assert r.offs.tolist() == [0] * 5 and r.inv.numel() == 0
    r = moe.route(torch.tensor([[7, -1, 1]]), 3)  # outside [0, E] is dropped like E
    assert r.offs.tolist() == [0, 1, 1]


def test_route_random_matches_bincount():
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 9, (257, 3), generator=g)  # 8 experts + masking index 8
    r = moe.route(idx, 8)
    counts = torch.bincount(idx.reshape(-1), minlength=9)[:8]
    assert r.offs.tolist() == torch.cumsum(counts, 0).tolist()
    assert sorted(r.inv.tolist()) == list(range(idx.numel()))


# -- emulated kernels ------------------------------------------------------------------------
def _kept(offs):
    return int(offs[-1])


def emu_scatter_rows(src, dst, inv, weights, rows, bias, row_expert, dot, offs, top_k):
    kept = _kept(offs)
    dst.zero_()
    for a in range(inv.numel()):
        r, t = int(inv[a]), a // top_k
        keep = 0 <= r < kept
        if keep:
            w = float(weights.reshape(-1)[a]) if weights is not None else 1.0
            dst[r] = (w * src[t].float()).to(dst.dtype)
        if dot is not None:
            if keep:
                y = rows[r].float() + (bias[int(row_expert[r])].float() if bias is not None else 0)
                dot[a] = (src[t].float() * y).sum()
            else:
                dot[a] = 0


def emu_gather_sum(rows, out, inv, weights, bias, row_expert, offs, top_k):
    kept = _kept(offs)
    acc = torch.zeros(out.shape, dtype=torch.float32)
    for a in range(inv.numel()):
        r, t = int(inv[a]), a // top_k
        if 0 <= r < kept:
            w = float(weights.reshape(-1)[a]) if weights is not None else 1.0
            y = rows[r].float() + (bias[int(row_expert[r])].float() if bias is not None else 0)
            acc[t] += w * y
    out.copy_(acc.to(out.dtype))


def _split(h, kind):
    inter = h.shape[1] // 2
    return (h[:, 0::2], h[:, 1::2]) if kind == moe.KIND_GPT_OSS else (h[:, :inter], h[:, inter:])


def _with_bias(h, bias, row_expert, kept):
    h = h.float().clone()
    if bias is not None:
        h[:kept] += bias[row_expert[:kept].long()].float()
    return h


def emu_act_forward(h, a, bias, row_expert, offs, kind, alpha, limit):
    kept = _kept(offs)
    hf = _with_bias(h, bias, row_expert, kept)
    g, u = _split(hf, kind)
    if kind == moe.KIND_SILU:
        out = torch.nn.functional.silu(g) * u
    elif kind == moe.KIND_CLAMPED:
        out = torch.nn.functional.silu(g.clamp(max=limit)) * u.clamp(-limit, limit)
    else:
        gc, uc = g.clamp(max=limit), u.clamp(-limit, limit)
        out = (uc + 1) * gc * torch.sigmoid(alpha * gc)
    out[kept:] = 0
    a.copy_(out.to(a.dtype))


def emu_act_backward(da, h, dh, bias, row_expert, offs, kind, alpha, limit):
    # closed-form derivatives (custom-op bodies run below autograd); checked against the
    # reference's autograd by the tests below
    kept = _kept(offs)
    hf = _with_bias(h, bias, row_expert, kept)
    g, u = _split(hf, kind)
    d = da.float()
    if kind == moe.KIND_SILU:
        s = torch.sigmoid(g)
        dg, du = d * u * s * (1 + g * (1 - s)), d * g * s
    elif kind == moe.KIND_CLAMPED:  # the clamp's gradient passes where min <= x <= max
        gc, uc = g.clamp(max=limit), u.clamp(-limit, limit)
        s = torch.sigmoid(gc)
        dg = torch.where(g <= limit, d * uc * s * (1 + gc * (1 - s)), torch.zeros_like(g))
        du = torch.where((u >= -limit) & (u <= limit), d * gc * s, torch.zeros_like(u))
    else:
        gc, uc = g.clamp(max=limit), u.clamp(-limit, limit)
        s = torch.sigmoid(alpha * gc)
        dg = torch.where(g <= limit, d * (uc + 1) * (s + alpha * gc * s * (1 - s)), torch.zeros_like(g))
        du = torch.where((u >= -limit) & (u <= limit), d * gc * s, torch.zeros_like(u))
    grad = torch.empty_like(hf)
    gs, us = _split(grad, kind)
    gs.copy_(dg)
    us.copy_(du)
    grad[kept:] = 0
    dh.copy_(grad.to(dh.dtype))


def emu_segment_sum(g, out, offs):
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[e] = g[start:end].float().sum(0).to(out.dtype)
        start = end


def emu_gmm_rows(a, b, c, offs):
    start = 0
    for e, end in enumerate(offs.tolist()):
        c[start:end] = (a[start:end].float() @ b[e].float()).to(c.dtype)
        start = end


def emu_gmm_wgrad(x, g, c, offs):
    start = 0
    for e, end in enumerate(offs.tolist()):
        c[e] = (x[start:end].float().t() @ g[start:end].float()).to(c.dtype)
        start = end


def emu_zero_tail(c, offs):
    c[_kept(offs) :] = 0


@pytest.fixture(params=["portable", "grouped_mm"])
def emulated(request, monkeypatch):
    """moe.py with its C entry points emulated on CPU; GEMMs via the portable kernel's emulation or
    via torch._grouped_mm (its CPU kernel) in the layouts the CUDA path uses."""
    for name, fn in [
        ("_k_scatter_rows", emu_scatter_rows),
        ("_k_gather_sum", emu_gather_sum),
        ("_k_act_forward", emu_act_forward),
        ("_k_act_backward", emu_act_backward),
        ("_k_segment_sum", emu_segment_sum),
        ("_k_gmm_rows", emu_gmm_rows),
        ("_k_gmm_wgrad", emu_gmm_wgrad),
        ("_k_zero_tail", emu_zero_tail),
    ]:
        monkeypatch.setattr(moe, name, fn)
    monkeypatch.setattr(moe, "_check", lambda t: None)
    monkeypatch.setattr(moe._lib, "check_device", lambda d: None)
    if request.param == "grouped_mm":
        if not hasattr(torch, "_grouped_mm"):
            pytest.skip("torch._grouped_mm missing")
        monkeypatch.setattr(moe, "_use_cutlass", lambda a, w: True)
    else:
        monkeypatch.setattr(moe, "_use_cutlass", lambda a, w: False)
    return request.param


def _qwen_module(E, H, I, seed=0):  # noqa: E741  (I: the intermediate size)
    g = torch.Generator().manual_seed(seed)
    m = types.SimpleNamespace()
    m.num_experts = E
    m.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, H, generator=g) * 0.2)
    m.down_proj = nn.Parameter(torch.randn(E, H, I, generator=g) * 0.2)
    m.act_fn = nn.SiLU()
    return m


def _gpt_oss_module(E, H, I, seed=0):  # noqa: E741  (I: the intermediate size)
    g = torch.Generator().manual_seed(seed)
    m = types.SimpleNamespace()
    m.num_experts = E
    m.gate_up_proj = nn.Parameter(torch.randn(E, H, 2 * I, generator=g) * 0.6)
    m.gate_up_proj_bias = nn.Parameter(torch.randn(E, 2 * I, generator=g) * 2)
    m.down_proj = nn.Parameter(torch.randn(E, I, H, generator=g) * 0.2)
    m.down_proj_bias = nn.Parameter(torch.randn(E, H, generator=g) * 0.2)
    m.alpha, m.limit = 1.702, 1.5  # a small limit so that the clamps are hit
    return m


def _clamped_module(E, H, I, seed=0):  # noqa: E741  (I: the intermediate size)
    m = _qwen_module(E, H, I, seed)
    m.gate_up_proj = nn.Parameter(m.gate_up_proj.detach() * 4)  # pre-activations beyond the limit
    m.limit = 0.75
    return m


def _inputs(T, H, E, K, seed=1, drop=True, skew=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    if skew:
        idx = torch.zeros(T, K, dtype=torch.long)
        idx[:, 1:] = torch.randint(0, E, (T, K - 1), generator=g)
        idx[::3, 0] = 2
    else:
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    if drop:
        idx[1, 0] = E
        idx[-1, :] = E
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    return x, idx, w


def _grads(fn, module, names, x, idx, w):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    params = [getattr(module, n) for n in names]
    for p in params:
        p.grad = None
    out = fn(module, x, idx, w)
    torch.manual_seed(3)
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, w] + params, go)
    return out.detach(), grads


def _close(a, b):
    tol = 2e-5 + 2e-5 * float(b.abs().max()) if b.numel() else 1e-6
    assert a.shape == b.shape
    if b.numel():
        assert float((a - b).abs().max()) <= tol * 10


@pytest.mark.parametrize("skew", [False, True])
def test_standard_matches_reference(emulated, skew):
    m = _qwen_module(E=6, H=16, I=8)
    x, idx, w = _inputs(T=11, H=16, E=6, K=3, skew=skew)
    names = ["gate_up_proj", "down_proj"]
    out, grads = _grads(moe.moe_standard, m, names, x, idx, w)
    ref_out, ref_grads = _grads(reference.moe_standard, m, names, x, idx, w)
    _close(out, ref_out)
    for a, b in zip(grads, ref_grads):
        _close(a, b)


@pytest.mark.parametrize("skew", [False, True])
def test_gpt_oss_matches_reference(emulated, skew):
    m = _gpt_oss_module(E=5, H=16, I=8)
    x, idx, w = _inputs(T=9, H=16, E=5, K=2, skew=skew)
    names = ["gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"]
    out, grads = _grads(moe.moe_gpt_oss, m, names, x, idx, w)
    ref_out, ref_grads = _grads(reference.moe_gpt_oss, m, names, x, idx, w)
    _close(out, ref_out)
    for a, b in zip(grads, ref_grads):
        _close(a, b)


@pytest.mark.parametrize("skew", [False, True])
def test_clamped_matches_reference(emulated, skew):
    m = _clamped_module(E=6, H=16, I=8)
    x, idx, w = _inputs(T=11, H=16, E=6, K=3, skew=skew)
    names = ["gate_up_proj", "down_proj"]
    gate, up = torch.einsum("th,eih->tei", x, m.gate_up_proj.detach()).chunk(2, dim=-1)
    assert (gate > m.limit).any() and (up.abs() > m.limit).any() and (up.abs() < m.limit).any()
    out, grads = _grads(moe.moe_clamped, m, names, x, idx, w)
    ref_out, ref_grads = _grads(reference.moe_clamped, m, names, x, idx, w)
    _close(out, ref_out)
    for a, b in zip(grads, ref_grads):
        _close(a, b)


def test_clamped_refuses_other_activations_and_no_limit():
    m = _clamped_module(E=2, H=8, I=8)
    m.act_fn = nn.GELU()
    with pytest.raises(ValueError, match="moe/clamped implements act_fn SiLU only"):
        moe.moe_clamped(m, torch.zeros(1, 8), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1))
    m.act_fn, m.limit = nn.SiLU(), None
    with pytest.raises(ValueError, match="needs the module's clamp limit"):
        moe.moe_clamped(m, torch.zeros(1, 8), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1))


def test_all_dropped_and_empty(emulated):
    m = _qwen_module(E=4, H=8, I=8)
    x, idx, w = _inputs(T=3, H=8, E=4, K=2, drop=False)
    idx[:] = 4
    out, grads = _grads(moe.moe_standard, m, ["gate_up_proj", "down_proj"], x, idx, w)
    assert float(out.abs().max()) == 0 and all(float(g.abs().max()) == 0 for g in grads)
    x0, idx0, w0 = torch.zeros(0, 8), torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2)
    out, grads = _grads(moe.moe_standard, m, ["gate_up_proj", "down_proj"], x0, idx0, w0)
    assert out.shape == (0, 8) and float(grads[2].abs().sum()) == 0


def test_grouped_experts_dispatched_interface(emulated):
    """The expert-parallel entry: tokens already in expert order, no routing weights."""
    m = _qwen_module(E=3, H=8, I=8)
    g = torch.Generator().manual_seed(5)
    x_sorted = torch.randn(10, 8, generator=g)
    offs = torch.tensor([4, 4, 9], dtype=torch.int32)  # expert 1 empty, row 9 padding
    row_expert = torch.tensor([0] * 4 + [2] * 5 + [3], dtype=torch.int32)
    y = moe.grouped_experts(x_sorted, offs, row_expert, m.gate_up_proj, m.down_proj)
    for r, e in enumerate(row_expert.tolist()[:9]):
        gate, up = (m.gate_up_proj[e] @ x_sorted[r]).chunk(2)
        ref = m.down_proj[e] @ (torch.nn.functional.silu(gate) * up)
        _close(y[r].detach(), ref.detach())
    assert float(y[9].detach().abs().max()) == 0


def test_grouped_experts_checks_its_routing(emulated):
    """offs and (with biases) row_expert come from the caller's all-to-all: a count that decreases or
    passes the rows, or an expert index out of range on a counted row, is refused (on a GPU by a
    device-side assert, no host synchronisation); padding rows may hold any expert index."""
    m = _gpt_oss_module(E=3, H=8, I=4)
    x = torch.randn(6, 8)
    bias = dict(kind=moe.KIND_GPT_OSS, transposed=False, gate_up_bias=m.gate_up_proj_bias)
    good = torch.tensor([0, 0, 1, 1, 2, 7], dtype=torch.int32)  # row 5: padding past offs[-1] = 5
    y = moe.grouped_experts(x, torch.tensor([2, 4, 5]), good, m.gate_up_proj, m.down_proj, **bias)
    assert y.shape == (6, 8) and float(y[5].detach().abs().max()) == 0
    message = (
        r"^grouped_experts: offs must be cumulative row counts \(never decreasing, from 0 up to the rows of "
        r"x_sorted\) and, with biases, row_expert must be an expert index on every counted row$"
    )
    for offs, row_expert, kwargs in [
        ([2, 1, 5], good, bias),  # decreasing
        ([2, 4, 7], good, bias),  # past the 6 rows
        ([-1, 4, 5], good, bias),  # negative
        ([2, 4, 6], good, bias),  # row 5 counted, its expert 7 out of range
        ([2, 4, 5], torch.tensor([0, -1, 1, 1, 2, 0], dtype=torch.int32), bias),
        ([2, 5, 1], good, dict(transposed=False)),  # no biases: the counts still checked
    ]:
        with pytest.raises(RuntimeError, match=message):
            moe.grouped_experts(x, torch.tensor(offs), row_expert, m.gate_up_proj, m.down_proj, **kwargs)


def test_standard_refuses_other_activations():
    m = _qwen_module(E=2, H=8, I=8)
    m.act_fn = nn.GELU()
    with pytest.raises(ValueError, match="SiLU only"):
        moe.moe_standard(m, torch.zeros(1, 8), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1))


def test_custom_ops_are_registered():
    for name in [
        "moe_route",
        "moe_gather",
        "moe_gather_backward",
        "moe_combine",
        "moe_combine_backward",
        "moe_act",
        "moe_act_backward",
        "moe_grouped_mm",
        "moe_grouped_mm_backward",
    ]:
        assert hasattr(torch.ops.opslot, name)


def test_cpu_tensors_are_refused_with_a_clear_error():
    from opslot.kernels.cuda import KernelLibraryError

    m = _qwen_module(E=2, H=8, I=8)
    with pytest.raises(KernelLibraryError):
        moe.moe_standard(m, torch.zeros(2, 8), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1))


# -- binding: Transformers' experts dispatch -------------------------------------------------
MOE_MODULE_SOURCE = """\
import torch
from torch import nn
from transformers.integrations import use_experts_implementation

from opslot import OpSlot

moe_slot = OpSlot("moe", "standard")


@use_experts_implementation
class TinyExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_experts = 2
        self.gate_up_proj = nn.Parameter(torch.randn(2, 8, 4))
        self.down_proj = nn.Parameter(torch.randn(2, 4, 4))
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if moe_slot.use_non_eager_impl:
            return moe_slot(self, hidden_states, top_k_index, top_k_weights)
        return hidden_states * 0 + 7.0


class TinyMoeModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.experts = TinyExperts(config)
"""


@pytest.fixture
def moe_module(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import importlib
    import sys

    path = tmp_path / "tiny_moe_generated.py"
    path.write_text(MOE_MODULE_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("tiny_moe_generated")
    yield mod
    sys.modules.pop("tiny_moe_generated", None)


def _hf_config(experts):
    from transformers import PretrainedConfig

    return PretrainedConfig(experts_implementation=experts)


def test_build_model_routes_experts_to_the_guard(moe_module):
    calls = []
    from opslot import KERNEL_REGISTRY, KernelSpec

    def spy(module, hidden_states, top_k_index, top_k_weights):
        calls.append(module)
        return hidden_states * 0 - 1.0

    KERNEL_REGISTRY.register(KernelSpec("spymoe", "moe", "standard", lambda: spy, description="test spy"), force=True)
    try:
        model = build_model(
            _hf_config("grouped_mm"),
            ops={"moe_implementation": "fused_spymoe"},
            module=moe_module,
            model_class="TinyMoeModel",
        )
        assert model.config._experts_implementation == "eager"
        out = model.experts(torch.ones(3, 4), torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1))
        assert calls and float(out.max()) == -1.0
        # eager moe: Transformers' own choice is kept
        model = build_model(
            _hf_config("grouped_mm"), ops={"moe_implementation": "eager"}, module=moe_module, model_class="TinyMoeModel"
        )
        assert model.config._experts_implementation == "grouped_mm"
    finally:
        KERNEL_REGISTRY.unregister("moe", "standard", "spymoe")


def test_moe_runs_kernel_without_module_slots():
    cfg = OpsImplementationConfig(moe_implementation="fused_torch")
    assert moe_runs_kernel({}, cfg)
    assert not moe_runs_kernel({}, OpsImplementationConfig(moe_implementation="eager"))
