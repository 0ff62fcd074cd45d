"""Every built-in portable kernel ("torch", "torch_chunked") against its fp32 reference: outputs and
gradients, fp32 and bf16, on every available device."""

import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernel_harness import DTYPES, assert_close, compare, forward_backward, leaf
from opslot import KERNEL_REGISTRY, reference
from opslot.kernels import fused_ce

pytestmark = pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=gen(seed)) * scale


def kernel(op, variant, name="torch"):
    return KERNEL_REGISTRY.resolve(op, variant, name)


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_rms_norm(device, dtype, variant):
    t = {"x": randn(2, 5, 32, seed=1) * 3, "w": 1 + randn(32, seed=2, scale=0.1)}
    ref = getattr(reference, f"rms_norm_{variant}")
    compare(
        kernel("rms_norm", variant), ref, t, lambda f, t, m: f(t["x"], t["w"], 1e-6), device, dtype, out_dtype=dtype
    )


def test_rms_norm_unweighted(device, dtype):
    t = {"x": randn(3, 7, 16, seed=3)}
    compare(
        kernel("rms_norm", "unweighted"),
        reference.rms_norm_unweighted,
        t,
        lambda f, t, m: f(t["x"], None, 1e-5),
        device,
        dtype,
        out_dtype=dtype,
    )


def test_rms_norm_variants_are_distinguished(device, dtype):
    """The tolerance check is sharp enough to tell standard from offset math."""
    t = {"x": randn(2, 5, 32, seed=1), "w": randn(32, seed=2, scale=0.1)}
    with pytest.raises(AssertionError, match="output 0: max abs error"):
        compare(
            kernel("rms_norm", "standard"),
            reference.rms_norm_offset,
            t,
            lambda f, t, m: f(t["x"], t["w"], 1e-6),
            device,
            dtype,
        )


def test_rms_norm_gated(device, dtype):
    t = {"x": randn(2, 4, 3, 16, seed=4), "gate": randn(2, 4, 3, 16, seed=5), "w": 1 + randn(16, seed=6, scale=0.1)}
    compare(
        kernel("rms_norm_gated", "standard"),
        reference.rms_norm_gated,
        t,
        lambda f, t, m: f(t["x"], t["gate"], t["w"], 1e-6),
        device,
        dtype,
        out_dtype=dtype,
    )


def _cos_sin(batch, seq, dim, seed):
    pos = torch.arange(seq).float()[None, :, None] + randn(batch, 1, 1, seed=seed).abs()
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    ang = torch.cat([pos * inv, pos * inv], dim=-1)
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("variant,rot_dim", [("full", 16), ("partial", 8)])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_rotary_pos_emb(device, dtype, variant, rot_dim, unsqueeze_dim):
    cos, sin = _cos_sin(2, 5, rot_dim, seed=7)
    q_shape = (2, 4, 5, 16) if unsqueeze_dim == 1 else (2, 5, 4, 16)
    k_shape = (2, 2, 5, 16) if unsqueeze_dim == 1 else (2, 5, 2, 16)
    t = {"q": randn(*q_shape, seed=8), "k": randn(*k_shape, seed=9), "cos": cos, "sin": sin}
    compare(
        kernel("rotary_pos_emb", variant),
        getattr(reference, f"rotary_pos_emb_{variant}"),
        t,
        lambda f, t, m: f(t["q"], t["k"], t["cos"], t["sin"], unsqueeze_dim=unsqueeze_dim),
        device,
        dtype,
        out_dtype=dtype,
    )


class MLP(nn.Module):
    def __init__(self, hidden=16, inter=24, act="silu"):
        super().__init__()
        torch.manual_seed(10)
        self.config = types.SimpleNamespace(hidden_act=act)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)


def test_swiglu_mlp(device, dtype):
    compare(
        kernel("swiglu_mlp", "standard"),
        reference.swiglu_mlp,
        {"x": randn(2, 5, 16, seed=11)},
        lambda f, t, m: f(m[0], t["x"]),
        device,
        dtype,
        modules=[MLP()],
        out_dtype=dtype,
    )


def test_swiglu_mlp_refuses_other_activation(dtype):
    with pytest.raises(
        ValueError, match=r"^swiglu_mlp computes SiLU gating but the model's hidden_act is 'gelu'; use 'eager'$"
    ):
        kernel("swiglu_mlp", "standard")(MLP(act="gelu"), randn(1, 2, 16))


class CausalLMHead(nn.Module):
    def __init__(self, hidden=16, vocab=50, bias=False):
        super().__init__()
        torch.manual_seed(12)
        self.config = types.SimpleNamespace(vocab_size=vocab)
        self.lm_head = nn.Linear(hidden, vocab, bias=bias)


def _labels(batch, seq, vocab, seed, pad=True):
    labels = torch.randint(0, vocab, (batch, seq), generator=gen(seed))
    if pad:
        labels[0, -3:] = -100  # right padding
        labels[1, 0] = -100  # a masked prompt token
    return labels


CE_CASES = {
    "mean": lambda labels: {},
    "num_items": lambda labels: {"num_items_in_batch": torch.tensor(9)},
    "num_items_int": lambda labels: {"num_items_in_batch": 9},
    "shift_labels": lambda labels: {"shift_labels": F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()},
}


@pytest.mark.parametrize("impl", ["torch", "torch_chunked"])
@pytest.mark.parametrize("case", sorted(CE_CASES))
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_cross_entropy_causal(device, dtype, impl, case, bias):
    labels = _labels(2, 7, 50, seed=13)
    kwargs = CE_CASES[case](labels)
    kwargs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in kwargs.items()}
    head = CausalLMHead(bias=bias)

    def call(f, t, m):
        logits, loss = f(m[0], t["h"], t["labels"].to(t["h"].device), **kwargs)
        if impl == "torch_chunked" and f is not reference.cross_entropy_causal:
            assert logits is None  # the fused kernel never builds logits when labels are given
            return (loss,)
        return (loss,) if impl == "torch_chunked" else (logits, loss)

    k_out, r_out = compare(
        kernel("cross_entropy_loss", "causal", impl),
        reference.cross_entropy_causal,
        {"h": randn(2, 7, 16, seed=14), "labels": labels},
        call,
        device,
        dtype,
        modules=[head],
    )
    assert k_out[-1].dtype == torch.float32 and k_out[-1].dim() == 0


@pytest.mark.parametrize("impl", ["torch", "torch_chunked"])
def test_cross_entropy_causal_refuses_softcapping(dtype, impl):
    head = CausalLMHead()
    head.config.final_logit_softcapping = 30.0
    with pytest.raises(
        ValueError,
        match=r"^cross_entropy_loss/causal kernels do not apply final_logit_softcapping "
        r"\(30.0\); use 'eager'$",
    ):
        kernel("cross_entropy_loss", "causal", impl)(head, randn(1, 2, 16), torch.zeros(1, 2, dtype=torch.long))


@pytest.mark.parametrize("impl", ["torch", "torch_chunked"])
def test_cross_entropy_causal_without_labels_returns_logits(device, dtype, impl):
    head = CausalLMHead().to(device=device, dtype=dtype)
    h = randn(2, 3, 16, seed=15).to(device=device, dtype=dtype)
    logits, loss = kernel("cross_entropy_loss", "causal", impl)(head, h, None)
    assert loss is None
    assert torch.equal(logits, head.lm_head(h))


def test_linear_cross_entropy_chunk_sizes_agree(dtype):
    """Same loss and gradients whatever the chunking (1 token, uneven tail, all at once)."""
    h0, w0 = randn(11, 16, seed=16), randn(40, 16, seed=17, scale=0.3)
    t = torch.randint(0, 40, (11,), generator=gen(18))
    t[3] = -100
    results = []
    for chunk in (1, 4, 11):
        h, w = leaf(h0, "cpu", dtype), leaf(w0, "cpu", dtype)
        outs, grads = forward_backward(
            lambda: fused_ce.chunked_linear_cross_entropy(h, w, None, t, chunk_size=chunk), [h, w]
        )
        results.append((outs[0], grads))
    for loss, grads in results[1:]:
        assert_close(loss, results[0][0], dtype, "loss")
        for a, b in zip(grads, results[0][1]):
            assert_close(a, b, dtype, "grad")


def test_linear_cross_entropy_weight_grad_in_weight_dtype(device, dtype):
    """Accumulating the weight gradient in the weight dtype stays within that dtype's tolerance."""
    h0, w0 = randn(13, 16, seed=16), randn(40, 16, seed=17, scale=0.3)
    t = torch.randint(0, 40, (13,), generator=gen(18)).to(device)
    results = []
    for fp32_acc in (True, False):
        h, w = leaf(h0, device, dtype), leaf(w0, device, dtype)
        outs, grads = forward_backward(
            lambda: fused_ce.chunked_linear_cross_entropy(h, w, None, t, chunk_size=3, fp32_weight_grad=fp32_acc),
            [h, w],
        )
        results.append((outs[0], grads))
    assert_close(results[1][0], results[0][0], dtype, "loss")
    assert results[1][1][1].dtype == dtype
    for a, b in zip(results[1][1], results[0][1]):
        assert_close(a, b, dtype, "grad")


def test_linear_cross_entropy_default_chunk_size(dtype):
    assert fused_ce.tokens_per_chunk(16384, 4096, 151936) == 512
    assert fused_ce.tokens_per_chunk(14, 16, 50) == 4
    assert fused_ce.tokens_per_chunk(1, 4096, 151936) == 1


@pytest.mark.parametrize("problem", ["regression", "single_label_classification", "multi_label_classification"])
def test_cross_entropy_sequence_classification(device, dtype, problem):
    num_labels = 1 if problem == "regression" else 4
    if problem == "single_label_classification":
        labels = torch.randint(0, 4, (3,), generator=gen(19))
    elif problem == "multi_label_classification":
        labels = (torch.rand(3, 4, generator=gen(19)) > 0.5).float()
    else:
        labels = torch.randn(3, generator=gen(19))
    problem_types = []

    def call(f, t, m):
        config = types.SimpleNamespace(num_labels=num_labels, problem_type=None)
        labels_d = t["labels"].to(t["pooled"].device)
        if labels_d.is_floating_point():
            labels_d = labels_d.to(t["pooled"].dtype).detach()
        loss = f(logits=t["pooled"], labels=labels_d, pooled_logits=t["pooled"], config=config)
        problem_types.append(config.problem_type)
        return loss

    compare(
        kernel("cross_entropy_loss", "sequence_classification"),
        reference.cross_entropy_sequence_classification,
        {"pooled": randn(3, num_labels, seed=20), "labels": labels},
        call,
        device,
        dtype,
    )
    assert problem_types == [problem, problem]  # both set config.problem_type, as upstream does


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_load_balancing_loss(device, dtype, masked):
    t = {f"g{i}": randn(12, 6, seed=21 + i) for i in range(3)}
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    mask[1, -1] = 0

    def call(f, t, m):
        gates = tuple(t[f"g{i}"] for i in range(3))
        am = mask.to(gates[0].device) if masked else None
        return f(gates, num_experts=6, top_k=2, attention_mask=am)

    compare(kernel("load_balancing_loss", "standard"), reference.load_balancing_loss, t, call, device, dtype)


def test_load_balancing_loss_without_tuple_is_zero(dtype):
    fn = kernel("load_balancing_loss", "standard")
    assert fn(None, 4) == 0
    assert fn(torch.zeros(3, 4), 4) == 0


class Experts(nn.Module):
    def __init__(self, experts=6, hidden=16, inter=12):
        super().__init__()
        torch.manual_seed(30)
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inter, hidden) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, inter) * 0.2)
        self.act_fn = nn.SiLU()
        self.config = types.SimpleNamespace(hidden_act="silu")


class GptOssExperts(nn.Module):
    def __init__(self, experts=5, hidden=16, inter=12):
        super().__init__()
        torch.manual_seed(31)
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, hidden, 2 * inter) * 0.5)
        self.gate_up_proj_bias = nn.Parameter(torch.randn(experts, 2 * inter) * 0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, inter, hidden) * 0.3)
        self.down_proj_bias = nn.Parameter(torch.randn(experts, hidden) * 0.3)
        self.alpha, self.limit = 1.702, 1.5  # a low limit so that the clamps are exercised


def _routing(tokens, experts, top_k, seed, unused=(), masked_rows=()):
    scores = torch.rand(tokens, experts, generator=gen(seed))
    scores[:, list(unused)] = -1  # experts nobody routes to
    weights, index = torch.topk(scores.softmax(-1), top_k, dim=-1)
    for row in masked_rows:
        index[row, -1] = experts  # the masking index: upstream skips it
    return index, weights / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("masking", [False, True], ids=["routed", "masking_index"])
def test_moe_standard(device, dtype, masking):
    index, weights = _routing(10, 6, 2, seed=32, unused=(4,), masked_rows=(1, 7) if masking else ())

    def call(f, t, m):
        return f(m[0], t["x"], index.to(t["x"].device), t["w"])

    compare(
        kernel("moe", "standard"),
        reference.moe_standard,
        {"x": randn(10, 16, seed=33), "w": weights},
        call,
        device,
        dtype,
        modules=[Experts()],
        out_dtype=dtype,
    )


def test_moe_gpt_oss(device, dtype):
    index, weights = _routing(9, 5, 2, seed=34, unused=(0,))

    def call(f, t, m):
        return f(m[0], t["x"], index.to(t["x"].device), t["w"])

    compare(
        kernel("moe", "gpt_oss"),
        reference.moe_gpt_oss,
        {"x": randn(9, 16, seed=35), "w": weights},
        call,
        device,
        dtype,
        modules=[GptOssExperts()],
        out_dtype=dtype,
    )


@pytest.mark.parametrize("activation", [None, "silu"])
def test_causal_conv1d(device, dtype, activation):
    t = {"x": randn(2, 8, 10, seed=36), "w": randn(8, 4, seed=37, scale=0.5), "b": randn(8, seed=38)}
    compare(
        kernel("causal_conv1d", "standard"),
        reference.causal_conv1d,
        t,
        lambda f, t, m: f(t["x"], t["w"], t["b"], activation=activation),
        device,
        dtype,
        out_dtype=dtype,
    )


@pytest.mark.parametrize("l2norm", [False, True], ids=["raw", "l2norm"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
def test_chunk_gated_delta_rule(device, dtype, l2norm, with_state):
    B, T, H, D = 1, 10, 2, 8  # T not a multiple of the chunk size: exercises the padding
    t = {
        "q": randn(B, T, H, D, seed=40),
        "k": randn(B, T, H, D, seed=41) * (1 if l2norm else 0.3),
        "v": randn(B, T, H, D, seed=42),
        "g": -F.softplus(randn(B, T, H, seed=43)),
        "beta": torch.sigmoid(randn(B, T, H, seed=44)),
    }
    if with_state:
        t["s0"] = randn(B, H, D, D, seed=45, scale=0.3)

    def call(f, t, m):
        return f(
            t["q"],
            t["k"],
            t["v"],
            g=t["g"],
            beta=t["beta"],
            chunk_size=4,
            initial_state=t.get("s0"),
            output_final_state=True,
            use_qk_l2norm_in_kernel=l2norm,
        )

    k_out, _ = compare(
        kernel("chunk_gated_delta_rule", "standard"), reference.chunk_gated_delta_rule, t, call, device, dtype
    )
    assert k_out[0].dtype == dtype and k_out[1].dtype == torch.float32
