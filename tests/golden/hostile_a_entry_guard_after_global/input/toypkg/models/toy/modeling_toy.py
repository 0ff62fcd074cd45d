# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License").
import torch

_CACHE = {}


def cached_rope(x):
    """Multiplies by a cached ramp."""
    global _CACHE
    key = x.shape[-1]
    if key not in _CACHE:
        _CACHE[key] = torch.arange(key)
    return x * _CACHE[key]


__all__ = ["cached_rope"]
