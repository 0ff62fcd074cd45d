#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (docs/fuzzing.md) from this repository's own test
data: the golden cases (tests/golden), the example specs and upstream (specs/example, examples/)
and the real-model specs (specs/*/*.yaml, spec loader only).

  fuzz/make_corpus.py DIR        write DIR/{fuzz_spec,fuzz_index,fuzz_generate}/ (fuzz/run_fuzz.sh does,
                                 into its work folder, before every run)

One file per seed, named after where it comes from. The seeds are derived, not committed (they
would be copies of the test data); what is committed under fuzz/corpus/<target>/ are the regress-*
inputs that once failed a target (docs/fuzzing.md). A generation seed is the spec, then
"#@@ upstream" and the upstream module, then "#@@ file NAME" and each file next to the spec that the
spec may read (parent specs, patch files): the format fuzz/fuzz_common.h's SplitSections reads.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
GOLDEN = os.path.join(ROOT, "tests", "golden")


# Seeds left out: each run of this one expands YAML aliases to the 1,000,000-node limit (3.5 s under
# ASan), which would slow every target that mutates it to a few executions a second. The limit has
# its golden case; the fuzzer still reaches alias expansion from the other seeds.
SLOW_SEEDS = {"error_yaml_alias_expansion_limit"}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def upstream_module(spec_text, roots):
    m = re.search(rb"^upstream:\s*([\w.]+)", spec_text, re.M)
    if not m:
        return None
    rel = m.group(1).decode().replace(".", "/") + ".py"
    for root in roots:
        path = os.path.join(root, rel)
        if os.path.isfile(path):
            return path
    return None


def side_files(folder, spec_name):
    """(name relative to the spec's folder, bytes) of every parent spec and patch file beside it."""
    out = []
    for dirpath, dirnames, files in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in ("expected", "input", "__pycache__"))
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, name), folder)
            if rel == spec_name or not (name.endswith(".yaml") or name.endswith(".py")):
                continue
            out.append((rel, read(os.path.join(dirpath, name))))
    return out


def generation_seed(spec_path, roots):
    spec = read(spec_path)
    parent_spec = spec
    folder = os.path.dirname(spec_path)
    files = side_files(folder, os.path.basename(spec_path))
    # A spec that only extends names its upstream in the parent.
    for name, text in files:
        if b"upstream:" not in parent_spec and name.endswith(".yaml") and b"upstream:" in text:
            parent_spec = text
    module = upstream_module(parent_spec, roots)
    if module is None:
        return None
    out = spec if spec.endswith(b"\n") else spec + b"\n"
    out += b"#@@ upstream\n" + read(module)
    for name, text in files:
        if not out.endswith(b"\n"):
            out += b"\n"
        out += b"#@@ file " + name.encode() + b"\n" + text
    return out


def golden_roots(case):
    ref = os.path.join(case, "input.ref")
    if os.path.isfile(ref):
        return [os.path.join(GOLDEN, "inputs", read(ref).decode().strip())]
    return [os.path.join(case, "input")]


def seeds():
    spec, index, generate = {}, {}, {}
    for case in sorted(os.listdir(GOLDEN)):
        folder = os.path.join(GOLDEN, case)
        spec_path = os.path.join(folder, "spec.yaml")
        if not os.path.isfile(spec_path) or case in SLOW_SEEDS:
            continue
        for name, text in [("spec.yaml", read(spec_path))] + side_files(folder, "spec.yaml"):
            key = case + "__" + name.replace("/", "__")
            (spec if name.endswith(".yaml") else index)[key] = text
        seed = generation_seed(spec_path, golden_roots(folder))
        if seed is not None:
            generate[case] = seed
    for root in [os.path.join(GOLDEN, "inputs"), os.path.join(ROOT, "examples")] + [
        os.path.join(GOLDEN, c, "input") for c in sorted(os.listdir(GOLDEN))
    ]:
        for dirpath, dirnames, files in os.walk(root):
            dirnames.sort()
            for name in sorted(files):
                if name.endswith(".py") and os.path.getsize(os.path.join(dirpath, name)) > 0:
                    rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
                    index[rel.replace("/", "__")] = read(os.path.join(dirpath, name))
    specs = os.path.join(ROOT, "specs")
    for model in sorted(os.listdir(specs)):
        for dirpath, dirnames, files in os.walk(os.path.join(specs, model)):
            dirnames.sort()
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT).replace("/", "__")
                if name.endswith(".yaml"):
                    spec[rel] = read(path)
                    if model == "example":
                        seed = generation_seed(path, [os.path.join(ROOT, "examples", "upstream")])
                        if seed is not None:
                            generate[rel] = seed
                elif name.endswith(".py"):
                    index[rel] = read(path)

    # Dedupe by content (libFuzzer would anyway); first name wins.
    def unique(d):
        seen, out = set(), {}
        for k, v in d.items():
            if v not in seen:
                seen.add(v)
                out[k] = v
        return out

    return {"fuzz_spec": unique(spec), "fuzz_index": unique(index), "fuzz_generate": unique(generate)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="folder to write <target>/<seed> into")
    args = ap.parse_args()
    for target, files in seeds().items():
        folder = os.path.join(args.out, target)
        os.makedirs(folder, exist_ok=True)
        for name, text in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(text)
        print(f"{target}: {len(files)} seeds, {sum(map(len, files.values()))} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
