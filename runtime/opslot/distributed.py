"""Distributed training of generated models: expert parallelism for the `moe` slot, FSDP2 and sequence
parallelism. The public names; the code is in expert_parallel.py (EP and FSDP2), sequence_parallel.py
(Ulysses) and collectives.py (what both use), which import each other one way.

    import opslot.distributed as od
    meshes = od.init_meshes("cuda", ep=2)                  # dp (all ranks), ep, expert_dp
    model = opslot.build_model(config, ops, module=..., model_class=...)
    od.shard_experts(model, meshes.ep)                     # each rank keeps num_experts / ep experts
    od.fully_shard_model(model, meshes)                    # FSDP2 per decoder layer, experts apart

`shard_experts` turns every experts module of the model (the module a `moe` slot guards: a
`num_experts` attribute and parameters whose first dimension is that number) into an expert-parallel
one: its parameters keep only this rank's contiguous block of experts, and its forward

1. sorts the (token, k) assignments by global expert and counts them per expert, on the device;
2. exchanges the counts with `all_to_all_single` (device tensors);
3. exchanges the token rows with `all_to_all_single` (autograd: the backward is the reverse exchange);
4. runs the received rows through the experts module's own forward with the local experts (the
   bound moe kernel: `torch`, `cuda`, ...; or upstream's code when the slot is eager), one expert
   per row and weight 1;
5. sends the results back the same way and combines them per token, weighted by the routing
   weights, as a sum over k in fp32 (deterministic: no atomics).

Host syncs. `all_to_all_single` with variable split sizes needs the sizes on the host, so the default
mode (`mode="splits"`) reads them once per layer forward (one `.tolist()` of 2·ep integers, which
waits for the GPU work queued before it); the backward reuses them and reads nothing. `mode="padded"`
reads no device data on the host: every rank sends `tokens·top_k` rows (or a given capacity) to every
rank (the most that can go to one rank), padded with upstream's masking index (rows the kernels skip),
so the exchanges carry ep times the rows; every rank must send the same number of rows (a fixed batch
shape, or `capacity`), and it needs a moe kernel that honours the masking index (`torch`, `cuda`).

Preconditions are agreed before a collective, never checked on one rank alone (a rank that refuses
alone leaves the others hanging in the exchange, and unequal exchange sizes abort gloo): `init_meshes`
gathers every rank's `ep`, `shard_experts` every rank's refusal and plan (mode, capacity, experts), and
padded mode, per layer forward, every rank's tokens and top_k (host integers: an all_gather of a CPU
tensor where the EP group has a CPU backend, gloo or "cpu:gloo,cuda:nccl", which waits for no GPU
work; on an NCCL-only group a device all_gather and a host read of 2·ep integers). A bad input on any
rank is then the same ValueError, naming every rank's values, on every rank.

Gradients. Each expert receives rows from every rank, so its gradient is the sum over every rank's
loss. Under data parallelism each rank's loss is a mean over its own batch and FSDP averages the other
gradients over the ranks; `fully_shard_model` therefore shards each experts module over the
`expert_dp` mesh (ranks that hold the same experts) and divides its gradient by the whole data-parallel
size (`set_gradient_divide_factor`), so that every parameter gets the gradient of the mean loss.

torch.compile: the expert-parallel forward is excluded from compilation (`torch.compiler.disable`:
collectives with split sizes read on the host), so a compiled decoder layer breaks its graph there and
runs the exchange and the local experts eagerly; the rest of the layer is compiled.
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
