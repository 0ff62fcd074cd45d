"""The Switch-Transformer load-balancing loss over the tuple of per-layer router logits, on
libopslot_kernels: the layers are never concatenated (their pointers go to the kernel by value).

Custom ops `opslot::load_balancing_loss_fwd` (loss and the per-expert coefficients the backward
needs) and `opslot::load_balancing_loss_bwd` (the gradient of every layer's logits). The top-k
selection counts are not differentiated, as upstream.
"""

from __future__ import annotations

import ctypes
from typing import List, Optional, Tuple

import torch

from . import _lib, _ops_common as C

C.require_library_on_cuda_machines()


def _check(logits: List[torch.Tensor], mask: Optional[torch.Tensor], num_experts: int, top_k: int) -> None:
    if not logits:
        raise ValueError("load_balancing_loss: no router logits")
    first = logits[0]
    C.check_float(first, "load_balancing_loss")
    for t in logits:
        if t.dim() != 2 or t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(
                "load_balancing_loss (cuda): every layer's router logits must be [tokens, experts] of "
                f"one shape, dtype and device; got {[(tuple(x.shape), x.dtype) for x in logits][:4]}"
            )
    if first.shape[1] != num_experts:
        raise ValueError(f"load_balancing_loss: logits have {first.shape[1]} experts, num_experts is {num_experts}")
    if not 0 < num_experts <= 512:
        raise ValueError(f"load_balancing_loss (cuda): {num_experts} experts; the kernel takes 1 to 512")
    if not 0 <= top_k <= num_experts:
        raise ValueError(f"load_balancing_loss: top_k {top_k} with {num_experts} experts")
    if mask is not None and (mask.dim() != 1 or mask.shape[0] != first.shape[0] or mask.dtype != torch.float32):
        raise ValueError(
            f"load_balancing_loss: the flattened attention mask has {mask.numel()} entries for "
            f"{first.shape[0]} rows of router logits"
        )


def _pointers(ts: List[torch.Tensor]):
    return (ctypes.c_void_p * len(ts))(*[t.data_ptr() if t.numel() else None for t in ts])


def _strides(ts: List[torch.Tensor]):
    return (ctypes.c_int64 * len(ts))(*[t.stride(0) if t.shape[0] > 1 else t.shape[1] for t in ts])


def _rows_ready(logits: List[torch.Tensor]) -> List[torch.Tensor]:
    return [t if t.shape[1] <= 1 or t.stride(1) == 1 else t.contiguous() for t in logits]


@torch.library.custom_op("opslot::load_balancing_loss_fwd", mutates_args=())
def load_balancing_loss_fwd(
    logits: List[torch.Tensor], mask: Optional[torch.Tensor], num_experts: int, top_k: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss, coef): the fp32 scalar loss and E * count_e / R^2 per expert (for the backward)."""
    _check(logits, mask, num_experts, top_k)
    first = logits[0]
    C.prepare(first)
    logits = _rows_ready(logits)
    rows = first.shape[0]
    n = C.raw("opslot_load_balancing_scratch_floats", _lib.I64, [_lib.I32, _lib.I64, _lib.I32])(
        len(logits), rows, num_experts
    )
    if n < 0:
        raise RuntimeError(f"opslot cuda kernel load_balancing: {C.last_error()}")
    scratch = torch.empty(max(n, 1), dtype=torch.float32, device=first.device)
    loss = torch.empty((), dtype=torch.float32, device=first.device)
    coef = torch.empty(num_experts, dtype=torch.float32, device=first.device)
    m = mask.contiguous() if mask is not None else None
    ptrs, strides = _pointers(logits), _strides(logits)  # kept alive across the call
    C.fn(
        "opslot_load_balancing_fwd",
        [
            _lib.I32,
            _lib.I32,
            ctypes.c_void_p,
            ctypes.c_void_p,
            _lib.I64,
            _lib.I32,
            _lib.I32,
            _lib.PTR,
            _lib.PTR,
            _lib.PTR,
            _lib.PTR,
            _lib.PTR,
        ],
    )(
        _lib.DTYPE_CODES[first.dtype],
        len(logits),
        ctypes.addressof(ptrs),
        ctypes.addressof(strides),
        rows,
        num_experts,
        top_k,
        m.data_ptr() if m is not None and m.numel() else None,
        scratch.data_ptr(),
        loss.data_ptr(),
        coef.data_ptr(),
        C.stream(first),
    )
    return loss, coef


@load_balancing_loss_fwd.register_fake
def _lb_fwd_fake(logits, mask, num_experts, top_k):
    _check(logits, mask, num_experts, top_k)
    first = logits[0]
    return first.new_empty((), dtype=torch.float32), first.new_empty((num_experts,), dtype=torch.float32)


@torch.library.custom_op("opslot::load_balancing_loss_bwd", mutates_args=())
def load_balancing_loss_bwd(
    grad: torch.Tensor, logits: List[torch.Tensor], mask: Optional[torch.Tensor], coef: torch.Tensor
) -> torch.Tensor:
    """The gradient of every layer's logits, stacked: [layers, rows, experts] in the logits' dtype."""
    first = logits[0]
    C.prepare(first)
    logits = _rows_ready(logits)
    rows, experts = first.shape
    out = torch.empty((len(logits), rows, experts), dtype=first.dtype, device=first.device)
    base, step = out.data_ptr(), rows * experts * out.element_size()
    outs = (ctypes.c_void_p * len(logits))(*[base + i * step if out.numel() else None for i in range(len(logits))])
    g = grad.to(device=first.device, dtype=torch.float32).reshape(1).contiguous()
    c = coef.contiguous()
    m = mask.contiguous() if mask is not None else None
    ptrs, strides = _pointers(logits), _strides(logits)  # kept alive across the call
    C.fn(
        "opslot_load_balancing_bwd",
        [
            _lib.I32,
            _lib.I32,
            ctypes.c_void_p,
            ctypes.c_void_p,
            _lib.I64,
            _lib.I32,
            _lib.PTR,
            _lib.PTR,
            _lib.PTR,
            ctypes.c_void_p,
            _lib.PTR,
        ],
    )(
        _lib.DTYPE_CODES[first.dtype],
        len(logits),
        ctypes.addressof(ptrs),
        ctypes.addressof(strides),
        rows,
        experts,
        m.data_ptr() if m is not None and m.numel() else None,
        c.data_ptr(),
        g.data_ptr(),
        ctypes.addressof(outs),
        C.stream(first),
    )
    return out


@load_balancing_loss_bwd.register_fake
def _lb_bwd_fake(grad, logits, mask, coef):
    first = logits[0]
    return first.new_empty((len(logits),) + tuple(first.shape))


def _setup_context(ctx, inputs, output):
    logits, mask, num_experts, top_k = inputs
    _, coef = output
    ctx.save_for_backward(mask, coef, *logits)
    ctx.mark_non_differentiable(coef)
    # coef never has a gradient: without this, autograd fills a zero tensor for it on every backward
    # (a fill kernel per call); a missing loss gradient is handled in _backward.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, _grad_coef):
    mask, coef, *logits = ctx.saved_tensors
    if grad_loss is None:
        return None, None, None, None
    grads = torch.ops.opslot.load_balancing_loss_bwd(grad_loss, list(logits), mask, coef)
    return list(grads.unbind(0)), None, None, None


load_balancing_loss_fwd.register_autograd(_backward, setup_context=_setup_context)


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
    loss, _ = torch.ops.opslot.load_balancing_loss_fwd(logits, mask, int(num_experts), int(top_k))
    return loss
