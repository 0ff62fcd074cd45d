"""Benchmark of DeepSeek sparse attention (the `dsa_attention` slots), bf16, one GPU, one run:

1. opslot's kernel `sparse_mqa_attention` alone at the two models' shapes (GLM-5's absorbed MLA: 64 heads,
   Dqk 576, dv 512, 2048 selected keys; DeepSeek-V4: 64 heads, D 512, 128 window + 512 compressed keys, with
   sinks), forward and forward + backward, as the device time (a CUDA graph of the call, replayed) and the
   user path (CUDA events around the eager Python call), with the fraction of the tensor-core bound of the
   FLOPs sparse attention needs (2 S H K (Dqk + dv) forward, twice that backward; at the bf16 GEMM rate
   measured in the same run) and the peak extra memory.
2. The slot as a model calls it, from its inputs (GLM: the latents, the indexer's top-k and the causal mask;
   V4: q, the shared kv with the compressed entries and the sliding-window mask with the block bias), forward
   + backward: opslot's `cuda` glue against upstream's dense path, the masked eager / SDPA attention upstream
   runs (GLM: expand_kv, the index mask, then eager or sdpa; V4: eager attention with sinks, the only path
   upstream has for sinks), and torch.compile of it. A peer that runs out of memory is reported as OOM.

    python3 bench/dsa_attention.py --out $OUT/dsa_attention_h200.md [--contexts 16384,65536] [--budget-s 150]

Rows past the time budget are reported as skipped. `--profile` adds, per kernel row, the GPU kernels one
forward + backward launches with their mean device time (torch.profiler) and the copy bandwidth of the run;
`--hashes` the SHA-256 of each kernel row's outputs and gradients (the same inputs every run: seed 0), to
compare two builds bit for bit. `--mma-sync N` runs on the bench library with the mma.sync kernels where
the wgmma ones would run (N: bit 0 the forward, bit 1 the backward), for side-by-side runs in one call.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import types

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "runtime"))
sys.path.insert(0, BENCH)

from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

import kernels as BK  # noqa: E402  (bench/kernels.py: the copy bandwidth, the kernel lists)
from opslot.kernels.cuda import sparse_attention as SA  # noqa: E402

BF = torch.bfloat16
#: name -> (heads, Dqk, dv, K, sinks)
MODELS = {"glm5": (64, 576, 512, 2048, False), "deepseek_v4": (64, 512, 512, 640, True)}
V4_WINDOW, V4_TOPK, V4_RATE = 128, 512, 4
START = time.time()


def gemm_rate():
    n = 8192
    a = torch.randn(n, n, dtype=BF, device="cuda")
    b = torch.randn(n, n, dtype=BF, device="cuda")
    ms = do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def glm_topk(S, K):
    """int32 [1, S, K] like the indexer's: for s >= K the K/2 most recent keys and K/2 spread evenly over the
    older ones (distinct); for s < K the keys 0..K-1 (0..s and future ones, which the causal mask removes)."""
    s = torch.arange(S, device="cuda").view(S, 1)
    j = torch.arange(K, device="cuda").view(1, K)
    half = K // 2
    recent = s - j[:, :half]
    spread = ((j[:, half:] - half) * (s - half)) // (K - half)
    idx = torch.where(s >= K, torch.cat([recent, spread], 1), j.expand(S, K))
    return idx.to(torch.int32).unsqueeze(0)


def v4_picks(S):
    """[S, V4_TOPK] compressed entries each query sees (spread over the ready ones; -1 where none)."""
    ready = ((torch.arange(S, device="cuda") + 1) // V4_RATE).view(S, 1)
    j = torch.arange(V4_TOPK, device="cuda").view(1, V4_TOPK)
    c = torch.where(ready > V4_TOPK, (j * ready) // V4_TOPK, j)
    return torch.where(c < ready, c, torch.full_like(c, -1))


def v4_indices(S):
    """int32 [1, S, 640]: the 128-token window and the compressed entries (kv rows S + c)."""
    s = torch.arange(S, device="cuda").view(S, 1)
    w = s - torch.arange(V4_WINDOW, device="cuda").view(1, V4_WINDOW)
    w = torch.where(w >= 0, w, torch.full_like(w, -1))
    c = v4_picks(S)
    c = torch.where(c >= 0, c + S, c)
    return torch.cat([w, c], 1).to(torch.int32).unsqueeze(0)


def v4_mask(S):
    """Upstream's mask: the sliding-window causal mask (bf16 min) with the block bias (-inf but the picks)."""
    C = S // V4_RATE
    i = torch.arange(S, device="cuda").view(S, 1)
    j = torch.arange(S, device="cuda").view(1, S)
    sliding = torch.zeros(S, S, device="cuda", dtype=BF)
    sliding.masked_fill_((j > i) | (i - j >= V4_WINDOW), torch.finfo(BF).min)
    block = torch.full((S, C + 1), float("-inf"), device="cuda", dtype=BF)
    picks = v4_picks(S)
    block.scatter_(1, torch.where(picks >= 0, picks, C), 0.0)
    mask = torch.cat([sliding, block[:, :C]], 1)
    del sliding, block
    return mask.view(1, 1, S, S + C)


def timings(call, graph=True):
    """(device ms from a CUDA graph, user-path ms from events, peak extra GiB) of call()."""
    call()
    torch.cuda.synchronize()
    dev = float("nan")
    if graph:
        try:
            dev = do_bench_cudagraph(call, rep=30, return_mode="median")
        except Exception as exc:  # noqa: BLE001
            print(f"    (no CUDA graph: {type(exc).__name__}: {str(exc)[:160]})")
    user = do_bench(call, warmup=1, rep=30, return_mode="median")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return dev, user, (torch.cuda.max_memory_allocated() - base) / 2**30


def once(call):
    """User-path ms of one call after one warm-up call (the dense peers take seconds)."""
    call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end), (torch.cuda.max_memory_allocated() - base) / 2**30


def sha256(t):
    """The first 16 hex digits of the SHA-256 of a tensor's bytes (bitwise comparisons across builds)."""
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def kernel_rows(model, S, rate, lines, profiles=None, hashes=None):
    H, D, dv, K, with_sinks = MODELS[model]
    T = S + S // V4_RATE if model == "deepseek_v4" else S
    torch.manual_seed(0)
    q = torch.randn(1, S, H, D, device="cuda", dtype=BF).requires_grad_(True)
    kv = torch.randn(1, T, D, device="cuda", dtype=BF).requires_grad_(True)
    sinks = torch.randn(H, device="cuda").requires_grad_(True) if with_sinks else None
    idx = v4_indices(S) if model == "deepseek_v4" else glm_topk(S, K)
    valid = int((idx >= 0).sum())
    fwd_flops = 2 * valid * H * (D + dv)
    dout = torch.randn(1, S, H, dv, device="cuda", dtype=BF)
    leaves = [x for x in (q, kv, sinks) if x is not None]

    for mode in ("fwd", "fwdbwd"):

        def call():
            for x in leaves:
                x.grad = None
            out, _ = SA.sparse_mqa_attention(q, kv, idx, sinks, D**-0.5, dv)
            if mode == "fwdbwd":
                out.backward(dout)

        dev, user, peak = timings(call)
        flops = fwd_flops * (1 if mode == "fwd" else 3)
        frac = 100 * flops / rate / (dev * 1e-3) if dev == dev else float("nan")
        lines.append(
            f"| {model} kernel | {S} | {mode} | opslot cuda | {dev:.2f} | {user:.2f} | {frac:.0f} % | {peak:.1f} |"
        )
        print(lines[-1], flush=True)
        if profiles is not None and mode == "fwdbwd":
            BK.kernel_breakdown(f"{model} kernel, {S} tokens, forward + backward", call, profiles, reps=3)
        if hashes is not None and mode == "fwdbwd":
            for x in leaves:
                x.grad = None
            out, lse = SA.sparse_mqa_attention(q, kv, idx, sinks, D**-0.5, dv)
            out.backward(dout)
            named = [("out", out), ("lse", lse), ("dq", q.grad), ("dkv", kv.grad)]
            named += [("dsinks", sinks.grad)] if sinks is not None else []
            digests = ", ".join(f"{n} {sha256(t)}" for n, t in named)
            hashes.append(f"- {model} kernel, {S} tokens (seed 0): {digests}")
            print(hashes[-1], flush=True)


def glm_attention():
    from transformers import GlmMoeDsaConfig
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as M

    config = GlmMoeDsaConfig(num_hidden_layers=1, hidden_size=1024, q_lora_rank=256)  # GLM-5's attention dims
    with torch.device("cuda"):
        attn = M.GlmMoeDsaAttention(config, 0).to(BF)
    attn.train()
    return M, attn


def glm_dense(M, attn, impl):
    """Upstream's GlmMoeDsaAttention.forward from the latents on (no cache), with attention `impl`."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def fn(q_pass, q_rot, k_pass, k_rot, topk, mask):
        B, _, S, _ = q_pass.shape
        query = torch.cat((q_pass, q_rot), dim=-1)
        key, value = attn.expand_kv(k_pass, k_rot)
        index_mask = topk.new_ones((B, S, key.shape[2]), dtype=torch.bool).scatter(-1, topk.long(), False)
        mask = mask.masked_fill(index_mask.unsqueeze(1), torch.finfo(q_pass.dtype).min)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(impl, M.eager_attention_forward)
        attn.config._attn_implementation = impl
        return interface(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling)[0]

    return fn


def v4_dense(module):
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

    def fn(q, kv, mask):
        return M.eager_attention_forward(module, q, kv, kv, mask, scaling=512**-0.5, dropout=0.0)[0]

    return fn


def slot_rows(model, S, lines, budget, compile_peers):
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    torch.manual_seed(0)
    peers = []
    if model == "glm5":
        M, attn = glm_attention()
        H = attn.num_heads
        mk = lambda *s: torch.randn(*s, device="cuda", dtype=BF)  # noqa: E731
        xs = [mk(1, H, S, 192), mk(1, H, S, 64), mk(1, 1, S, 512), mk(1, 1, S, 64)]
        topk = glm_topk(S, 2048)
        causal = torch.full((S, S), torch.finfo(BF).min, device="cuda", dtype=BF).triu_(1).view(1, 1, S, S)
        extra = [topk, causal]
        peers.append(("opslot cuda", lambda *a: SA.dsa_attention_glm(attn, *a)[0]))
        peers.append(("upstream sdpa", glm_dense(M, attn, "sdpa")))
        peers.append(("upstream eager", glm_dense(M, attn, "eager")))
        if compile_peers:
            peers.append(("torch.compile(upstream sdpa)", torch.compile(glm_dense(M, attn, "sdpa"), dynamic=False)))
        params = [attn.kv_b_proj.weight]
    else:
        H = 64
        sinks = torch.nn.Parameter(torch.randn(H, device="cuda", dtype=BF))
        module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=H, training=True, config=None)
        module.compressor = types.SimpleNamespace(indexer=types.SimpleNamespace(index_topk=V4_TOPK))
        T = S + S // V4_RATE
        xs = [torch.randn(1, H, S, 512, device="cuda", dtype=BF), torch.randn(1, 1, T, 512, device="cuda", dtype=BF)]
        extra = [v4_mask(S)]
        kw = dict(dropout=0.0, scaling=512**-0.5, sliding_window=V4_WINDOW, s_aux=sinks)
        peers.append(("opslot cuda", lambda q, kv, m: SA.dsa_attention_deepseek_v4(module, q, kv, m, **kw)[0]))
        peers.append(("upstream eager", v4_dense(module)))
        if compile_peers:
            peers.append(("torch.compile(upstream eager)", torch.compile(v4_dense(module), dynamic=False)))
        params = [sinks]
    leaves = [x.requires_grad_(True) for x in xs] + params
    T = extra[-1].shape[-1]
    scores_gib = 64 * S * T * 2 / 2**30  # the dense path's [1, 64, S, T] bf16 scores, one copy
    for label, fn in peers:
        if time.time() - START > budget:
            lines.append(f"| {model} slot | {S} | fwdbwd | {label} | skipped (time budget) | | | |")
            print(lines[-1], flush=True)
            continue
        if label.startswith("torch.compile") and "eager" in label and scores_gib > total_gib:
            lines.append(
                f"| {model} slot | {S} | fwdbwd | {label} | not run: one copy of the scores is {scores_gib:.0f} GiB "
                f"(GPU {total_gib:.0f} GiB) | | | |"
            )
            print(lines[-1], flush=True)
            continue

        def call():
            for x in leaves:
                x.grad = None
            out = fn(*xs, *extra)
            out.backward(torch.ones_like(out))

        try:
            if label == "opslot cuda":
                dev, user, peak = timings(call)
            else:
                dev, (user, peak) = float("nan"), once(call)
        except torch.cuda.OutOfMemoryError:
            lines.append(f"| {model} slot | {S} | fwdbwd | {label} | OOM | OOM | | |")
        except Exception as exc:  # noqa: BLE001
            lines.append(
                f"| {model} slot | {S} | fwdbwd | {label} | failed: {type(exc).__name__}: {str(exc)[:90]} | | | |"
            )
        else:
            lines.append(f"| {model} slot | {S} | fwdbwd | {label} | {dev:.1f} | {user:.1f} | | {peak:.1f} |")
        print(lines[-1], flush=True)
        for x in leaves:
            x.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--contexts", default="16384,65536")
    ap.add_argument("--models", default="glm5,deepseek_v4")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip the slot rows that start after this")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-slot", action="store_true", help="only the kernel rows")
    ap.add_argument("--profile", action="store_true", help="list the kernels of each kernel row's fwd+bwd")
    ap.add_argument(
        "--hashes", action="store_true", help="SHA-256 of each kernel row's outputs and gradients (compare builds)"
    )
    ap.add_argument(
        "--tuning",
        "--mma-sync",
        type=int,
        default=None,
        help="run on the bench library with opslot_sparse_mqa_set_tuning(N) (the rows say so): bit 0 the mma.sync "
        "forward, bit 1 the mma.sync backward where the wgmma ones apply",
    )
    args = ap.parse_args()
    if args.tuning is not None:
        import contextlib
        import ctypes

        from opslot.kernels.cuda import _lib

        with contextlib.ExitStack() as stack:
            lib = stack.enter_context(_lib.using_library(_lib.bench_library_path()))
            lib.opslot_sparse_mqa_set_tuning.argtypes = [ctypes.c_int]
            if lib.opslot_sparse_mqa_set_tuning(args.tuning) != 0:
                ap.error(f"--tuning {args.tuning}: the bench library refused it (0 to 3)")
            try:
                return run(args, f"bench library, opslot_sparse_mqa_set_tuning({args.tuning})")
            finally:
                lib.opslot_sparse_mqa_set_tuning(0)
    return run(args, None)


def run(args, library):
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown --models {', '.join(unknown)} (known: {', '.join(MODELS)})")
    rate = gemm_rate()
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; bf16 GEMM 8192^3 measured {rate / 1e12:.0f} TFLOP/s (the bound); "
        "batch 1, bf16" + (f"; kernels: {library}" if library else ""),
        "",
        "| what | context | pass | impl | device ms (graph) | user ms (events) | % of tensor-core bound | peak extra GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    contexts = [int(c) for c in args.contexts.split(",")]
    models = args.models.split(",")
    profiles = [] if args.profile else None
    hashes = [] if args.hashes else None
    if args.profile:
        lines[0] += f"; copy bandwidth measured {BK.copy_bandwidth() / 1e12:.2f} TB/s"
    for model in models:
        for S in contexts:
            kernel_rows(model, S, rate, lines, profiles, hashes)
            torch.cuda.empty_cache()
    if not args.no_slot:
        for S in contexts:
            for model in models:
                slot_rows(model, S, lines, args.budget_s, not args.no_compile)
    text = "\n".join(lines + ([""] + hashes if hashes else []) + ([""] + profiles if profiles else []))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
