# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
"""PyTorch Toy model."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from ...activations import ACT2FN
from ...integrations import use_kernel_forward_from_hub
from ...utils import auto_docstring, can_return_tuple
from .configuration_toy import ToyConfig


if TYPE_CHECKING:
    from ...cache_utils import Cache

try:
    from flash_attn import flash_attn_func, flash_attn_varlen_func
except ImportError:
    flash_attn_func = flash_attn_varlen_func = None


class ToyRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
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


class ToyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@auto_docstring
class ToyModel(nn.Module):
    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.norm = ToyRMSNorm(config.hidden_size)  # final norm

    @can_return_tuple
    @auto_docstring
    def forward(self, hidden_states):
        # The final norm only; layers are elided in this fixture.
        return self.norm(hidden_states)


class ToyForTokenClassification(ToyModel):
    pass


class ToyForQuestionAnswering(ToyModel): ...


__all__ = ["ToyModel", "ToyForTokenClassification", "ToyForQuestionAnswering"]
