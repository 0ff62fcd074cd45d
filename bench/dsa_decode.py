"""Benchmark of GLM-MoE-DSA's attention in a decoding step over Transformers 5.17's cache (every head's expanded
keys and values), bf16, one GPU, one run. Per cache length, one layer's attention of one new token (B x 1
queries, 64 heads, qk_head_dim 256, v_head_dim 256, 2048 selected keys):

- `sparse_mha_attention`: what opslot's `cuda` glue runs under no_grad (generate()): the selected rows read
  straight from the cache;
- the gathers + `sparse_mqa_attention`: what the glue ran before (the selected rows of every head gathered into
  [v | k], one key head a (batch, head) pair);
- upstream's dense attention over the whole cache with the index mask (0 at the selected keys, -inf
  elsewhere; built once, outside the timing): SDPA (what `attn_implementation="sdpa"` runs) and eager
  (matmul, softmax, matmul);
- the ceiling: copy bandwidth (a 2 GiB copy, the same run): the selected rows' bytes (B x 64 x 2048 x 512 x 2)
  at that rate. The kernel rows give their fraction of it.

Two timings per row: the device time (a CUDA graph of the call, replayed) and the user path (CUDA events
around the eager Python call), and each output's relative error against an fp32 reference.

    python3 bench/dsa_decode.py --out $OUT/dsa_decode.md [--contexts 4096,16384,65536] [--batch 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "runtime"))
sys.path.insert(0, BENCH)

from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

import kernels as BK  # noqa: E402  (bench/kernels.py: the copy bandwidth)
from opslot.kernels.cuda import sparse_attention as SA  # noqa: E402

BF = torch.bfloat16
H, DK, DV, K = 64, 256, 256, 2048


def inputs(B, T, gen):
    q = torch.randn(B, H, 1, DK, device="cuda", dtype=BF, generator=gen)
    keys = torch.randn(B, H, T, DK, device="cuda", dtype=BF, generator=gen)
    values = torch.randn(B, H, T, DV, device="cuda", dtype=BF, generator=gen)
    sel = torch.rand(B, 1, T, device="cuda", generator=gen).topk(min(K, T), -1).indices.to(torch.int32)
    return q, keys, values, sel


def ours(q, keys, values, sel, scale):
    return SA._MHA(q.transpose(1, 2), keys, values, sel, scale)[0]


def gathered(q, keys, values, sel, scale):
    """The glue's no-grad path before sparse_mha_attention: the selected rows gathered into [v | k]."""
    B, _, T, _ = keys.shape
    rows = (torch.arange(0, B * H * T, T, device=q.device).view(B, H, 1) + sel.view(B, 1, -1).long()).view(-1)
    kv = values.new_empty(B * H * K, DV + DK)
    torch.index_select(values.reshape(B * H * T, DV), 0, rows, out=kv[:, :DV])
    torch.index_select(keys.reshape(B * H * T, DK), 0, rows, out=kv[:, DV:])
    slots = torch.arange(K, device=q.device, dtype=torch.int32).view(1, 1, K).expand(B * H, 1, K)
    qq = torch.cat([q.new_zeros(B, H, 1, DV), q], dim=-1).reshape(B * H, 1, 1, DV + DK)
    out, _ = SA._FWD(qq, kv.view(B * H, K, DV + DK), slots, None, scale, DV)
    return out.view(B, H, 1, DV).transpose(1, 2)


def index_mask(sel, T):
    B = sel.shape[0]
    mask = torch.full((B, 1, 1, T), float("-inf"), device=sel.device, dtype=BF)
    return mask.scatter(-1, sel.long().view(B, 1, 1, -1), 0.0)


def sdpa(q, keys, values, mask, scale):
    out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def eager(q, keys, values, mask, scale):
    w = torch.matmul(q, keys.transpose(2, 3)) * scale + mask
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, values).transpose(1, 2)


def reference(q, keys, values, sel, scale):
    B = q.shape[0]
    idx = sel.long().view(B, 1, K, 1)
    kg = keys.float().gather(2, idx.expand(B, H, K, DK))
    vg = values.float().gather(2, idx.expand(B, H, K, DV))
    p = torch.softmax(torch.matmul(q.float(), kg.transpose(2, 3)) * scale, -1)
    return torch.matmul(p, vg).transpose(1, 2)


def timings(call):
    call()
    torch.cuda.synchronize()
    dev = do_bench_cudagraph(call, rep=50, return_mode="median")
    user = do_bench(call, warmup=5, rep=50, return_mode="median")
    return dev, user


def context_rows(B, T, bw, gen):
    """The table rows of one cache length: each path's device and user-path ms, checked against fp32 first."""
    q, keys, values, sel = inputs(B, T, gen)
    scale = DK**-0.5
    mask = index_mask(sel, T)
    ref = reference(q, keys, values, sel, scale)
    nbytes = B * H * K * (DK + DV) * 2
    rows = [
        ("`sparse_mha_attention` (ours, generate()'s path)", lambda: ours(q, keys, values, sel, scale), True),
        ("gathers + `sparse_mqa_attention` (the previous path)", lambda: gathered(q, keys, values, sel, scale), True),
        ("upstream SDPA, dense with the index mask", lambda: sdpa(q, keys, values, mask, scale), False),
        ("upstream eager, dense with the index mask", lambda: eager(q, keys, values, mask, scale), False),
    ]
    results = []
    for name, call, kernel in rows:
        out = call()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        dev, user = timings(call)
        results.append((name, dev, user, err, kernel))
        print(f"T={T} {name}: device {dev:.4f} ms, user {user:.4f} ms, err {err:.2e}", flush=True)
    sdpa_dev = results[2][1]
    lines = []
    for name, dev, user, err, kernel in results:
        frac = f"{nbytes / (dev * 1e-3) / bw * 100:.1f} %" if kernel else ""
        lines.append(f"| {T} | {name} | {dev:.4f} | {user:.4f} | {sdpa_dev / dev:.2f}x | {frac} | {err:.1e} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--contexts", default="4096,16384,65536")
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    bw = BK.copy_bandwidth()
    commit = subprocess.run(
        ["git", "-C", ROOT, "log", "-1", "--format=%h"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"# GLM-MoE-DSA decoding step, attention over Transformers 5.17's cache ({torch.cuda.get_device_name()})",
        "",
        f"commit {commit or 'n/a'}; bf16; {args.batch} x 1 query, {H} heads, dk {DK}, dv {DV}, {K} selected keys; "
        f"copy bandwidth {bw / 1e12:.2f} TB/s (2 GiB copy, this run)",
        "",
        "| cache length | path | device ms (CUDA graph) | user-path ms | vs upstream SDPA (device) | selected bytes at copy BW | rel. error vs fp32 |",
        "|---|---|---|---|---|---|---|",
    ]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for T in [int(x) for x in args.contexts.split(",")]:
        lines += context_rows(args.batch, T, bw, gen)
        torch.cuda.empty_cache()
    nbytes = args.batch * H * K * (DK + DV) * 2
    lines += [
        "",
        f"Selected bytes: {args.batch} x {H} x {K} x ({DK} + {DV}) x 2 = {nbytes / 1e6:.0f} MB a layer and step.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
