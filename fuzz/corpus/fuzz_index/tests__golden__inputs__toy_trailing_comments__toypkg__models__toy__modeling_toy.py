# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
"""Trailing comments at the ends of bodies."""

import torch
from torch import nn


class ToyExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts  # experts per layer

    def forward(self, hidden_states, top_k_index, top_k_weights):
        """Mixes the experts' outputs."""
        # Experts are applied one by one.
        out = hidden_states * top_k_weights.sum(-1, keepdim=True)  # weighted
        if top_k_index is None:
            out = out * 0  # no routing
        return out  # [T, H]


class ToyHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, 2)  # start/end logits
