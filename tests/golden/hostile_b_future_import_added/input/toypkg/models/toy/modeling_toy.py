# Copyright 2026 The Toy Authors. All rights reserved.
"""Toy model for hostile-input cases."""

from __future__ import annotations

import torch
from torch import nn


def helper_fn(x, scale=1.0):
    return x * scale


def unused_fn(x):
    return x


class ToyBase(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config


class ToyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.scale = config.scale

    def forward(self, hidden_states):
        hidden_states = hidden_states * self.scale
        hidden_states = hidden_states * self.scale
        for i in range(3):
            hidden_states = hidden_states + i
        return hidden_states


class ToyMLP(nn.Module):
    def __init__(self, config):
        self.size = config.size
        return


class ToyNorm(nn.Module):
    def __init__(self, config):
        self.eps = config.eps
        return None


class ToyEarly(nn.Module):
    def __init__(self, config):
        if config is None:
            return
        self.eps = config.eps


__all__ = ["ToyAttention", "ToyMLP"]
__all__ += ["unused_fn", "helper_fn"]
__all__ += ["ToyNorm"]
