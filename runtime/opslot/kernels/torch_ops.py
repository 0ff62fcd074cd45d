"""Portable PyTorch kernels (impl name "torch"): run wherever PyTorch runs (CPU, CUDA, NPU).

They compute the same mathematics as the upstream eager code (see `opslot.reference`) but are
organised for speed where plain PyTorch allows it: MoE experts as sorted, contiguous per-expert
matmuls instead of a one-hot mask per expert; the load-balancing loss over all layers at once; the
causal conv without computing the right-hand padding.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from .. import reference

_SILU_NAMES = ("silu", "swish")


def _rms(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`w * norm(x).to(dtype)` (Llama/Qwen)."""
    return weight * _rms(hidden_states.float(), eps).to(hidden_states.dtype)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`(norm(x) * (1 + w)).to(dtype)` in fp32 (Gemma3/Qwen3.5)."""
    return (_rms(hidden_states.float(), eps) * (1.0 + weight.float())).to(hidden_states.dtype)


def rms_norm_unweighted(hidden_states: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """`norm(x).to(dtype)`; `weight` must be None."""
    if weight is not None:
        raise ValueError("rms_norm/unweighted takes weight=None")
    return _rms(hidden_states.float(), eps).to(hidden_states.dtype)


def rms_norm_unweighted_cast(hidden_states: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """DeepSeek-V4's unweighted norm, `x * rsqrt(mean(x^2) + eps).to(dtype)` (the rsqrt rounded to x's
    dtype before the product); `weight` must be None. The reference is upstream's own ops in its order
    (a fused fp32 form would round differently), so outputs and gradients are upstream eager's, bit for
    bit, in every dtype."""
    if weight is not None:
        raise ValueError("rms_norm/unweighted_cast takes weight=None")
    return reference.rms_norm_unweighted_cast(hidden_states, None, eps)


def rms_norm_gated(hidden_states: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`(w * norm(x).to(dtype)) * silu(gate.float())`, cast back (Qwen3.5 RMSNormGated)."""
    dtype = hidden_states.dtype
    normed = weight * _rms(hidden_states.float(), eps).to(dtype)
    return (normed * F.silu(gate.float())).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c1, c2 = cos[..., :half], cos[..., half:]
    s1, s2 = sin[..., :half], sin[..., half:]
    return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)


def rotary_pos_emb_full(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the whole head dimension."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE over the first `cos.shape[-1]` features; the rest pass through."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    d = cos.shape[-1]
    return (
        torch.cat((_rotate(q[..., :d], cos, sin), q[..., d:]), dim=-1),
        torch.cat((_rotate(k[..., :d], cos, sin), k[..., d:]), dim=-1),
    )


def rotary_pos_emb_interleaved(
    q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1
) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3: interleaved pairs `(x0, x1), (x2, x3), ...` turned by the first half of cos/sin,
    returned de-interleaved (`position_ids` is unused, as upstream)."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half].unsqueeze(unsqueeze_dim), sin[..., :half].unsqueeze(unsqueeze_dim)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)  # views of the even and odd features
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    return rotate(q), rotate(k)


def rotary_pos_emb_deepseek_v4(x, cos, sin, unsqueeze_dim: int = 1) -> torch.Tensor:
    """DeepSeek-V4: the trailing `2 * cos.shape[-1]` features' interleaved pairs turned in place by
    half-width cos/sin, in fp32, cast back; the leading features pass through. The reference is
    upstream's own ops in its order (no faster form in plain PyTorch ops keeps its bits), so outputs
    and gradients are upstream eager's, bit for bit, in every dtype."""
    return reference.rotary_pos_emb_deepseek_v4(x, cos, sin, unsqueeze_dim=unsqueeze_dim)


def rotary_pos_emb_vision(q, k, cos, sin) -> Tuple[torch.Tensor, torch.Tensor]:
    """The vision towers' RoPE (q/k `[seq, heads, dim]`, cos/sin `[seq, dim]`) in fp32, cast back to
    q's and k's dtypes; every product and sum is upstream's, so the result is too."""
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    return _rotate(q.float(), cos, sin).to(q.dtype), _rotate(k.float(), cos, sin).to(k.dtype)


def _is_silu(fn: Any) -> bool:
    """True for torch's and Transformers' SiLU modules and for F.silu itself."""
    return fn is F.silu or isinstance(fn, torch.nn.SiLU) or type(fn).__name__ in ("SiLUActivation", "SiLU")


def _check_silu(module: Any, op: str) -> None:
    """Refuse modules whose activation is not SiLU (by `config.hidden_act`, else by `act_fn`)."""
    act = getattr(getattr(module, "config", None), "hidden_act", None)
    if act is not None and act not in _SILU_NAMES:
        raise ValueError(f"{op} computes SiLU gating but the model's hidden_act is {act!r}; use 'eager'")
    act_fn = getattr(module, "act_fn", None)
    if act is None and act_fn is not None and not _is_silu(act_fn):
        raise ValueError(f"{op} computes SiLU gating but the module's act_fn is {type(act_fn).__name__}; use 'eager'")


def check_no_softcapping(module: Any) -> None:
    """Refuse causal-LM heads that soft-cap their logits (Gemma): the loss would silently differ."""
    cap = getattr(reference.text_config(getattr(module, "config", None)), "final_logit_softcapping", None)
    if cap is not None:
        raise ValueError(f"cross_entropy_loss/causal kernels do not apply final_logit_softcapping ({cap}); use 'eager'")


def swiglu_mlp(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`down(silu(gate(x)) * up(x))`; refuses models whose `config.hidden_act` is not SiLU."""
    _check_silu(module, "swiglu_mlp")
    return module.down_proj(F.silu(module.gate_proj(x)) * module.up_proj(x))


def swiglu_mlp_clamped(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`down(silu(gate(x).clamp(max=L)) * up(x).clamp(-L, L))`, L = `module.limit` (DeepSeek-V4's
    shared experts); refuses models whose `config.hidden_act` is not SiLU."""
    _check_silu(module, "swiglu_mlp")
    return module.down_proj(reference.clamped_swiglu(module.gate_proj(x), module.up_proj(x), module.limit))


def cross_entropy_causal(module: Any, hidden_states: torch.Tensor, labels: Optional[torch.Tensor], **kwargs):
    """lm_head, then HF's causal-LM loss (fp32 upcast, shift, ignore_index): `(logits, loss)`."""
    check_no_softcapping(module)
    logits = module.lm_head(hidden_states)
    if labels is None:
        return logits, None
    vocab = reference.text_config(module.config).vocab_size  # a multimodal head's is in its text config
    return logits, reference.for_causal_lm_loss(logits, labels, vocab_size=vocab, **kwargs)


def cross_entropy_sequence_classification(logits=None, labels=None, pooled_logits=None, config=None, **kwargs):
    """HF `ForSequenceClassificationLoss` (regression / single-label / multi-label by problem_type)."""
    return reference.cross_entropy_sequence_classification(
        logits=logits, labels=labels, pooled_logits=pooled_logits, config=config, **kwargs
    )


def load_balancing_loss(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """Switch-Transformer auxiliary loss, all layers in one softmax/top-k."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    device = gate_logits[0].device
    layers = len(gate_logits)
    logits = torch.cat([g.to(device) for g in gate_logits], dim=0)  # [layers * rows, E]
    probs = F.softmax(logits, dim=-1)
    selected = torch.topk(probs, top_k, dim=-1).indices  # [layers * rows, top_k]
    if attention_mask is None:
        counts = torch.bincount(selected.reshape(-1), minlength=num_experts).float()
        prob_sum = probs.float().sum(dim=0)
        rows = float(probs.shape[0])
    else:
        mask = attention_mask.reshape(-1).to(device=device, dtype=torch.float32).repeat(layers)
        counts = torch.zeros(num_experts, dtype=torch.float32, device=device).scatter_add_(
            0, selected.reshape(-1), mask.repeat_interleave(top_k)
        )
        prob_sum = (probs.float() * mask.unsqueeze(-1)).sum(dim=0)
        rows = mask.sum()
    return torch.sum((counts / rows) * (prob_sum / rows)) * num_experts


def _sort_by_expert(top_k_index: torch.Tensor, num_experts: int):
    """Flattened (token, k) assignments sorted by expert: (order, token of each, per-expert counts).
    Assignments to the masking index `num_experts` are dropped, as upstream skips them."""
    flat = top_k_index.reshape(-1)
    sorted_experts, order = torch.sort(flat, stable=True)
    counts = torch.bincount(sorted_experts, minlength=num_experts + 1)[:num_experts]
    kept = int(counts.sum())
    order = order[:kept]
    return order, order // top_k_index.shape[-1], counts.tolist()


def _grouped(x_sorted: torch.Tensor, counts, expert_fn) -> torch.Tensor:
    outs, start = [], 0
    for e, n in enumerate(counts):
        if n:
            outs.append(expert_fn(e, x_sorted[start : start + n]))
            start += n
    return torch.cat(outs, dim=0)


def _moe_gated(module: Any, hidden_states, top_k_index, top_k_weights, glu) -> torch.Tensor:
    """Experts with `gate_up_proj [E, 2I, H]` (gate rows first) and `down_proj [E, H, I]` as sorted
    per-expert matmuls over contiguous token segments; `glu(gate, up)` is the gated activation."""
    order, token_idx, counts = _sort_by_expert(top_k_index, module.num_experts)
    final = torch.zeros_like(hidden_states)
    if not token_idx.numel():
        return final

    def expert(e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, module.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(glu(gate, up), module.down_proj[e])

    out = _grouped(hidden_states[token_idx], counts, expert)
    out = out * top_k_weights.reshape(-1)[order, None]
    return final.index_add(0, token_idx, out.to(final.dtype))


def moe_standard(module: Any, hidden_states, top_k_index, top_k_weights):
    """Qwen3-MoE-style experts (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`): `act(gate) * up`."""
    return _moe_gated(module, hidden_states, top_k_index, top_k_weights, lambda gate, up: module.act_fn(gate) * up)


def moe_clamped(module: Any, hidden_states, top_k_index, top_k_weights):
    """DeepSeek-V4's experts: as `moe_standard`, the gate clamped to at most `module.limit` and up to
    +-`module.limit` before `act(gate) * up`."""
    return _moe_gated(
        module,
        hidden_states,
        top_k_index,
        top_k_weights,
        lambda gate, up: reference.clamped_swiglu(gate, up, module.limit, module.act_fn),
    )


def moe_gpt_oss(module: Any, hidden_states, router_indices, routing_weights):
    """GPT-OSS experts (biases, interleaved gate/up, clamped alpha-SwiGLU) as sorted per-expert matmuls."""
    order, token_idx, counts = _sort_by_expert(router_indices, module.num_experts)
    final = torch.zeros_like(hidden_states)
    if not token_idx.numel():
        return final

    def expert(e: int, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.addmm(module.gate_up_proj_bias[e], x, module.gate_up_proj[e])
        return torch.addmm(module.down_proj_bias[e], reference.gpt_oss_gate(module, gate_up), module.down_proj[e])

    out = _grouped(hidden_states[token_idx], counts, expert)
    out = out * routing_weights.reshape(-1)[order, None]
    return final.index_add(0, token_idx, out.to(final.dtype))


def causal_conv1d(hidden_states, weight, bias=None, activation=None, cu_seqlens=None, conv_state=None, **kwargs):
    """Depthwise causal conv: left-pad by `width - 1`, convolve without padding.

    `cu_seqlens` (batch 1): the conv restarts at every segment (zero history): each tap that would
    reach back across a segment start is masked. `conv_state [B, C, S]` (S >= width - 1): decode, as
    upstream's `causal_conv1d_update` (conv over cat(conv_state, x), state updated in place)."""
    if activation is not None and activation not in _SILU_NAMES:
        raise ValueError(f"causal_conv1d supports activation None, 'silu' or 'swish', got {activation!r}")
    if conv_state is not None:
        if cu_seqlens is not None:
            raise ValueError("causal_conv1d: conv_state (decode) and cu_seqlens (packed) cannot be combined")
        return _causal_conv1d_update(hidden_states, conv_state, weight, bias, activation)
    channels, seq_len = hidden_states.shape[1], hidden_states.shape[-1]
    width = weight.shape[-1]
    if seq_len == 0:  # an empty (packed) sequence
        return hidden_states.new_zeros(hidden_states.shape)
    x = F.pad(hidden_states.to(weight.dtype), (width - 1, 0))
    if cu_seqlens is None:
        out = F.conv1d(x, weight.unsqueeze(1), bias, groups=channels)
    else:
        bounds = reference.cu_seqlens_bounds(cu_seqlens, hidden_states.shape[0], seq_len, "causal_conv1d")
        # Offset of every position inside its segment; tap j reads position t - (width - 1 - j),
        # which belongs to the same segment only when that lag is <= the offset.
        starts = torch.repeat_interleave(
            torch.tensor([s for s, _ in bounds], dtype=torch.long),
            torch.tensor([e - s for s, e in bounds], dtype=torch.long),
        )
        offset = (torch.arange(seq_len) - starts).to(device=x.device)
        out = None
        for j in range(width):
            lag = width - 1 - j
            tap = x[:, :, j : j + seq_len] * weight[:, j, None]
            if lag:
                tap = tap * (offset >= lag).to(tap.dtype)
            out = tap if out is None else out + tap
        if bias is not None:
            out = out + bias[:, None]
    if activation is not None:
        out = F.silu(out)
    return out.to(hidden_states.dtype)


def _causal_conv1d_update(hidden_states, conv_state, weight, bias, activation):
    """Decode: conv over cat(conv_state, x) (last `seq` positions); conv_state <- its last S columns."""
    channels, seq_len = hidden_states.shape[1], hidden_states.shape[-1]
    state_len, width = conv_state.shape[-1], weight.shape[-1]
    if conv_state.dim() != 3 or conv_state.shape[:2] != hidden_states.shape[:2]:
        raise ValueError(
            f"causal_conv1d: conv_state must be [batch, channels, S] = "
            f"[{hidden_states.shape[0]}, {channels}, S], got {tuple(conv_state.shape)}"
        )
    if state_len < width - 1:
        raise ValueError(
            f"causal_conv1d: conv_state holds {state_len} columns, the kernel width {width} needs at least {width - 1}"
        )
    full = torch.cat([conv_state.to(weight.dtype), hidden_states.to(weight.dtype)], dim=-1)
    conv_state.copy_(full[:, :, -state_len:])
    out = F.conv1d(full[:, :, -(seq_len + width - 1) :], weight.unsqueeze(1), bias, groups=channels)
    if activation is not None:
        out = F.silu(out)
    return out.to(hidden_states.dtype)


def chunk_gated_delta_rule(
    query,
    key,
    value,
    g,
    beta,
    chunk_size: int = 64,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens=None,
    **kwargs,
):
    """Gated delta rule, chunk-parallel (UT transform per chunk, sequential scan over chunks).

    Shapes: q/k `[B, T, H, Dk]`, v `[B, T, H, Dv]`, g/beta `[B, T, H]`; returns
    (`[B, T, H, Dv]` in q's dtype, final state `[B, H, Dk, Dv]` fp32 or None). With `cu_seqlens`
    (B = 1, `[N + 1]` boundaries) every segment runs on its own: initial/final states `[N, H, Dk, Dv]`."""
    if cu_seqlens is None:
        return _chunk_gated_delta_rule(
            query, key, value, g, beta, chunk_size, initial_state, output_final_state, use_qk_l2norm_in_kernel
        )
    bounds = reference.cu_seqlens_bounds(cu_seqlens, query.shape[0], query.shape[1], "chunk_gated_delta_rule")
    if initial_state is not None and initial_state.shape[0] != len(bounds):
        raise ValueError(
            f"chunk_gated_delta_rule: initial_state has {initial_state.shape[0]} states for "
            f"{len(bounds)} sequences in cu_seqlens"
        )
    outs, states = [], []
    for n, (start, end) in enumerate(bounds):
        out, state = _chunk_gated_delta_rule(
            query[:, start:end],
            key[:, start:end],
            value[:, start:end],
            g[:, start:end],
            beta[:, start:end],
            chunk_size,
            None if initial_state is None else initial_state[n : n + 1],
            output_final_state,
            use_qk_l2norm_in_kernel,
        )
        outs.append(out)
        states.append(state)
    return torch.cat(outs, dim=1), (torch.cat(states, dim=0) if output_final_state else None)


def _chunk_gated_delta_rule(
    query, key, value, g, beta, chunk_size, initial_state, output_final_state, use_qk_l2norm_in_kernel
):
    dtype = query.dtype
    B, T, H, Dk = key.shape
    Dv = value.shape[-1]
    if T == 0:  # an empty packed sequence: no output, the state passes through
        state = (
            torch.zeros(B, H, Dk, Dv, dtype=torch.float32, device=query.device)
            if initial_state is None
            else initial_state.float()
        )
        out = value.new_zeros(B, 0, H, Dv, dtype=dtype)
        return out, (state if output_final_state else None)
    q, k, v, b, decay = (x.transpose(1, 2).float().contiguous() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = reference.l2norm(q), reference.l2norm(k)
    q = q * Dk**-0.5
    C = min(chunk_size, T)  # exact for any chunk size; short inputs (decode: T = 1) need no padding
    pad = (C - T % C) % C
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    b, decay = (F.pad(x, (0, pad)) for x in (b, decay))
    n = (T + pad) // C
    q, k, v = (x.reshape(B, H, n, C, x.shape[-1]) for x in (q, k, v))
    b, decay = b.reshape(B, H, n, C), decay.reshape(B, H, n, C)
    k_beta, v_beta = k * b.unsqueeze(-1), v * b.unsqueeze(-1)

    cum = decay.cumsum(-1)  # log of the decay from chunk start to each position
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    pair = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    strictly_lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    # (I + A) with A = strictly lower part of (k_beta k^T * decay): the UT transform system.
    system = ((k_beta @ k.transpose(-1, -2)) * pair).masked_fill(~strictly_lower, 0.0)
    system = system + torch.eye(C, dtype=system.dtype, device=system.device)
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp().unsqueeze(-1), upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * pair
    q_decayed = q * cum.exp().unsqueeze(-1)
    k_decayed = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]

    state = (
        torch.zeros(B, H, Dk, Dv, dtype=torch.float32, device=q.device)
        if initial_state is None
        else initial_state.float()
    )
    outs = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        outs.append(q_decayed[:, :, i] @ state + attn[:, :, i] @ v_new)
        state = state * chunk_decay[:, :, i] + k_decayed[:, :, i].transpose(-1, -2) @ v_new
    out = torch.stack(outs, dim=2).reshape(B, H, n * C, Dv)[:, :, :T]
    return out.transpose(1, 2).contiguous().to(dtype), (state if output_final_state else None)


# -- DeepSeek-V4 --------------------------------------------------------------------------------
def mhc_pre(module: Any, hidden_streams: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V4's hyper-connection weights and collapsed block input (`DeepseekV4HyperConnection`):
    `(post [B, S, N], comb [B, S, N, N], collapsed [B, S, D])`, every operation upstream's, in its
    order and on tensors of its layouts (vectorised elementwise kernels round as upstream's: bit for
    bit on the CPU)."""
    hc, eps = module.hc_mult, module.hc_eps
    normed = reference.v4_unweighted_rms_norm(hidden_streams.flatten(start_dim=2).float(), module.input_norm.eps)
    pre_w, post_w, comb_w = F.linear(normed, module.fn.float()).split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = module.base.split([hc, hc, hc * hc])
    pre_s, post_s, comb_s = module.scale.unbind(0)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * post_s + post_b)
    comb = torch.softmax(comb_w.unflatten(-1, (hc, hc)) * comb_s + comb_b.view(hc, hc), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(module.hc_sinkhorn_iters - 1):  # Sinkhorn: rows, then columns
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    collapsed = (pre.unsqueeze(-1) * hidden_streams).sum(dim=2).to(hidden_streams.dtype)
    return post, comb, collapsed


def mhc_post(post: torch.Tensor, comb: torch.Tensor, block_output: torch.Tensor, hidden_states: torch.Tensor):
    """`post * block_output + comb^T @ streams` in the streams' dtype (DeepSeek-V4's decoder layer):
    each product rounded as upstream rounds it (a fused multiply-add would not be bit for bit)."""
    dtype = hidden_states.dtype
    expanded = post.to(dtype).unsqueeze(-1) * block_output.unsqueeze(-2)
    return expanded + torch.matmul(comb.to(dtype).transpose(-1, -2), hidden_states)


def mhc_head(module: Any, x: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4's final collapse of the streams (`DeepseekV4HyperHead`): sigmoid weights of the
    normalised streams, `[B, S, D]` in x's dtype."""
    mixes = F.linear(
        reference.v4_unweighted_rms_norm(x.flatten(2).float(), module.input_norm.eps), module.hc_fn.float()
    )
    pre = torch.sigmoid(mixes * module.hc_scale.float() + module.hc_base.float()) + module.eps
    return (pre.unsqueeze(-1) * x).sum(dim=2).to(x.dtype)


#: Elements of one chunk of the indexer's per-head scores ([B, queries, H, T] fp32: 256 MiB).
INDEX_SCORE_CHUNK = 1 << 26


def dsa_indexer_deepseek_v4(module: Any, hidden_states, q_residual, position_ids, past_key_values, layer_idx: int):
    """DeepSeek-V4's Lightning indexer: keys and queries as upstream (the cache updated as upstream
    does), the per-head scores `[B, S, H, T]` in query chunks of at most INDEX_SCORE_CHUNK elements
    (upstream holds them all at once), summed over the heads, then the causal top-k: int64
    `[B, S, min(index_topk, T)]`, -1 = no valid key. Indices carry no gradient: computed without
    autograd."""
    with torch.no_grad():
        keys = reference.v4_indexer_keys(module, hidden_states, past_key_values, layer_idx)
        q = reference.v4_indexer_queries(module, hidden_states, q_residual, position_ids)
        weights = reference.v4_index_weights(module, hidden_states)  # [B, S, H]
        batch, seq_len, heads, _ = q.shape
        keys_t = keys.transpose(-1, -2).float().unsqueeze(1)  # [B, 1, D, T]
        step = max(1, INDEX_SCORE_CHUNK // max(1, batch * heads * keys.shape[1]))
        scores = q.new_empty((batch, seq_len, keys.shape[1]), dtype=torch.float32)
        for start in range(0, seq_len, step):
            end = min(seq_len, start + step)
            part = F.relu(torch.matmul(q[:, start:end].float(), keys_t)) * module.scorer.softmax_scale
            scores[:, start:end] = (part * weights[:, start:end].unsqueeze(-1)).sum(dim=2)
        return reference.v4_index_topk(module, scores, position_ids)


def dsa_attention_deepseek_v4(
    module: Any,
    query: torch.Tensor,
    kv: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs,
):
    """DeepSeek-V4's attention core (shared K = V, one head; per-head sinks), as upstream's eager
    attention but without repeating the shared head per query head: the heads of a row are one
    `[H * S, D] x [D, T]` product against it. Returns (`[B, S, H, D]`, probabilities `[B, H, S, T]`)."""
    if s_aux is None:
        raise ValueError("dsa_attention/deepseek_v4 needs the attention sinks (s_aux=self.sinks, as the guard passes)")
    if kv.dim() != 4 or kv.shape[1] != 1:
        raise ValueError(f"dsa_attention/deepseek_v4 takes one shared K=V head [B, 1, T, D], got kv {tuple(kv.shape)}")
    batch, heads, seq_len, dim = query.shape
    shared = kv[:, 0]  # [B, T, D]
    attn_weights = torch.matmul(query.reshape(batch, heads * seq_len, dim), shared.transpose(1, 2))
    attn_weights = attn_weights.view(batch, heads, seq_len, -1) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    sinks = s_aux.reshape(1, -1, 1, 1).expand(batch, -1, seq_len, -1)
    combined_logits = torch.cat([attn_weights, sinks], dim=-1)
    combined_logits = combined_logits - combined_logits.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined_logits, dim=-1, dtype=combined_logits.dtype)
    attn_weights = F.dropout(probs[..., :-1], p=dropout, training=module.training).to(kv.dtype)
    out = torch.matmul(attn_weights.reshape(batch, heads * seq_len, -1), shared)
    return out.view(batch, heads, seq_len, dim).transpose(1, 2).contiguous(), attn_weights


# -- GLM-MoE-DSA --------------------------------------------------------------------------------
#: The indexer's fp32 scores are computed for as many query rows as keep them under this many elements
#: (256 MiB), instead of upstream's whole [B, S, H, T] at once (512 GiB at 64k tokens and 32 heads).
_INDEX_SCORE_ELEMENTS = 1 << 26


def dsa_indexer_glm(
    module: Any, hidden_states, q_resid, position_embeddings, attention_mask, position_ids=None, past_key_values=None
) -> torch.Tensor:
    """`GlmMoeDsaIndexer.forward`'s operations in its order (bit for bit on the CPU): q, k with the
    interleaved RoPE on their first `qk_rope_head_dim` features, the cache's indexer keys appended,
    fp32 scores `relu(q . k) * scale` weighted per head and summed, the mask, and the top k as int32
    `[B, S, min(index_topk, T)]`; the scores a block of query rows at a time (`_INDEX_SCORE_ELEMENTS`)."""
    with torch.no_grad():
        batch_size, seq_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        rope = module.qk_rope_head_dim
        q = module.wq_b(q_resid).view(batch_size, seq_len, module.n_heads, module.head_dim)
        q_rot, q_pass = torch.split(q, [rope, module.head_dim - rope], dim=-1)
        k = module.k_norm(module.wk(hidden_states)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [rope, module.head_dim - rope], dim=-1)
        q_rot, k_rot = rotary_pos_emb_interleaved(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        if past_key_values is not None:
            k = past_key_values.update_indexer(k, module.layer_idx)
        keys = k.transpose(-1, -2).float().unsqueeze(1)  # [B, 1, D, T]
        weights = module.weights_proj(hidden_states.to(module.weights_proj.weight.dtype)).float() * (
            module.n_heads**-0.5
        )
        top_k = min(module.index_topk, keys.shape[-1])
        # upstream's [B, S, H, T] fp32 scores, a block of query rows at a time (each row's products
        # and sums are the same: matmul treats every (b, s) as its own matrix)
        rows = max(1, _INDEX_SCORE_ELEMENTS // max(1, batch_size * module.n_heads * keys.shape[-1]))
        out = []
        for start in range(0, max(seq_len, 1), rows):  # one (empty) block for no query
            part = slice(start, start + rows)
            scores = F.relu(torch.matmul(q[:, part].float(), keys) * module.softmax_scale)
            index_scores = torch.matmul(weights[:, part].unsqueeze(-2), scores).squeeze(-2)
            mask = attention_mask[:, part]
            if mask.dtype == torch.bool:
                index_scores = index_scores.masked_fill(~mask, float("-inf"))
            else:
                index_scores = index_scores + mask
            out.append(index_scores.topk(top_k, dim=-1).indices.to(torch.int32))
        return torch.cat(out, dim=1)


def dsa_attention_glm(
    module: Any, q_pass, q_rot, k_pass, k_rot, topk_indices, attention_mask, past_key_values=None, **kwargs
):
    """`GlmMoeDsaAttention.forward` from the latents on, as upstream (bit for bit on the CPU): per-head
    K/V from `expand_kv`, the cache written with them when `past_key_values` is given (Transformers
    < 5.23 caches the expanded K/V), every key outside `topk_indices` masked for eager/sdpa (other
    attentions get `indices=topk_indices`), then the model's attention function."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    batch_size, _, seq_length, _ = q_pass.shape
    query_states = torch.cat((q_pass, q_rot), dim=-1)
    key_states, value_states = module.expand_kv(k_pass, k_rot)
    if past_key_values is not None:
        key_states, value_states = past_key_values.update(key_states, value_states, module.layer_idx)
    sparse_indices = None
    if module.config._attn_implementation in ("eager", "sdpa"):
        index_mask = (
            topk_indices.new_ones((batch_size, seq_length, key_states.shape[2]), dtype=torch.bool)
            .scatter(-1, topk_indices.long(), False)
            .unsqueeze(1)
        )
        if attention_mask.dtype == torch.bool:
            attention_mask = attention_mask & ~index_mask
        else:  # upstream fills with the minimum of the hidden states' dtype, which q_pass has
            attention_mask = attention_mask.masked_fill(index_mask, torch.finfo(q_pass.dtype).min)
    else:
        sparse_indices = topk_indices
    eager = sys.modules[type(module).__module__].eager_attention_forward  # the model module's own
    attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager)
    return attention_interface(
        module,
        query_states,
        key_states,
        value_states,
        attention_mask,
        dropout=0.0 if not module.training else module.attention_dropout,
        scaling=module.scaling,
        indices=sparse_indices,
        **kwargs,
    )
