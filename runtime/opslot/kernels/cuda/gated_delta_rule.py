"""The chunked gated delta rule (Qwen3.5's Gated DeltaNet) on libopslot_kernels, forward and backward,
dense batches and packed sequences (`cu_seqlens`).

Torch ops `opslot::gdr_fwd` (returns the output, the final states and the tensors the backward reads:
the state entering each 64-token chunk, the chunk's corrected values and keys, the in-chunk decay)
and `opslot::gdr_bwd`, registered from C++ with their Meta and Autograd kernels
(kernels/torch/gated_delta_rule.cc). q, k, v are read through their (batch, token, head) strides (HF
passes views of the conv output: nothing is copied); the last dimension must be contiguous. The
device-side check of cu_seqlens (`torch._assert_async`, no host synchronisation) stays here, in
`chunk_gated_delta_rule`. The kernel math is in kernels/include/opslot_kernels/gated_delta_rule.h and
docs/kernels.md.
"""

from __future__ import annotations

import torch

from . import _ops_common as C

C.require_library_on_cuda_machines()
_FWD = C.torch_op("gdr_fwd")  # its Autograd kernel's backward calls opslot::gdr_bwd

CHUNK = 64
MAX_HEAD_DIM = 128


def max_chunks(batch: int, seqlen: int, nseq: int, packed: bool) -> int:
    """opslot_gdr_max_chunks: chunks of a dense batch, or an upper bound for packed sequences."""
    per = (seqlen + CHUNK - 1) // CHUNK
    return per + nseq if packed else batch * per


def _check_cu_seqlens_async(cu_seqlens: torch.Tensor, seqlen: int) -> None:
    """Device-side checks (no host synchronisation): starts at 0, never decreases, ends at seqlen."""
    cu = cu_seqlens
    ok = (cu[0] == 0) & (cu[-1] == seqlen)
    if cu.shape[0] > 1:
        ok = ok & (cu[1:] >= cu[:-1]).all()
    torch._assert_async(
        ok, "chunk_gated_delta_rule: cu_seqlens must start at 0, never decrease and end at the sequence length"
    )


def chunk_gated_delta_rule(
    query,
    key,
    value,
    g,
    beta,
    chunk_size: int = 64,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens=None,
    **kwargs,
):
    """The upstream `torch_chunk_gated_delta_rule` contract (docs/ops.md) on the CUDA kernels; `chunk_size`
    does not change the result (the kernels use 64-token chunks). With cu_seqlens (batch 1) each segment
    is its own sequence, initial_state and the final state are [num_seqs, H, Dk, Dv]."""
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            cu_seqlens = torch.as_tensor(cu_seqlens, device=query.device)
        cu_seqlens = cu_seqlens.to(query.device)
        if cu_seqlens.dim() == 1 and cu_seqlens.numel() > 0:
            _check_cu_seqlens_async(cu_seqlens, query.shape[1])
    out, final, *_ = _FWD(
        query,
        key,
        value,
        g,
        beta,
        initial_state,
        cu_seqlens,
        bool(use_qk_l2norm_in_kernel),
        float(query.shape[-1] ** -0.5),
    )
    return out, (final if output_final_state else None)
