# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License").
import torch
from torch import nn


def rms_norm(hidden_states, weight, norm_slot=None):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return hidden_states * torch.rsqrt(variance + 1e-6) * weight


def rotate(x):
    rope_slot = x.shape[-1] // 2
    return torch.cat((-x[..., rope_slot:], x[..., :rope_slot]), dim=-1)


class ToyExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.moe_slot = config.num_experts
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x):
        return self.proj(x)


__all__ = ["ToyExperts", "rms_norm", "rotate"]
