"""fp32 references: the upstream eager mathematics of every op in docs/ops.md, written by us.

These are the executable form of the op contracts. Tests run them on fp32 copies of the inputs and
compare every kernel's outputs and gradients against them. They follow the upstream code line for
line (Transformers 5.17.0: Llama/Qwen3/Gemma3/Qwen3.5 norms and RoPE, DeepSeek-V3's interleaved RoPE,
the VL vision towers' RoPE, `loss_utils`, Qwen3-MoE and GPT-OSS experts, Qwen3.5 gated-delta-net
helpers); none of them is meant to be fast.
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
def moe_standard(module: Any, hidden_states, top_k_index, top_k_weights):
    """Qwen3-MoE experts: per hit expert, `down(act(gate) * up) * weight`, index-added."""
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = F.one_hot(top_k_index, num_classes=module.num_experts + 1)[..., : module.num_experts]
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        e = expert_idx[0]
        top_k_pos, token_idx = torch.where(expert_mask[e])
        gate, up = F.linear(hidden_states[token_idx], module.gate_up_proj[e]).chunk(2, dim=-1)
        current = F.linear(module.act_fn(gate) * up, module.down_proj[e])
        current = current * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, current.to(final.dtype))
    return final


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
