"""Distributed training of generated models: expert parallelism for the `moe` slot, FSDP2 and sequence
parallelism. The public names; the code is in expert_parallel.py (EP and FSDP2: how the exchange,
the gradients and the agreed preconditions work), sequence_parallel.py (Ulysses) and collectives.py
(what both use), which import each other one way.

    import opslot.distributed as od
    meshes = od.init_meshes("cuda", ep=2)                  # dp (all ranks), ep, expert_dp
    model = opslot.build_model(config, ops, module=..., model_class=...)
    od.shard_experts(model, meshes.ep)                     # each rank keeps num_experts / ep experts
    od.fully_shard_model(model, meshes)                    # FSDP2 per decoder layer, experts apart

    par = od.parallelize(model, sp=2)                      # sequence parallelism (+ FSDP2, EP)
    batch = od.shard_batch(global_batch, par.sp)
"""

from __future__ import annotations

from .collectives import all_to_all
from .expert_parallel import (
    MODES,
    EPState,
    Meshes,
    decoder_layers,
    experts_modules,
    full_state_dict,
    fully_shard_model,
    init_meshes,
    is_experts_module,
    moe_slot_of,
    shard_experts,
)
from .sequence_parallel import Parallel, average_gradients, init_sp_mesh, parallelize, sequence_parallel, shard_batch

__all__ = [
    "Meshes",
    "init_meshes",
    "shard_experts",
    "all_to_all",
    "fully_shard_model",
    "full_state_dict",
    "decoder_layers",
    "experts_modules",
    "is_experts_module",
    "moe_slot_of",
    "EPState",
    "MODES",
    "Parallel",
    "average_gradients",
    "init_sp_mesh",
    "parallelize",
    "sequence_parallel",
    "shard_batch",
]
