"""DeepSeek-V4's manifold-constrained hyper-connections (`mhc/pre`, `mhc/post`, `mhc/head`, impl `cuda`).

Torch ops registered from C++ with their Meta and Autograd kernels (kernels/torch/mhc.cc) over
kernels/src/mhc.cu (docs/kernels.md "## mhc"):

- `opslot::mhc_pre_fwd` (`DeepseekV4HyperConnection.forward`): the mix GEMM against `fn` on cuBLAS
  (bf16 streams: one bf16 GEMM against `fn` split into three bf16 terms, fp32 output), then one
  kernel per token (sum of squares, the collapse weights, the collapsed row) and one thread per
  token for post and the Sinkhorn-normalised comb. Backward (`opslot::mhc_pre_bwd`): the Sinkhorn
  backward by recomputation, one pass for the collapse weights' gradient, one for dx, a cuBLAS
  GEMM for d fn; gradients of the streams, fn, base and scale.
- `opslot::mhc_head_fwd` (`DeepseekV4HyperHead.forward`): the same without post/comb.
- `opslot::mhc_post` (the decoder layer's `post * block_output + comb^T @ streams`): one pass each way.

fp32 math as upstream's (post and comb rounded to the streams' dtype where upstream casts them).
Nothing reads device data on the host (CUDA-graph capturable); every reduction is in a fixed
order (bitwise deterministic).
"""

from __future__ import annotations

from typing import Any, Tuple

import torch

from . import _lib, _ops_common as C

C.require_library_on_cuda_machines()
_PRE = C.torch_op("mhc_pre_fwd")  # (post, comb, collapsed, mix, rstd); backward: opslot::mhc_pre_bwd
_HEAD = C.torch_op("mhc_head_fwd")  # (out, mix, rstd); backward: opslot::mhc_head_bwd
_POST = C.torch_op("mhc_post")  # backward: opslot::mhc_post_bwd


def _check(t: torch.Tensor) -> None:
    if not torch.compiler.is_compiling():  # the ops check again when they run
        _lib.check_device(t.device)


def _check_streams(what: str, x: torch.Tensor, hc_mult: int) -> None:
    if x.dim() != 4 or x.shape[2] != hc_mult:
        raise ValueError(
            f"{what} (cuda): the streams must be [batch, seq, hc_mult={hc_mult}, hidden], got shape {tuple(x.shape)}"
        )


def mhc_pre(module: Any, hidden_streams: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`DeepseekV4HyperConnection.forward`: `(post [B, S, N] fp32, comb [B, S, N, N] fp32, collapsed
    [B, S, D])` from the streams `[B, S, N, D]`, differentiable in the streams, `fn`, `base`, `scale`."""
    _check(hidden_streams)
    _check_streams("mhc/pre", hidden_streams, module.hc_mult)
    post, comb, collapsed, _, _ = _PRE(
        hidden_streams,
        module.fn,
        module.base,
        module.scale,
        int(module.hc_sinkhorn_iters),
        float(module.hc_eps),
        float(module.input_norm.eps),
    )
    return post, comb, collapsed


def mhc_post(
    post: torch.Tensor, comb: torch.Tensor, block_output: torch.Tensor, hidden_states: torch.Tensor
) -> torch.Tensor:
    """`post.to(dtype).unsqueeze(-1) * block_output.unsqueeze(-2) + comb.to(dtype).transpose(-1, -2) @
    hidden_states` (dtype = hidden_states.dtype), in fp32 with one rounding: `[B, S, N, D]`."""
    _check(hidden_states)
    return _POST(post, comb, block_output, hidden_states)


def mhc_head(module: Any, x: torch.Tensor) -> torch.Tensor:
    """`DeepseekV4HyperHead.forward`: the streams `[B, S, N, D]` collapsed with sigmoid weights,
    `[B, S, D]`, differentiable in x, `hc_fn`, `hc_base`, `hc_scale`."""
    _check(x)
    _check_streams("mhc/head", x, module.hc_mult)
    out, _, _ = _HEAD(x, module.hc_fn, module.hc_base, module.hc_scale, float(module.eps), float(module.input_norm.eps))
    return out


__all__ = ["mhc_pre", "mhc_post", "mhc_head"]
