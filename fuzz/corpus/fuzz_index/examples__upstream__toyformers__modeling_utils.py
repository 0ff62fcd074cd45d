# Copyright 2026 The patchgen authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Base class of the models: config handling, weight init, and the loss function."""

import torch
from torch import nn

from .loss_utils import ForCausalLMLoss


class PreTrainedModel(nn.Module):
    """A module built from a config; `post_init()` initialises the weights deterministically."""

    config_class = None
    base_model_prefix = "model"

    def __init__(self, config, *inputs, **kwargs):
        super().__init__()
        self.config = config

    def _init_weights(self, module):
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=std)

    def post_init(self):
        self.apply(self._init_weights)

    @property
    def loss_function(self):
        return ForCausalLMLoss

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype
