"""Hostile and broken input (issue #17), part 4: a gate is never green by checking nothing. Spec
discovery reports what it cannot walk (unreadable folders, folder links), *.yml files are specs, and
`--check` reports outputs that no spec produces any more (`--fix` removes them when they carry
patchgen's header). Each test failed before its fix.
"""

import os
import shutil
import stat
import subprocess
import tempfile

import pytest

from conftest import Project

SPEC = "specs/tiny/tiny.yaml"
PY = "generated/tiny/patched_modeling_tiny.py"
DIFF = "generated/tiny/patched_modeling_tiny.diff"


def run(project, *args, preexec_fn=None):
    env = {k: v for k, v in os.environ.items() if k != "PATCHGEN_SOURCE_PATH"}
    env["PATH"] = "/usr/bin:/bin"
    return subprocess.run(
        [project.binary, *args],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=preexec_fn,
    )


def reachable_by_others(path):
    """Whether others may enter every folder from the file system root down to `path` (o+x)."""
    path = os.path.abspath(path)
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def copy_for_nobody(project):
    """The binary and the project copied to a folder that `nobody` can reach, wherever the clone
    lives: under a private (0700) folder nobody could not even start the binary (issue #28 item 7).
    """
    bases = [tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]
    usable = [b for b in bases if os.path.isdir(b) and reachable_by_others(b)]
    if not usable:
        pytest.skip(f"no temporary folder that others may enter (tried {', '.join(bases)})")
    top = tempfile.mkdtemp(prefix="patchgen-gate-", dir=usable[0])
    os.chmod(top, 0o755)
    binary = os.path.join(top, "patchgen")
    shutil.copy(project.binary, binary)
    os.chmod(binary, 0o755)
    shutil.copytree(project.root, os.path.join(top, "project"))
    return Project(os.path.join(top, "project"), binary)


def test_unreadable_spec_folder_fails_discovery(project):
    # As root every folder is readable: run patchgen as nobody, on copies that nobody can reach.
    root = os.geteuid() == 0
    if root:
        project = copy_for_nobody(project)
    try:
        os.makedirs(project.path("specs/locked"))
        shutil.copy(project.path(SPEC), project.path("specs/locked/hidden.yaml"))
        os.chmod(project.path("specs/locked"), 0)

        def as_nobody():
            if root:
                os.setgid(65534)
                os.setuid(65534)

        try:
            r = run(project, "--check", preexec_fn=as_nobody)
        except subprocess.SubprocessError as e:  # setuid refused (a container without CAP_SETUID)
            pytest.skip(f"cannot run patchgen as nobody (uid 65534): {e}")
        assert r.returncode == 5, r  # was: exit 1/0 with specs/locked silently left out
        assert r.stderr == (
            "specs/locked: error: cannot read the specs folder: Permission denied\n"
            "help: patchgen must see every spec under the specs root; fix the folder's permissions\n"
        )
        assert r.stdout == ""
    finally:
        os.chmod(project.path("specs/locked"), 0o755)
        if root:
            shutil.rmtree(os.path.dirname(project.root))


def test_symlinked_spec_folder_is_refused(project, tmp_path):
    elsewhere = tmp_path / "more_specs"
    shutil.copytree(project.path("specs/tiny"), elsewhere)
    os.symlink(elsewhere, project.path("specs/linked"))
    r = run(project, "--all")
    assert r.returncode == 5  # was: the linked folder skipped without a word
    assert r.stderr == (
        f"specs/linked: error: spec folder is a symbolic link (to '{elsewhere}'); patchgen does not "
        "follow folder links under the specs root\n"
        "help: replace the link with the folder, or name its specs on the command line\n"
    )
    assert not os.path.exists(project.path(PY))


def test_yml_files_are_specs(project):
    spec = project.read(SPEC).replace("output: patched_modeling_tiny.py", "output: from_yml.py")
    project.write("specs/tiny/extra.yml", spec)
    r = run(project, "--all")
    assert r.returncode == 0, r.stderr
    assert "2 specs: 2 written" in r.stdout  # was: 1 spec, extra.yml skipped without a word
    assert os.path.isfile(project.path("generated/tiny/from_yml.py"))


def test_check_reports_outputs_no_spec_produces_and_fix_removes_only_generated_ones(project):
    assert run(project, "--all", "--diff").returncode == 0
    # The spec is renamed: its old outputs are orphans; a hand-written file is left alone.
    spec = project.read(SPEC).replace("output: patched_modeling_tiny.py", "output: renamed.py")
    project.write(SPEC, spec)
    assert run(project, "--all", "--diff").returncode == 0
    project.write("generated/tiny/handwritten.py", "# mine\nx = 1\n")
    r = run(project, "--check")
    assert r.returncode == 1, r  # was: 0, "1 up to date"
    assert r.stdout == (
        f"orphaned: {DIFF} (carries patchgen's header, but no spec produces it; `patchgen --check --fix` "
        "removes it)\n"
        f"orphaned: {PY} (carries patchgen's header, but no spec produces it; `patchgen --check --fix` "
        "removes it)\n"
        "check: 1 up to date, 0 stale, 0 skipped, 0 failed, 2 orphaned\n"
    )
    r = run(project, "--check", "--fix")
    assert r.returncode == 0, r
    assert r.stdout == (
        f"removed: {DIFF} (orphaned: no spec produces it)\n"
        f"removed: {PY} (orphaned: no spec produces it)\n"
        "check: 1 up to date, 0 stale, 0 fixed, 0 skipped, 0 failed, 2 orphaned removed\n"
    )
    assert not os.path.exists(project.path(PY)) and not os.path.exists(project.path(DIFF))
    assert project.read("generated/tiny/handwritten.py") == "# mine\nx = 1\n"
    assert run(project, "--check").returncode == 0


def test_check_of_named_specs_reports_no_orphans(project):
    assert run(project, "--all").returncode == 0
    os.rename(project.path(PY), project.path("generated/tiny/old_name.py"))
    assert run(project, "--all").returncode == 0
    r = run(project, "--check", SPEC)
    assert r.returncode == 0, r
    assert "orphaned" not in r.stdout


def test_fifo_named_like_a_spec_is_an_error_not_a_hang(project):
    os.mkfifo(project.path("specs/tiny/pipe.yaml"))
    r = run(project, "--check")
    assert r.returncode == 5
    assert "specs/tiny/pipe.yaml: error: cannot read spec: is a FIFO (named pipe), not a regular file\n" in r.stderr


def test_output_root_holding_the_project_is_not_searched_for_orphans(project):
    # `output = "."`: a copy of a generated file elsewhere in the project (a test expectation) is not
    # an orphan and is never removed.
    project.write("pyproject.toml", project.read("pyproject.toml").replace('output = "generated"', 'output = "."'))
    assert run(project, "--all").returncode == 0
    generated = project.read("tiny/patched_modeling_tiny.py")
    project.write("tests/expected/patched_modeling_tiny.py", generated)
    r = run(project, "--check", "--fix")
    assert r.returncode == 0, r
    assert "orphaned" not in r.stdout and "removed" not in r.stdout
    assert project.read("tests/expected/patched_modeling_tiny.py") == generated


def test_source_roots_and_specs_under_the_output_root_are_not_searched(project):
    # Output root = the folder holding specs/ and upstream/ (but not pyproject.toml's folder).
    project.write(
        "pyproject.toml",
        project.read("pyproject.toml")
        .replace('specs = "specs"', 'specs = "all/specs"')
        .replace('output = "generated"', 'output = "all"')
        .replace('source_roots = ["upstream"]', 'source_roots = ["all/upstream"]'),
    )
    os.makedirs(project.path("all"))
    os.rename(project.path("specs"), project.path("all/specs"))
    os.rename(project.path("upstream"), project.path("all/upstream"))
    assert run(project, "--all").returncode == 0
    generated = project.read("all/tiny/patched_modeling_tiny.py")
    project.write("all/specs/tiny/patches/kept.py", generated)
    project.write("all/upstream/kept.py", generated)
    r = run(project, "--check", "--fix")
    assert r.returncode == 0, r
    assert os.path.exists(project.path("all/specs/tiny/patches/kept.py"))
    assert os.path.exists(project.path("all/upstream/kept.py"))
