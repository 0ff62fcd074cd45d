#!/usr/bin/env python3
"""Whole-process benchmarks of the patchgen binary (method: the design notes, shared/design/benchmarks.md; targets also in docs/benchmarks.md).

Measures, each as the median of --runs runs of the whole process:
  one spec     generate + diff of one spec (a real-model spec when .upstream/transformers-5.17.0 exists, else the example)
  29 specs     `--all --diff` on a temporary tree of 29 specs (the repository's specs replicated)
  --check      `--check` of that tree right after generating it (everything up to date)
  index        `patchgen index` over every .py file of a corpus folder (default .upstream/transformers-5.17.0/transformers),
               on one thread (`-j 1`) and on every core the process may use
"CPU ms" is the median user+system time of the process, a figure that a busy shared machine
distorts much less than wall time. Peak memory is the child's ru_maxrss (os.wait4), the same figure `/usr/bin/time -v` prints.

With --baseline OTHER_BINARY, only the two 29-spec measures run, for both binaries, alternating
run by run (each binary in its own copy of the tree), so that a busy machine slows both alike:
the before/after comparison of docs/benchmarks.md.

Usage: bench/patchgen_bench.py [--patchgen build/tools/patchgen/patchgen] [--runs 5] [--csv out.csv]
                               [--baseline OLD_BINARY]
"""

import argparse
import csv
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE_SIZE = 29

# Targets for a 2-core machine and the Python tool's figures (16 cores), from benchmarks.md.
TARGETS = {
    "one spec (generate + diff)": ("<= 50 ms", "15.0 s"),
    f"{TREE_SIZE} specs (--all --diff)": ("<= 250 ms", "24.1 s"),
    f"{TREE_SIZE} specs (--check)": ("<= 50 ms", "23.7 s"),
    "index corpus (1 thread)": ("<= 6 s", "~5 s (ast.parse)"),
    "index corpus (all cores)": ("scales with cores", ""),
}


def run_once(cmd, cwd):
    """(wall seconds, CPU seconds, peak RSS in MB, exit code) of one whole-process run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, proc.returncode


def measure(name, cmd, cwd, runs, files=None, nbytes=None, ok_codes=(0,)):
    samples = [run_once(cmd, cwd) for _ in range(runs)]
    return summarize(name, cmd, cwd, samples, files, nbytes, ok_codes)


def summarize(name, cmd, cwd, samples, files=None, nbytes=None, ok_codes=(0,)):
    times = [s[0] for s in samples]
    cpu = [s[1] for s in samples]
    rss = [s[2] for s in samples]
    codes = {s[3] for s in samples}
    bad = codes - set(ok_codes)
    if bad:
        # Show why, once, so that a broken setup is not reported as a fast one.
        err = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True).stderr
        print(f"warning: {name}: exit code(s) {sorted(bad)}\n{err[:2000]}", file=sys.stderr)
    med = statistics.median(times)
    row = {
        "measure": name,
        "median_ms": round(med * 1000, 1),
        "min_ms": round(min(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "cpu_ms": round(statistics.median(cpu) * 1000, 1),
        "files": files if files is not None else "",
        "files_per_s": round(files / med) if files else "",
        "mb_per_s": round(nbytes / med / 1e6, 1) if nbytes else "",
        "peak_rss_mb": round(max(rss), 1),
        "exit": ",".join(str(c) for c in sorted(codes)),
        "target": TARGETS.get(name.split(": ")[-1], ("", ""))[0],
        "python_tool": TARGETS.get(name.split(": ")[-1], ("", ""))[1],
    }
    return row


def spec_files(root):
    out = []
    for dirpath, _, names in os.walk(root):
        out += [os.path.join(dirpath, n) for n in names if n.endswith(".yaml")]
    return sorted(out)


def build_tree(dest, source_roots, use_real):
    """A project with TREE_SIZE specs: whole copies of the repository's specs (so `extends` and
    patch files keep their relative paths), then specs nobody extends removed down to TREE_SIZE."""
    specs_src = os.path.join(REPO, "specs")
    chosen = spec_files(specs_src)
    if not use_real:
        chosen = [s for s in chosen if "/example/" in s]
    folders = sorted({os.path.relpath(os.path.dirname(s), specs_src) for s in chosen})
    copies = 0
    while len(spec_files(os.path.join(dest, "specs"))) < TREE_SIZE:
        for folder in folders:
            shutil.copytree(os.path.join(specs_src, folder), os.path.join(dest, "specs", f"r{copies}", folder))
        copies += 1
    all_specs = spec_files(os.path.join(dest, "specs"))
    texts = {s: open(s).read() for s in all_specs}
    for s in reversed(all_specs):
        if len(all_specs) <= TREE_SIZE:
            break
        base = os.path.basename(s)
        folder = os.path.dirname(s)
        extended = any(
            o != s
            and os.path.dirname(os.path.dirname(o)) == os.path.dirname(folder)
            and re.search(r"extends:.*" + re.escape(base), t)
            for o, t in texts.items()
        )
        if not extended:
            os.remove(s)
            all_specs.remove(s)
    roots = ", ".join(f'"{r}"' for r in source_roots)
    with open(os.path.join(dest, "pyproject.toml"), "w") as f:
        f.write(
            f'[tool.patchgen]\nspecs = "specs"\noutput = "generated"\nsource_roots = [{roots}]\n'
            'python = "/nonexistent-python"\n'
        )
    return len(all_specs)


def build_identity_tree(dest, upstream):
    """A project with TREE_SIZE identity specs (no entries: header and relative imports only) on the
    first TREE_SIZE transformers modeling modules in sorted order: TREE_SIZE distinct upstream files,
    each parsed once as upstream and once as output."""
    models = os.path.join(upstream, "transformers", "models")
    modules = []
    for name in sorted(os.listdir(models)):
        if os.path.isfile(os.path.join(models, name, f"modeling_{name}.py")):
            modules.append(name)
    for name in modules[:TREE_SIZE]:
        os.makedirs(os.path.join(dest, "specs", name))
        with open(os.path.join(dest, "specs", name, f"{name}.yaml"), "w") as f:
            f.write(
                f"version: 1\nupstream: transformers.models.{name}.modeling_{name}\n"
                f"output: patched_modeling_{name}.py\n"
            )
    with open(os.path.join(dest, "pyproject.toml"), "w") as f:
        f.write(
            f'[tool.patchgen]\nspecs = "specs"\noutput = "generated"\nsource_roots = ["{upstream}"]\n'
            'python = "/nonexistent-python"\n'
        )
    return min(TREE_SIZE, len(modules))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patchgen", default=os.path.join(REPO, "build/tools/patchgen/patchgen"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--corpus", default=os.path.join(REPO, ".upstream/transformers-5.17.0/transformers"))
    ap.add_argument("--csv", help="also write the rows to this CSV file")
    ap.add_argument("--baseline", help="another patchgen binary: run the 29-spec measures of both, alternating")
    args = ap.parse_args()
    binary = os.path.abspath(args.patchgen)
    upstream = os.path.join(REPO, ".upstream/transformers-5.17.0")  # `make upstream`
    use_real = os.path.isdir(os.path.join(upstream, "transformers"))
    source_roots = [os.path.join(REPO, "examples/upstream")] + ([upstream] if use_real else [])

    rows = []
    if args.baseline:
        rows = compare(os.path.abspath(args.baseline), binary, source_roots, use_real, args.runs)
    else:
        rows = measure_all(binary, source_roots, use_real, args)
    print_rows(rows, binary, args, use_real)


def compare(baseline, binary, source_roots, use_real, runs):
    """The two 29-spec measures of `baseline` and `binary`, alternating run by run, on the 29-spec
    tree and (with .upstream) on a tree of 29 identity specs."""
    rows = []
    kinds = [("", lambda d: build_tree(d, source_roots, use_real))]
    if use_real:
        kinds.append(("identity ", lambda d: build_identity_tree(d, source_roots[-1])))
    with tempfile.TemporaryDirectory(prefix="patchgen_bench_") as tmp:
        for kind, build in kinds:
            trees = {}
            for label, b in (("before", baseline), ("after", binary)):
                trees[label] = (b, os.path.join(tmp, kind + label))
                n = build(trees[label][1])
            time.sleep(1.1)  # specs older than a second: generation writes check stamps
            for label, (b, tree) in trees.items():
                run_once([b, "--all", "--diff"], tree)  # outputs (and stamps) in place
            for measure_name, args in (
                (f"{TREE_SIZE} {kind}specs (--all --diff)", ["--all", "--diff"]),
                (f"{TREE_SIZE} {kind}specs (--check)", ["--check"]),
            ):
                samples = {label: [] for label in trees}
                for _ in range(runs):
                    for label, (b, tree) in trees.items():
                        samples[label].append(run_once([b, *args], tree))
                for label, (b, tree) in trees.items():
                    rows.append(summarize(f"{label}: {measure_name}", [b, *args], tree, samples[label], files=n))
    return rows


def measure_all(binary, source_roots, use_real, args):
    rows = []
    with tempfile.TemporaryDirectory(prefix="patchgen_bench_") as tmp:
        one = os.path.join(REPO, "specs/qwen3/qwen3_gpu.yaml" if use_real else "specs/example/toy_gpu.yaml")
        cmd = [binary, one, "--diff", "-o", os.path.join(tmp, "one")]
        for r in source_roots:
            cmd += ["--source-root", r]
        rows.append(measure("one spec (generate + diff)", cmd, REPO, args.runs))

        tree = os.path.join(tmp, "tree")
        n = build_tree(tree, source_roots, use_real)
        name_all = f"{TREE_SIZE} specs (--all --diff)"
        rows.append(measure(name_all, [binary, "--all", "--diff"], tree, args.runs, files=n))
        rows.append(measure(f"{TREE_SIZE} specs (--check)", [binary, "--check"], tree, args.runs, files=n))

        if os.path.isdir(args.corpus):
            files = []
            for dirpath, _, names in os.walk(args.corpus):
                files += [os.path.join(dirpath, x) for x in names if x.endswith(".py")]
            files.sort()
            nbytes = sum(os.path.getsize(f) for f in files)
            runs = max(1, min(args.runs, 3))
            rows.append(
                measure(
                    "index corpus (1 thread)",
                    [binary, "index", "-j", "1", *files],
                    REPO,
                    runs,
                    files=len(files),
                    nbytes=nbytes,
                )
            )
            rows.append(
                measure(
                    "index corpus (all cores)", [binary, "index", *files], REPO, runs, files=len(files), nbytes=nbytes
                )
            )
        else:
            print(f"note: corpus {args.corpus} not found; index benchmark skipped", file=sys.stderr)
    return rows


def print_rows(rows, binary, args, use_real):
    print(
        f"patchgen benchmark: {binary}, median of {args.runs} runs, {len(os.sched_getaffinity(0))} cores, "
        f"{'real-model specs (.upstream)' if use_real else 'example specs'}\n"
    )
    cols = [
        "measure",
        "median_ms",
        "min_ms",
        "max_ms",
        "cpu_ms",
        "files",
        "files_per_s",
        "mb_per_s",
        "peak_rss_mb",
        "exit",
        "target",
        "python_tool",
    ]
    heads = [
        "measure",
        "median ms",
        "min ms",
        "max ms",
        "CPU ms",
        "files",
        "files/s",
        "MB/s",
        "peak RSS MB",
        "exit",
        "target",
        "Python tool",
    ]
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
