#!/usr/bin/python3
"""Golden-case runner: runs the built patchgen on every case under tests/golden/ and compares.

A case is a folder tests/golden/<case>/ holding
  input/            an upstream package tree (e.g. input/toypkg/models/toy/modeling_toy.py), or
  input.ref         one line naming a shared input tree tests/golden/inputs/<name>/, used as input/
  spec.yaml         the spec to run (plus any parent specs and patches/*.py it uses)
and its expectations, either
  expected/         positive case: every file patchgen writes (the .py and its .diff), byte for byte
or
  expected.stderr   negative case: patchgen's exact stderr
  expected.exit     ... and its exit code (one line)
A positive case may also pin warnings in expected.stderr; without it, stderr must be empty.

Each case is copied to a temporary folder and run there as
  patchgen spec.yaml --source-root input -o out --diff
so printed paths are relative (`spec.yaml:3:5`). stdout is not compared.

  run_golden.py --patchgen BIN [-k SUBSTRING] [--update]

`--update` rewrites the expectations of the selected cases from what patchgen does now. It refuses
to bless a positive case whose generated .py does not parse, a case that changed between positive
and negative, and a negative case that crashed (exit code above 5). Review every update.
Stdlib only: runs on Debian's /usr/bin/python3.
"""

import argparse
import ast
import difflib
import os
import shutil
import subprocess
import sys
import tempfile

GOLDEN_DIR = os.path.dirname(os.path.abspath(__file__))
SHARED_INPUTS_DIR = os.path.join(GOLDEN_DIR, "inputs")
EXPECTATION_NAMES = ("expected", "expected.stderr", "expected.exit")
TIMEOUT_S = 60


def list_cases(selector):
    """Case folders (those with a spec.yaml) whose name contains `selector`, sorted."""
    names = []
    for name in sorted(os.listdir(GOLDEN_DIR)):
        path = os.path.join(GOLDEN_DIR, name)
        if os.path.isfile(os.path.join(path, "spec.yaml")) and (not selector or selector in name):
            names.append(name)
    return names


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_tree(root):
    """{relative path: bytes} of every file under root (empty when root does not exist)."""
    files = {}
    if not os.path.isdir(root):
        return files
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            files[os.path.relpath(path, root).replace(os.sep, "/")] = read_bytes(path)
    return files


class Run:
    """What patchgen did for one case."""

    def __init__(self, exit_code, stderr, outputs):
        self.exit_code = exit_code
        self.stderr = stderr
        self.outputs = outputs


def run_case(patchgen, case_dir):
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        work = os.path.join(tmp, "case")
        shutil.copytree(case_dir, work,
                        ignore=lambda d, names: [n for n in names
                                                 if d == case_dir and n in EXPECTATION_NAMES])
        ref = os.path.join(case_dir, "input.ref")
        if os.path.isfile(ref):
            if os.path.isdir(os.path.join(case_dir, "input")):
                raise SystemExit(f"{case_dir}: has both input/ and input.ref")
            name = read_bytes(ref).decode().strip()
            shutil.copytree(os.path.join(SHARED_INPUTS_DIR, name), os.path.join(work, "input"))
        proc = subprocess.run(
            [patchgen, "spec.yaml", "--source-root", "input", "-o", "out", "--diff"],
            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT_S)
        return Run(proc.returncode, proc.stderr, read_tree(os.path.join(work, "out")))


def text_diff(expected, actual, label):
    """Unified diff of two byte strings, for a human."""
    exp = expected.decode("utf-8", "replace").splitlines(keepends=True)
    act = actual.decode("utf-8", "replace").splitlines(keepends=True)
    lines = difflib.unified_diff(exp, act, "expected/" + label, "actual/" + label)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)


def compare(case_dir, run):
    """List of human-readable mismatches (empty when the case passes)."""
    problems = []
    if not any(os.path.exists(os.path.join(case_dir, n)) for n in ("expected", "expected.exit")):
        return ["no expectations yet: review the output of --update -k " + os.path.basename(case_dir)]
    stderr_path = os.path.join(case_dir, "expected.stderr")
    exit_path = os.path.join(case_dir, "expected.exit")
    if os.path.isfile(exit_path):
        expected_exit = int(read_bytes(exit_path).decode().strip())
        expected_outputs = {}
    else:
        expected_exit = 0
        expected_outputs = read_tree(os.path.join(case_dir, "expected"))
    expected_stderr = read_bytes(stderr_path) if os.path.isfile(stderr_path) else b""

    if run.exit_code != expected_exit:
        problems.append("exit code: expected %d, got %d" % (expected_exit, run.exit_code))
    if run.stderr != expected_stderr:
        problems.append("stderr differs:\n" + text_diff(expected_stderr, run.stderr, "stderr"))
    for name in sorted(set(expected_outputs) | set(run.outputs)):
        if name not in run.outputs:
            problems.append("missing output: " + name)
        elif name not in expected_outputs:
            problems.append("unexpected output: " + name)
        elif run.outputs[name] != expected_outputs[name]:
            problems.append("output %s differs:\n" % name
                            + text_diff(expected_outputs[name], run.outputs[name], name))
    return problems


def python_parse_error(name, data):
    """None when `data` parses as Python, else the error text."""
    try:
        ast.parse(data.decode("utf-8"), filename=name)
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        return "%s: %s" % (name, exc)
    return None


def update_case(case_dir, run):
    """Rewrite the case's expectations from `run`; returns an error text when refused."""
    was_negative = os.path.isfile(os.path.join(case_dir, "expected.exit"))
    was_positive = os.path.isdir(os.path.join(case_dir, "expected"))
    negative = run.exit_code != 0
    if negative and was_positive:
        return "refusing to update: positive case now fails (exit %d):\n%s" % (
            run.exit_code, run.stderr.decode("utf-8", "replace"))
    if not negative and was_negative:
        return "refusing to update: negative case now succeeds"
    if negative and not 1 <= run.exit_code <= 5:
        return "refusing to update: exit %d is a crash, not a diagnosed error:\n%s" % (
            run.exit_code, run.stderr.decode("utf-8", "replace"))
    if not negative:
        if not run.outputs:
            return "refusing to update: patchgen wrote nothing"
        for name, data in run.outputs.items():
            if name.endswith(".py"):
                error = python_parse_error(name, data)
                if error:
                    return "refusing to update: generated code does not parse: " + error

    for name in EXPECTATION_NAMES:
        path = os.path.join(case_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.isfile(path):
            os.remove(path)
    if negative:
        with open(os.path.join(case_dir, "expected.exit"), "w") as f:
            f.write("%d\n" % run.exit_code)
        with open(os.path.join(case_dir, "expected.stderr"), "wb") as f:
            f.write(run.stderr)
    else:
        for name, data in run.outputs.items():
            path = os.path.join(case_dir, "expected", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        if run.stderr:
            with open(os.path.join(case_dir, "expected.stderr"), "wb") as f:
                f.write(run.stderr)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patchgen", required=True, help="the patchgen binary to test")
    parser.add_argument("-k", dest="selector", default="", help="run cases whose name contains this")
    parser.add_argument("--update", action="store_true", help="rewrite expectations from actual output")
    args = parser.parse_args()
    patchgen = os.path.abspath(args.patchgen)
    if not os.access(patchgen, os.X_OK):
        print("error: patchgen binary not found or not executable: " + args.patchgen, file=sys.stderr)
        return 2

    passed = failed = 0
    for name in list_cases(args.selector):
        case_dir = os.path.join(GOLDEN_DIR, name)
        try:
            run = run_case(patchgen, case_dir)
        except subprocess.TimeoutExpired:
            print("FAIL %s: timed out after %ds" % (name, TIMEOUT_S))
            failed += 1
            continue
        if args.update:
            error = update_case(case_dir, run)
            if error:
                print("FAIL %s: %s" % (name, error))
                failed += 1
            else:
                print("updated %s" % name)
                passed += 1
            continue
        problems = compare(case_dir, run)
        if problems:
            failed += 1
            print("FAIL %s" % name)
            for problem in problems:
                print("  " + problem.replace("\n", "\n  ").rstrip())
        else:
            passed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
