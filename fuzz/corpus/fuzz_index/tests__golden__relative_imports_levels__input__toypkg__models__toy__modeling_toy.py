# Copyright 2026 The Toy Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
"""Relative imports of every level."""

from . import configuration_toy
from .configuration_toy import ToyConfig
from ..llama.modeling_llama import LlamaMLP as ToyMLP
from ... import initialization as init
from ...utils import (
    auto_docstring,
    can_return_tuple,  # used by forward
)
from ...utils.generic import check_model_inputs


def build(config: ToyConfig):
    def local_import():
        from ...activations import ACT2FN

        return ACT2FN

    return ToyMLP(config), init, configuration_toy, local_import, auto_docstring, can_return_tuple, check_model_inputs
