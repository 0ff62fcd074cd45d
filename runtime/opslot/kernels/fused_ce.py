"""Chunked fused linear + cross-entropy (impl "torch_chunked" of `cross_entropy_loss/causal`).

The eager path materialises `[tokens, vocab]` logits in the model dtype, again in fp32, and a third
time as their gradient: for 16k tokens and a 152k vocabulary that is ~25 GB. Here the tokens are
processed in chunks: each chunk's logits are computed (in the weight dtype, upcast to fp32 exactly
as eager does), turned into the loss and, in the same pass, into the gradients of the hidden states
and of the lm_head weight (accumulated in fp32). Backward only scales the stored gradients by the
incoming gradient. Peak extra memory is one chunk of fp32 logits plus the gradients themselves.
Full logits are never built, so the kernel returns `logits=None` whenever labels are given.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F

from .torch_ops import check_no_softcapping


def tokens_per_chunk(tokens: int, hidden: int, vocab: int) -> int:
    """Tokens per chunk: a power of two giving chunk logits about the size of the hidden states.
    (Not the CUDA kernel's `kernels.cuda.cross_entropy.default_chunk_size`, which sizes by a memory budget.)"""
    per = max(1, math.ceil(tokens / max(1, math.ceil(vocab / hidden))))
    return 1 << (per - 1).bit_length()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, bias, targets, ignore_index: int, divisor, chunk_size: int, fp32_weight_grad: bool
    ):
        # hidden [N, H], weight [V, H], bias [V] or None, targets [N]; loss = sum(CE) / divisor.
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if need_h else None
        acc_dtype = torch.float32 if fp32_weight_grad else weight.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        w_buf = None
        inv = 1.0 / divisor if not torch.is_tensor(divisor) else divisor.float().reciprocal().to(hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size]
            t = targets[start : start + chunk_size]
            logits = F.linear(h, weight, bias).float()
            valid = t != ignore_index
            safe_t = torch.where(valid, t, torch.zeros_like(t))
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, safe_t.unsqueeze(1)).squeeze(1)
            total = total + torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
            if need_h or need_w or need_b:
                grad = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the logits
                grad.scatter_add_(1, safe_t.unsqueeze(1), -valid.to(grad.dtype).unsqueeze(1))
                grad.mul_((valid.to(grad.dtype) * inv).unsqueeze(1))
                if need_b:
                    grad_b += grad.sum(0)
                g = grad.to(weight.dtype)  # eager's backward also rounds the logits' grad to this dtype
                if need_h:
                    grad_h[start : start + chunk_size] = g @ weight
                if need_w:
                    if grad_w.dtype == weight.dtype:  # fp32 weights, or accumulation in the weight dtype
                        grad_w.addmm_(g.t(), h)
                    else:  # low-precision product into one reused buffer, summed in fp32
                        w_buf = torch.mm(g.t(), h, out=w_buf) if w_buf is not None else torch.mm(g.t(), h)
                        grad_w += w_buf
                del grad, g
            del logits
        w_buf = None  # free before the final cast, which lowers the peak
        ctx.save_for_backward(
            grad_h if need_h else None,
            grad_w.to(weight.dtype) if need_w else None,
            grad_b.to(bias.dtype) if need_b else None,
        )
        return total * inv

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors

        def scale(g):
            return None if g is None else g * grad_out.to(g.dtype)

        return scale(grad_h), scale(grad_w), scale(grad_b), None, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    num_items_in_batch=None,
    chunk_size: Optional[int] = None,
    fp32_weight_grad: bool = True,
) -> torch.Tensor:
    """`cross_entropy(hidden @ weight.T + bias, targets)` (fp32 logits) without full logits: mean
    over non-ignored targets, or sum / `num_items_in_batch` when that is given (as HF does).
    `fp32_weight_grad=False` accumulates the weight gradient in the weight dtype: less memory and
    time, one rounding per chunk."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1).to(hidden.device)
    if num_items_in_batch is None:
        divisor = (targets != ignore_index).sum().float()
    else:
        divisor = num_items_in_batch
    if chunk_size is None:
        chunk_size = tokens_per_chunk(hidden.shape[0], hidden.shape[1], weight.shape[0])
    if not torch.is_grad_enabled():  # skip the gradient work entirely
        hidden, weight = hidden.detach(), weight.detach()
        bias = bias.detach() if bias is not None else None
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, ignore_index, divisor, chunk_size, fp32_weight_grad)


def cross_entropy_causal_chunked(
    module: Any,
    hidden_states: torch.Tensor,
    labels: Optional[torch.Tensor],
    num_items_in_batch=None,
    ignore_index: int = -100,
    shift_labels=None,
    chunk_size: Optional[int] = None,
    **kwargs,
):
    """`(logits, loss)` for a `*ForCausalLM`; with labels, `logits` is None and the loss comes from
    `chunked_linear_cross_entropy` over `module.lm_head` (HF shift and ignore_index semantics)."""
    check_no_softcapping(module)
    lm_head = module.lm_head
    if labels is None and shift_labels is None:
        return lm_head(hidden_states), None
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = chunked_linear_cross_entropy(
        hidden_states,
        lm_head.weight,
        lm_head.bias,
        shift_labels,
        ignore_index=ignore_index,
        num_items_in_batch=num_items_in_batch,
        chunk_size=chunk_size,
    )
    return None, loss
