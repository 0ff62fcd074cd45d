"""--check without parsing (check stamps, docs/cli.md): generation writes a stamp per spec under
.patchgen_cache/check/; --check answers "up to date" from it only when every input, output and
setting still hashes the same, and otherwise takes the full path. A stale output is never up to
date: each test changes one thing and expects the full path's verdict."""

import glob
import os
import shutil
import stat

PY = "generated/tiny/patched_modeling_tiny.py"
DIFF = "generated/tiny/patched_modeling_tiny.diff"
SPEC = "specs/tiny/tiny.yaml"
PATCH = "specs/tiny/patches/mlp.py"
UPSTREAM = "upstream/tinypkg/models/tiny/modeling_tiny.py"
FAST = "up to date by their check stamps (nothing parsed): 1 spec\n"
CLEAN = "check: 1 up to date, 0 stale, 0 skipped, 0 failed\n"


def stamps(project):
    return sorted(glob.glob(project.path(".patchgen_cache", "check", "*.stamp")))


def generate_with_stamp(project):
    r = project.run("--all", "--diff")
    assert r.returncode == 0, r.stderr
    assert len(stamps(project)) == 1
    r = project.run("--check", "-v")
    assert (r.returncode, r.stdout, r.stderr) == (0, FAST + CLEAN, "")


def test_generation_writes_a_stamp_and_check_uses_it(project):
    generate_with_stamp(project)
    with open(project.path(".patchgen_cache", ".gitignore")) as f:
        assert f.read().splitlines()[-1] == "*"  # the cache never shows in git status
    text = open(stamps(project)[0]).read()
    assert text.startswith("patchgen check stamp 1\n")
    assert f"\t{project.path(SPEC)}\n" in text and f"\t{project.path(PATCH)}\n" in text
    # Without -v the output is the full path's, byte for byte.
    r = project.run("--check")
    assert (r.returncode, r.stdout, r.stderr) == (0, CLEAN, "")
    # A second generation leaves the stamp alone (mtime included).
    before = project.snapshot()
    assert project.run("--all", "--diff").returncode == 0
    assert project.snapshot() == before


def test_changed_output_byte_is_stale(project):
    generate_with_stamp(project)
    project.write(PY, project.read(PY).replace("variance_epsilon)\n", "variance_epsilon) \n", 1))
    r = project.run("--check", "-v")
    assert r.returncode == 1
    assert r.stdout.startswith(f"stale: {PY} (from {SPEC})\n")
    assert FAST not in r.stdout


def test_changed_diff_byte_is_stale(project):
    generate_with_stamp(project)
    project.write(DIFF, project.read(DIFF) + " ")
    r = project.run("--check", "-v")
    assert r.returncode == 1
    assert r.stdout.startswith(f"stale: {DIFF} (from {SPEC})\n")


def test_changed_spec_byte_is_stale(project):
    generate_with_stamp(project)
    project.write(SPEC, project.read(SPEC).replace("Tiny model", "Tiny  model"))
    r = project.run("--check", "-v")
    assert r.returncode == 1
    assert r.stdout.startswith(f"stale: {PY} (from {SPEC})\n")
    assert "+#   about:    Tiny  model" in r.stdout


def test_spec_change_that_keeps_the_output_is_up_to_date_by_the_full_path(project):
    generate_with_stamp(project)
    project.write(SPEC, project.read(SPEC) + "# a comment\n")
    r = project.run("--check", "-v")
    assert (r.returncode, r.stdout) == (0, CLEAN)  # no stamp line: the full path answered


def test_changed_patch_file_byte_is_stale(project):
    generate_with_stamp(project)
    text = project.read(PATCH)
    assert "\n" in text
    project.write(PATCH, text.rstrip("\n") + "  # edited\n")
    r = project.run("--check", "-v")
    assert r.returncode == 1
    assert r.stdout.startswith(f"stale: {PY} (from {SPEC})\n")
    assert "# edited" in r.stdout


def test_changed_upstream_byte_is_stale(project):
    generate_with_stamp(project)
    project.write(UPSTREAM, project.read(UPSTREAM) + "\nEXTRA = 1\n")
    r = project.run("--check", "-v")
    assert r.returncode == 1
    assert r.stdout.startswith(f"stale: {PY} (from {SPEC})\nupstream changed since generation: ")


def test_new_pin_file_takes_the_full_path(project):
    generate_with_stamp(project)
    assert project.run("pin", SPEC).returncode == 0
    r = project.run("--check", "-v")
    assert (r.returncode, r.stdout) == (0, CLEAN)


def test_other_binary_or_settings_take_the_full_path(project, tmp_path):
    generate_with_stamp(project)
    other = tmp_path / "bin" / "patchgen"
    other.parent.mkdir()
    shutil.copy2(project.binary, other)
    os.chmod(other, os.stat(other).st_mode | stat.S_IXUSR)
    copy = type(project)(project.root, str(other))
    r = copy.run("--check", "-v")
    assert (r.returncode, r.stdout) == (0, CLEAN)  # another binary: no stamp is trusted
    r = project.run("--check", "-v", "--source-root", "upstream")
    assert (r.returncode, r.stdout) == (0, CLEAN)  # other settings: the full path
    r = project.run("--check", "-v", env={"PATCHGEN_SOURCE_PATH": project.path("upstream")})
    assert (r.returncode, r.stdout) == (0, CLEAN)


def test_new_spec_and_json_take_the_full_path(project):
    generate_with_stamp(project)
    r = project.run("--check", "--json")
    assert r.returncode == 0 and '"status": "up to date"' in r.stdout
    project.write(
        "specs/tiny/second.yaml", "version: 1\nupstream: tinypkg.models.tiny.modeling_tiny\noutput: second.py\n"
    )
    r = project.run("--check", "-v")
    assert r.returncode == 1
    assert r.stdout.startswith("missing: generated/tiny/second.py (from specs/tiny/second.yaml)\n")


def test_damaged_or_foreign_stamp_takes_the_full_path(project):
    generate_with_stamp(project)
    path = stamps(project)[0]
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace("\npy\t", "\npy\t0"))
    r = project.run("--check", "-v")
    assert (r.returncode, r.stdout) == (0, CLEAN)
    with open(path, "w") as f:
        f.write("garbage\n")
    r = project.run("--check", "-v")
    assert (r.returncode, r.stdout) == (0, CLEAN)


def test_failed_generation_removes_the_stamp(project):
    generate_with_stamp(project)
    project.write(SPEC, project.read(SPEC).replace("TinyMLP.forward", "TinyMLP.nope"))
    assert project.run("--all").returncode == 3
    assert stamps(project) == []


def test_orphans_are_still_found(project):
    generate_with_stamp(project)
    project.write("generated/old/patched_old.py", project.read(PY))
    r = project.run("--check", "-v")
    assert r.returncode == 1
    assert r.stdout.startswith(FAST)
    assert "orphaned: generated/old/patched_old.py" in r.stdout
