"""Generation: --all, SPEC, --diff, -o, --dry-run, -v, --jobs, --json, atomic writes, usage errors."""

import json
import os
import shutil
import subprocess

PY = "generated/tiny/patched_modeling_tiny.py"
DIFF = "generated/tiny/patched_modeling_tiny.diff"
SPEC = "specs/tiny/tiny.yaml"


def size(project, rel):
    return os.path.getsize(project.path(rel))


def test_all_with_diff_writes_py_and_diff(project):
    r = project.run("--all", "--diff")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout == (
        f"wrote {PY} ({size(project, PY)} bytes, 2 patches)\n"
        f"wrote {DIFF} ({size(project, DIFF)} bytes)\n"
        "1 specs: 1 written, 0 unchanged, 0 skipped, 0 failed\n"
    )
    text = project.read(PY)
    assert "tinypkg.models.tiny.modeling_tiny" in text.split("\n\n")[0]
    assert "specs/tiny/tiny.yaml" in text
    assert project.path() not in text  # no absolute paths
    diff = project.read(DIFF)
    assert diff.startswith("--- a/tinypkg/models/tiny/modeling_tiny.py\n+++ b/patched_modeling_tiny.py\n@@ ")


def test_diff_applies_to_upstream_with_patch(project, tmp_path):
    assert project.run("--all", "--diff").returncode == 0
    work = tmp_path / "apply"
    shutil.copytree(project.path("upstream"), work)
    subprocess.run(["patch", "-s", "-p1", "-i", project.path(DIFF)], cwd=work, check=True)
    with open(work / "tinypkg/models/tiny/modeling_tiny.py") as f:
        assert f.read() == project.read(PY)


def test_second_run_is_unchanged_and_keeps_mtimes(project):
    assert project.run("--all", "--diff").returncode == 0
    before = project.snapshot()
    r = project.run("--all", "--diff")
    assert r.returncode == 0
    assert r.stdout == "1 specs: 0 written, 1 unchanged, 0 skipped, 0 failed\n"
    assert project.snapshot() == before


def test_verbose_reports_unchanged_files_and_upstream(project):
    project.run("--all")
    r = project.run("--all", "-v")
    assert r.stdout == (
        f"unchanged {PY} ({size(project, PY)} bytes, 2 patches)\n"
        "  specs/tiny/tiny.yaml: tinypkg.models.tiny.modeling_tiny 1.0.0 from "
        "upstream/tinypkg/models/tiny/modeling_tiny.py\n"
        "1 specs: 0 written, 1 unchanged, 0 skipped, 0 failed\n"
    )


def test_named_spec_without_diff_writes_only_py(project):
    r = project.run(SPEC)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(project.path(PY))
    assert not os.path.exists(project.path(DIFF))


def test_output_dir_flag(project):
    r = project.run(SPEC, "--diff", "-o", "out")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(project.path("out"))) == ["patched_modeling_tiny.diff", "patched_modeling_tiny.py"]
    assert not os.path.exists(project.path("generated"))


def test_dry_run_writes_nothing(project):
    before = project.snapshot()
    r = project.run("--all", "--diff", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"would write {PY} (") and lines[0].endswith(" bytes, 2 patches)")
    assert lines[1].startswith(f"would write {DIFF} (")
    assert lines[2] == "1 specs: 1 to write, 0 unchanged, 0 skipped, 0 failed"
    assert project.snapshot() == before


def test_jobs_one_and_many_give_identical_outputs(project, tmp_path):
    # Three specs on the same upstream: the upstream is parsed once, outputs are independent.
    for name in ["a", "b"]:
        spec = project.read("specs/tiny/tiny.yaml").replace("patched_modeling_tiny.py", f"patched_{name}.py")
        project.write(f"specs/tiny/{name}.yaml", spec)
    assert project.run("--all", "--diff", "--jobs", "1").returncode == 0
    one = {k: v[0] for k, v in project.snapshot().items()}
    shutil.rmtree(project.path("generated"))
    assert project.run("--all", "--diff", "--jobs", "8").returncode == 0
    assert {k: v[0] for k, v in project.snapshot().items()} == one


def test_json_report_shape(project):
    r = project.run("--all", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert list(report) == ["exit_code", "specs"] or set(report) == {"exit_code", "specs"}
    assert report["exit_code"] == 0
    (entry,) = report["specs"]
    assert set(entry) == {
        "spec",
        "upstream",
        "upstream_path",
        "upstream_version",
        "output",
        "status",
        "patches",
        "bytes",
        "errors",
        "warnings",
        "skipped_entries",
    }
    assert entry["warnings"] == [] and entry["skipped_entries"] == []
    assert entry["spec"] == SPEC
    assert entry["upstream"] == "tinypkg.models.tiny.modeling_tiny"
    assert entry["upstream_path"] == "upstream/tinypkg/models/tiny/modeling_tiny.py"
    assert entry["upstream_version"] == "1.0.0"
    assert entry["output"] == PY
    assert entry["status"] == "written"
    assert entry["patches"] == 2
    assert entry["bytes"] == size(project, PY)
    assert entry["errors"] == []


def test_failing_spec_leaves_existing_outputs_untouched(project):
    # A second spec whose target does not exist; its previous output must survive byte for byte.
    bad = (
        project.read(SPEC)
        .replace("TinyMLP.forward", "TinyMLP.fowrard")
        .replace("patched_modeling_tiny.py", "patched_bad.py")
    )
    project.write("specs/tiny/bad.yaml", bad)
    project.write("generated/tiny/patched_bad.py", "# previous output\n")
    os.utime(project.path("generated/tiny/patched_bad.py"), ns=(1_000_000_000, 1_000_000_000))
    r = project.run("--all", "--json")
    assert r.returncode == 3, r.stderr
    assert "specs/tiny/bad.yaml:" in r.stderr and "fowrard" in r.stderr
    report = json.loads(r.stdout)
    assert [e["status"] for e in report["specs"]] == ["error", "written"]
    assert report["specs"][0]["errors"][0]["kind"] == "spec"
    assert project.read("generated/tiny/patched_bad.py") == "# previous output\n"
    assert os.stat(project.path("generated/tiny/patched_bad.py")).st_mtime_ns == 1_000_000_000
    assert sorted(os.listdir(project.path("generated/tiny"))) == ["patched_bad.py", "patched_modeling_tiny.py"]


def test_write_replaces_file_atomically_via_rename(project):
    project.run("--all")
    inode = os.stat(project.path(PY)).st_ino
    project.write(
        "upstream/tinypkg/models/tiny/modeling_tiny.py",
        project.read("upstream/tinypkg/models/tiny/modeling_tiny.py") + "\nEXTRA = 1\n",
    )
    assert project.run("--all").returncode == 0
    assert os.stat(project.path(PY)).st_ino != inode  # a new file renamed into place
    assert project.read(PY).endswith("EXTRA = 1\n")
    assert [n for n in os.listdir(project.path("generated/tiny")) if n.startswith(".")] == []


def test_usage_errors_exit_2(project):
    assert project.run().returncode == 2
    assert project.run("--bogus").returncode == 2
    r = project.run("--fix")
    assert (r.returncode, r.stderr) == (
        2,
        "patchgen: error: --fix needs --check\nRun with --help for more information.\n",
    )
    r = project.run("--all", SPEC)
    assert (r.returncode, r.stderr.splitlines()[0]) == (2, "patchgen: error: give SPEC files or --all, not both")
    assert project.run("--check", "--list").returncode == 2
    assert project.run("--all", "--jobs", "0").returncode == 2
    assert project.run("--help").returncode == 0


def test_missing_spec_file_is_io_error(project):
    r = project.run("specs/nope.yaml")
    assert r.returncode == 5
    assert r.stderr == "specs/nope.yaml: error: spec file not found\n"


def test_missing_specs_root_is_a_usage_error(project):
    shutil.rmtree(project.path("specs"))
    r = project.run("--all")
    assert r.returncode == 2
    assert r.stderr == (
        "patchgen: error: specs folder 'specs' does not exist\n"
        "help: set `specs` in the project config (pyproject.toml) or name spec files "
        "on the command line\n"
    )
