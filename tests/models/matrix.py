#!/usr/bin/env python3
"""Version matrix: the real-model specs against every Transformers release pinned in
requirements/upstream.txt (unpacked by scripts/fetch-upstream.py --all), on the CPU.

For each release it runs tests/models/e2e.py (generation + the CPU end-to-end checks) with that
release first on PYTHONPATH, then writes one table: spec x release -> generates? imports?
eager equal? kernels match?, with each failure's first line. It shows what the next upgrade will
meet and does not gate CI (`make matrix`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEEP_MARKER = "## Why they fail"
sys.path.insert(0, str(ROOT / "scripts"))


def releases():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fetch_upstream", ROOT / "scripts" / "fetch-upstream.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [(name, version) for name, version, _ in mod.pins()]


def run_release(patchgen: str, version: str, work: Path):
    tree = ROOT / ".upstream" / f"transformers-{version}"
    out = work / version
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep))
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "models" / "e2e.py"),
        "--device",
        "cpu",
        "--patchgen",
        patchgen,
        "--source-root",
        str(tree),
        "--gen-dir",
        str(out / "generated"),
        "--out",
        str(out),
    ]
    started = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.time() - started
    report = out / "e2e.json"
    if not report.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return None, f"the test did not run (exit {proc.returncode}): {tail[0]}", seconds
    return json.loads(report.read_text(encoding="utf-8")), None, seconds


def first_line(err: str) -> str:
    """The line that explains an error: for a failed patchgen run, its first diagnostic (the
    relative spec location and message), not the command line."""
    lines = err.splitlines()
    if lines[0].startswith("patchgen exit") and len(lines) > 1:
        return "patchgen: " + lines[1].replace(str(ROOT) + "/", "")
    return lines[0].replace(str(ROOT) + "/", "")


def verdicts(res: dict):
    errors = res["errors"]
    gen = res["gen_lines"] is not None
    imports = bool(res["slots"])
    eager = bool(res["eager_logits_equal"] and res["eager_loss_equal"] and res["eager_grads_equal"])
    kernel_errors = [e for e in errors if e.startswith(("torch ", "chunked", "slot ", "optimizer"))]
    kernels = imports and res["torch_logits_max_abs_err"] is not None and not kernel_errors
    return gen, imports, eager, kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patchgen", required=True)
    parser.add_argument("--out", required=True, help="markdown file to write")
    args = parser.parse_args()
    patchgen = str(Path(args.patchgen).resolve())
    rows, notes, header = {}, [], []
    versions = [v for _, v in releases()]
    with tempfile.TemporaryDirectory(prefix="patchgen-matrix-") as tmp:
        for version in versions:
            data, setup_error, seconds = run_release(patchgen, version, Path(tmp))
            header.append(f"{version} ({seconds:.0f} s)")
            if data is None:
                notes.append(f"- transformers {version}: {setup_error}")
                continue
            for err in data["setup_errors"]:
                notes.append(f"- transformers {version}, setup: {err.splitlines()[0]}")
            for res in data["results"]:
                gen, imports, eager, kernels = verdicts(res)
                mark = lambda ok: "yes" if ok else "**no**"  # noqa: E731
                rows.setdefault(res["model"], {})[version] = (
                    f"{mark(gen)} / {mark(imports)} / {mark(eager)} / {mark(kernels)}"
                )
                for err in res["errors"]:
                    notes.append(f"- {res['model']} on {version}: {first_line(err)}")
    lines = [
        "# Real-model specs across Transformers releases",
        "",
        "Written by `make matrix` (tests/models/matrix.py): every real-model spec generated against each",
        "release pinned in requirements/upstream.txt and checked on the CPU by tests/models/e2e.py",
        f"(torch {__import__('torch').__version__}). Each cell: generates / imports / eager equal to upstream /",
        "`torch` kernels match. CI gates only the first release; the others show what an upgrade meets.",
        "",
        "| model | " + " | ".join(header) + " |",
        "|---|" + "---|" * len(header),
    ]
    for model in sorted(rows):
        lines.append(f"| {model} | " + " | ".join(rows[model].get(v, "-") for v in versions) + " |")
    lines += ["", "Failures (first line of each):", ""] + (notes or ["- none"]) + [""]
    # The hand-written explanations below KEEP_MARKER survive a regeneration.
    out = Path(args.out)
    kept = ""
    if out.is_file():
        text = out.read_text(encoding="utf-8")
        if KEEP_MARKER in text:
            kept = text[text.index(KEEP_MARKER) :]
    out.write_text("\n".join(lines) + ("\n" + kept if kept else ""), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
