# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License").
import torch
from torch import nn

_CACHE = {}


def chunks(x, size):
    for start in range(0, x.shape[0], size):
        yield x[start : start + size]


async def stream(x):
    for row in x:
        yield row * 2


def cached_rope(x):
    key = x.shape[-1]
    global _CACHE
    if key not in _CACHE:
        _CACHE[key] = torch.arange(key)
    return x * _CACHE[key]


class ToyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x):
        return self.proj(x)


__all__ = ["ToyMLP", "cached_rope", "chunks", "stream"]
