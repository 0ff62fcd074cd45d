"""The Switch-Transformer load-balancing loss over the tuple of per-layer router logits, on
libopslot_kernels: the layers are never concatenated (their pointers go to the kernel by value).

Torch ops `opslot::load_balancing_loss_fwd` (loss and the per-expert coefficients the backward
needs) and `opslot::load_balancing_loss_bwd` (the gradient of every layer's logits), registered
from C++ (kernels/torch/load_balancing.cc). The top-k selection counts are not differentiated, as
upstream.
"""

from __future__ import annotations

import torch

from . import _ops_common as C

C.require_library_on_cuda_machines()
_FWD = C.torch_op("load_balancing_loss_fwd")  # (loss, coef); its backward calls ..._bwd


def load_balancing_loss(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """Switch-Transformer auxiliary loss (Qwen3-MoE's load_balancing_loss_func); `0` when
    `gate_logits` is None or not a tuple, as upstream."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    device = gate_logits[0].device
    experts = gate_logits[0].shape[-1]
    if num_experts is None:
        num_experts = experts
    logits = [g if g.dim() == 2 and g.device == device else g.to(device).reshape(-1, experts) for g in gate_logits]
    mask = None
    if attention_mask is not None:
        mask = attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
    loss, _ = _FWD(logits, mask, num_experts, top_k)
    return loss
