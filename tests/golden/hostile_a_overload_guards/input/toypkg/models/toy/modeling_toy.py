# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License").
from typing import overload

import torch
from torch import nn


@overload
def scale(x: int) -> int: ...
@overload
def scale(x: torch.Tensor) -> torch.Tensor: ...
def scale(x):
    """Doubles x."""
    return x * 2


class ToyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    @overload
    def forward(self, x: int) -> int: ...

    @overload
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    def forward(self, x):
        y = self.proj(x)
        return y


__all__ = ["ToyMLP", "scale"]
