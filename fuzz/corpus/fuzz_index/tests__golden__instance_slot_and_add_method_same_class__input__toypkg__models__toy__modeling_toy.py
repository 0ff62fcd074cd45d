# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
"""A class whose __init__ comes last."""

import torch
from torch import nn


class ToyGate(nn.Module):
    def forward(self, x):
        return x * self.weight

    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(config.hidden_size))
