# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License").
import torch
from torch import nn


def _fast_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def gelu(x):
    return nn.functional.gelu(x)


gelu = _fast_gelu


__all__ = ["gelu"]
