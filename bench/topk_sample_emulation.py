"""CPU emulation of the threshold of the top-k's bench paths 13 and 14 (kernels/src/topk_split.cuh): how many
candidates a row gets from the threshold sampled as the kernel samples it, on rows of GLM-5-shaped random
lightning-indexer scores (32 heads of 128, bf16 q and k, fp32 weights scaled by H^-1/2 as bench/dsa_indexer.py
draws them). No GPU.

The sample: one 16-byte chunk (4 columns) in every 32 chunks, from chunk 0; m sampled keys; the threshold: the
sample's r-th largest key, r = ceil(f m + 4 sqrt(f m)) + 4 with f = k / n (at most m). A row's candidates are its
keys at or above the threshold; the kernels hold at most 5120 a row and need at least k. Also printed: the
candidates the floor of the bucket holding that key would give, by the digit spanning the sample over at most
1025 buckets (the first version's threshold, replaced because of these counts).

    .venv/bin/python bench/topk_sample_emulation.py [--cols 8193,12000,16384,16385,32768,65536] [--k 512,2048]
"""

from __future__ import annotations

import argparse
import math

import torch

CAP = 5120


def order_keys(v: torch.Tensor) -> torch.Tensor:
    """torch.topk's order of fp32 values as unsigned 32-bit keys (int64 here): NaN above +inf, -0.0 below +0.0."""
    x = v.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    key = torch.where((x & 0x80000000) != 0, x ^ 0xFFFFFFFF, x ^ 0x80000000)
    return torch.where(v.isnan(), torch.full_like(key, 0xFFFFFFFF), key)


def sampled(keys: torch.Tensor) -> torch.Tensor:
    """The kernel's sample of a row's keys: columns 128 i .. 128 i + 3 (those inside the row)."""
    n = keys.numel()
    cols = (torch.arange(0, (n + 127) // 128) * 128).unsqueeze(1) + torch.arange(4)
    cols = cols.flatten()
    return keys[cols[cols < n]]


def thresholds(sample: torch.Tensor, k: int, n: int) -> tuple[int, int, int]:
    """(r, the r-th largest sampled key, the floor of its bucket by the digit spanning the sample)."""
    m = sample.numel()
    fm = k * m / n
    r = min(m, math.ceil(fm + 4 * math.sqrt(fm)) + 4)
    key = int(sample.sort(descending=True).values[r - 1])
    lo, hi = int(sample.min()), int(sample.max())
    shift = max(0, 22 - (32 - (hi - lo).bit_length())) if hi > lo else 0
    return r, key, (key >> shift) << shift


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", default="8193,12000,16384,16385,20000,32768,40000,65536")
    ap.add_argument("--k", default="512,2048")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cols = [int(x) for x in args.cols.split(",")]
    ks = [int(x) for x in args.k.split(",")]
    H, D = 32, 128
    g = torch.Generator().manual_seed(args.seed)
    q = torch.randn(len(cols), H, D, generator=g).bfloat16().float()
    keys_bf = torch.randn(max(cols), D, generator=g).bfloat16().float()
    w = torch.randn(len(cols), H, generator=g) * H**-0.5
    print("| columns | k | sampled keys | r | candidates (the key) | candidates (its bucket's floor) | in [k, 5120] |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for i, n in enumerate(cols):
        scores = (w[i].unsqueeze(1) * torch.relu(q[i] @ keys_bf[:n].T)).sum(0) * D**-0.5
        row = order_keys(scores)
        sample = sampled(row)
        for k in ks:
            r, key, floor = thresholds(sample, k, n)
            exact, coarse = int((row >= key).sum()), int((row >= floor).sum())
            ok = "yes" if k <= exact <= CAP else "no: the row falls back"
            print(f"| {n} | {k} | {sample.numel()} | {r} | {exact} | {coarse} | {ok} |")


if __name__ == "__main__":
    main()
