# Copyright 2026 The patchgen authors. Toy upstream for contract-pin tests.
"""Toy model for contract pins."""

import torch
from torch import nn

from ...utils import can_return_tuple, old_helper


class ToyRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        """Root-mean-square normalisation of the last dimension."""
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class ToyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.scale = config.head_dim**-0.5

    def forward(self, hidden_states, attention_mask=None):
        return hidden_states * self.scale


class ToyForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @can_return_tuple
    def forward(self, hidden_states, labels=None, logits_to_keep=0):
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden_states = hidden_states[:, slice_indices, :]
        logits = self.output_head(hidden_states)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return logits, loss


__all__ = ["ToyRMSNorm", "ToyAttention", "ToyForCausalLM"]
