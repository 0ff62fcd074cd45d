#!/usr/bin/env python3
"""MoE experts layer, forward + backward on one GPU: opslot `cuda` vs upstream and Liger.

Per shape (Qwen3-30B-A3B, a Qwen3.5-MoE-like layer, GPT-OSS-20B) and token count it times one
experts layer forward + backward (gradients of hidden states, routing weights and all expert
parameters; median of CUDA-event timings after warm-up) for:

  upstream eager         Transformers' per-expert loop (config._experts_implementation="eager"), 4k only
  upstream grouped_mm    Transformers' experts_implementation="grouped_mm" (torch._grouped_mm)
  liger                  Liger LigerExperts (standard layout only; GPT-OSS's biases/interleaving: n/a)
  opslot torch           opslot's portable `torch` kernel (sorted per-expert matmuls), 4k only
  opslot cuda            opslot's `cuda` kernel (this repository's kernels/src/moe.cu + torch._grouped_mm)

TFLOP/s counts the six expert GEMMs of forward + backward (18 * tokens * top_k * H * I). In the same
run it measures dense bf16 GEMMs (8192^3 and the layer's gate-up shape without grouping) as the
ceiling, opslot cuda's stages (routing, gather, GEMM1, act, GEMM2, combine and their backwards), and
the max difference of opslot cuda's output against upstream grouped_mm. Writes moe_bench.md/json and
moe_stages.md to --out. Sections run in priority order (16k first) so a time limit keeps the main
numbers. Usage:

    OPSLOT_KERNELS_LIB=... python3 bench/moe.py --out results/ [--tokens 16384,4096,65536]
"""

import argparse
import json
import os
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
from opslot.kernels import torch_ops  # noqa: E402
from opslot.kernels.cuda import moe  # noqa: E402

MODELS = [
    # name, variant, experts, top_k, hidden, expert width
    ("Qwen3-30B-A3B", "standard", 128, 8, 2048, 768),
    ("GPT-OSS-20B", "gpt_oss", 32, 4, 2880, 2880),
    ("Qwen3.5-MoE (35B-A3B-like)", "standard", 256, 8, 2048, 512),
]


def timed(fn, reps=20, warmup=2, budget_ms=800.0):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = (time.perf_counter() - t0) * 1e3
    reps = max(3, min(reps, int(budget_ms / max(one, 1e-3))))
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def make_layer(variant, E, K, H, I):  # noqa: E741  (I: the intermediate size)
    if variant == "standard":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K)
        with torch.device("cuda"):
            mod = Qwen3MoeExperts(cfg)
    else:
        from transformers import GptOssConfig
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

        cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K)
        with torch.device("cuda"):
            mod = GptOssExperts(cfg)
    mod.config = cfg
    mod.to(torch.bfloat16)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0, 0.02)
    return mod


def make_inputs(T, E, K, H, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, H, device="cuda", generator=g, dtype=torch.bfloat16)
    logits = torch.randn(T, E, device="cuda", generator=g)
    top, idx = torch.topk(torch.softmax(logits, -1), K, dim=-1)
    w = (top / top.sum(-1, keepdim=True)).to(torch.bfloat16)
    return x, idx, w


def impls(variant, mod, E, K, H, I):  # noqa: E741  (I: the intermediate size)
    out = {}

    def upstream(kind):
        def f(x, idx, w):
            mod.config._experts_implementation = kind
            return mod(x, idx, w)

        return f

    out["upstream eager"] = upstream("eager")
    out["upstream grouped_mm"] = upstream("grouped_mm")
    if variant == "standard":
        try:
            from liger_kernel.transformers.swiglu import LigerExperts

            lcfg = types.SimpleNamespace(num_experts=E, moe_intermediate_size=I, hidden_size=H, hidden_act="silu")
            with torch.device("cuda"):
                lig = LigerExperts(lcfg)
            lig.gate_up_proj, lig.down_proj = mod.gate_up_proj, mod.down_proj
            out["liger"] = lambda x, idx, w: lig(x, idx, w)
            if os.environ.get("LIGER_FUSED_MOE_AUTOTUNE", "1").lower() in ("0", "false", "no"):
                out["liger"].note = "Triton autotune off (one fixed config)"
        except Exception as exc:  # reported in the table
            out["liger"] = f"n/a ({type(exc).__name__}: {exc})"
    else:
        out["liger"] = "n/a (LigerExperts has no biases / interleaved clamped SwiGLU)"
    if variant == "standard":
        out["opslot torch"] = lambda x, idx, w: torch_ops.moe_standard(mod, x, idx, w)
        out["opslot cuda"] = lambda x, idx, w: moe.moe_standard(mod, x, idx, w)
    else:
        out["opslot torch"] = lambda x, idx, w: torch_ops.moe_gpt_oss(mod, x, idx, w)
        out["opslot cuda"] = lambda x, idx, w: moe.moe_gpt_oss(mod, x, idx, w)
    return out


def fwd_bwd(fn, mod, x, idx, w, go):
    params = list(mod.parameters())
    xs = x.detach().requires_grad_(True)
    ws = w.detach().requires_grad_(True)

    def step():
        out = fn(xs, idx, ws)
        torch.autograd.grad(out, [xs, ws] + params, go, allow_unused=True)

    return step


def dense_ceiling(rows):
    res = {}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, reps=30)  # noqa: F821  (called before the del)
    res["dense bf16 GEMM 8192^3"] = (ms, 2 * 8192**3 / ms / 1e9)
    del a, b
    x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16)
    wt = torch.randn(1536, 2048, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: x @ wt.t(), reps=30)
    res[f"dense bf16 GEMM {rows}x2048x1536 (Qwen3 gate-up, no grouping)"] = (ms, 2 * rows * 2048 * 1536 / ms / 1e9)
    return res


def stages(variant, mod, x, idx, w):
    """Median ms of each piece of opslot cuda's forward and backward."""
    E = mod.num_experts
    K = idx.shape[1]
    T = x.shape[0]
    tr = variant == "standard"
    kind = moe.KIND_SILU if tr else moe.KIND_GPT_OSS
    b1 = None if tr else mod.gate_up_proj_bias
    b2 = None if tr else mod.down_proj_bias
    alpha = 0.0 if tr else float(mod.alpha)
    limit = 0.0 if tr else float(mod.limit)
    wf = w.float()
    r = moe.route(idx, E)
    xs = moe.moe_gather(x, r.inv, r.offs, K)
    h = moe.moe_grouped_mm(xs, mod.gate_up_proj, r.offs, tr)
    a = moe.moe_act(h, r.offs, r.row_expert, b1, kind, alpha, limit)
    y = moe.moe_grouped_mm(a, mod.down_proj, r.offs, tr)
    go = torch.randn(T, x.shape[1], device="cuda", dtype=x.dtype)
    ops = torch.ops.opslot
    dy = ops.moe_combine_backward(go, y, r.inv, r.offs, wf, r.row_expert, b2)[0]
    da = ops.moe_grouped_mm_backward(dy, a, mod.down_proj, r.offs, tr)[0]
    dh = ops.moe_act_backward(da, h, r.offs, r.row_expert, b1, kind, alpha, limit)[0]
    dxs = ops.moe_grouped_mm_backward(dh, xs, mod.gate_up_proj, r.offs, tr)[0]
    rows = {
        "routing kernel (opslot::moe_route)": lambda: moe.route(idx, E),
        "(for comparison: routing in torch ops, route_torch)": lambda: moe.route_torch(idx, E),
        "gather": lambda: ops.moe_gather(x, r.inv, r.offs, K),
        "GEMM1 gate-up": lambda: ops.moe_grouped_mm(xs, mod.gate_up_proj, r.offs, tr),
        "activation": lambda: ops.moe_act(h, r.offs, r.row_expert, b1, kind, alpha, limit),
        "GEMM2 down": lambda: ops.moe_grouped_mm(a, mod.down_proj, r.offs, tr),
        "combine (weighted gather-sum)": lambda: ops.moe_combine(y, r.inv, r.offs, wf, r.row_expert, b2),
        "bwd combine (scatter + weight grad)": lambda: ops.moe_combine_backward(
            go, y, r.inv, r.offs, wf, r.row_expert, b2
        ),
        "bwd GEMM2 (dgrad + wgrad)": lambda: ops.moe_grouped_mm_backward(dy, a, mod.down_proj, r.offs, tr),
        "bwd activation": lambda: ops.moe_act_backward(da, h, r.offs, r.row_expert, b1, kind, alpha, limit),
        "bwd GEMM1 (dgrad + wgrad)": lambda: ops.moe_grouped_mm_backward(dh, xs, mod.gate_up_proj, r.offs, tr),
        "bwd gather (gather-sum)": lambda: ops.moe_gather_backward(dxs, r.inv, r.offs, K),
    }
    return {name: timed(fn, reps=20) for name, fn in rows.items()}


def train_step(out_dir, batch=4, seq=4096, layers=2):
    """Tokens/s of a forward + backward training step (loss.backward(), no optimizer) of a 2-layer
    Qwen3-30B-A3B-shaped causal LM: upstream Transformers (default experts_implementation, i.e.
    grouped_mm) vs the generated module built by opslot.build_model with moe_implementation
    fused_cuda (other slots eager), both with the same weights. Needs
    generated/qwen3_moe/patched_modeling_qwen3_moe_gpu.py (`make generate`)."""
    import importlib.util

    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from opslot import build_model

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    path = os.path.join(root, "generated", "qwen3_moe", "patched_modeling_qwen3_moe_gpu.py")
    spec = importlib.util.spec_from_file_location("bench_patched_qwen3_moe_gpu", path)
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen
    spec.loader.exec_module(gen)
    cfg = Qwen3MoeConfig(
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=seq,
        norm_topk_prob=True,
    )
    import dataclasses

    from opslot import OpsImplementationConfig

    ops = {
        f.name: "eager"
        for f in dataclasses.fields(OpsImplementationConfig)
        if f.name.endswith("_implementation") and f.name != "attn_implementation"
    }
    ops["moe_implementation"] = "fused_cuda"  # every other slot explicitly eager: only the experts differ
    torch.manual_seed(0)
    with torch.device("cuda"):
        up = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
        op = build_model(cfg, ops=ops, module=gen, model_class="Qwen3MoeForCausalLM").to(torch.bfloat16)
    op.load_state_dict(up.state_dict())
    bound = sys.modules[type(op).__module__]
    info = {
        "upstream experts_implementation": up.config._experts_implementation,
        "opslot experts_implementation": op.config._experts_implementation,
        "opslot moe slot impl": bound.moe_slot.impl,
    }
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=g)
    calls = []
    orig_fn = bound.moe_slot._fn
    bound.moe_slot._fn = lambda *a, **k: (calls.append(1), orig_fn(*a, **k))[1]
    res = {}
    for name, model in (("upstream (grouped_mm experts)", up), ("opslot build_model, moe fused_cuda", op)):
        model.train()

        def step():
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            return loss

        loss = float(step().detach())
        ms = timed(step, reps=10, budget_ms=3000.0)
        res[name] = {"loss": loss, "ms": ms, "tokens_per_s": batch * seq / ms * 1e3}
        print(name, res[name], flush=True)
    info["opslot moe kernel calls"] = len(calls)
    lines = [
        f"2-layer Qwen3-30B-A3B-shaped causal LM (vocab 151936), batch {batch} x seq {seq}, bf16, "
        f"forward + backward (no optimizer)",
        "",
        f"{info}",
        "",
        "| model | loss (step 1) | step ms | tokens/s |",
        "|---|---|---|---|",
    ]
    for name, r in res.items():
        lines.append(f"| {name} | {r['loss']:.5f} | {r['ms']:.1f} | {r['tokens_per_s']:.0f} |")
    with open(os.path.join(out_dir, "moe_train_step.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--tokens", default="16384,4096,65536")
    ap.add_argument("--slow-at", type=int, default=4096, help="token count for eager and opslot torch")
    ap.add_argument("--train-step", action="store_true", help="only the 2-layer training-step comparison")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.train_step:
        train_step(args.out)
        return
    tokens = [int(t) for t in args.tokens.split(",")]
    dev = torch.cuda.get_device_name()
    print(f"# device {dev}, torch {torch.__version__}", flush=True)
    results = {"device": dev, "torch": torch.__version__, "ceiling": {}, "rows": [], "stages": {}}

    def dump():
        with open(os.path.join(args.out, "moe_bench.json"), "w") as fh:
            json.dump(results, fh, indent=1)
        lines = [f"device: {dev}, torch {torch.__version__}", "", "| ceiling | ms | TFLOP/s |", "|---|---|---|"]
        for k, (ms, tf) in results["ceiling"].items():
            lines.append(f"| {k} | {ms:.3f} | {tf:.0f} |")
        lines += [
            "",
            "| model | tokens | impl | fwd+bwd ms | TFLOP/s (6 expert GEMMs) | note |",
            "|---|---|---|---|---|---|",
        ]
        for row in results["rows"]:
            ms = f"{row['ms']:.2f}" if row.get("ms") is not None else "—"
            tf = f"{row['tflops']:.0f}" if row.get("tflops") is not None else "—"
            lines.append(f"| {row['model']} | {row['tokens']} | {row['impl']} | {ms} | {tf} | {row.get('note', '')} |")
        with open(os.path.join(args.out, "moe_bench.md"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        st = []
        for key, d in results["stages"].items():
            st += ["", f"{key}", "", "| stage | ms |", "|---|---|"]
            st += [f"| {k} | {v:.3f} |" for k, v in d.items()]
            st.append(
                f"| sum (without the comparison row) | {sum(v for k, v in d.items() if not k.startswith('(')):.3f} |"
            )
        with open(os.path.join(args.out, "moe_stages.md"), "w") as fh:
            fh.write("\n".join(st) + "\n")

    results["ceiling"] = dense_ceiling(16384 * 8)
    for k, (ms, tf) in results["ceiling"].items():
        print(f"{k}: {ms:.3f} ms, {tf:.0f} TFLOP/s", flush=True)
    dump()

    order = [(m, t) for t in tokens for m in MODELS]
    for (name, variant, E, K, H, I), T in order:  # noqa: E741  (I: the intermediate size)
        mod = make_layer(variant, E, K, H, I)
        x, idx, w = make_inputs(T, E, K, H)
        go = torch.randn_like(x)
        flops = 18.0 * T * K * H * I
        ref = None
        for impl, fn in impls(variant, mod, E, K, H, I).items():
            row = {"model": name, "tokens": T, "impl": impl}
            if getattr(fn, "note", None):
                row["note"] = fn.note
            if isinstance(fn, str):
                row["note"] = fn
                if T == tokens[0]:
                    results["rows"].append(row)
                continue
            if impl in ("upstream eager", "opslot torch") and T != args.slow_at:
                continue
            try:
                with torch.no_grad():
                    o = fn(x, idx, w)
                if impl == "upstream grouped_mm":
                    ref = o.float()
                if impl == "opslot cuda" and ref is not None:
                    d = o.float() - ref
                    row["note"] = (
                        f"vs grouped_mm: max|Δ| {float(d.abs().max()):.2e}, rel {float(d.norm() / ref.norm()):.2e}"
                    )
                del o
                ms = timed(fwd_bwd(fn, mod, x, idx, w, go))
                row["ms"], row["tflops"] = ms, flops / ms / 1e9
            except Exception as exc:
                row["note"] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
            results["rows"].append(row)
            print(row, flush=True)
            dump()
        if T == 16384 and name in ("Qwen3-30B-A3B", "GPT-OSS-20B"):
            try:
                results["stages"][f"{name}, {T} tokens (opslot cuda, ms per stage)"] = stages(variant, mod, x, idx, w)
                print(results["stages"], flush=True)
            except Exception as exc:
                print(f"stages failed: {exc}", flush=True)
            dump()
        del mod, x, idx, w, go, ref
        torch.cuda.empty_cache()
    dump()
    print(open(os.path.join(args.out, "moe_bench.md")).read())
    print(open(os.path.join(args.out, "moe_stages.md")).read())


if __name__ == "__main__":
    main()
