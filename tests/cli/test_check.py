"""--check: clean, drift, missing, upstream changed, broken spec, read-only, --fix, skipped upstreams."""

import hashlib
import os

PY = "generated/tiny/patched_modeling_tiny.py"
DIFF = "generated/tiny/patched_modeling_tiny.diff"
SPEC = "specs/tiny/tiny.yaml"
UPSTREAM = "upstream/tinypkg/models/tiny/modeling_tiny.py"


def generated(project, *extra):
    r = project.run("--all", *extra)
    assert r.returncode == 0, r.stderr
    return project.snapshot()


def test_clean_tree_passes(project):
    generated(project, "--diff")
    r = project.run("--check")
    assert (r.returncode, r.stdout, r.stderr) == (0, "check: 1 up to date, 0 stale, 0 skipped, 0 failed\n", "")


def test_drift_prints_unified_diff_and_exits_1(project):
    generated(project)
    good = project.read(PY)
    project.write(PY, good.replace("variance_epsilon)\n", "variance_epsilon)  # edited\n", 1))
    before = project.snapshot()
    r = project.run("--check")
    assert r.returncode == 1
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0] == f"stale: {PY} (from {SPEC})"
    assert lines[1] == f"--- a/{PY}"
    assert lines[2] == f"+++ b/{PY}"
    assert lines[3].startswith("@@ -")
    assert any(line.startswith("-") and line.endswith("# edited") for line in lines)
    assert lines[-1] == "check: 0 up to date, 1 stale, 0 skipped, 0 failed"
    assert project.snapshot() == before  # bytes and mtimes untouched


def test_check_named_spec_only(project):
    generated(project)
    r = project.run("--check", SPEC)
    assert (r.returncode, r.stdout) == (0, "check: 1 up to date, 0 stale, 0 skipped, 0 failed\n")


def test_missing_output_is_drift(project):
    r = project.run("--check")
    assert r.returncode == 1
    assert r.stdout.startswith(f"missing: {PY} (from {SPEC})\n--- a/{PY}\n+++ b/{PY}\n@@ -0,0 +1,")
    assert not os.path.exists(project.path("generated"))


def test_stale_diff_file_is_drift_and_diff_flag_requires_it(project):
    generated(project)
    # No .diff on disk: not compared unless --diff is given.
    assert project.run("--check").returncode == 0
    r = project.run("--check", "--diff")
    assert r.returncode == 1
    assert r.stdout.startswith(f"missing: {DIFF} (from {SPEC})\n")
    generated(project, "--diff")
    project.write(DIFF, project.read(DIFF) + " trailing\n")
    r = project.run("--check")
    assert r.returncode == 1
    assert r.stdout.startswith(f"stale: {DIFF} (from {SPEC})\n")


def test_upstream_changed_since_generation_names_both_versions(project):
    generated(project)
    old_sha = hashlib.sha256(project.read(UPSTREAM).encode()).hexdigest()
    project.write(UPSTREAM, project.read(UPSTREAM) + "\nEXTRA = 1\n")
    project.write("upstream/tinypkg/__init__.py", '__version__ = "1.0.1"\n')
    new_sha = hashlib.sha256(project.read(UPSTREAM).encode()).hexdigest()
    before = project.snapshot()
    r = project.run("--check")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0] == f"stale: {PY} (from {SPEC})"
    assert lines[1] == (
        f"upstream changed since generation: 1.0.0 (sha256 {old_sha[:12]}) -> 1.0.1 (sha256 {new_sha[:12]})"
    )
    assert "+EXTRA = 1" in lines
    assert project.snapshot() == before


def test_broken_spec_fails_the_gate_with_its_error(project):
    generated(project)
    project.write(
        "specs/tiny/broken.yaml", "version: 1\nupstream: tinypkg.models.tiny.modeling_tiny\noutput: b.py\nslotz: []\n"
    )
    before = project.snapshot()
    r = project.run("--check")
    assert r.returncode == 3
    assert r.stderr.startswith("specs/tiny/broken.yaml:4:1: error: ")
    assert "slotz" in r.stderr
    assert r.stdout == "check: 1 up to date, 0 stale, 0 skipped, 1 failed\n"
    assert project.snapshot() == before


def test_fix_writes_what_differs(project):
    generated(project, "--diff")
    good_py, good_diff = project.read(PY), project.read(DIFF)
    project.write(PY, "stale\n")
    diff_mtime = os.stat(project.path(DIFF)).st_mtime_ns
    r = project.run("--check", "--fix")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [f"fixed: {PY}", "check: 0 up to date, 0 stale, 1 fixed, 0 skipped, 0 failed"]
    assert project.read(PY) == good_py
    assert project.read(DIFF) == good_diff
    assert os.stat(project.path(DIFF)).st_mtime_ns == diff_mtime  # unchanged file not rewritten
    assert project.run("--check").returncode == 0


def test_absent_upstream_package_is_skipped_by_all_and_check(project):
    generated(project)
    project.write(
        "specs/real/llama.yaml",
        "version: 1\nupstream: transformers.models.llama.modeling_llama\noutput: patched_llama.py\n",
    )
    r = project.run("--all")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (
        "skipped specs/real/llama.yaml: upstream package 'transformers' not found (upstream not found)"
    )
    r = project.run("--check")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (
        "skipped specs/real/llama.yaml: upstream package 'transformers' not found on any source root\n"
        "check: 1 up to date, 0 stale, 1 skipped, 0 failed\n"
    )
    # Named explicitly, it is an error.
    r = project.run("--check", "specs/real/llama.yaml")
    assert r.returncode == 4
    assert "error: upstream module 'transformers.models.llama.modeling_llama' not found" in r.stderr


def test_package_found_but_module_missing_fails_check_and_all(project):
    generated(project)
    project.write("specs/tiny/gone.yaml", "version: 1\nupstream: tinypkg.models.gone.modeling_gone\noutput: gone.py\n")
    for args in (["--check"], ["--all"]):
        r = project.run(*args)
        assert r.returncode == 4, args
        assert r.stderr.startswith(
            "specs/tiny/gone.yaml:2:11: error: upstream module 'tinypkg.models.gone.modeling_gone' not found\n"
        )


def test_check_json_statuses(project):
    import json

    for name in ["a", "b"]:
        project.write(f"specs/tiny/{name}.yaml", project.read(SPEC).replace("patched_modeling_tiny.py", f"{name}.py"))
    generated(project)
    os.remove(project.path("generated/tiny/a.py"))
    project.write("generated/tiny/b.py", "old\n")
    r = project.run("--check", "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["exit_code"] == 1
    assert [(e["spec"], e["status"]) for e in report["specs"]] == [
        ("specs/tiny/a.yaml", "missing"),
        ("specs/tiny/b.yaml", "stale"),
        (SPEC, "up to date"),
    ]
