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

Every op is a `torch.library.custom_op` (`opslot::ce_linear_fwd`, `opslot::ce_logits_fwd`,
`opslot::ce_scale_`) with a fake implementation and an autograd formula; no op reads device data
on the host.
"""

import math
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from ... import reference
from ..torch_ops import check_no_softcapping
from . import _lib

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
    """Launches of libopslot_kernels' entry points (resolved on first use, so this module imports
    on machines without the library or a GPU)."""

    def __init__(self) -> None:
        self._rows = None
        self._scale = None

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
        if self._rows is None:
            self._rows = _lib.function(
                "opslot_ce_rows",
                [
                    _lib.PTR,
                    _lib.I64,
                    _lib.PTR,
                    _lib.I64,
                    _lib.I64,
                    _lib.I64,
                    _lib.I32,
                    _lib.PTR,
                    _lib.I64,
                    _lib.PTR,
                    _lib.PTR,
                    _lib.PTR,
                ],
            )
        rows, vocab = logits.shape
        self._rows(
            logits.data_ptr(),
            logits.stride(0),
            None if grad is None else grad.data_ptr(),
            0 if grad is None else grad.stride(0),
            rows,
            vocab,
            _lib.dtype_code(logits),
            targets.data_ptr(),
            int(ignore_index),
            None if grad_scale is None else grad_scale.data_ptr(),
            row_loss.data_ptr(),
            _lib.stream_of(logits),
        )

    def scale_(self, x: torch.Tensor, factor: torch.Tensor) -> None:
        if self._scale is None:
            self._scale = _lib.function("opslot_ce_scale_inplace", [_lib.PTR, _lib.I64, _lib.I32, _lib.PTR, _lib.PTR])
        self._scale(x.data_ptr(), x.numel(), _lib.dtype_code(x), factor.data_ptr(), _lib.stream_of(x))


#: What the ops launch. Tests may swap in an emulation to check the Python side without a GPU.
_backend: Any = _CudaBackend()


def _divisor(
    targets: torch.Tensor, divisor: Optional[torch.Tensor], divisor_value: float, mode: int, ignore_index: int
) -> torch.Tensor:
    """The loss's denominator as a device fp32 scalar, without a host synchronisation."""
    if mode == _MODE_TENSOR:
        return divisor.to(device=targets.device, dtype=torch.float32).reshape(())
    if mode == _MODE_VALUE:
        return torch.full((), float(divisor_value), dtype=torch.float32, device=targets.device)
    # mean over counted tokens; 0 counted tokens -> divide by 1 (loss 0, not upstream's NaN)
    return (targets != ignore_index).sum().clamp_min(1).to(torch.float32)


# -- causal LM: fused lm_head + loss --------------------------------------------------------------
@torch.library.custom_op("opslot::ce_linear_fwd", mutates_args=())
def _ce_linear_fwd(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    divisor: Optional[torch.Tensor],
    divisor_value: float,
    mode: int,
    ignore_index: int,
    chunk_size: int,
    grad_hidden: bool,
    grad_weight: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, d loss/d hidden, d loss/d weight) of `CE(hidden @ weight.T, targets)` reduced by
    `mode`; a gradient not asked for comes back as an empty tensor."""
    _backend.check(hidden)
    tokens, _ = hidden.shape
    vocab = weight.shape[0]
    want_grad = grad_hidden or grad_weight
    div = _divisor(targets, divisor, divisor_value, mode, ignore_index)
    inv = div.reciprocal() if want_grad else None
    row_loss = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
    grad_h = torch.empty_like(hidden) if grad_hidden else hidden.new_empty(0)
    grad_w = torch.empty_like(weight) if grad_weight else weight.new_empty(0)
    if tokens == 0:
        if grad_weight:
            grad_w.zero_()
    else:
        chunk = max(1, min(chunk_size, tokens))
        tile_buf = torch.empty((chunk, vocab), dtype=weight.dtype, device=hidden.device)
        wt = weight.t()
        for start in range(0, tokens, chunk):
            end = min(start + chunk, tokens)
            h = hidden[start:end]
            tile = tile_buf[: end - start]
            torch.mm(h, wt, out=tile)
            _backend.rows(tile, tile if want_grad else None, targets[start:end], ignore_index, inv, row_loss[start:end])
            if grad_hidden:
                torch.mm(tile, weight, out=grad_h[start:end])
            if grad_weight:
                if start == 0:
                    torch.mm(tile.t(), h, out=grad_w)
                else:
                    grad_w.addmm_(tile.t(), h)
        del tile_buf
    loss = row_loss.sum() / div
    return loss, grad_h, grad_w


@_ce_linear_fwd.register_fake
def _(hidden, weight, targets, divisor, divisor_value, mode, ignore_index, chunk_size, grad_hidden, grad_weight):
    loss = hidden.new_empty((), dtype=torch.float32)
    grad_h = torch.empty_like(hidden) if grad_hidden else hidden.new_empty(0)
    grad_w = torch.empty_like(weight) if grad_weight else weight.new_empty(0)
    return loss, grad_h, grad_w


@torch.library.custom_op("opslot::ce_scale_", mutates_args=("x",))
def _ce_scale_(x: torch.Tensor, factor: torch.Tensor) -> None:
    """x *= factor (a one-element tensor), in place, fp32 math."""
    if x.numel() == 0:
        return
    _backend.check(x)
    if not x.is_contiguous():
        raise ValueError("opslot::ce_scale_ scales contiguous tensors")
    f = factor.to(device=x.device, dtype=torch.float32).reshape(()).contiguous()
    _backend.scale_(x, f)


@_ce_scale_.register_fake
def _(x, factor):
    return None


def _linear_setup_context(ctx, inputs, output):
    # The gradient outputs are never differentiated: without this, autograd would hand backward
    # zero-filled [N, H] and [V, H] tensors for them (a second copy of the gradients' memory).
    ctx.set_materialize_grads(False)
    _, grad_h, grad_w = output
    ctx.grad_hidden, ctx.grad_weight = inputs[8], inputs[9]
    ctx.save_for_backward(grad_h, grad_w)


def _traced(t: torch.Tensor) -> bool:
    """True while torch.compile / AOTAutograd traces (fake or functional tensors)."""
    if torch.compiler.is_compiling():
        return True
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(t, (FakeTensor, FunctionalTensor)) or torch._is_functional_tensor(t)


def _scaled(grad: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """`grad * grad_loss` (fp32 math, rounded to grad's dtype). Eager: in place on the gradient
    saved by the forward, so no second copy of a vocab x hidden gradient exists; a second backward
    through the same graph (retain_graph) is then refused by autograd's version check. Traced
    (torch.compile): the same math out of place, which the compiler fuses and plans memory for
    (AOTAutograd cannot express a backward mutation of a forward output)."""
    if _traced(grad) or _traced(grad_loss):
        return (grad.float() * grad_loss.float()).to(grad.dtype)
    torch.ops.opslot.ce_scale_(grad, grad_loss)
    return grad


def _linear_backward(ctx, grad_loss, _grad_h_out, _grad_w_out):
    grad_h, grad_w = ctx.saved_tensors
    if grad_loss is None:  # only the gradient outputs were used: they are constants
        return None, None, None, None, None, None, None, None, None, None
    gh = _scaled(grad_h, grad_loss) if ctx.grad_hidden else None
    gw = _scaled(grad_w, grad_loss) if ctx.grad_weight else None
    return gh, gw, None, None, None, None, None, None, None, None


_ce_linear_fwd.register_autograd(_linear_backward, setup_context=_linear_setup_context)


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
    loss, _, _ = torch.ops.opslot.ce_linear_fwd(
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
@torch.library.custom_op("opslot::ce_logits_fwd", mutates_args=())
def _ce_logits_fwd(
    logits: torch.Tensor,
    targets: torch.Tensor,
    divisor: Optional[torch.Tensor],
    divisor_value: float,
    mode: int,
    ignore_index: int,
    compute_grad: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(fp32 loss, d loss/d logits or an empty tensor) of `CE(logits.float(), targets)`."""
    _backend.check(logits)
    rows = logits.shape[0]
    div = _divisor(targets, divisor, divisor_value, mode, ignore_index)
    row_loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device) if compute_grad else logits.new_empty(0)
    if rows > 0:
        _backend.rows(
            logits,
            grad if compute_grad else None,
            targets,
            ignore_index,
            div.reciprocal() if compute_grad else None,
            row_loss,
        )
    return row_loss.sum() / div, grad


@_ce_logits_fwd.register_fake
def _(logits, targets, divisor, divisor_value, mode, ignore_index, compute_grad):
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device) if compute_grad else logits.new_empty(0)
    return logits.new_empty((), dtype=torch.float32), grad


def _logits_setup_context(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.compute_grad = inputs[6]
    ctx.save_for_backward(output[1])


def _logits_backward(ctx, grad_loss, _grad_out):
    (grad,) = ctx.saved_tensors
    if not ctx.compute_grad or grad_loss is None:
        return None, None, None, None, None, None, None
    return _scaled(grad, grad_loss), None, None, None, None, None, None


_ce_logits_fwd.register_autograd(_logits_backward, setup_context=_logits_setup_context)


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
    loss, _ = torch.ops.opslot.ce_logits_fwd(x, t, divisor, value, mode, int(ignore_index), compute_grad)
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
