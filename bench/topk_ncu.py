"""One `opslot::topk_indices` call on the GLM-5 indexer's causal scores, for Nsight Compute to profile
(docs/results/dsa_indexer_h200.md, "What bounds the top-k"): bench/dsa_indexer.py's GLM inputs at L tokens
(32 heads of 128), the scores by `dsa_index_scores`, then the top-2048 twice (profile the second);
prints how many top-digit buckets the last row's scores fill.

    L=65536 ncu --kernel-name regex:topk_kernel --launch-count 1 --launch-skip 1 --set full \\
        --import-source yes -o $OUT/topk python3 bench/topk_ncu.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime"))
from opslot.kernels.cuda import dsa_indexer as DI  # noqa: E402


def main():
    L, H, D = int(os.environ.get("L", "65536")), 32, 128
    g = torch.Generator(device="cuda").manual_seed(L)  # the bench's GLM inputs
    q = torch.randn(1, L, H, D, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(1, L, D, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(1, L, H, device="cuda", generator=g) * H**-0.5
    limit = (torch.arange(L, device="cuda", dtype=torch.int32) + 1).view(1, L)
    scores = DI.dsa_index_scores(q, k, w, D**-0.5, limit)
    for _ in range(2):
        DI.topk_indices(scores, 2048, limit)
    torch.cuda.synchronize()
    bits = scores[0, L - 1].view(torch.int32).long() & 0xFFFFFFFF  # the kernel's order keys
    keys = torch.where(bits >= 2**31, bits ^ 0xFFFFFFFF, bits ^ 0x80000000)
    _, counts = torch.unique(keys >> 21, return_counts=True)
    print(f"last row: {counts.numel()} top-digit buckets, the largest {counts.max().item()} of {L}")


if __name__ == "__main__":
    main()
