"""Qwen3.5's Gated DeltaNet ops (`chunk_gated_delta_rule`, `causal_conv1d`): the portable `torch`
kernels against the token-by-token fp32 references of `opslot.reference`, and the contract of
docs/ops.md: packed sequences (`cu_seqlens`) give exactly what their documents give run one by one,
the decode forms (one token with a state, `conv_state`) continue a prefill, and whatever cannot be
honoured is a ValueError (never ignored)."""

import pytest
import torch
import torch.nn.functional as F

from kernel_harness import assert_close, compare, forward_backward, leaf
from opslot import KERNEL_REGISTRY, reference

FP32 = torch.float32
BF16 = torch.bfloat16


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=gen(seed)) * scale


def delta_rule():
    return KERNEL_REGISTRY.resolve("chunk_gated_delta_rule", "standard", "torch")


def conv():
    return KERNEL_REGISTRY.resolve("causal_conv1d", "standard", "torch")


def delta_inputs(B, T, H, D, seed, l2norm=True, states=None, Dv=None):
    """q/k/v, log-space gate g < 0, beta in (0, 1); `states` initial states (None: no state)."""
    Dv = Dv or D
    t = {
        "q": randn(B, T, H, D, seed=seed),
        "k": randn(B, T, H, D, seed=seed + 1) * (1 if l2norm else 0.3),
        "v": randn(B, T, H, Dv, seed=seed + 2),
        "g": -F.softplus(randn(B, T, H, seed=seed + 3)),
        "beta": torch.sigmoid(randn(B, T, H, seed=seed + 4)),
    }
    if states is not None:
        t["s0"] = randn(states, H, D, Dv, seed=seed + 5, scale=0.3)
    return t


def delta_call(chunk_size=64, l2norm=True, final=True, cu=None):
    def call(f, t, m):
        kwargs = {} if cu is None else {"cu_seqlens": cu}
        return f(
            t["q"],
            t["k"],
            t["v"],
            g=t["g"],
            beta=t["beta"],
            chunk_size=chunk_size,
            initial_state=t.get("s0"),
            output_final_state=final,
            use_qk_l2norm_in_kernel=l2norm,
            **kwargs,
        )

    return call


# -- chunk_gated_delta_rule: torch against the recurrence -----------------------------------------------
SHAPES = {  # (B, T, H, D, chunk_size)
    "T_not_multiple_of_chunk": (2, 10, 2, 8, 4),
    "T_not_multiple_of_64": (1, 70, 2, 8, 64),
    "T1": (2, 1, 3, 8, 64),
    "one_head": (1, 9, 1, 16, 4),
    "exact_chunks": (1, 16, 2, 8, 8),
}


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("l2norm", [False, True], ids=["raw", "l2norm"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
def test_delta_rule_fp32_outputs_and_gradients(device, shape, l2norm, with_state):
    """Outputs, final state and the gradients of q, k, v, g, beta and the initial state."""
    B, T, H, D, C = SHAPES[shape]
    t = delta_inputs(B, T, H, D, seed=100, l2norm=l2norm, states=B if with_state else None)
    k_out, _ = compare(delta_rule(), reference.chunk_gated_delta_rule, t, delta_call(C, l2norm), device, FP32)
    assert k_out[0].dtype == FP32 and k_out[1].dtype == FP32 and k_out[1].shape == (B, H, D, D)


def test_delta_rule_without_final_state_returns_none():
    t = delta_inputs(1, 5, 2, 8, seed=110)
    out, state = delta_rule()(t["q"], t["k"], t["v"], t["g"], t["beta"], output_final_state=False)
    assert state is None and out.shape == (1, 5, 2, 8)


def test_delta_rule_value_dim_differs_from_key_dim(device):
    t = delta_inputs(1, 11, 2, 8, seed=120, states=1, Dv=12)
    k_out, _ = compare(delta_rule(), reference.chunk_gated_delta_rule, t, delta_call(4), device, FP32)
    assert k_out[0].shape == (1, 11, 2, 12) and k_out[1].shape == (1, 2, 8, 12)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
def test_delta_rule_bf16_smoke(device, with_state):
    """bf16 inputs: bf16 output, fp32 state, close to the fp32 recurrence (bf16 tolerance)."""
    t = delta_inputs(1, 12, 2, 8, seed=130, states=1 if with_state else None)
    k_out, _ = compare(delta_rule(), reference.chunk_gated_delta_rule, t, delta_call(4), device, BF16)
    assert k_out[0].dtype == BF16 and k_out[1].dtype == FP32


def test_decode_continues_a_prefill(device):
    """Prefill T tokens, then one token at a time with the state (upstream's recurrent decode call):
    the same outputs and state as the whole sequence at once."""
    t = {k: v.to(device) for k, v in delta_inputs(2, 9, 2, 8, seed=140, states=2).items()}
    f = delta_rule()
    whole, whole_state = f(
        t["q"],
        t["k"],
        t["v"],
        t["g"],
        t["beta"],
        chunk_size=4,
        initial_state=t["s0"],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    outs, state = [], t["s0"]
    out, state = f(
        *(t[k][:, :6] for k in ("q", "k", "v", "g", "beta")),
        chunk_size=4,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    outs.append(out)
    for i in range(6, 9):
        out, state = f(
            *(t[k][:, i : i + 1] for k in ("q", "k", "v", "g", "beta")),
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(out)
    assert_close(torch.cat(outs, dim=1), whole, FP32, "decode outputs")
    assert_close(state, whole_state, FP32, "decode state")


# -- packed sequences: packed == separate ---------------------------------------------------------------
LENGTHS = [5, 1, 0, 9, 6]  # a length-1 and an empty document among them; T = 21


def cu_of(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


def run_separately(f, t, lengths, chunk_size, l2norm):
    """Every document alone (batch 1, its own initial state); returns the packed outputs and the
    stacked final states."""
    outs, states, start = [], [], 0
    for n, length in enumerate(lengths):
        end = start + length
        piece = {k: v[:, start:end] for k, v in t.items() if k != "s0"}
        if "s0" in t:
            piece["s0"] = t["s0"][n : n + 1]
        out, state = delta_call(chunk_size, l2norm)(f, piece, [])
        outs.append(out)
        states.append(state)
        start = end
    return torch.cat(outs, dim=1), torch.cat(states, dim=0)


@pytest.mark.parametrize("impl", ["torch", "reference"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("l2norm", [False, True], ids=["raw", "l2norm"])
def test_packed_equals_separate(device, impl, with_state, l2norm):
    """A row of documents with cu_seqlens: the outputs, final states and every gradient equal
    those of the documents run one by one (up to reduction order)."""
    f = delta_rule() if impl == "torch" else reference.chunk_gated_delta_rule
    T = sum(LENGTHS)
    base = delta_inputs(1, T, 2, 8, seed=150, l2norm=l2norm, states=len(LENGTHS) if with_state else None)
    cu = cu_of(LENGTHS)
    packed = {k: leaf(v, device, FP32) for k, v in base.items()}
    separate = {k: leaf(v, device, FP32) for k, v in base.items()}
    p_out, p_grads = forward_backward(
        lambda: delta_call(4, l2norm, cu=cu.to(device))(f, packed, []), list(packed.values())
    )
    s_out, s_grads = forward_backward(lambda: run_separately(f, separate, LENGTHS, 4, l2norm), list(separate.values()))
    assert p_out[1].shape == (len(LENGTHS), 2, 8, 8)
    for i, (a, b) in enumerate(zip(p_out, s_out)):
        assert_close(a, b, FP32, f"output {i}")
    assert len(p_grads) == len(s_grads) == len(base)
    for name, a, b in zip(base, p_grads, s_grads):
        assert_close(a, b, FP32, f"grad {name}")


def test_packed_torch_matches_packed_reference(device):
    """The torch kernel against the reference, both packed: outputs and gradients."""
    T = sum(LENGTHS)
    t = delta_inputs(1, T, 2, 8, seed=160, states=len(LENGTHS))
    compare(
        delta_rule(), reference.chunk_gated_delta_rule, t, delta_call(4, cu=cu_of(LENGTHS).to(device)), device, FP32
    )


def test_packed_documents_do_not_see_each_other():
    """Changing one document changes nothing in the others (and changes that document)."""
    t = delta_inputs(1, 21, 2, 8, seed=170)
    cu = cu_of(LENGTHS)
    f = delta_rule()
    out, _ = delta_call(4, cu=cu)(f, t, [])
    t2 = dict(t, v=t["v"].clone())
    t2["v"][:, 6:15] += 1.0  # the fourth document (positions 6..14)
    out2, _ = delta_call(4, cu=cu)(f, t2, [])
    assert torch.equal(out[:, :6], out2[:, :6]) and torch.equal(out[:, 15:], out2[:, 15:])
    assert not torch.allclose(out[:, 6:15], out2[:, 6:15])
    # without cu_seqlens the same change leaks into the following document: the test can tell
    whole, _ = delta_call(4)(f, t, [])
    whole2, _ = delta_call(4)(f, t2, [])
    assert not torch.allclose(whole[:, 15:], whole2[:, 15:])


@pytest.mark.parametrize(
    "f", [lambda: delta_rule(), lambda: reference.chunk_gated_delta_rule], ids=["torch", "reference"]
)
def test_packed_errors(f):
    f = f()
    t = delta_inputs(2, 6, 2, 8, seed=180)
    q, k, v, g, beta = (t[n] for n in ("q", "k", "v", "g", "beta"))
    with pytest.raises(
        ValueError, match=r"^chunk_gated_delta_rule: cu_seqlens \(packed sequences\) needs batch size 1, got 2$"
    ):
        f(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 3, 6]))
    q, k, v, g, beta = (x[:1] for x in (q, k, v, g, beta))
    for bad in ([1, 3, 6], [0, 4, 3, 6], [6]):
        with pytest.raises(ValueError, match=r"^chunk_gated_delta_rule: cu_seqlens must start at 0 and never decrease"):
            f(q, k, v, g, beta, cu_seqlens=torch.tensor(bad))
    with pytest.raises(
        ValueError, match=r"^chunk_gated_delta_rule: cu_seqlens ends at 5, but the input has 6 positions"
    ):
        f(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 3, 5]))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        f(q, k, v, g, beta, cu_seqlens=torch.tensor([0.0, 6.0]))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        f(q, k, v, g, beta, cu_seqlens=[0, 6])
    with pytest.raises(ValueError, match=r"^chunk_gated_delta_rule: initial_state has 1 states for 2 sequences"):
        f(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 2, 6]), initial_state=torch.zeros(1, 2, 8, 8))


def test_one_sequence_in_cu_seqlens_is_the_plain_call(device):
    t = {k: v.to(device) for k, v in delta_inputs(1, 7, 2, 8, seed=190, states=1).items()}
    plain = delta_call(4)(delta_rule(), t, [])
    packed = delta_call(4, cu=torch.tensor([0, 7], device=device))(delta_rule(), t, [])
    assert torch.equal(plain[0], packed[0]) and torch.equal(plain[1], packed[1])


def test_reference_without_cu_seqlens_is_the_recurrence():
    """The reference's unpacked path is upstream's torch_recurrent_gated_delta_rule, written out here."""
    t = delta_inputs(2, 5, 2, 4, seed=200, states=2)
    out, state = delta_call(l2norm=True)(reference.chunk_gated_delta_rule, t, [])
    q = reference.l2norm(t["q"].transpose(1, 2)) / 2.0  # Dk ** 0.5 = 2
    k = reference.l2norm(t["k"].transpose(1, 2))
    v, g, beta = t["v"].transpose(1, 2), t["g"].transpose(1, 2), t["beta"].transpose(1, 2)
    S = t["s0"].clone()
    for i in range(5):
        S = S * g[:, :, i].exp()[..., None, None]
        delta = (v[:, :, i] - torch.einsum("bhkv,bhk->bhv", S, k[:, :, i])) * beta[:, :, i, None]
        S = S + k[:, :, i, :, None] * delta[:, :, None, :]
        assert torch.allclose(out[:, i], torch.einsum("bhkv,bhk->bhv", S, q[:, :, i]), atol=1e-6)
    assert torch.allclose(state, S, atol=1e-6)


# -- causal_conv1d ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_conv_packed_equals_separate(device, width, activation, bias):
    """cu_seqlens restarts the conv (zero history) at every segment: torch == reference == the
    documents one by one, outputs and gradients of x, weight and bias."""
    T = sum(LENGTHS)
    t = {"x": randn(1, 6, T, seed=210), "w": randn(6, width, seed=211, scale=0.5)}
    if bias:
        t["b"] = randn(6, seed=212)
    cu = cu_of(LENGTHS).to(device)

    def packed(f, t, m):
        return f(t["x"], t["w"], t.get("b"), activation=activation, cu_seqlens=cu)

    compare(conv(), reference.causal_conv1d, t, packed, device, FP32, out_dtype=FP32)

    def separate(f, t, m):
        bounds = [(int(a), int(b)) for a, b in zip(cu[:-1], cu[1:])]
        return torch.cat(
            [f(t["x"][:, :, a:b], t["w"], t.get("b"), activation=activation) for a, b in bounds if b > a], dim=-1
        )

    for f in (conv(), reference.causal_conv1d):
        pt = {k: leaf(v, device, FP32) for k, v in t.items()}
        st = {k: leaf(v, device, FP32) for k, v in t.items()}
        p_out, p_grads = forward_backward(lambda: packed(f, pt, []), list(pt.values()))
        s_out, s_grads = forward_backward(lambda: separate(f, st, []), list(st.values()))
        assert_close(p_out[0], s_out[0], FP32, "output")
        for name, a, b in zip(t, p_grads, s_grads):
            assert_close(a, b, FP32, f"grad {name}")


def test_conv_packed_restarts_at_segment_starts():
    x, w = randn(1, 3, 21, seed=215), randn(3, 4, seed=216)
    cu = cu_of(LENGTHS)
    packed, whole = conv()(x, w, cu_seqlens=cu), conv()(x, w)
    starts = [int(a) for a, b in zip(cu[:-1], cu[1:]) if b > a]
    assert_close(packed[:, :, :5], whole[:, :, :5], FP32, "first document")  # no history either way
    for s in starts[1:]:
        assert not torch.allclose(packed[:, :, s], whole[:, :, s])
        assert_close(packed[:, :, s], x[:, :, s] * w[:, -1], FP32, f"position {s}: only the current tap")


def test_conv_packed_bf16_smoke(device):
    t = {"x": randn(1, 8, 21, seed=220), "w": randn(8, 4, seed=221, scale=0.5), "b": randn(8, seed=222)}
    cu = cu_of(LENGTHS).to(device)
    compare(
        conv(),
        reference.causal_conv1d,
        t,
        lambda f, t, m: f(t["x"], t["w"], t["b"], activation="silu", cu_seqlens=cu),
        device,
        BF16,
        out_dtype=BF16,
    )


def upstream_conv_update(x, conv_state, weight, bias=None, activation=None):
    """Transformers 5.17's `causal_conv1d_update` (the torch path), copied as the spec of conv_state."""
    _, hidden_size, seq_len = x.shape
    state_len = conv_state.shape[-1]
    new = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(new[:, :, -state_len:])
    out = F.conv1d(new, weight.unsqueeze(1), bias, padding=0, groups=hidden_size)[:, :, -seq_len:]
    if activation is not None:
        out = F.silu(out)
    return out.to(x.dtype)


@pytest.mark.parametrize("impl", ["torch", "reference"])
@pytest.mark.parametrize("state_len", [3, 4, 6])
@pytest.mark.parametrize("seq_len", [1, 3])
def test_conv_state_is_upstreams_update(device, impl, state_len, seq_len):
    f = conv() if impl == "torch" else reference.causal_conv1d
    x, w, b = randn(2, 6, seq_len, seed=230).to(device), randn(6, 4, seed=231).to(device), randn(6, seed=232).to(device)
    state = randn(2, 6, state_len, seed=233).to(device)
    expected_state = state.clone()
    expected = upstream_conv_update(x, expected_state, w, b, "silu")
    out = f(x, w, b, activation="silu", conv_state=state)
    assert_close(out, expected, FP32, "output")
    assert torch.equal(state, expected_state), "conv_state not updated in place as upstream"


@pytest.mark.parametrize("impl", ["torch", "reference"])
def test_conv_decode_continues_a_prefill(device, impl):
    """Zero state, then token by token: the full causal conv."""
    f = conv() if impl == "torch" else reference.causal_conv1d
    x, w, b = randn(1, 5, 8, seed=240).to(device), randn(5, 4, seed=241).to(device), randn(5, seed=242).to(device)
    whole = f(x, w, b, activation="silu")
    state = torch.zeros(1, 5, 4, device=device)
    steps = [f(x[:, :, i : i + 1], w, b, activation="silu", conv_state=state) for i in range(8)]
    assert_close(torch.cat(steps, dim=-1), whole, FP32, "decoded conv")
    assert torch.equal(state, x[:, :, -4:])


@pytest.mark.parametrize("impl", ["torch", "reference"])
def test_conv_errors(impl):
    f = conv() if impl == "torch" else reference.causal_conv1d
    x, w = randn(1, 4, 6, seed=250), randn(4, 4, seed=251)
    with pytest.raises(
        ValueError, match=r"^causal_conv1d: conv_state \(decode\) and cu_seqlens \(packed\) cannot be combined$"
    ):
        f(x, w, conv_state=torch.zeros(1, 4, 3), cu_seqlens=torch.tensor([0, 6]))
    with pytest.raises(
        ValueError, match=r"^causal_conv1d: conv_state holds 2 columns, the kernel width 4 needs at least 3$"
    ):
        f(x, w, conv_state=torch.zeros(1, 4, 2))
    with pytest.raises(ValueError, match=r"^causal_conv1d: cu_seqlens \(packed sequences\) needs batch size 1, got 2$"):
        f(x.expand(2, -1, -1), w, cu_seqlens=torch.tensor([0, 6]))
    with pytest.raises(ValueError, match=r"^causal_conv1d: cu_seqlens ends at 5, but the input has 6 positions"):
        f(x, w, cu_seqlens=torch.tensor([0, 5]))
