"""The committed example: generated/example/*.py (patchgen output of specs/example/*.yaml) over the
upstream `toyformers` package in examples/upstream. Importing this module puts both on sys.path,
which is what docs/runtime.md's quick start does."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _folder in (os.path.join(REPO, "examples", "upstream"), os.path.join(REPO, "generated", "example")):
    if _folder not in sys.path:
        sys.path.append(_folder)

TOY = "patched_modeling_toy_gpu"
TOY_MOE = "patched_modeling_toy_moe_gpu"


def toy_config(**kwargs):
    from toyformers.models.toy.configuration_toy import ToyConfig

    return ToyConfig(**kwargs)


def moe_config(**kwargs):
    from toyformers.models.toy_moe.configuration_toy_moe import ToyMoeConfig

    return ToyMoeConfig(**kwargs)
