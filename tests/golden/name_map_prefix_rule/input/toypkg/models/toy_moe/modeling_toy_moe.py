# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
"""PyTorch Toy model (guard fixtures)."""

import torch
from torch import nn

from ...activations import ACT2FN
from ...modeling_outputs import CausalLMOutputWithPast
from ...utils import auto_docstring, can_return_tuple


class ToyMoeRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def rotate_half(x):
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Applies Rotary Position Embedding to the query and key tensors.

    Returns:
        `tuple(torch.Tensor)` comprising of the query and key tensors rotated using the Rotary Position Embedding.
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class ToyMoeExperts(nn.Module):
    """Collection of expert weights stored as 3D tensors."""

    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * config.moe_intermediate_size, config.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, config.hidden_size, config.moe_intermediate_size))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final_hidden_states = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
            gate, up = nn.functional.linear(hidden_states[token_idx], self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
            current = nn.functional.linear(self.act_fn(gate) * up, self.down_proj[expert_idx])
            final_hidden_states.index_add_(0, token_idx, current * top_k_weights[token_idx, top_k_pos, None])
        return final_hidden_states


def load_balancing_loss_func(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    r"""
    Computes auxiliary load balancing loss as in Switch Transformer.
    """
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    routing_weights = torch.nn.functional.softmax(torch.cat(gate_logits, dim=0), dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


class ToyMoeAttention(nn.Module):
    class KVCache:
        """Per-layer key/value cache."""

        def update(self, key_states, value_states):
            # Append along the sequence dimension.
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            return self.keys, self.values

    def __init__(self, config):
        super().__init__()
        self.config = config


@auto_docstring
class ToyMoeForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = nn.Identity()
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @can_return_tuple
    @auto_docstring
    def forward(self, hidden_states, labels=None, output_router_logits=False, router_logits=None, logits_to_keep=0, **kwargs):
        r"""
        labels (`torch.LongTensor`, *optional*): Labels for computing the language modeling loss.
        """
        hidden_states = self.model(hidden_states)
        # Only compute necessary logits, and do not upcast them to float if we are not computing the loss
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, slice_indices, :])

        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config.vocab_size, **kwargs)

        aux_loss = None
        if output_router_logits:
            aux_loss = load_balancing_loss_func(
                router_logits,
                self.config.num_experts,
                self.config.num_experts_per_tok,
            )
            if labels is not None:
                loss += self.config.router_aux_loss_coef * aux_loss

        return CausalLMOutputWithPast(loss=loss, logits=logits)


__all__ = ["ToyMoeForCausalLM"]
