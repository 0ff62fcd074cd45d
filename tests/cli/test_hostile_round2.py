"""Hostile input, round 2 (issue #28), the generator side: never silent, no data lost.

`--check --fix` removes only orphaned outputs that patchgen itself wrote in this project, still
holding the bytes it wrote, reached without a symbolic link, whose spec did not appear during the
run; a source root that holds nothing (or does not exist) never makes `--check` or `audit` pass;
a different binary never reuses a check stamp. Each test failed before its fix.
"""

import glob
import json
import os
import shutil
import subprocess

from conftest import FIXTURES, Project

SPEC = "specs/tiny/tiny.yaml"
PY = "generated/tiny/patched_modeling_tiny.py"
DIFF = "generated/tiny/patched_modeling_tiny.diff"
CLEAN = "check: 1 up to date, 0 stale, 0 skipped, 0 failed\n"
CLEAN_FIX = "check: 1 up to date, 0 stale, 0 fixed, 0 skipped, 0 failed\n"
NO_RECORD = "patchgen has no record of writing it in this project; remove it by hand if no other project writes it"


def generate(project, *args):
    r = project.run("--all", "--diff", *args)
    assert r.returncode == 0, r.stderr
    return r


def set_config(project, old, new):
    text = project.read("pyproject.toml")
    assert old in text, old
    project.write("pyproject.toml", text.replace(old, new))


# --- 1a: an output folder that is a link inside the output root --------------------------------


def test_output_written_through_a_folder_link_inside_the_output_root_is_no_orphan(project):
    os.makedirs(project.path("generated/real_tiny"))
    os.symlink("real_tiny", project.path("generated/tiny"))
    generate(project)
    assert os.path.isfile(project.path("generated/real_tiny/patched_modeling_tiny.py"))
    r = project.run("--check")
    assert (r.returncode, r.stdout, r.stderr) == (0, CLEAN, "")  # was: 2 orphaned, exit 1
    r = project.run("--check", "--fix")
    assert (r.returncode, r.stdout, r.stderr) == (0, CLEAN_FIX, "")  # was: both removed
    assert os.path.isfile(project.path("generated/real_tiny/patched_modeling_tiny.py"))
    assert os.path.isfile(project.path("generated/real_tiny/patched_modeling_tiny.diff"))


# --- 1b: two projects that share an output root ------------------------------------------------


def test_fix_never_removes_the_outputs_of_another_project_sharing_the_output_root(project, tmp_path):
    shared = tmp_path / "shared"
    other = Project(tmp_path / "other", project.binary)
    shutil.copytree(os.path.join(FIXTURES, "project"), other.root)
    for p in (project, other):
        set_config(p, 'output = "generated"', f'output = "{shared}"')
    # The other project's spec writes other.py; this project's spec renames its output, so that
    # its old outputs are its own orphans.
    other.write(SPEC, other.read(SPEC).replace("output: patched_modeling_tiny.py", "output: other.py"))
    generate(other)
    generate(project)
    project.write(SPEC, project.read(SPEC).replace("output: patched_modeling_tiny.py", "output: renamed.py"))
    generate(project)
    theirs = {n: open(shared / "tiny" / n, "rb").read() for n in ("other.py", "other.diff")}

    r = project.run("--check")
    assert r.returncode == 1
    assert r.stdout == (
        "orphaned: ../shared/tiny/other.diff (carries patchgen's header, but no spec produces it; "
        f"`patchgen --check --fix` leaves it: {NO_RECORD})\n"
        "orphaned: ../shared/tiny/other.py (carries patchgen's header, but no spec produces it; "
        f"`patchgen --check --fix` leaves it: {NO_RECORD})\n"
        "orphaned: ../shared/tiny/patched_modeling_tiny.diff (carries patchgen's header, but no spec "
        "produces it; `patchgen --check --fix` removes it)\n"
        "orphaned: ../shared/tiny/patched_modeling_tiny.py (carries patchgen's header, but no spec "
        "produces it; `patchgen --check --fix` removes it)\n"
        "check: 1 up to date, 0 stale, 0 skipped, 0 failed, 4 orphaned\n"
    )
    r = project.run("--check", "--fix")
    assert r.returncode == 1, r  # what is left is still reported
    assert r.stdout == (
        f"kept: ../shared/tiny/other.diff (orphaned, not removed: {NO_RECORD})\n"
        f"kept: ../shared/tiny/other.py (orphaned, not removed: {NO_RECORD})\n"
        "removed: ../shared/tiny/patched_modeling_tiny.diff (orphaned: no spec produces it)\n"
        "removed: ../shared/tiny/patched_modeling_tiny.py (orphaned: no spec produces it)\n"
        "check: 1 up to date, 0 stale, 0 fixed, 0 skipped, 0 failed, 2 orphaned removed, "
        "2 orphaned kept\n"
    )
    # was: the other project's outputs removed too
    assert {n: open(shared / "tiny" / n, "rb").read() for n in ("other.py", "other.diff")} == theirs
    assert not os.path.exists(shared / "tiny" / "patched_modeling_tiny.py")
    r = project.run("--check", "--fix", "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["orphaned"] == ["../shared/tiny/other.diff", "../shared/tiny/other.py"]
    assert report["orphaned_kept"] == report["orphaned"]


def test_fix_keeps_an_orphan_that_changed_since_patchgen_wrote_it(project):
    generate(project)
    project.write(SPEC, project.read(SPEC).replace("output: patched_modeling_tiny.py", "output: renamed.py"))
    generate(project)
    project.write(PY, project.read(PY) + "# a note someone added\n")
    r = project.run("--check", "--fix")
    assert r.returncode == 1
    assert r.stdout == (
        "removed: generated/tiny/patched_modeling_tiny.diff (orphaned: no spec produces it)\n"
        f"kept: {PY} (orphaned, not removed: its bytes are not the ones patchgen wrote there; remove "
        "it by hand if the change is not needed)\n"
        "check: 1 up to date, 0 stale, 0 fixed, 0 skipped, 0 failed, 1 orphaned removed, "
        "1 orphaned kept\n"
    )
    assert project.read(PY).endswith("# a note someone added\n")


# --- 1c: a symlinked output that --check calls up to date --------------------------------------


def test_fix_never_removes_the_target_of_a_symlinked_output(project):
    generate(project)
    os.makedirs(project.path("generated/keep"))
    os.rename(project.path(PY), project.path("generated/keep/real.py"))
    os.symlink("../keep/real.py", project.path(PY))
    r = project.run("--check")
    assert (r.returncode, r.stdout, r.stderr) == (0, CLEAN, "")  # was: the target an orphan
    r = project.run("--check", "--fix")
    assert (r.returncode, r.stdout, r.stderr) == (0, CLEAN_FIX, "")  # was: the target removed
    assert os.path.isfile(project.path("generated/keep/real.py"))
    assert project.run("--check").returncode == 0


# --- 1d: a spec added while --check --fix runs -------------------------------------------------


def test_fix_never_removes_the_output_of_a_spec_added_during_the_run(project):
    # specs/new/new.yaml is generated (its outputs are patchgen's, recorded), then moved aside; an
    # "interpreter" that patchgen asks for sys.path during --check puts it back: the spec appears
    # after discovery, before the orphans are removed.
    project.write(
        "specs/new/new.yaml",
        project.read(SPEC)
        .replace("output: patched_modeling_tiny.py", "output: patched_new.py")
        .replace("file: patches/mlp.py", "file: ../tiny/patches/mlp.py"),
    )
    generate(project)
    new_py = project.read("generated/new/patched_new.py")
    shutil.move(project.path("specs/new"), project.path("aside"))
    project.write(
        "specs/real/llama.yaml",
        "version: 1\nupstream: transformers.models.llama.modeling_llama\noutput: patched_llama.py\n",
    )
    project.write("fakepy", "#!/bin/sh\nmv aside specs/new\necho '[]'\n")
    os.chmod(project.path("fakepy"), 0o755)
    set_config(project, 'source_roots = ["upstream"]', 'source_roots = ["upstream"]\npython = "./fakepy"')
    r = project.run("--check", "--fix")
    assert os.path.isfile(project.path("specs/new/new.yaml"))  # the race happened
    assert r.returncode == 1, r
    reason = (
        "its spec 'specs/new/new.yaml' exists but was not checked in this run (added during "
        "the run?); run `patchgen --check` again"
    )
    assert f"kept: generated/new/patched_new.diff (orphaned, not removed: {reason})\n" in r.stdout
    assert f"kept: generated/new/patched_new.py (orphaned, not removed: {reason})\n" in r.stdout
    assert project.read("generated/new/patched_new.py") == new_py  # was: removed


# --- 2: a source root that holds nothing -------------------------------------------------------


def test_check_fails_when_a_configured_source_root_is_empty(project):
    generate(project)
    shutil.rmtree(project.path("upstream"))
    os.makedirs(project.path("upstream"))  # an uninitialised submodule, a failed unpack
    before = project.snapshot()
    r = project.run("--check")
    assert r.returncode == 2, r  # was: 0, "1 skipped"
    assert r.stderr == (
        "pyproject.toml:7:17: error: source root 'upstream' holds no upstream package of the specs "
        "(no 'tinypkg' under it): it is empty\n"
        '    7 | source_roots = ["upstream"]\n'
        "      |                 ^~~~~~~~~~\n"
        "help: --check would skip 1 spec whose upstream package is on no source root, and pass; fill "
        "the folder (e.g. `make upstream`, `git submodule update --init`) or remove it from the "
        "source roots\n"
    )
    assert r.stdout == ""
    assert project.snapshot() == before


def test_check_fails_when_a_source_root_holds_another_package_and_a_spec_is_skipped(project):
    generate(project)
    os.makedirs(project.path("tf/transformers-5.17.0.dist-info"))  # the package itself is missing
    set_config(project, 'source_roots = ["upstream"]', 'source_roots = ["upstream", "tf"]')
    project.write(
        "specs/real/llama.yaml",
        "version: 1\nupstream: transformers.models.llama.modeling_llama\noutput: patched_llama.py\n",
    )
    r = project.run("--check")
    assert r.returncode == 2, r  # was: 0, "1 skipped"
    assert r.stderr.startswith(
        "pyproject.toml:7:29: error: source root 'tf' holds no upstream package of the specs (no "
        "'tinypkg', 'transformers' under it)\n"
    )
    # Without the useless root, the skip is what it always was: the package is on no root.
    set_config(project, 'source_roots = ["upstream", "tf"]', 'source_roots = ["upstream"]')
    r = project.run("--check")
    assert r.returncode == 0, r.stderr
    assert "1 skipped" in r.stdout


def no_roots(project):
    set_config(project, 'source_roots = ["upstream"]\n', "")


def test_check_fails_on_a_source_root_flag_or_path_entry_that_does_not_exist(project):
    no_roots(project)
    generate(project, "--source-root", "upstream")
    r = project.run("--check", "--source-root", "upstrem")
    assert r.returncode == 2, r  # was: 0, the spec skipped
    assert r.stderr == (
        "patchgen: error: source root 'upstrem' (--source-root) does not exist\n"
        "help: --check would skip every spec whose upstream package lives there; give the folder "
        "that contains the upstream package (e.g. the one that contains 'transformers/')\n"
    )
    assert r.stdout == ""
    r = project.run("--check", env={"PATCHGEN_SOURCE_PATH": "upstrem"})
    assert r.returncode == 2, r  # was: 0, the spec skipped
    assert r.stderr.startswith("patchgen: error: source root 'upstrem' (PATCHGEN_SOURCE_PATH) does not exist\n")
    # Right, they pass.
    assert project.run("--check", "--source-root", "upstream").returncode == 0
    assert project.run("--check", env={"PATCHGEN_SOURCE_PATH": "upstream"}).returncode == 0


def test_check_fails_on_a_source_root_flag_that_holds_no_package_of_the_specs(project):
    generate(project)
    # One level too high: 'upstream' is the folder that holds 'tinypkg/'.
    r = project.run("--check", "--source-root", ".")
    assert r.returncode == 2, r  # was: 0, checked against the configured root instead
    assert r.stderr.startswith(
        "patchgen: error: source root '.' (--source-root) holds no upstream package of the specs "
        "(no 'tinypkg' under it)\n"
    )


def test_audit_fails_when_the_new_source_root_is_wrong(project):
    generate(project)
    os.makedirs(project.path("empty"))
    for new, what in [
        ("new-typo", "does not exist"),
        ("empty", "holds no upstream package of the specs (no 'tinypkg' under it): it is empty"),
        (".", "holds no upstream package of the specs (no 'tinypkg' under it)"),
    ]:
        r = project.run("audit", "--source-root", new)
        assert r.returncode == 2, (new, r)  # was: 0, "1 ok": the configured (old) root audited
        assert r.stderr.startswith(f"patchgen: error: source root '{new}' (--source-root) {what}\n"), r.stderr
        assert r.stdout == ""
    r = project.run("audit", "--source-root", "upstream", "--source-root-old", "old-typo")
    assert r.returncode == 2
    assert r.stderr.startswith("patchgen: error: source root 'old-typo' (--source-root-old) does not exist\n")
    assert project.run("audit", "--source-root", "upstream").returncode in (0, 1)


# --- 3: a different binary copied in place with `cp -p` ----------------------------------------


def test_a_different_binary_copied_in_place_never_reuses_check_stamps(project, tmp_path):
    binary = tmp_path / "bin" / "patchgen"
    os.makedirs(binary.parent)
    shutil.copy2(project.binary, binary)
    mine = Project(project.root, str(binary))
    generate(mine)
    r = mine.run("--check", "-v")
    assert r.stdout.startswith("up to date by their check stamps")
    # Another build that writes another header, with the same size and modification time, copied
    # over the binary in place (same inode).
    data = open(binary, "rb").read()
    other = data.replace(b"DO NOT EDIT. Edit the spec", b"DO NOT EDIT! Edit the spec")
    assert other != data and len(other) == len(data)
    other_path = tmp_path / "other-build"
    with open(other_path, "wb") as f:
        f.write(other)
    st = os.stat(binary)
    os.chmod(other_path, st.st_mode & 0o7777)
    os.utime(other_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    subprocess.run(["cp", "-p", str(other_path), str(binary)], check=True)
    assert os.stat(binary).st_ino == st.st_ino and os.stat(binary).st_mtime_ns == st.st_mtime_ns
    r = mine.run("--check", "-v")
    assert r.returncode == 1, r  # was: 0, up to date by the old binary's stamps
    assert r.stdout.startswith(f"stale: {PY} (from {SPEC})\n")


def test_check_stamps_still_answer_after_a_second_run(project):
    # The binary's hash is cached by generation: --check (read-only) finds it and stays fast.
    generate(project)
    for _ in range(2):
        r = project.run("--check", "-v")
        assert (r.returncode, r.stdout) == (0, "up to date by their check stamps (nothing parsed): 1 spec\n" + CLEAN)
    assert glob.glob(project.path(".patchgen_cache", "binary", "*"))
