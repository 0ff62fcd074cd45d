"""Helpers for tests that compare a patched (generated) model with its upstream original."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import torch


@dataclass
class ModelDiff:
    """Max absolute differences between two models run on the same weights and inputs."""

    logits: Optional[float]  # None when either model returned no logits (e.g. fused CE with labels)
    loss: Optional[float]  # None when the models returned no loss
    grads: float  # over every parameter gradient, by parameter name
    grad_by_param: Dict[str, float]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute elementwise difference (0.0 for empty tensors)."""
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def compare_models(
    upstream_model: torch.nn.Module, patched_model: torch.nn.Module, inputs: Mapping[str, Any]
) -> ModelDiff:
    """Load the upstream weights into the patched model (strictly), run both on `inputs` (keyword
    arguments of `forward`; the output is a logits tensor or has `.logits`/`.loss`), back-propagate
    the loss when there is one (else the sum of the logits), and return the max absolute
    differences of logits, loss and parameter gradients."""
    patched_model.load_state_dict(upstream_model.state_dict(), strict=True)
    outputs = []
    for model in (upstream_model, patched_model):
        model.zero_grad(set_to_none=True)
        out = model(**inputs)
        if torch.is_tensor(out):
            logits, loss = out, None
        else:
            logits, loss = getattr(out, "logits", None), getattr(out, "loss", None)
        target = loss if loss is not None else logits.float().sum()
        target.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        outputs.append((logits, loss, grads))
    (l0, s0, g0), (l1, s1, g1) = outputs
    if set(g0) != set(g1):
        raise AssertionError(
            f"parameters with gradients differ: only upstream {sorted(set(g0) - set(g1))}, "
            f"only patched {sorted(set(g1) - set(g0))}"
        )
    by_param = {n: max_abs_diff(g0[n], g1[n]) for n in sorted(g0)}
    return ModelDiff(
        logits=max_abs_diff(l0, l1) if l0 is not None and l1 is not None else None,
        loss=max_abs_diff(s0, s1) if s0 is not None and s1 is not None else None,
        grads=max(by_param.values(), default=0.0),
        grad_by_param=by_param,
    )
