# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License").
import typing

import torch
from torch import nn


@typing.overload
def shift(x: int) -> int: ...
@typing.overload
def shift(x: torch.Tensor) -> torch.Tensor: ...
def shift(x):
    return x + 1


class ToyNorm(nn.Module):
    @typing.overload
    def forward(self, x: int) -> int: ...

    @typing.overload
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    def forward(self, x):
        return x / 2


class ToyMLP(nn.Module):
    @typing.overload
    def forward(self, x: int) -> int: ...

    @typing.overload
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    def forward(self, x):
        y = x * 3
        return y


__all__ = ["ToyMLP", "ToyNorm", "shift"]
