"""Benchmark of DeepSeek-V4's memory-bound ops on opslot's CUDA kernels (issue #35): the hyper-
connections `mhc/pre`, `mhc/post`, `mhc/head` and the clamped SiLU-mul of `swiglu_mlp/clamped`,
against Transformers' eager modules and torch.compile of them, forward + backward, bf16, in one run
on one GPU. Per row: the device time of one call replayed from a CUDA graph (triton's
do_bench_cudagraph: what the GPU spends), the user path (CUDA events around calls issued from
Python, triton's do_bench: what a training step sees, host included), and the fraction of the
device-to-device copy bandwidth measured in the same run, for the fewest bytes the op must move
(each input read once, each output written once; the per-token fp32 vectors and the parameters are
left out, under 1 %).

    python3 bench/mhc.py --out $OUT/mhc_h200.md [--compile pre,post] [--quick] [--only pre,post,head,silu,rope,qnorm] [--tune]

`--only rope` (not in the default list): DeepSeek-V4's `apply_rotary_pos_emb` (slot rotary_pos_emb,
variant deepseek_v4) as the attention calls it on q and on the output (q [2, 4096, 64, 512] seen as
[B, H, S, D], the rope slice the last 64 features; cos/sin of the model's rotary embedding): upstream
eager, torch.compile of it and opslot's cuda kernel, fwd+bwd, against 8 bytes per element (x read and
out written forward, the gradient read and written backward).

`--only gemm` (not in the default list): the forward's GEMM of pre and head alone, x against 12 to 96
rows of fn's bf16 terms (torch.mm, fp32 out), against x's bytes.

`--only qnorm` (not in the default list): DeepSeek-V4's q_b_norm, `DeepseekV4UnweightedRMSNorm` (slot
rms_norm, variant unweighted_cast) on the same q view, its result transposed back as the attention
reads it (the gradient then has the model's layout): upstream eager, torch.compile of it and opslot's
cuda kernel, fwd+bwd, against 10 bytes per element (x read and y written forward; x, the gradient read
and dx written backward).

--tune also times, on the bench library (opslot_mhc_set_tuning), the forward with the rows held in
registers (blocks up to 128 / 256 threads; the default reads them twice) and the dx configurations of
the backward (DX_VARIANTS; with --profile, each one's kernel list); --fwd-threads N,.. also the forward
with collapse_fwd's blocks of N threads (opslot_mhc_collapse_set_tuning); --forms C:B,.. also the op with
collapse_fwd's form C and the comb kernels' form B (opslot_mhc_forms_set_tuning: COLLAPSE_FORMS,
COMB_FORMS).

Bytes per token (bf16, hc = 4 streams of hidden D; T tokens):
  pre / head, fwd + bwd: x read forward and backward (2 x 8D), collapsed written (2D), its gradient
      read (2D), dx written (8D): 28 D bytes
  post, fwd + bwd: block output 2D + streams 8D read, out 8D written; gradient 8D, block output 2D,
      streams 8D read, their gradients 2D + 8D written: 46 D bytes
  SiLU-mul: 16 bytes per element (gate, up read twice, h written, grad read, two gradients written)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "runtime"))
sys.path.insert(0, BENCH)

from triton.testing import do_bench  # noqa: E402

import kernels as K  # noqa: E402  (bench/kernels.py: copy bandwidth, timing, tables)
from opslot.kernels.cuda import mhc as CM, norms as CN, rope as CR, swiglu as CS  # noqa: E402

BF = torch.bfloat16
DEV = "cuda"


def user_ms(fn):
    """Median time of one call issued from Python, CUDA events (the user path)."""
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def measure(name, make, nbytes):
    """(name, device ms, user ms, nbytes) of fwd+bwd callable `make()`; failures are reported."""
    try:
        run = make()
        run()
        dev, mark = K.bench_ms(run)
        usr = user_ms(run)
        return (name, dev, mark, usr, nbytes)
    except Exception as exc:  # noqa: BLE001
        print(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        return (name + " (failed)", float("nan"), "", float("nan"), nbytes)


def table(title, copy_bw, rows, note=""):
    lines = [f"### {title}", ""]
    lines.append("| implementation | device ms (CUDA graph) | % of copy BW | user path ms (CUDA events) |")
    lines.append("|---|---:|---:|---:|")
    for name, dev, mark, usr, nbytes in rows:
        frac = f"{100 * nbytes / (dev * 1e-3) / copy_bw:.1f}" if dev == dev else "-"
        lines.append(f"| {name} | {dev:.4f}{mark} | {frac} | {usr:.4f} |")
    if note:
        lines += ["", note]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text


def _config(hidden, hc=4):
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    return DeepseekV4Config(hidden_size=hidden, hc_mult=hc, hc_sinkhorn_iters=20, rms_norm_eps=1e-6)


def _init(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in ("fn", "hc_fn"):
                p.copy_(torch.randn(p.shape) / p.shape[1] ** 0.5)
            elif name in ("base", "hc_base"):
                p.copy_(torch.randn(p.shape) * 0.5)
            else:
                p.copy_(1 + torch.rand(p.shape))
    return module.to(DEV)  # parameters stay fp32 (the model keeps the hc modules in fp32)


def streams(T, D, hc=4):
    return (torch.randn(1, T, hc, D, device=DEV) * 2).to(BF).requires_grad_(True)


#: The bench library's dx configurations (opslot_mhc_set_tuning's dx_version; kernels/src/mhc.cu
#: launch_dx_variant): columns per thread x threads, tokens per tile, loads of the next 8 tokens
#: issued before the current ones are computed (prefetch) or not. 2 to 12 run the CUDA-core dx and the
#: d fn GEMM (version 11: the production backward where the fused dx + d fn kernel does not fit); the
#: default row runs the fused kernel (opslot_mhc_dx_dfn: a 3-deep ring, 2 blocks per SM), 13 and 14
#: other rings of it.
DX_VARIANTS = {
    2: "2 cols x 256 thr, 256 tok, no prefetch",
    3: "2 cols x 256 thr, 256 tok",
    4: "2 cols x 512 thr, 256 tok",
    5: "2 cols x 256 thr, 64 tok",
    6: "4 cols x 256 thr, 256 tok",
    7: "16 B x 256 thr, 256 tok",
    8: "2 cols x 256 thr, 256 tok, 3 blocks/SM",
    9: "16 B x 256 thr, 256 tok, 3 blocks/SM",
    10: "2 cols x 256 thr, 128 tok, cp.async ring",
    11: "4 cols x 256 thr, 128 tok, cp.async ring",
    12: "2 cols x 256 thr, 128 tok, cp.async ring, 3 blocks/SM",
    13: "fused dx + d fn (mma.sync), 2-deep ring",
    14: "fused dx + d fn (mma.sync), 4-deep ring",
    15: "fused dx + d fn (mma.sync), 3-deep ring",
    16: "fused dx + d fn (wgmma), 1 warpgroup, 2-deep ring, 3 blocks/SM",
    17: "fused dx + d fn (wgmma), 1 warpgroup, 3-deep ring, 2 blocks/SM",
}


#: The bench library's forms of the token kernels (opslot_mhc_forms_set_tuning; 0: production's).
COLLAPSE_FORMS = {0: "production", 1: "a block a token", 2: "pipelined blocks"}
COMB_FORMS = {0: "production", 1: "a thread a token", 2: "a lane an entry"}


def _collapse_rows(copy_bw, args, out, head):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead

    what = "head" if head else "pre"
    for D in args.hidden:
        T = args.tokens
        m = _init((DeepseekV4HyperHead if head else DeepseekV4HyperConnection)(_config(D)))
        x = streams(T, D)
        nbytes = 28 * D * T
        ours = (lambda t: CM.mhc_head(m, t)) if head else (lambda t: CM.mhc_pre(m, t))
        impls = [("Transformers eager", lambda t: m(t))]
        if what in args.compile and D == args.hidden[0]:
            impls.append(("torch.compile(eager)", torch.compile(lambda t: m(t))))
        impls.append(("opslot cuda", ours))
        params = tuple(m.parameters())  # fp32 fn/base/scale: their gradients are part of the backward
        ins = (x,) + params

        def fb(f):
            return K.fwd_bwd(lambda t, *p: f(t), ins)

        rows = [measure(n, lambda f=f: fb(f), nbytes) for n, f in impls]
        xd = x.detach()
        with torch.no_grad():
            rows.append(measure("opslot cuda, forward only (10 D B/token)", lambda: lambda: ours(xd), 10 * D * T))

        def knob_rows(name, forward=True):
            """The op fwd+bwd as a bench knob has set it and, with `forward`, its forward alone."""
            rows.append(measure(f"opslot cuda [{name}]", lambda: fb(ours), nbytes))
            if forward:
                with torch.no_grad():
                    rows.append(measure(f"opslot cuda, forward only [{name}]", lambda: lambda: ours(xd), 10 * D * T))

        if args.tune:  # bench library knobs: the forward's row held in registers; the tiled dx kernel
            with K.bench_library("mhc --tune") as lib:
                if lib is not None:
                    set_tuning = K.knob(lib, "opslot_mhc_set_tuning", 2)
                    try:
                        for hold, dxv, name in (
                            (128, 1, "rows held up to 128 threads"),
                            (256, 1, "rows held up to 256 threads"),
                        ) + tuple((0, v, f"dx {v}: {DX_VARIANTS[v]}") for v in args.dx_versions):
                            set_tuning(hold, dxv)
                            knob_rows(name, forward=dxv == 1)
                            if dxv != 1 and args.profile:
                                K.kernel_breakdown(f"mhc/{what} {T}x4x{D} [{name}]", fb(ours), out)
                        set_tuning(0, 1)
                        fwd_threads = K.knob(lib, "opslot_mhc_collapse_set_tuning", 1)
                        for n in args.fwd_threads:
                            fwd_threads(n)
                            knob_rows(f"forward collapse {n} threads")
                        fwd_threads(0)
                        forms = K.knob(lib, "opslot_mhc_forms_set_tuning", 2) if args.forms else None
                        try:
                            for cf, cb in args.forms:
                                forms(cf, cb)
                                name = f"collapse_fwd {COLLAPSE_FORMS[cf]}, comb {COMB_FORMS[cb]}"
                                knob_rows(name)
                                if args.profile:
                                    K.kernel_breakdown(f"mhc/{what} {T}x4x{D} [{name}]", fb(ours), out)
                        finally:
                            if forms is not None:
                                forms(0, 0)
                    finally:
                        set_tuning(0, 1)
        if args.profile:
            K.kernel_breakdown(f"mhc/{what} {T}x4x{D}", fb(ours), out)
        out.append(
            table(
                f"mhc/{what}: {T} tokens x 4 streams x {D}, bf16, fwd+bwd — 28 D bytes/token",
                copy_bw,
                rows,
                "The forward's fp32 GEMM against fn is cuBLAS (one bf16 GEMM against fn split into three bf16 "
                "terms, fp32 output); the backward's dx and d fn are one tensor-core pass (opslot_mhc_dx_dfn; "
                "the [dx n] rows: the CUDA-core dx and a d fn GEMM). The kernels read the streams twice "
                "forward and twice backward (docs/kernels.md '## mhc').",
            )
        )


def bench_pre(copy_bw, args, out):
    _collapse_rows(copy_bw, args, out, head=False)


def bench_head(copy_bw, args, out):
    _collapse_rows(copy_bw, args, out, head=True)


def upstream_post(post, comb, block_output, hidden_states):
    dtype = hidden_states.dtype
    return post.to(dtype).unsqueeze(-1) * block_output.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), hidden_states
    )


def bench_post(copy_bw, args, out):
    for D in args.hidden:
        T = args.tokens
        post = (torch.rand(1, T, 4, device=DEV) * 2).requires_grad_(True)
        comb = torch.rand(1, T, 4, 4, device=DEV).requires_grad_(True)
        bo = torch.randn(1, T, D, device=DEV).to(BF).requires_grad_(True)
        h = torch.randn(1, T, 4, D, device=DEV).to(BF).requires_grad_(True)
        ins = (post, comb, bo, h)
        impls = [("upstream eager", upstream_post)]
        if "post" in args.compile and D == args.hidden[0]:
            impls.append(("torch.compile(eager)", torch.compile(upstream_post)))
        impls.append(("opslot cuda", CM.mhc_post))
        rows = [measure(n, lambda f=f: K.fwd_bwd(f, ins), 46 * D * T) for n, f in impls]
        det = tuple(t.detach() for t in ins)
        with torch.no_grad():
            rows.append(
                measure("opslot cuda, forward only (18 D B/token)", lambda: lambda: CM.mhc_post(*det), 18 * D * T)
            )
        if args.profile:
            K.kernel_breakdown(f"mhc/post {T}x4x{D}", K.fwd_bwd(CM.mhc_post, ins), out)
        out.append(table(f"mhc/post: {T} tokens x 4 streams x {D}, bf16, fwd+bwd — 46 D bytes/token", copy_bw, rows))


def bench_silu(copy_bw, args, out):
    N, D = (args.tokens, 12288) if not args.quick else (4096, 12288)
    a, b = K.leaf(N, D, scale=3.0), K.leaf(N, D)
    L = 10.0  # DeepSeek-V4's swiglu_limit

    def eager(a, b):
        return F.silu(a.clamp(max=L)) * b.clamp(min=-L, max=L)

    impls = [("upstream eager (silu(a.clamp) * b.clamp)", eager)]
    if "silu" in args.compile:
        impls.append(("torch.compile(eager)", torch.compile(eager)))
    impls += [
        ("opslot cuda clamped", lambda a, b: torch.ops.opslot.silu_mul_clamped(a, b, L)),
        ("opslot cuda unclamped (silu_mul, same run)", lambda a, b: torch.ops.opslot.silu_mul(a, b)),
    ]
    rows = [measure(n, lambda f=f: K.fwd_bwd(f, (a, b)), 16 * N * D) for n, f in impls]
    ad, bd = a.detach(), b.detach()
    rows.append(
        measure(
            "opslot cuda clamped, forward only (6 B/element)", lambda: lambda: CS.silu_mul_clamped(ad, bd, L), 6 * N * D
        )
    )
    rows.append(
        measure("opslot cuda unclamped, forward only", lambda: lambda: torch.ops.opslot.silu_mul(ad, bd), 6 * N * D)
    )
    out.append(table(f"clamped SiLU·mul {N}x{D} bf16, limit {L} — 16 B/element", copy_bw, rows))


def eager_against_ours(key, x, eager, ours, names, nbytes, copy_bw, args, out, title, extra=()):
    """One op on `x`, fwd+bwd: upstream's `eager`, its torch.compile (when `key` is in --compile) and
    opslot's `ours` (names[0] / names[1] in the rows and the profile), then the `extra` rows; with
    --profile the kernels of both calls first; the table titled `title` appended to `out`."""
    impls = [(f"upstream eager ({names[0]})", eager)]
    if key in args.compile:
        impls.append(("torch.compile(eager)", torch.compile(eager)))
    impls.append(("opslot cuda", ours))
    rows = [measure(n, lambda f=f: K.fwd_bwd(f, (x,)), nbytes) for n, f in impls] + list(extra)
    if args.profile:
        shape = "x".join(str(n) for n in x.shape)
        K.kernel_breakdown(f"upstream {names[0]} {shape}", K.fwd_bwd(eager, (x,)), out)
        K.kernel_breakdown(f"opslot {names[1]} {shape}", K.fwd_bwd(ours, (x,)), out)
    out.append(table(title, copy_bw, rows))


def bench_rope(copy_bw, args, out):
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as up

    B, S, H, D, RD = (2, 4096, 64, 512, 64) if not args.quick else (1, 1024, 64, 512, 64)
    x = K.leaf(B, S, H, D)
    config = up.DeepseekV4Config()
    rotary = up.DeepseekV4RotaryEmbedding(config).to(DEV)
    pos = torch.arange(S, device=DEV).expand(B, S)
    cos, sin = rotary(x, position_ids=pos, layer_type="main")
    if 2 * cos.shape[-1] != RD:
        raise RuntimeError(f"rope dim {2 * cos.shape[-1]}, expected {RD}")

    def eager(x):  # as the attention calls it: [B, S, H, D] memory seen as [B, H, S, D]
        return up.apply_rotary_pos_emb(x.transpose(1, 2), cos, sin)

    def ours(x):
        return CR.rotary_pos_emb_deepseek_v4(x.transpose(1, 2), cos, sin)

    xd = x.detach()
    copy = measure(
        "copy of x forward + backward (x.clone() twice)", lambda: lambda: (xd.clone(), xd.clone()), 8 * x.numel()
    )
    title = f"DeepSeek-V4 RoPE: {B}x{S}x{H}x{D}, rope on the last {RD}, bf16, fwd+bwd — 8 B/element"
    names = ("apply_rotary_pos_emb", "rotary_pos_emb/deepseek_v4")
    eager_against_ours("rope", x, eager, ours, names, 8 * x.numel(), copy_bw, args, out, title, [copy])


def bench_qnorm(copy_bw, args, out):
    """DeepSeek-V4's q_b_norm (`DeepseekV4UnweightedRMSNorm`) on q as the attention passes it."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as up

    B, S, H, D = (2, 4096, 64, 512) if not args.quick else (1, 1024, 64, 512)
    x = K.leaf(B, S, H, D)
    norm = up.DeepseekV4UnweightedRMSNorm(eps=1e-6)

    # q: [B, S, H, D] memory seen as [B, H, S, D]; the result as the attention reads it, transposed
    # back (so its gradient has the layout the model's gives it, not a contiguous [B, H, S, D] one)
    def eager(x):
        return norm(x.transpose(1, 2)).transpose(1, 2)

    def ours(x):
        return CN.rms_norm_unweighted_cast(x.transpose(1, 2), None, 1e-6).transpose(1, 2)

    title = f"DeepSeek-V4 q_b_norm: {B}x{S}x{H}x{D}, bf16, fwd+bwd — 10 B/element (x, y; x, dy, dx)"
    names = ("DeepseekV4UnweightedRMSNorm", "rms_norm/unweighted_cast")
    eager_against_ours("qnorm", x, eager, ours, names, 10 * x.numel(), copy_bw, args, out, title)


def bench_gemm(copy_bw, args, out):
    """The forward's GEMM of pre and head alone: x [T, 4 D] bf16 against N rows of fn's bf16 terms,
    fp32 out (cuBLAS through torch.mm), for N from head's 12 to pre's 72 and past: the rows count
    decides cuBLAS's kernel."""
    T = args.tokens
    for D in args.hidden:
        x = torch.randn(T, 4 * D, device="cuda").to(torch.bfloat16)
        rows = []
        for n in (12, 16, 24, 32, 48, 72, 96):
            w = torch.randn(n, 4 * D, device="cuda").to(torch.bfloat16)
            rows.append(
                measure(
                    f"x @ w^T, w {n} rows",
                    lambda w=w: lambda: torch.mm(x, w.t(), out_dtype=torch.float32),
                    x.numel() * 2,
                )
            )
        out.append(
            table(
                f"the forward GEMM: x {T} x {4 * D} bf16 against N rows, fp32 out — x's bytes",
                copy_bw,
                rows,
                "mhc's forward pads fn's terms to at least 16 rows (head: 12 -> 16).",
            )
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--compile", default="pre,post,head,silu,rope,qnorm", help="ops with a torch.compile row (first hidden size)"
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", action="store_true", help="list the kernels of one opslot call (torch.profiler)")
    ap.add_argument("--only", default="pre,post,head,silu", help="of pre, post, head, silu, rope, qnorm, gemm")
    ap.add_argument("--tune", action="store_true", help="also time the knob variants (bench library)")
    ap.add_argument(
        "--dx-versions",
        type=lambda v: [int(i) for i in v.split(",")],
        default=sorted(DX_VARIANTS),
        help="with --tune: the dx versions to time (default: all of DX_VARIANTS)",
    )
    ap.add_argument(
        "--fwd-threads",
        type=lambda v: [int(i) for i in v.split(",") if i],
        default=[],
        help="with --tune: collapse_fwd block sizes to time (opslot_mhc_collapse_set_tuning)",
    )
    ap.add_argument(
        "--forms",
        type=lambda v: [tuple(int(i) for i in f.split(":")) for f in v.split(",") if f],
        default=[],
        help="with --tune: collapse_fwd:comb form pairs to time (opslot_mhc_forms_set_tuning), e.g. 1:1,2:2",
    )
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", default="4096,7168")
    args = ap.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",")]
    if any(v not in DX_VARIANTS for v in args.dx_versions):
        ap.error(f"--dx-versions: each of {sorted(DX_VARIANTS)}")
    if any(len(f) != 2 or f[0] not in COLLAPSE_FORMS or f[1] not in COMB_FORMS for f in args.forms):
        ap.error("--forms: pairs collapse:comb of 0, 1 or 2")
    args.compile = args.compile.split(",") if args.compile else []
    if args.quick:
        args.tokens, args.hidden = 4096, args.hidden[:1]
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # upstream's fp32 GEMM as it runs by default
    bw = K.copy_bandwidth()
    head = (
        f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; device-to-device copy "
        f"{bw / 1e12:.2f} TB/s (bytes read + written, 2 GiB bf16 copy, median)\n\n{K.libraries_line()}\n"
    )
    print(head, flush=True)
    out = [head]
    steps = {
        "pre": bench_pre,
        "post": bench_post,
        "head": bench_head,
        "silu": bench_silu,
        "rope": bench_rope,
        "qnorm": bench_qnorm,
        "gemm": bench_gemm,
    }
    for key in args.only.split(","):
        steps[key](bw, args, out)
        torch.cuda.empty_cache()
        if args.out:
            with open(args.out, "w") as fh:
                fh.write("\n".join(out))


if __name__ == "__main__":
    main()
