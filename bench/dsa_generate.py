#!/usr/bin/env python3
"""Greedy generation with a cache of GLM-MoE-DSA (or DeepSeek-V4): upstream eager against opslot's defaults,
side by side in one process: what the `cuda` sparse attention costs or saves while decoding.

    OPSLOT_KERNELS_LIB=.../libopslot_kernels.so python3 bench/dsa_generate.py --patchgen .device-bin/patchgen \
        --out $OUT/generate
    .venv/bin/python bench/dsa_generate.py --device cpu --tiny --out /tmp/generate   # CPU check

Models: bench/train_step.py's configs (`--tiny`: its tiny ones) and weights (Transformers' seeded init of the
upstream class, loaded into every row). Rows: "upstream eager" (the upstream class), "opslot defaults"
(GLM-MoE-DSA's and DeepSeek-V4's `dsa_attention` is `cuda` there on sm_90+) and "opslot defaults,
dsa_attention eager" (the field set to upstream's attention); the model's attention as in train_step.py.
A prompt of --batch x --prompt random tokens, then `generate(do_sample=False, use_cache=True)` with a
DynamicCache (Transformers 5.17: GLM-MoE-DSA caches its expanded per-head keys and values).

Measures (the user path: CUDA events around the Python call; generate() is driven from the host, so there
is no device-only timing): prefill ms = generate(max_new_tokens=1); decode ms/token = (generate(--new
tokens) - prefill) / (--new - 1); each the median of --iters calls after one warm-up call, with the range of
the whole calls' decode in brackets. Every row's model stays resident and the calls run in interleaved
rounds (each round a prefill and a whole call of every row, its order rotated by one each round): decoding
is host-bound, and rows timed one after another drift apart with the process's state. Peak GiB = the row's
own: the largest rise of allocated memory over one of its calls plus its own weights (the other rows'
resident models do not count). "first logits vs upstream" = the relative error (2-norm) of the first
generated token's logits against upstream eager's (the prefill's numerics); "same tokens" = how many
generated tokens equal upstream eager's (greedy in bf16 on Transformers' random init, whose logits are
nearly flat: different rounding flips a close argmax, after which the sequences part, so few equal tokens
are no error by themselves).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("train_step", ROOT / "bench" / "train_step.py")
ts = importlib.util.module_from_spec(_spec)
sys.modules["train_step"] = ts
_spec.loader.exec_module(ts)  # also puts runtime/ on sys.path and keeps bench/ off it

import torch  # noqa: E402

ROWS = ("upstream eager", "opslot defaults", "opslot defaults, dsa_attention eager")
MODELS = ("glm_moe_dsa", "deepseek_v4")


def row_ops(mdef, name: str) -> Optional[Dict[str, str]]:
    attn = {"attn_implementation": mdef.attn}
    return {"upstream eager": None, "opslot defaults": attn}.get(name, dict(attn, dsa_attention_implementation="eager"))


def greedy(new: int) -> Dict[str, Any]:
    """generate()'s arguments for exactly `new` greedy tokens with a cache."""
    return dict(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None
    )


def timed_generate(model, ids, new: int, device: torch.device):
    """(ms, generated tokens [B, new]) of one greedy generate() call."""
    cuda = device.type == "cuda"
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, **greedy(new))
    if cuda:
        end.record()
        end.synchronize()
    ms = start.elapsed_time(end) if cuda else (time.perf_counter() - t) * 1e3
    return ms, out[:, ids.shape[1] :].cpu()


def first_logits(model, ids) -> torch.Tensor:
    """The logits of the first generated token (after the prompt's prefill), fp32 on the CPU."""
    with torch.no_grad():
        out = model.generate(ids, return_dict_in_generate=True, output_logits=True, **greedy(1))
    return out.logits[0].float().cpu()


def own_bytes(model) -> int:
    """The bytes of a model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


class Row:
    """One configuration's model and what its calls measured: prefill and whole-call times (ms), and its
    own peak (the largest rise of allocated memory over one of its calls, plus its own weights, so that the
    other rows' resident models do not count)."""

    def __init__(self, name: str, model, device: torch.device) -> None:
        self.name, self.model, self.device = name, model, device
        self.weights = own_bytes(model)
        self.prefill: List[float] = []
        self.total: List[float] = []
        self.peak = 0
        self.tokens = None

    def call(self, ids, new: int) -> float:
        cuda = self.device.type == "cuda"
        if cuda:
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        ms, tokens = timed_generate(self.model, ids, new, self.device)
        if cuda:
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device) - base + self.weights)
        if new > 1 and self.tokens is None:
            self.tokens = tokens
        return ms

    def result(self, new: int) -> Dict[str, Any]:
        prefill, total = statistics.median(self.prefill), statistics.median(self.total)
        return dict(
            prefill_ms=prefill,
            total_ms=total,
            decode_ms=(total - prefill) / (new - 1),  # main() asks for new >= 2
            prefill_ms_range=[min(self.prefill), max(self.prefill)],
            decode_ms_range=[(min(self.total) - prefill) / (new - 1), (max(self.total) - prefill) / (new - 1)],
            peak_gib=self.peak / ts.GiB if self.device.type == "cuda" else None,
        )


def measure(rows: List[Row], ids, new: int, iters: int) -> Dict[str, str]:
    """Interleaved rounds (the module's docstring): one warm-up call a row, then --iters rounds. Returns
    {row name: error} for the rows that failed (dropped from later rounds)."""
    failed: Dict[str, str] = {}

    def attempt(row: Row, fn) -> None:
        if row.name in failed:
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001  (one row's failure must not stop the others)
            failed[row.name] = ts.row_error(exc, row.device)
            traceback.print_exc()
            row.model = None
            ts.free(row.device)

    for row in rows:
        attempt(row, lambda: row.call(ids, new))
    for it in range(iters):
        for row in rows[it % len(rows) :] + rows[: it % len(rows)]:
            attempt(row, lambda: row.prefill.append(row.call(ids, 1)))
            attempt(row, lambda: row.total.append(row.call(ids, new)))
    return failed


def profile_generate(model, ids, new: int, device: torch.device, top: int) -> Dict[str, Any]:
    """One generate(--new tokens) call under torch.profiler: the device time of its kernels (total and the
    `top` costliest; kernel events only, not the operators that launched them), and the `top` host events by
    self CPU time (where a slow decode step spends its time)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timed_generate(model, ids, new, device)
    gpu = ts.kernel_events(prof)
    cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return dict(
        device_ms=sum(e.self_device_time_total for e in gpu) / 1e3,
        kernels=[dict(name=e.key[:90], calls=e.count, ms=round(e.self_device_time_total / 1e3, 3)) for e in gpu[:top]],
        host=[dict(name=e.key[:90], calls=e.count, ms=round(e.self_cpu_time_total / 1e3, 3)) for e in cpu[:top]],
    )


def build_row(name: str, mdef, config, module, up_cls, state, device, dtype) -> Tuple[Row, str]:
    """(the row with its model, its kernels cell)."""
    from opslot import binding_plan, build_model

    ops = row_ops(mdef, name)
    if ops is None:
        model = ts.construct(lambda: up_cls(copy.deepcopy(config)), device, dtype)
        kernels = f"attention={config._attn_implementation}"
    else:
        model = ts.construct(
            lambda: build_model(copy.deepcopy(config), ops=ops, module=module, model_class=mdef.causal_lm),
            device,
            dtype,
        )
        plan = binding_plan(model)
        kernels = ", ".join(sorted({f"{e.op}/{e.variant}={e.impl}" for e in plan.entries if e.op.startswith("dsa")}))
    model.load_state_dict(state, strict=True)
    model.eval()
    return Row(name, model, device), kernels


def run_model(key: str, args, device: torch.device, dtype: torch.dtype) -> Dict[str, Any]:
    mdef = ts.MODELS[key]
    config = ts.make_config(mdef, args.tiny)
    if getattr(config, "output_router_logits", False):
        config.output_router_logits = False
    module = ts.generate_and_import(mdef, args.patchgen, args.source_root, Path(args.gen_dir))
    up_cls = getattr(importlib.import_module(mdef.upstream_module), mdef.causal_lm)
    torch.manual_seed(args.seed)
    ref = ts.construct(lambda: up_cls(copy.deepcopy(config)), device, dtype)
    if mdef.prepare is not None:
        mdef.prepare(ref, args.seed)
    state = {k: v.detach().to("cpu", copy=True) for k, v in ref.state_dict().items()}
    del ref
    ts.free(device)
    gen = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(1, config.vocab_size, (args.batch, args.prompt), generator=gen).to(device)
    entry: Dict[str, Any] = dict(model=key, batch=args.batch, prompt=args.prompt, new=args.new, rows=[])
    names = args.rows or list(ROWS)
    rows: List[Row] = []
    cells: Dict[str, Dict[str, Any]] = {name: dict(name=name) for name in names}
    for name in names:  # every row's model resident, so that the rounds can interleave them
        try:
            row, cells[name]["kernels"] = build_row(name, mdef, config, module, up_cls, state, device, dtype)
            rows.append(row)
        except Exception as exc:  # noqa: BLE001
            cells[name]["error"] = ts.row_error(exc, device)
            traceback.print_exc()
    for name, error in measure(rows, ids, args.new, args.iters).items():
        cells[name]["error"] = error
    upstream_tokens = upstream_logits = None
    for row in rows:
        cell = cells[row.name]
        if cell.get("error"):
            continue
        try:
            cell.update(row.result(args.new))
            if args.profile and device.type == "cuda":
                cell["profile"] = profile_generate(row.model, ids, args.new, device, args.profile)
            logits = first_logits(row.model, ids)
            if row.name == "upstream eager":
                upstream_tokens, upstream_logits = row.tokens, logits
            if upstream_tokens is not None:
                cell["same_tokens"] = int((row.tokens == upstream_tokens).sum())
                cell["logits_rel_err"] = float((logits - upstream_logits).norm() / upstream_logits.norm())
        except Exception as exc:  # noqa: BLE001
            cell["error"] = ts.row_error(exc, device)
            traceback.print_exc()
    for row in rows:
        row.model = None
    ts.free(device)
    for name in names:
        entry["rows"].append(cells[name])
        print(key, json.dumps(cells[name]), flush=True)
    return entry


def table(entries: List[Dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| model | configuration | prefill ms | decode ms/token (range) | peak GiB | first logits vs upstream | same tokens "
        "| kernels |",
    ]
    lines.append("|---|---|---:|---:|---:|---:|---:|---|")
    for e in entries:
        shape = f"{e['model']} ({e['batch']}x{e['prompt']} + {e['new']})"
        for r in e["rows"]:
            if r.get("error"):
                lines.append(f"| {shape} | {r['name']} | FAILED | | | | | {r['error']} |")
                continue
            peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
            same = f"{r.get('same_tokens', 'n/a')} / {e['batch'] * e['new']}"
            err = "n/a" if r.get("logits_rel_err") is None else f"{r['logits_rel_err']:.2e}"
            lo, hi = r["decode_ms_range"]
            lines.append(
                f"| {shape} | {r['name']} | {r['prefill_ms']:.1f} | {r['decode_ms']:.2f} ({lo:.2f}–{hi:.2f}) | {peak} | "
                f"{err} | {same} | "
                f"{r['kernels']} |"
            )
    for e in entries:
        for r in e["rows"]:
            prof = r.get("profile")
            if not prof:
                continue
            lines += [
                "",
                f"{e['model']}, {r['name']}: one generate() under torch.profiler, kernels {prof['device_ms']:.1f} ms",
            ]
            lines += [f"  device {k['ms']:9.3f} ms {k['calls']:6d}x {k['name']}" for k in prof["kernels"]]
            lines += [f"  host   {k['ms']:9.3f} ms {k['calls']:6d}x {k['name']}" for k in prof["host"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="glm_moe_dsa", help=f"comma-separated, of: {', '.join(MODELS)}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="train_step.py's tiny configs (and its CPU check)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=4096, help="prompt tokens a row")
    ap.add_argument("--new", type=int, default=32, help="generated tokens a row (>= 2)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--row", action="append", default=[], dest="rows", choices=ROWS, help="only this row; repeatable")
    ap.add_argument(
        "--profile", type=int, default=0, metavar="N", help="CUDA: one more generate() a row under torch.profiler"
    )
    ap.add_argument("--patchgen", default=ts.default_patchgen())
    ap.add_argument("--source-root", default=None, help="folder holding transformers (default: the installed one)")
    ap.add_argument("--gen-dir", default=None)
    ap.add_argument("--out", default=".", help="folder for generate.md and generate.json")
    args = ap.parse_args()
    keys = [k for k in args.models.split(",") if k]
    if any(k not in MODELS for k in keys):
        ap.error(f"--models: of {', '.join(MODELS)}, got {keys}")
    if args.new < 2:
        ap.error("--new must be at least 2 (decode = the calls' difference)")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    args.source_root = args.source_root or ts.site_packages()
    args.gen_dir = args.gen_dir or tempfile.mkdtemp(prefix="dsa-generate-gen.")
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    header = (
        f"# Greedy generation with a cache: {name}\n\ntorch {torch.__version__}, transformers "
        f"{transformers.__version__}, {args.dtype}; command: `{' '.join(sys.argv)}`"
    )
    entries = [run_model(k, args, device, dtype) for k in keys]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generate.md").write_text(table(entries, header))
    (out / "generate.json").write_text(json.dumps(dict(header=header, models=entries), indent=1))
    print(table(entries, header))
    return 0 if all(not r.get("error") for e in entries for r in e["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
