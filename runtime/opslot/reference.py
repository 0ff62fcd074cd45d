"""fp32 references: the upstream eager mathematics of every op in docs/ops.md, written by us.

These are the executable form of the op contracts. Tests run them on fp32 copies of the inputs and
compare every kernel's outputs and gradients against them. They follow the upstream code line for
line (Transformers 5.17.0: Llama/Qwen3/Gemma3/Qwen3.5 norms and RoPE, DeepSeek-V3's interleaved RoPE,
the VL vision towers' RoPE, `loss_utils`, Qwen3-MoE and GPT-OSS experts, Qwen3.5 gated-delta-net
helpers; DeepSeek-V4's unweighted RMSNorm, RoPE, clamped SwiGLU, hyper-connections, Lightning indexer
and attention, the same in 5.17.0 to 5.24.0); none of them is meant to be fast.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F


# -- RMSNorm ------------------------------------------------------------------------------------
def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama/Qwen: `w * (x.float() * rsqrt(mean(x^2) + eps)).to(dtype)`."""
    input_dtype = hidden_states.dtype
    x = hidden_states.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(input_dtype)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma3/Qwen3.5: `(x.float() * rsqrt(mean(x^2) + eps) * (1 + w.float())).type_as(x)`."""
    x = hidden_states.float()
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(hidden_states)


def rms_norm_unweighted(hidden_states: torch.Tensor, weight: None, eps: float) -> torch.Tensor:
    """No weight: `(x.float() * rsqrt(mean(x^2) + eps)).type_as(x)`."""
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).type_as(hidden_states)


def rms_norm_unweighted_cast(hidden_states: torch.Tensor, weight: None, eps: float) -> torch.Tensor:
    """DeepSeek-V4's `DeepseekV4UnweightedRMSNorm` (5.17.0 to 5.24.0), no weight:
    `x * rsqrt(x.float().square().mean(-1) + eps).to(x.dtype)`. The fp32 rsqrt is rounded to x's
    dtype *before* the product, which is then taken in x's dtype; `rms_norm_unweighted` multiplies in
    fp32 and rounds once, so in bf16/fp16 the two differ. Returns x's shape and dtype."""
    x = hidden_states
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def rms_norm_gated(hidden_states: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5 RMSNormGated: norm before gate, `(w * norm(x).to(dtype)) * silu(gate.float())`, cast back."""
    input_dtype = hidden_states.dtype
    x = hidden_states.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    x = weight * x.to(input_dtype)
    x = x * F.silu(gate.to(torch.float32))
    return x.to(input_dtype)


# -- RoPE ---------------------------------------------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary_pos_emb_full(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    return torch.cat([q_embed, q_pass], dim=-1), torch.cat([k_embed, k_pass], dim=-1)


def rotary_pos_emb_interleaved(
    q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1
) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's `apply_rotary_pos_emb_interleave` (5.17.0 to 5.24.0): the rotary features come in
    interleaved pairs `(x0, x1), (x2, x3), ...`, pair i turned by the angle of `cos[..., i]`; the output
    is de-interleaved (`[rotated evens, rotated odds]`). `position_ids` is unused, as upstream."""
    cos = cos[..., : cos.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    sin = sin[..., : sin.shape[-1] // 2].unsqueeze(unsqueeze_dim)

    q1, q2 = q[..., 0::2], q[..., 1::2]
    k1, k2 = k[..., 0::2], k[..., 1::2]

    q_embed = torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1)
    k_embed = torch.cat([k1 * cos - k2 * sin, k2 * cos + k1 * sin], dim=-1)
    return q_embed, k_embed


def rotary_pos_emb_deepseek_v4(x, cos, sin, unsqueeze_dim: int = 1) -> torch.Tensor:
    """DeepSeek-V4's `apply_rotary_pos_emb` (5.17.0 to 5.24.0): one tensor; cos/sin come half-width
    (`[..., rope_dim / 2]`, one entry per pair). The trailing `rope_dim` features of `x` come in
    interleaved pairs `(x0, x1), (x2, x3), ...`, pair i turned by the angle of `cos[..., i]` in fp32,
    kept in place (not de-interleaved) and cast back to x's dtype; the leading features pass through."""
    cos = cos.repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim)
    sin = sin.repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim)
    rope_dim = cos.shape[-1]
    nope, rope = x[..., :-rope_dim], x[..., -rope_dim:]
    turned = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    rotated = ((rope.float() * cos) + (turned.float() * sin)).to(x.dtype)
    return torch.cat([nope, rotated], dim=-1)


def rotary_pos_emb_vision(q, k, cos, sin) -> Tuple[torch.Tensor, torch.Tensor]:
    """The vision towers' `apply_rotary_pos_emb_vision` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE;
    the same in 5.17.0, 5.23.0 and 5.24.0): q/k `[seq, heads, dim]`, cos/sin `[seq, dim]`, rotated in
    fp32 and cast back to q's and k's dtypes."""
    orig_q_dtype = q.dtype
    orig_k_dtype = k.dtype
    q, k = q.float(), k.float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    q_embed = q_embed.to(orig_q_dtype)
    k_embed = k_embed.to(orig_k_dtype)
    return q_embed, k_embed


# -- MLP ----------------------------------------------------------------------------------------
def swiglu_mlp(module: Any, x: torch.Tensor) -> torch.Tensor:
    return module.down_proj(F.silu(module.gate_proj(x)) * module.up_proj(x))


# -- losses -------------------------------------------------------------------------------------
def fixed_cross_entropy(source, target, num_items_in_batch=None, ignore_index: int = -100, **kwargs):
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(source, target, ignore_index=ignore_index, reduction=reduction)
    if reduction == "sum":
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def for_causal_lm_loss(
    logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100, shift_labels=None, **kwargs
):
    logits = logits.float()
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(logits.device)
    return fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)


def text_config(config: Any) -> Any:
    """The language model's config: a multimodal config's text sub-config (`get_text_config()`, where
    the vocabulary and the logit softcapping of a `*ForConditionalGeneration` live), else `config`."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def cross_entropy_causal(module: Any, hidden_states: torch.Tensor, labels: Optional[torch.Tensor], **kwargs):
    """`*ForCausalLM.forward` from `logits = self.lm_head(...)` through the loss: `(logits, loss)`."""
    logits = module.lm_head(hidden_states)
    loss = None
    if labels is not None:
        loss = for_causal_lm_loss(logits, labels, vocab_size=text_config(module.config).vocab_size, **kwargs)
    return logits, loss


def sequence_classification_problem_type(config, labels) -> str:
    """`config.problem_type`, set first when unset, exactly as upstream's ForSequenceClassificationLoss does."""
    num_labels = config.num_labels
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif num_labels > 1 and (labels.dtype in (torch.long, torch.int)):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    return config.problem_type


def cross_entropy_sequence_classification(logits=None, labels=None, pooled_logits=None, config=None, **kwargs):
    """HF `ForSequenceClassificationLoss` (sets `config.problem_type` when unset, as upstream does)."""
    num_labels = config.num_labels
    sequence_classification_problem_type(config, labels)
    labels = labels.to(pooled_logits.device)
    if config.problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(pooled_logits.squeeze(), labels.squeeze())
        return F.mse_loss(pooled_logits, labels)
    if config.problem_type == "single_label_classification":
        return fixed_cross_entropy(pooled_logits.view(-1, num_labels), labels.view(-1), **kwargs)
    if config.problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(pooled_logits, labels)
    raise RuntimeError(f"Invalid problem type: {config.problem_type}")


def load_balancing_loss(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """Switch-Transformer auxiliary loss, as Qwen3-MoE's `load_balancing_loss_func`."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    compute_device = gate_logits[0].device
    tokens_per_expert_sum = torch.zeros(num_experts, dtype=torch.float32, device=compute_device)
    router_prob_sum = torch.zeros(num_experts, dtype=torch.float32, device=compute_device)
    total_rows = 0.0
    if attention_mask is not None:
        flat_mask = attention_mask.reshape(-1).to(device=compute_device, dtype=torch.float32)
    for layer_gate in gate_logits:
        routing_weights = F.softmax(layer_gate.to(compute_device), dim=-1)
        _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
        if attention_mask is None:
            tokens_per_expert_sum = (
                tokens_per_expert_sum + torch.bincount(selected_experts.reshape(-1), minlength=num_experts).float()
            )
            router_prob_sum = router_prob_sum + routing_weights.float().sum(dim=0)
            total_rows = total_rows + routing_weights.shape[0]
        else:
            tokens_per_expert_sum = tokens_per_expert_sum + torch.zeros(
                num_experts, dtype=torch.float32, device=compute_device
            ).scatter_add_(0, selected_experts.reshape(-1), flat_mask.repeat_interleave(top_k))
            router_prob_sum = router_prob_sum + (routing_weights.float() * flat_mask.unsqueeze(-1)).sum(dim=0)
            total_rows = total_rows + flat_mask.sum()
    tokens_per_expert = tokens_per_expert_sum / total_rows
    router_prob_per_expert = router_prob_sum / total_rows
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


# -- MoE experts --------------------------------------------------------------------------------
def _moe_experts(module: Any, hidden_states, top_k_index, top_k_weights, gated) -> torch.Tensor:
    """Upstream's expert loop (`gate_up_proj [E, 2I, H]`, gate rows first): per hit expert,
    `down(gated(gate, up)) * weight`, index-added; the masking index `num_experts` is skipped."""
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = F.one_hot(top_k_index, num_classes=module.num_experts + 1)[..., : module.num_experts]
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        e = expert_idx[0]
        top_k_pos, token_idx = torch.where(expert_mask[e])
        gate, up = F.linear(hidden_states[token_idx], module.gate_up_proj[e]).chunk(2, dim=-1)
        current = F.linear(gated(gate, up), module.down_proj[e])
        current = current * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, current.to(final.dtype))
    return final


def moe_standard(module: Any, hidden_states, top_k_index, top_k_weights):
    """Qwen3-MoE experts: per hit expert, `down(act(gate) * up) * weight`, index-added."""
    return _moe_experts(module, hidden_states, top_k_index, top_k_weights, lambda gate, up: module.act_fn(gate) * up)


def gpt_oss_gate(module: Any, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=module.limit)
    up = up.clamp(min=-module.limit, max=module.limit)
    glu = gate * torch.sigmoid(gate * module.alpha)
    return (up + 1) * glu


def moe_gpt_oss(module: Any, hidden_states, router_indices, routing_weights):
    """GPT-OSS experts: biased, interleaved gate/up, clamped `alpha` SwiGLU."""
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = F.one_hot(router_indices, num_classes=module.num_experts + 1)[..., : module.num_experts]
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        e = expert_idx[0]
        top_k_pos, token_idx = torch.where(expert_mask[e])
        gate_up = hidden_states[token_idx] @ module.gate_up_proj[e] + module.gate_up_proj_bias[e]
        out = gpt_oss_gate(module, gate_up) @ module.down_proj[e] + module.down_proj_bias[e]
        final.index_add_(0, token_idx, (out * routing_weights[token_idx, top_k_pos, None]).to(final.dtype))
    return final


# -- Qwen3.5 gated delta net --------------------------------------------------------------------
_ACTIVATIONS = {"silu": F.silu, "swish": F.silu}


def cu_seqlens_bounds(cu_seqlens, batch_size: int, seq_len: int, op: str):
    """Validate packed-sequence boundaries and return them as a list of (start, end) Python ints.

    `cu_seqlens` is a 1-D integer tensor [N + 1] with 0 = cu[0] <= cu[1] <= ... <= cu[N] = seq_len
    (empty segments allowed); the batch must be 1 (segments of one packed row). Anything else is a
    ValueError naming `op`."""
    if (
        not torch.is_tensor(cu_seqlens)
        or cu_seqlens.dim() != 1
        or cu_seqlens.is_floating_point()
        or cu_seqlens.is_complex()
        or cu_seqlens.dtype == torch.bool
    ):
        what = (
            f"a {cu_seqlens.dim()}-D {cu_seqlens.dtype} tensor"
            if torch.is_tensor(cu_seqlens)
            else type(cu_seqlens).__name__
        )
        raise ValueError(f"{op}: cu_seqlens must be a 1-D integer tensor [num_sequences + 1], got {what}")
    if batch_size != 1:
        raise ValueError(f"{op}: cu_seqlens (packed sequences) needs batch size 1, got {batch_size}")
    cu = [int(v) for v in cu_seqlens.tolist()]
    if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{op}: cu_seqlens must start at 0 and never decrease (at least 2 entries), got {cu}")
    if cu[-1] != seq_len:
        raise ValueError(f"{op}: cu_seqlens ends at {cu[-1]}, but the input has {seq_len} positions (cu_seqlens {cu})")
    return list(zip(cu[:-1], cu[1:]))


def causal_conv1d(hidden_states, weight, bias=None, activation=None, cu_seqlens=None, conv_state=None, **kwargs):
    """Depthwise causal conv over [batch, channels, seq] with kernel `weight [channels, width]`.

    `cu_seqlens` (batch 1): every segment is convolved on its own, with zero history at its start.
    `conv_state [batch, channels, S]` (S >= width - 1): upstream's decode `causal_conv1d_update`: the
    conv runs over cat(conv_state, x) and returns its last `seq` positions; `conv_state` is updated in
    place to the last S columns of cat(conv_state, x)."""
    if conv_state is not None:
        if cu_seqlens is not None:
            raise ValueError("causal_conv1d: conv_state (decode) and cu_seqlens (packed) cannot be combined")
        return _causal_conv1d_update(hidden_states, conv_state, weight, bias, activation)
    if cu_seqlens is not None:
        bounds = cu_seqlens_bounds(cu_seqlens, hidden_states.shape[0], hidden_states.shape[-1], "causal_conv1d")
        pieces = [
            causal_conv1d(hidden_states[:, :, start:end], weight, bias, activation)
            for start, end in bounds
            if end > start
        ]
        if not pieces:  # no positions at all
            return hidden_states.new_zeros(hidden_states.shape)
        return torch.cat(pieces, dim=-1)
    _, hidden_size, seq_len = hidden_states.shape
    out = F.conv1d(
        hidden_states.to(weight.dtype),
        weight=weight.unsqueeze(1),
        bias=bias,
        padding=weight.shape[-1] - 1,
        groups=hidden_size,
    )[:, :, :seq_len]
    if activation is not None:
        out = _ACTIVATIONS[activation](out)
    return out.to(hidden_states.dtype)


def _causal_conv1d_update(hidden_states, conv_state, weight, bias, activation):
    """Upstream `causal_conv1d_update`, line for line."""
    _, hidden_size, seq_len = hidden_states.shape
    state_len = conv_state.shape[-1]
    if state_len < weight.shape[-1] - 1:
        raise ValueError(
            f"causal_conv1d: conv_state holds {state_len} columns, the kernel width "
            f"{weight.shape[-1]} needs at least {weight.shape[-1] - 1}"
        )
    hidden_states_new = torch.cat([conv_state, hidden_states], dim=-1).to(weight.dtype)
    conv_state.copy_(hidden_states_new[:, :, -state_len:])
    out = F.conv1d(hidden_states_new, weight.unsqueeze(1), bias, padding=0, groups=hidden_size)
    out = out[:, :, -seq_len:]
    if activation is not None:
        out = _ACTIVATIONS[activation](out)
    return out.to(hidden_states.dtype)


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


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
    """The gated delta rule token by token (upstream `torch_recurrent_gated_delta_rule`, the defining
    recurrence that `torch_chunk_gated_delta_rule` computes chunk-wise); `chunk_size` is ignored.

    With `cu_seqlens` (batch 1) every segment is an independent sequence: `initial_state` is then
    [num_sequences, H, Dk, Dv] (or None) and the final state [num_sequences, H, Dk, Dv]."""
    if cu_seqlens is not None:
        bounds = cu_seqlens_bounds(cu_seqlens, query.shape[0], query.shape[1], "chunk_gated_delta_rule")
        if initial_state is not None and initial_state.shape[0] != len(bounds):
            raise ValueError(
                f"chunk_gated_delta_rule: initial_state has {initial_state.shape[0]} states for "
                f"{len(bounds)} sequences in cu_seqlens"
            )
        outs, states = [], []
        for n, (start, end) in enumerate(bounds):
            out, state = chunk_gated_delta_rule(
                query[:, start:end],
                key[:, start:end],
                value[:, start:end],
                g[:, start:end],
                beta[:, start:end],
                initial_state=None if initial_state is None else initial_state[n : n + 1],
                output_final_state=True,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            )
            outs.append(out)
            states.append(state)
        return torch.cat(outs, dim=1), (torch.cat(states, dim=0) if output_final_state else None)
    initial_dtype = query.dtype
    batch_size, sequence_length, _, k_head_dim = key.shape
    num_v_heads, v_head_dim = value.shape[-2:]
    query, key, value, beta, decay = [
        x.transpose(1, 2).to(torch.float32).contiguous() for x in (query, key, value, beta, g)
    ]
    if use_qk_l2norm_in_kernel:
        query = l2norm(query, dim=-1, eps=1e-6)
        key = l2norm(key, dim=-1, eps=1e-6)
    query = query / (query.shape[-1] ** 0.5)
    if initial_state is None:
        state = torch.zeros(batch_size, num_v_heads, k_head_dim, v_head_dim, dtype=value.dtype, device=value.device)
    else:
        state = initial_state.to(value)
    outs = []
    for i in range(sequence_length):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        state = state * decay[:, :, i].exp()[..., None, None]
        kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append((state * q_t.unsqueeze(-1)).sum(dim=-2))
    if not outs:  # an empty (packed) sequence: no output, the state passes through
        outs_t = value.new_zeros(batch_size, num_v_heads, 0, v_head_dim)
    else:
        outs_t = torch.stack(outs, dim=2)
    core_attn_out = outs_t.transpose(1, 2).contiguous().to(initial_dtype)
    return core_attn_out, (state if output_final_state else None)


# -- DeepSeek-V4 (Transformers 5.17.0 to 5.24.0, modeling_deepseek_v4) ---------------------------
# SwiGLU with clamped pre-activations (the shared experts' `DeepseekV4MLP` and the routed experts'
# `DeepseekV4Experts._apply_gate`): gate clamped to at most `limit`, up to [-limit, limit].
def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, act: Any = F.silu) -> torch.Tensor:
    """`act(gate.clamp(max=limit)) * up.clamp(-limit, limit)` (act: SiLU, or the module's `act_fn`)."""
    return act(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def swiglu_mlp_clamped(module: Any, x: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4's MLP: `down(silu(gate(x).clamp(max=L)) * up(x).clamp(-L, L))`, L = `module.limit`."""
    return module.down_proj(clamped_swiglu(module.gate_proj(x), module.up_proj(x), module.limit))


def moe_clamped(module: Any, hidden_states, top_k_index, top_k_weights):
    """DeepSeek-V4's experts: as `moe_standard` (`gate_up_proj [E, 2I, H]`, gate rows first), with the
    clamped SwiGLU (limit `module.limit`, activation `module.act_fn`, SiLU in the model)."""
    return _moe_experts(
        module,
        hidden_states,
        top_k_index,
        top_k_weights,
        lambda g, u: clamped_swiglu(g, u, module.limit, module.act_fn),
    )


def v4_unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`DeepseekV4UnweightedRMSNorm` as the mHC modules call it (`input_norm`): `rms_norm_unweighted_cast`
    (`x * rsqrt(mean(x^2) + eps).to(x.dtype)`, the rsqrt cast before the product)."""
    return rms_norm_unweighted_cast(x, None, eps)


def mhc_pre(module: Any, hidden_streams: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`DeepseekV4HyperConnection.forward`: from the streams `[B, S, N, D]` (N = `hc_mult`) the
    mixing weights, `post [B, S, N]` and the Sinkhorn-normalised `comb [B, S, N, N]` (fp32), and the
    block input `collapsed [B, S, D]` (the streams weighted by `pre`, in the streams' dtype).

    `module` has `hc_mult`, `hc_sinkhorn_iters`, `hc_eps`, `input_norm.eps`, `fn [(2 + N) N, N D]`,
    `base [(2 + N) N]`, `scale [3]`."""
    hc = module.hc_mult
    flat = v4_unweighted_rms_norm(hidden_streams.flatten(start_dim=2).float(), module.input_norm.eps)
    pre_w, post_w, comb_w = F.linear(flat, module.fn.float()).split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = module.base.split([hc, hc, hc * hc])
    pre_scale, post_scale, comb_scale = module.scale.unbind(0)
    pre = torch.sigmoid(pre_w * pre_scale + pre_b) + module.hc_eps
    post = 2 * torch.sigmoid(post_w * post_scale + post_b)
    comb = torch.softmax(comb_w.view(*comb_w.shape[:-1], hc, hc) * comb_scale + comb_b.view(hc, hc), dim=-1)
    comb = comb + module.hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + module.hc_eps)
    for _ in range(module.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + module.hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + module.hc_eps)
    collapsed = (pre.unsqueeze(-1) * hidden_streams).sum(dim=2).to(hidden_streams.dtype)
    return post, comb, collapsed


def mhc_post(post: torch.Tensor, comb: torch.Tensor, block_output: torch.Tensor, hidden_states: torch.Tensor):
    """The expansion after a block in `DeepseekV4DecoderLayer.forward`: `post * block_output + comb^T @
    streams`, with post/comb cast to the streams' dtype: `[B, S, N, D]`."""
    dtype = hidden_states.dtype
    return post.to(dtype).unsqueeze(-1) * block_output.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), hidden_states
    )


def mhc_head(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`DeepseekV4HyperHead.forward`: the streams `[B, S, N, D]` collapsed with sigmoid weights
    (`hc_fn [N, N D]`, `hc_base [N]`, `hc_scale [1]`, `eps`, `input_norm.eps`): `[B, S, D]`."""
    flat = v4_unweighted_rms_norm(x.flatten(2).float(), module.input_norm.eps)
    mixes = F.linear(flat, module.hc_fn.float())
    pre = torch.sigmoid(mixes * module.hc_scale.float() + module.hc_base.float()) + module.eps
    return (pre.unsqueeze(-1) * x).sum(dim=2).to(x.dtype)


def v4_indexer_keys(module: Any, hidden_states: torch.Tensor, past_key_values: Any, layer_idx: int) -> torch.Tensor:
    """The Lightning indexer's keys `[B, T, index_head_dim]` (`DeepseekV4Indexer.forward` up to the
    scores): every full window of `compress_rate` tokens pooled over the two overlapping series
    (the previous window's first half, this window's second half; softmax gates in fp32 with the
    position bias), normalised (`module.kv_norm`) and rotated at its first token's position. With a
    cache (`past_key_values.layers[layer_idx]`, a `DeepseekV4CSACache`) the leftover tokens, the last
    window's first series and the emitted keys are kept there, as upstream keeps them; without one the
    leftover tokens are dropped."""
    batch = hidden_states.shape[0]
    cache_layer = past_key_values.layers[layer_idx] if past_key_values is not None else None
    kv = module.kv_proj(hidden_states)
    gate = module.gate_proj(hidden_states)
    ratio, head_dim = module.compress_rate, module.head_dim
    if cache_layer is None:
        usable = (kv.shape[1] // ratio) * ratio
        chunk_kv, chunk_gate, first_window_position = kv[:, :usable], gate[:, :usable], 0
    else:
        chunk_kv, chunk_gate, first_window_position = cache_layer.store_compression_weights("indexer", kv, gate)
    if chunk_kv.shape[1] > 0:
        n_windows = chunk_kv.shape[1] // ratio
        chunk_kv = chunk_kv.view(batch, n_windows, ratio, -1)
        chunk_gate = chunk_gate.view(batch, n_windows, ratio, -1) + module.position_bias
        new_kv = chunk_kv.new_zeros((batch, n_windows, 2 * ratio, head_dim))
        new_gate = chunk_gate.new_full((batch, n_windows, 2 * ratio, head_dim), float("-inf"))
        new_kv[:, :, ratio:] = chunk_kv[..., head_dim:]
        new_gate[:, :, ratio:] = chunk_gate[..., head_dim:]
        if n_windows > 1:
            new_kv[:, 1:, :ratio] = chunk_kv[:, :-1, :, :head_dim]
            new_gate[:, 1:, :ratio] = chunk_gate[:, :-1, :, :head_dim]
        if cache_layer is not None:
            prior_kv, prior_gate = cache_layer.update_overlap_state("indexer", chunk_kv, chunk_gate, head_dim)
            if prior_kv is not None:
                new_kv[:, 0, :ratio] = prior_kv.to(new_kv.dtype)
                new_gate[:, 0, :ratio] = prior_gate.to(new_gate.dtype)
        compressed = module.kv_norm((new_kv * new_gate.softmax(dim=2, dtype=torch.float32).to(new_kv.dtype)).sum(dim=2))
        positions = torch.arange(n_windows, device=compressed.device) * ratio + first_window_position
        positions = positions.unsqueeze(0).expand(batch, -1)
        cos, sin = module.rotary_emb(compressed, position_ids=positions, layer_type=module.rope_layer_type)
        compressed = rotary_pos_emb_deepseek_v4(compressed.unsqueeze(1), cos, sin).squeeze(1)
    else:
        compressed = chunk_kv.new_zeros((batch, 0, head_dim))
    return compressed if cache_layer is None else cache_layer.update_compressor_states("indexer", compressed)


def v4_indexer_queries(module: Any, hidden_states: torch.Tensor, q_residual: torch.Tensor, position_ids):
    """The indexer's queries `[B, S, index_n_heads, index_head_dim]`: `q_b_proj(q_residual)` per head,
    rotated at the tokens' positions (the "compress" RoPE)."""
    batch, seq_len, _ = hidden_states.shape
    cos_q, sin_q = module.rotary_emb(hidden_states, position_ids=position_ids, layer_type=module.rope_layer_type)
    q = module.q_b_proj(q_residual).view(batch, seq_len, -1, module.head_dim).transpose(1, 2)
    return rotary_pos_emb_deepseek_v4(q, cos_q, sin_q).transpose(1, 2)


def v4_index_weights(module: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """The per-head weights of the scores, fp32 `[B, S, index_n_heads]`: `weights_proj(h) * H^-0.5`."""
    return module.scorer.weights_proj(hidden_states).float() * module.scorer.weights_scaling


def v4_index_scores(module: Any, q: torch.Tensor, keys: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """`DeepseekV4IndexerScorer`: fp32 `[B, S, T]`, `sum_h w[b,s,h] * relu(q[b,s,h] . k[b,t]) * D^-0.5`."""
    scores = torch.matmul(q.float(), keys.transpose(-1, -2).float().unsqueeze(1))  # [B, S, H, T]
    scores = F.relu(scores) * module.scorer.softmax_scale
    return (scores * v4_index_weights(module, hidden_states).unsqueeze(-1)).sum(dim=2)


def v4_index_topk(module: Any, index_scores: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The top-`index_topk` keys per query (int64 `[B, S, min(index_topk, T)]`) of fp32 scores `[B, S, T]`:
    a key whose window a query's position has not completed (`t >= (pos + 1) // compress_rate`) is never
    chosen before a valid one, and every such pick is -1."""
    compressed_len = index_scores.shape[-1]
    top_k = min(module.index_topk, compressed_len)
    if compressed_len == 0:
        return index_scores.topk(top_k, dim=-1).indices
    causal_threshold = (position_ids + 1) // module.compress_rate  # [B, S]
    entry_indices = torch.arange(compressed_len, device=index_scores.device)
    future_mask = entry_indices.view(1, 1, -1) >= causal_threshold.unsqueeze(-1)
    index_scores = index_scores.masked_fill(future_mask, float("-inf"))
    top_k_indices = index_scores.topk(top_k, dim=-1).indices
    invalid = top_k_indices >= causal_threshold.unsqueeze(-1)
    return torch.where(invalid, torch.full_like(top_k_indices, -1), top_k_indices)


def dsa_indexer_deepseek_v4(module: Any, hidden_states, q_residual, position_ids, past_key_values, layer_idx: int):
    """`DeepseekV4Indexer.forward`: the keys (`v4_indexer_keys`, which updates the cache as upstream
    does), the queries, the scores and the causal top-k: int64 `[B, S, min(index_topk, T)]`, -1 =
    no valid key. No gradient flows through it (its output is indices)."""
    keys = v4_indexer_keys(module, hidden_states, past_key_values, layer_idx)
    q = v4_indexer_queries(module, hidden_states, q_residual, position_ids)
    return v4_index_topk(module, v4_index_scores(module, q, keys, hidden_states), position_ids)


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
    """DeepSeek-V4's `eager_attention_forward` with K = V = `kv`: `query [B, H, S, D]` against the one
    shared head `kv [B, 1, T, D]`, the additive `attention_mask [B, 1, S, T]` (or None), a per-head sink
    logit `s_aux [H]` in the softmax whose probability is dropped; returns (`[B, S, H, D]`, the
    probabilities `[B, H, S, T]`). `sliding_window` is informational (the mask holds the window)."""
    batch, _, keys, dim = kv.shape
    key = kv[:, :, None].expand(batch, 1, query.shape[1], keys, dim).reshape(batch, query.shape[1], keys, dim)
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    sinks = s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
    combined_logits = torch.cat([attn_weights, sinks], dim=-1)
    combined_logits = combined_logits - combined_logits.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined_logits, dim=-1, dtype=combined_logits.dtype)
    scores = probs[..., :-1]
    attn_weights = F.dropout(scores, p=dropout, training=module.training).to(kv.dtype)
    attn_output = torch.matmul(attn_weights, key)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


# -- GLM-MoE-DSA (Transformers 5.17.0 to 5.24.0, modeling_glm_moe_dsa) ---------------------------
# DeepSeek sparse attention: the indexer scores every visible key with relu(q.k) weighted per head and
# keeps the top k; attention runs over those keys only. Written in the form a kernel computes them
# (per-key score sums; attention on the latents, kv_b_proj absorbed), not upstream's dense masks.
def dsa_index_scores(
    q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, scale: float, limit: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """fp32 `[B, S, T]`: `sum_h weights[b, s, h] * relu(q[b, s, h] . k[b, t]) * scale` for `q [B, S, H, D]`,
    `k [B, T, D]`, `weights [B, S, H]`; -inf where `t >= limit[b, s]` (`limit` int `[B, S]`, or None)."""
    dots = torch.einsum("bshd,btd->bsht", q.float(), k.float())
    scores = (F.relu(dots) * scale * weights.float().unsqueeze(-1)).sum(dim=2)
    if limit is not None:
        t = torch.arange(k.shape[1], device=k.device)
        scores = scores.masked_fill(t.view(1, 1, -1) >= limit.unsqueeze(-1), float("-inf"))
    return scores


def glm_indexer_inputs(module: Any, hidden_states, q_resid, position_embeddings, past_key_values=None):
    """`GlmMoeDsaIndexer`'s queries `[B, S, H, D]`, keys `[B, T, D]` and fp32 head weights `[B, S, H]`
    (`weights_proj(h) * H^-0.5`): the first `qk_rope_head_dim` features of q and k rotated by the
    interleaved RoPE, k layer-normed; with a cache the keys are appended to its indexer keys
    (`update_indexer`, as upstream) and all of them returned."""
    batch, seq_len, _ = hidden_states.shape
    cos, sin = position_embeddings
    rope = module.qk_rope_head_dim
    q = module.wq_b(q_resid).view(batch, seq_len, module.n_heads, module.head_dim)
    k = module.k_norm(module.wk(hidden_states)).unsqueeze(2)
    q_rot, k_rot = rotary_pos_emb_interleaved(q[..., :rope], k[..., :rope], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q[..., rope:]], dim=-1)
    k = torch.cat([k_rot, k[..., rope:]], dim=-1).squeeze(2)
    if past_key_values is not None:
        k = past_key_values.update_indexer(k, module.layer_idx)
    weights = module.weights_proj(hidden_states.to(module.weights_proj.weight.dtype)).float() * module.n_heads**-0.5
    return q, k, weights


def dsa_indexer_glm(
    module: Any, hidden_states, q_resid, position_embeddings, attention_mask, position_ids=None, past_key_values=None
) -> torch.Tensor:
    """`GlmMoeDsaIndexer.forward`: int32 `[B, S, min(index_topk, T)]`, the keys of the largest
    `dsa_index_scores` (scale `head_dim^-0.5`) with the mask `[B, S, T]` applied first (bool: False ->
    -inf; float: added). Keys the mask hides are picked only when fewer than k are visible (in no
    particular order: attention masks them again). No gradient (upstream runs under no_grad)."""
    with torch.no_grad():
        q, k, weights = glm_indexer_inputs(module, hidden_states, q_resid, position_embeddings, past_key_values)
        scores = dsa_index_scores(q, k, weights, module.softmax_scale)
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask.float()
        return scores.topk(min(module.index_topk, scores.shape[-1]), dim=-1).indices.to(torch.int32)


def glm_absorbed_weights(module: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """`kv_b_proj.weight [H * (nope + v), r]` split per head: `(W_uk [H, nope, r], W_uv [H, v, r])`,
    so that head h's key is `W_uk[h] @ k_pass` and its value `W_uv[h] @ k_pass`."""
    if module.kv_b_proj.bias is not None:
        raise ValueError("dsa_attention/glm: kv_b_proj has a bias, which the latent form does not fold in; use 'eager'")
    weight = module.kv_b_proj.weight.view(module.num_heads, module.qk_nope_head_dim + module.v_head_dim, -1)
    return weight[:, : module.qk_nope_head_dim], weight[:, module.qk_nope_head_dim :]


def dsa_attention_glm(
    module: Any, q_pass, q_rot, k_pass, k_rot, topk_indices, attention_mask, past_key_values=None, **kwargs
):
    """`GlmMoeDsaAttention`'s attention from the latents, in the absorbed (MQA) form: per head
    `q_lat = W_uk^T q_pass`, scores `(q_lat . k_pass[t] + q_rot . k_rot[t]) * scaling` over the
    selected keys `t` of `topk_indices [B, S, K]` (distinct per row) that the mask `[B, 1, S, T]` lets
    through (bool: True; float: added, its dtype's minimum hiding the key), softmax in fp32, `out = W_uv (sum_t p_t k_pass[t])`. Returns
    (`[B, S, H, v_head_dim]`, the probabilities `[B, H, S, T]` (zero off the selection) with eager
    attention, else None). A row that sees no key gives zeros. Refuses a cache (`past_key_values`:
    the expanded K/V of Transformers < 5.23) and attention dropout in training."""
    if past_key_values is not None:
        raise ValueError("reference.dsa_attention_glm: no cache of expanded K/V (Transformers < 5.23 generation)")
    if module.training and module.attention_dropout > 0:
        raise ValueError("reference.dsa_attention_glm: attention dropout in training is not computed")
    batch, heads, seq_len, _ = q_pass.shape
    w_uk, w_uv = glm_absorbed_weights(module)
    q_lat = torch.einsum("bhsn,hnr->bhsr", q_pass, w_uk)
    idx = topk_indices.long()  # [B, S, K]
    rows = torch.arange(batch, device=idx.device).view(-1, 1, 1)
    kv_sel, rot_sel = k_pass[:, 0][rows, idx], k_rot[:, 0][rows, idx]  # [B, S, K, r], [B, S, K, rope]
    scores = torch.einsum("bhsr,bskr->bhsk", q_lat, kv_sel) + torch.einsum("bhsd,bskd->bhsk", q_rot, rot_sel)
    scores = scores.float() * module.scaling
    mask = attention_mask[:, 0].gather(-1, idx).unsqueeze(1)  # [B, 1, S, K]
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:  # Transformers hides a key with the dtype's minimum; other values are added
        hidden = mask == torch.finfo(mask.dtype).min
        scores = (scores + mask.float()).masked_fill(hidden, float("-inf"))
    seen = torch.isfinite(scores).any(dim=-1, keepdim=True)
    probs = torch.where(seen, scores, 0.0).softmax(dim=-1) * seen
    probs = probs.masked_fill(~torch.isfinite(scores), 0.0)
    o_lat = torch.einsum("bhsk,bskr->bhsr", probs.to(k_pass.dtype), kv_sel)
    out = torch.einsum("bhsr,hvr->bshv", o_lat, w_uv)
    weights = None
    if module.config._attn_implementation == "eager":
        weights = probs.new_zeros(batch, heads, seq_len, k_pass.shape[2])
        weights = weights.scatter(-1, idx.unsqueeze(1).expand(-1, heads, -1, -1), probs).to(q_pass.dtype)
    return out, weights
