"""`cuda` implementations of `cross_entropy_loss/causal` and `cross_entropy_loss/sequence_classification`.

Causal LM (`cross_entropy_causal`): the lm_head and the loss without full logits. Tokens are taken
in chunks; per chunk
  1. one cuBLAS GEMM writes the chunk's logits `[C, V]` in the weight dtype (as upstream's lm_head),
  2. one CUDA kernel (`opslot_ce_rows`) reads each row for its logsumexp (fp32, as upstream's
     `.float()` loss), writes the row's loss, and overwrites the row with its gradient
     `(softmax - onehot) / divisor` in the logits dtype (where upstream's backward rounds it too),
  3. when gradients are needed, two GEMMs: `grad_hidden[chunk] = dlogits @ W` straight into its
     slice of the output, and `grad_weight += dlogits^T @ h` (cuBLAS beta=1: fp32 inside the GEMM,
     the running sum rounded to the weight dtype once per chunk, see docs/kernels.md).
The loss's upstream gradient is a scalar, so the gradients are made in the forward and backward
only scales them in place (`opslot_ce_scale_inplace`): three GEMMs in all, never a fourth. A
forward without autograd (no_grad, or no input requiring grad) runs steps 1-2 only, without a
gradient write.

Extra memory is one logits tile (`chunk x V` in the weight dtype; the chunk comes from
`CHUNK_BUDGET_BYTES`) plus fp32 row losses, besides the gradients themselves.

Semantics are HF's `ForCausalLMLoss`: labels shifted left by one (or `shift_labels` as given),
`ignore_index`, sum / `num_items_in_batch` (int or tensor) or the mean over counted tokens. One
deliberate difference: when every label is ignored, the mean is 0 here (upstream: 0/0 = NaN loss,
zero gradients); with `num_items_in_batch` the loss is `0 / num_items_in_batch` as upstream.
A target outside `[0, vocab)` gives a NaN loss (upstream: a device-side assert).
Refused with a clear error: `final_logit_softcapping`, an lm_head with a bias, a hidden/weight
dtype mismatch (e.g. autocast), `config.vocab_size != lm_head.weight.shape[0]`.

Sequence classification (`cross_entropy_sequence_classification`): the single-label loss on given
logits runs `opslot_ce_rows` (fp32 math, loss returned in the logits dtype as upstream's
`F.cross_entropy`); the gradient is written in the forward into its own buffer (the caller's
logits are returned to the user, so they are not overwritten) and scaled in place in backward.
Regression and multi-label losses use the reference math (`opslot.reference`): they are an MSE /
BCE over `[batch, num_labels]`, nothing to fuse.

The ops (`opslot::ce_linear_fwd`, `opslot::ce_logits_fwd`, `opslot::ce_scale_`, and
`opslot::ce_rows`, the launch of `opslot_ce_rows`) are registered from C++ with their Meta and
Autograd kernels (kernels/torch/cross_entropy.cc): the chunk loop, the reductions and the backward's
in-place scaling run there; no op reads device data on the host. Kept in Python: the CPU kernels of
the two launches (`ce_rows`, `ce_scale_`), which call `_backend`: CPU tests replace it with a torch
emulation to run the C++ ops' chunking, reductions and autograd without a GPU (on CPU tensors the
real backend raises KernelLibraryError).
"""

import math
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from ... import reference
from ..torch_ops import check_no_softcapping
from . import _lib, _ops_common as C

#: Bytes one logits tile may take (the chunk's logits and, in place, their gradient). With the
#: fp32 row losses and cuBLAS' workspace this keeps the extra peak under 1 GiB.
CHUNK_BUDGET_BYTES = 960 << 20
#: Chunks are multiples of this many tokens when the budget allows (cuBLAS' 128x256 output tiles
#: then fill whole waves of the dgrad GEMM [chunk, H] on 132 SMs), else of CHUNK_MULTIPLE.
CHUNK_STEP = 1024
CHUNK_MULTIPLE = 128

_MODE_MEAN, _MODE_VALUE, _MODE_TENSOR = 0, 1, 2


def default_chunk_size(tokens: int, vocab: int, itemsize: int, budget: int = CHUNK_BUDGET_BYTES) -> int:
    """Tokens per chunk: the largest multiple of CHUNK_STEP (or CHUNK_MULTIPLE for huge rows) whose
    `[chunk, vocab]` tile fits in `budget`, then evened out over the chunks `tokens` needs."""
    cap = budget // max(1, vocab * itemsize)
    step = CHUNK_STEP if cap >= CHUNK_STEP else CHUNK_MULTIPLE
    cap = max(CHUNK_MULTIPLE, cap // step * step)
    if tokens <= cap:
        return max(1, tokens)
    chunks = math.ceil(tokens / cap)
    even = math.ceil(math.ceil(tokens / chunks) / step) * step
    return min(cap, even)


# -- kernel launches ------------------------------------------------------------------------------
class _CudaBackend:
    """The two kernel launches, `opslot::ce_rows` and `opslot::ce_scale_` (C++, CUDA tensors)."""

    def check(self, t: torch.Tensor) -> None:
        _lib.check_device(t.device)

    def rows(
        self,
        logits: torch.Tensor,
        grad: Optional[torch.Tensor],
        targets: torch.Tensor,
        ignore_index: int,
        grad_scale: Optional[torch.Tensor],
        row_loss: torch.Tensor,
    ) -> None:
        _ROWS(logits, grad, targets, int(ignore_index), grad_scale, row_loss)

    def scale_(self, x: torch.Tensor, factor: torch.Tensor) -> None:
        _SCALE(x, factor)


#: What the CPU kernels of the launches call. Tests swap in an emulation to run the ops without a GPU.
_backend: Any = _CudaBackend()


def _rows_cpu(logits, grad, targets, ignore_index, grad_scale, row_loss) -> None:
    _backend.check(logits)
    _backend.rows(logits, grad, targets, ignore_index, grad_scale, row_loss)


def _scale_cpu(x: torch.Tensor, factor: torch.Tensor) -> None:
    """x *= factor (a one-element tensor), in place, fp32 math (the C++ CUDA kernel's checks)."""
    if x.numel() == 0:
        return
    _backend.check(x)
    if not x.is_contiguous():
        raise ValueError("opslot::ce_scale_ scales contiguous tensors")
    _backend.scale_(x, factor.to(device=x.device, dtype=torch.float32).reshape(()).contiguous())


C.require_library_on_cuda_machines()
_LINEAR = C.torch_op("ce_linear_fwd")  # (loss, grad_hidden, grad_weight); backward scales the grads
_LOGITS = C.torch_op("ce_logits_fwd")  # (loss, grad_logits)
_ROWS = C.torch_op("ce_rows")
_SCALE = C.torch_op("ce_scale_")
C.cpu_kernel("ce_rows", _rows_cpu)
C.cpu_kernel("ce_scale_", _scale_cpu)


# -- causal LM: fused lm_head + loss --------------------------------------------------------------
def _reduction_args(num_items_in_batch, device: torch.device) -> Tuple[Optional[torch.Tensor], float, int]:
    if num_items_in_batch is None:
        return None, 0.0, _MODE_MEAN
    if torch.is_tensor(num_items_in_batch):  # moved to the device as upstream does (`.to(loss.device)`)
        return num_items_in_batch.to(device), 0.0, _MODE_TENSOR
    return None, float(num_items_in_batch), _MODE_VALUE


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    num_items_in_batch=None,
    chunk_size: Optional[int] = None,
) -> torch.Tensor:
    """fp32 `cross_entropy(hidden @ weight.T, targets)` without full logits: mean over targets !=
    ignore_index (0 when there are none), or sum / `num_items_in_batch` when given (HF semantics).
    `hidden [..., H]` and `weight [V, H]` share a dtype (fp32, fp16 or bf16); `targets` has one
    entry per row of `hidden`."""
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: hidden {tuple(hidden.shape)} does not match weight {tuple(weight.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise ValueError(
            f"linear_cross_entropy: hidden is {hidden.dtype} but the lm_head weight is {weight.dtype} "
            "(autocast is not supported by this kernel; cast the model or use 'torch')"
        )
    if hidden.dtype not in _lib.DTYPE_CODES:
        raise TypeError(f"linear_cross_entropy takes float32, float16 or bfloat16, got {hidden.dtype}")
    if not torch.compiler.is_compiling():  # early, clear error; the op checks again when it runs
        _backend.check(hidden)
    h2 = hidden.reshape(-1, hidden.shape[-1])
    if not h2.is_contiguous():
        h2 = h2.contiguous()
    w = weight if weight.is_contiguous() else weight.contiguous()
    t = targets.reshape(-1).to(device=h2.device, dtype=torch.int64)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() != h2.shape[0]:
        raise ValueError(f"linear_cross_entropy: {h2.shape[0]} tokens but {t.numel()} labels")
    if chunk_size is None:
        chunk_size = default_chunk_size(h2.shape[0], w.shape[0], w.element_size())
    grad_enabled = torch.is_grad_enabled()
    divisor, value, mode = _reduction_args(num_items_in_batch, h2.device)
    loss, _, _ = _LINEAR(
        h2,
        w,
        t,
        divisor,
        value,
        mode,
        int(ignore_index),
        int(chunk_size),
        grad_enabled and h2.requires_grad,
        grad_enabled and w.requires_grad,
    )
    return loss


def cross_entropy_causal(
    module: Any,
    hidden_states: torch.Tensor,
    labels: Optional[torch.Tensor],
    num_items_in_batch=None,
    ignore_index: int = -100,
    shift_labels=None,
    chunk_size: Optional[int] = None,
    **kwargs,
):
    """`(logits, loss)` of a `*ForCausalLM` (slot contract of `cross_entropy_loss/causal`). Without
    labels: `(lm_head(hidden_states), None)` as upstream. With labels: `(None, loss)`, full logits
    are never made."""
    check_no_softcapping(module)
    lm_head = module.lm_head
    if labels is None:
        return lm_head(hidden_states), None
    weight = getattr(lm_head, "weight", None)
    if not torch.is_tensor(weight) or weight.dim() != 2:
        raise ValueError(
            f"cross_entropy_loss/causal (cuda) needs an lm_head with a 2-D weight, got {type(lm_head).__name__}"
        )
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError(
            "cross_entropy_loss/causal (cuda) does not support an lm_head with a bias; use 'torch_chunked'"
        )
    vocab = getattr(reference.text_config(getattr(module, "config", None)), "vocab_size", weight.shape[0])
    if vocab != weight.shape[0]:
        raise ValueError(f"config.vocab_size={vocab} but lm_head.weight has {weight.shape[0]} rows")
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    loss = linear_cross_entropy(
        hidden_states,
        weight,
        shift_labels,
        ignore_index=ignore_index,
        num_items_in_batch=num_items_in_batch,
        chunk_size=chunk_size,
    )
    return None, loss


# -- cross-entropy on given logits ----------------------------------------------------------------
def logits_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100, num_items_in_batch=None
) -> torch.Tensor:
    """`F.cross_entropy(logits, targets)` of `[N, C]` logits as HF's `fixed_cross_entropy`: mean (0
    when every target is ignored) or sum / `num_items_in_batch`; the loss has the logits' dtype."""
    if logits.dim() != 2:
        raise ValueError(f"logits_cross_entropy takes [rows, classes] logits, got {tuple(logits.shape)}")
    if logits.dtype not in _lib.DTYPE_CODES:
        raise TypeError(f"logits_cross_entropy takes float32, float16 or bfloat16 logits, got {logits.dtype}")
    if not torch.compiler.is_compiling():
        _backend.check(logits)
    x = logits if logits.stride(-1) == 1 and logits.stride(0) >= logits.shape[1] else logits.contiguous()
    t = targets.reshape(-1).to(device=x.device, dtype=torch.int64).contiguous()
    if t.numel() != x.shape[0]:
        raise ValueError(f"logits_cross_entropy: {x.shape[0]} rows but {t.numel()} targets")
    divisor, value, mode = _reduction_args(num_items_in_batch, x.device)
    compute_grad = torch.is_grad_enabled() and x.requires_grad
    loss, _ = _LOGITS(x, t, divisor, value, mode, int(ignore_index), compute_grad)
    return loss.to(logits.dtype)


def cross_entropy_sequence_classification(logits=None, labels=None, pooled_logits=None, config=None, **kwargs):
    """HF `ForSequenceClassificationLoss`: single-label classification on the CUDA kernel;
    regression and multi-label through the reference math."""
    if reference.sequence_classification_problem_type(config, labels) != "single_label_classification":
        return reference.cross_entropy_sequence_classification(
            logits=logits, labels=labels, pooled_logits=pooled_logits, config=config, **kwargs
        )
    labels = labels.to(pooled_logits.device)
    num_labels = config.num_labels
    return logits_cross_entropy(
        pooled_logits.view(-1, num_labels),
        labels.view(-1),
        ignore_index=kwargs.get("ignore_index", -100),
        num_items_in_batch=kwargs.get("num_items_in_batch"),
    )
