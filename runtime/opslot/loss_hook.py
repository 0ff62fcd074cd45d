"""opslot's causal-LM loss for Transformers models that opslot does not generate (docs/runtime.md,
"The fused loss for models opslot does not generate").

A generated `*ForCausalLM` reaches opslot's loss through its `cross_entropy_loss/causal` slot, which
takes the hidden states and does the lm_head itself. An upstream (unpatched) Transformers model
computes its logits itself and then calls `self.loss_function(logits, labels, vocab_size, **kwargs)`,
which Transformers resolves through `transformers.loss.loss_utils.LOSS_MAPPING[model.loss_type]`
(`ForCausalLMLoss` for `*ForCausalLM` and `*ForConditionalGeneration`), unless the instance has its
own `_loss_function`. This module puts a function with exactly `ForCausalLMLoss`'s contract there,
computed by an opslot kernel that takes logits (op `cross_entropy_loss`, variant `causal_logits`):

    handle = opslot.loss_hook.install_causal_lm_loss("cuda", model)   # this model instance only
    ...
    handle.uninstall()                                                # or: with install_...(...):

`model=None` installs it globally (`LOSS_MAPPING["ForCausalLM"]`) instead.

Kernels (`cross_entropy_loss/causal_logits`, signature and result of `ForCausalLMLoss`):
  - `torch`: opslot's fp32 reference of `ForCausalLMLoss` (`opslot.reference.for_causal_lm_loss`),
    the same operations in the same order: bit-identical to upstream, anywhere;
  - `cuda`: the logits-in CUDA cross-entropy of libopslot_kernels (`opslot::ce_logits_fwd`, the
    kernel the `sequence_classification` cuda kernel runs): reads the logits in their own dtype with
    fp32 math (no fp32 copy of the logits), writes the gradient in the logits dtype in the forward.
The registry is asked first (`KERNEL_REGISTRY`, so a plug-in can add an implementation of
`cross_entropy_loss/causal_logits`); these two are the fallback while the registry has none.
"""

from __future__ import annotations

import difflib
import inspect
import sys
import threading
from typing import Any, Callable, Dict, Optional

import torch
import torch.nn.functional as F

from . import reference
from .hardware import ANY
from .kernels import CUDA
from .ops import EAGER
from .registry import KERNEL_REGISTRY, KernelRegistry, KernelSpec

OP = "cross_entropy_loss"
#: The variant of `cross_entropy_loss` whose kernels take logits: the contract of Transformers'
#: `ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
#: shift_labels=None, **kwargs) -> fp32 scalar loss`.
VARIANT = "causal_logits"
#: The key of `LOSS_MAPPING` that a global install replaces.
LOSS_TYPE = "ForCausalLM"

_LOCK = threading.RLock()


# -- kernels (cross_entropy_loss/causal_logits) -----------------------------------------------------
def causal_lm_loss_torch(
    logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100, shift_labels=None, **kwargs
):
    """Transformers' `ForCausalLMLoss`, as opslot's fp32 reference writes it (same operations)."""
    return reference.for_causal_lm_loss(
        logits,
        labels,
        vocab_size,
        num_items_in_batch=num_items_in_batch,
        ignore_index=ignore_index,
        shift_labels=shift_labels,
        **kwargs,
    )


def causal_lm_loss_cuda(
    logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100, shift_labels=None, **kwargs
):
    """`ForCausalLMLoss` on libopslot_kernels' logits-in cross-entropy (`opslot::ce_logits_fwd`): the
    logits are read in their dtype (fp32, fp16, bf16) with fp32 math, as upstream's `.float()` copy
    does, and the fp32 loss is returned; the gradient is written in the logits dtype (where upstream's
    backward of `.float()` rounds it). Every label ignored: NaN loss and zero gradients, as upstream."""
    from .kernels.cuda import _lib, cross_entropy as ce

    if logits.dtype not in _lib.DTYPE_CODES:
        raise TypeError(
            f"cross_entropy_loss/causal_logits (cuda) takes float32, float16 or bfloat16 logits, got {logits.dtype}"
        )
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    x = logits.reshape(-1, vocab_size)
    if not (x.stride(-1) == 1 and x.stride(0) >= x.shape[1]):
        x = x.contiguous()
    t = shift_labels.reshape(-1).to(device=x.device, dtype=torch.int64).contiguous()
    if t.numel() != x.shape[0]:
        raise ValueError(f"cross_entropy_loss/causal_logits: {x.shape[0]} logit rows but {t.numel()} labels")
    if not torch.compiler.is_compiling():  # early, clear error (CPU tensors, no library); the op checks again
        ce._backend.check(x)
    divisor, value, mode = ce._reduction_args(num_items_in_batch, x.device)
    compute_grad = torch.is_grad_enabled() and x.requires_grad
    loss, _ = torch.ops.opslot.ce_logits_fwd(x, t, divisor, value, mode, int(ignore_index), compute_grad)
    if num_items_in_batch is None:
        # The kernel's mean divides by max(count, 1); upstream's is 0/0 = NaN when every label is
        # ignored (with zero gradients). A constant keeps both, without a host synchronisation.
        loss = loss + torch.where((t != ignore_index).any(), 0.0, float("nan")).to(loss.dtype)
    return loss


#: The built-in kernels of cross_entropy_loss/causal_logits, used when the registry has none of that name.
BUILTIN_KERNELS: Dict[str, KernelSpec] = {
    "torch": KernelSpec(
        "torch",
        OP,
        VARIANT,
        f"{__name__}:causal_lm_loss_torch",
        ANY,
        "Transformers' ForCausalLMLoss (opslot.reference), bit-identical",
    ),
    "cuda": KernelSpec(
        "cuda",
        OP,
        VARIANT,
        f"{__name__}:causal_lm_loss_cuda",
        CUDA,
        "logits-in CUDA cross-entropy (opslot::ce_logits_fwd), fp32 math, no fp32 logits copy",
    ),
}


def available_impls(registry: Optional[KernelRegistry] = None) -> Dict[str, KernelSpec]:
    """{impl: spec} of `cross_entropy_loss/causal_logits`: the built-ins, overridden by the registry's."""
    registry = registry or KERNEL_REGISTRY
    specs = dict(BUILTIN_KERNELS)
    for name in registry.list_available(OP, VARIANT, include_unsupported=True).get((OP, VARIANT), []):
        specs[name] = registry.get(OP, VARIANT, name)
    return specs


def resolve_kernel(impl: str, registry: Optional[KernelRegistry] = None) -> Callable[..., Any]:
    """The `cross_entropy_loss/causal_logits` kernel `impl`, refused (ValueError / RuntimeError) when
    it does not exist or cannot run on this machine."""
    if impl == EAGER:
        raise ValueError(
            "impl 'eager' is Transformers' own ForCausalLMLoss: there is nothing to install "
            "(leave the loss as it is, or choose one of: "
            f"{', '.join(sorted(available_impls(registry)))})"
        )
    specs = available_impls(registry)
    spec = specs.get(impl) if isinstance(impl, str) else None
    if spec is None:
        close = difflib.get_close_matches(str(impl), list(specs), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"no kernel {impl!r} for {OP}/{VARIANT} (the causal-LM loss on given logits){hint} "
            f"(available: {', '.join(sorted(specs))})"
        )
    reason = spec.hardware.unmet_reason()
    if reason is None and impl == "cuda":
        from .device_defaults import cuda_kernels_unavailable_reason

        reason = cuda_kernels_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"kernel {impl!r} for {OP}/{VARIANT} cannot run here: {reason}")
    return spec.load()


# -- the hook -------------------------------------------------------------------------------------
class CausalLMLoss:
    """A drop-in for Transformers' `ForCausalLMLoss` running opslot kernel `impl`. `calls` counts the
    calls (the proof that a model's loss went through it)."""

    def __init__(self, impl: str, registry: Optional[KernelRegistry] = None) -> None:
        self.impl = impl
        self.kernel = resolve_kernel(impl, registry)
        self.calls = 0

    def __call__(
        self,
        logits,
        labels,
        vocab_size: int,
        num_items_in_batch=None,
        ignore_index: int = -100,
        shift_labels=None,
        **kwargs,
    ):
        if logits.shape[-1] != vocab_size:
            raise ValueError(
                f"opslot causal-LM loss ({self.impl}): the logits have {logits.shape[-1]} classes but the model "
                f"passes vocab_size={vocab_size}; Transformers' ForCausalLMLoss would reshape them with "
                f"logits.view(-1, {vocab_size}), which is an error or a wrong loss, so the hook refuses it "
                f"(check config.vocab_size against the lm_head)"
            )
        self.calls += 1
        return self.kernel(
            logits,
            labels,
            vocab_size,
            num_items_in_batch=num_items_in_batch,
            ignore_index=ignore_index,
            shift_labels=shift_labels,
            **kwargs,
        )

    def __reduce__(self):  # pickled / deep-copied with a model: the kernel is resolved again
        return (CausalLMLoss, (self.impl,))

    def __repr__(self) -> str:
        return f"opslot.loss_hook.CausalLMLoss(impl={self.impl!r}, calls={self.calls})"


def _upstream_loss() -> Callable[..., Any]:
    from transformers.loss.loss_utils import ForCausalLMLoss

    return ForCausalLMLoss


def _loss_mapping() -> Dict[str, Callable[..., Any]]:
    from transformers.loss.loss_utils import LOSS_MAPPING

    return LOSS_MAPPING


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _text_vocab_size(config: Any) -> Optional[int]:
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    vocab = getattr(text, "vocab_size", None)
    return vocab if vocab is not None else getattr(config, "vocab_size", None)


def check_model(model: Any) -> None:
    """Refuse (TypeError / ValueError) a model on which the causal-LM hook cannot stand in for its loss
    exactly: not a Transformers model, a loss function other than ForCausalLMLoss, a forward that never
    calls `self.loss_function`, a generated model whose `cross_entropy_loss/causal` slot runs a kernel
    (its loss never reaches `loss_function`), or an lm_head whose rows are not `config.vocab_size`."""
    name = type(model).__name__
    if not isinstance(getattr(type(model), "loss_function", None), property):
        raise TypeError(
            f"install_causal_lm_loss(model=...) takes a Transformers PreTrainedModel (a *ForCausalLM "
            f"or *ForConditionalGeneration head), got {name}"
        )
    current = model.loss_function
    upstream = _upstream_loss()
    if not (current is upstream or isinstance(current, CausalLMLoss)):
        loss_type = getattr(model, "loss_type", None)
        raise ValueError(
            f"{name}'s loss function is {_fn_name(current)} (loss_type {loss_type!r}), "
            f"not Transformers' ForCausalLMLoss: the causal-LM loss hook would change what this model "
            f"computes; install it on a causal-LM head"
        )
    try:
        source = inspect.getsource(inspect.unwrap(type(model).forward))
    except (OSError, TypeError):
        source = None  # no source to read: the hook's `calls` says whether it ran
    if source is not None and "loss_function" not in source:
        raise ValueError(
            f"{name}.forward never calls self.loss_function (it computes no loss, or its own), so the "
            f"hook would never run; install it on the model's causal-LM head (e.g. *ForCausalLM)"
        )
    from .slot import OpSlot

    module = sys.modules.get(type(model).__module__)
    candidates = list(vars(module).items()) if module is not None else []
    candidates += list(vars(model).items())
    for attr, slot in candidates:
        if isinstance(slot, OpSlot) and slot.op == OP and slot.variant == "causal" and slot.use_non_eager_impl:
            raise ValueError(
                f"{name} is a generated model whose {attr} ({OP}/causal) runs kernel {slot.impl!r}: its "
                f"forward computes the loss there and never calls loss_function, so the hook would never "
                f"run. Its loss is already opslot's; to use the hook instead, bind that slot to eager"
            )
    vocab = _text_vocab_size(getattr(model, "config", None))
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = None
    weight = getattr(head, "weight", None)
    if vocab is not None and torch.is_tensor(weight) and weight.dim() == 2 and weight.shape[0] != vocab:
        raise ValueError(
            f"{name}: the lm_head has {weight.shape[0]} rows but config vocab_size is {vocab}; "
            f"ForCausalLMLoss reshapes the logits by vocab_size, so the loss would be wrong or an error"
        )


class CausalLMLossHandle:
    """An installed hook: `uninstall()` (or leaving the `with` block) restores what was there."""

    def __init__(self, hook: CausalLMLoss, model: Any, previous: Any, had_previous: bool) -> None:
        self.hook = hook
        self.model = model
        self._previous = previous
        self._had_previous = had_previous
        self.installed = True

    @property
    def calls(self) -> int:
        """How many times the installed loss ran."""
        return self.hook.calls

    @property
    def scope(self) -> str:
        return "global" if self.model is None else "model"

    def uninstall(self) -> None:
        """Restore the previous loss function (the instance's own `_loss_function`, or none, or the
        previous `LOSS_MAPPING["ForCausalLM"]`). A hook installed over this one must be removed first."""
        with _LOCK:
            if not self.installed:
                return
            if self.model is None:
                mapping = _loss_mapping()
                if mapping.get(LOSS_TYPE) is not self.hook:
                    now = _fn_name(mapping.get(LOSS_TYPE))
                    raise RuntimeError(
                        f"LOSS_MAPPING[{LOSS_TYPE!r}] is {now} now, not this hook: uninstall what was "
                        f"installed over it first (in reverse order)"
                    )
                if self._had_previous:
                    mapping[LOSS_TYPE] = self._previous
                else:
                    del mapping[LOSS_TYPE]
            else:
                state = vars(self.model)
                if state.get("_loss_function") is not self.hook:
                    raise RuntimeError(
                        f"{type(self.model).__name__}.loss_function is "
                        f"{_fn_name(state.get('_loss_function'))} now, not this hook: uninstall what "
                        f"was installed over it first (in reverse order)"
                    )
                if self._had_previous:
                    self.model._loss_function = self._previous
                else:
                    del self.model._loss_function
            self.installed = False

    def __enter__(self) -> "CausalLMLossHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        where = "LOSS_MAPPING['ForCausalLM']" if self.model is None else type(self.model).__name__
        state = "installed" if self.installed else "uninstalled"
        return f"CausalLMLossHandle({self.hook.impl!r} on {where}, {state}, calls={self.calls})"


def install_causal_lm_loss(
    impl: str, model: Any = None, *, registry: Optional[KernelRegistry] = None
) -> CausalLMLossHandle:
    """Make the causal-LM loss of an unpatched Transformers model run opslot kernel `impl` of
    `cross_entropy_loss/causal_logits` ("torch", "cuda", or a plug-in's).

    `model` given: that instance only (its `loss_function` is set; other models are untouched); the
    model is checked first (`check_model`). `model=None`: globally, `LOSS_MAPPING["ForCausalLM"]`,
    i.e. every model whose loss type resolves to "ForCausalLM" and that has no loss function of its
    own, now and later (not `*ForConditionalGeneration`, whose key is "ForConditionalGeneration").
    Returns a handle: `uninstall()`, a context manager, `calls`."""
    hook = CausalLMLoss(impl, registry)
    with _LOCK:
        if model is None:
            mapping = _loss_mapping()
            had, previous = LOSS_TYPE in mapping, mapping.get(LOSS_TYPE)
            mapping[LOSS_TYPE] = hook
            return CausalLMLossHandle(hook, None, previous, had)
        check_model(model)
        state = vars(model)
        had, previous = "_loss_function" in state, state.get("_loss_function")
        model.loss_function = hook
        return CausalLMLossHandle(hook, model, previous, had)


def installed_causal_lm_loss(model: Any = None) -> Optional[CausalLMLoss]:
    """The opslot hook `model` would call for its loss now (`model=None`: the one in
    `LOSS_MAPPING["ForCausalLM"]`), or None."""
    fn = _loss_mapping().get(LOSS_TYPE) if model is None else model.loss_function
    return fn if isinstance(fn, CausalLMLoss) else None
