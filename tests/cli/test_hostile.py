"""Hostile and broken input (issue #17): no hang, no crash, no unbounded read, no lost file.

Every run has a timeout, so a patchgen that blocks on its input fails the test instead of hanging.
"""

import os
import subprocess

import pytest

SPEC = "specs/tiny/tiny.yaml"
PY = "generated/tiny/patched_modeling_tiny.py"


def run(project, *args):
    env = {k: v for k, v in os.environ.items() if k != "PATCHGEN_SOURCE_PATH"}
    env["PATH"] = "/usr/bin:/bin"
    try:
        return subprocess.run(
            [project.binary, *args], cwd=project.root, env=env, capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("patchgen blocked on its input")


def point_patch_file_at(project, target):
    text = project.read(SPEC)
    assert "file: patches/mlp.py" in text
    project.write(SPEC, text.replace("file: patches/mlp.py", f"file: {target}"))


def test_patch_file_fifo_is_refused_without_blocking(project):
    os.mkfifo(project.path("specs/tiny/patches/pipe.py"))
    point_patch_file_at(project, "patches/pipe.py")
    r = run(project, "--all")
    assert r.returncode == 3
    assert (
        "specs/tiny/tiny.yaml:17:11: error: cannot read patch file 'specs/tiny/patches/pipe.py': "
        "is a FIFO (named pipe), not a regular file\n"
    ) in r.stderr
    assert not os.path.exists(project.path(PY))


def test_extends_fifo_is_refused_without_blocking(project):
    os.mkfifo(project.path("specs/tiny/parent.yaml"))
    project.write(SPEC, "extends: parent.yaml\n" + project.read(SPEC))
    # The spec is named: with --all the FIFO is also discovered as a spec and refused as one
    # (test_hostile_gate.py).
    r = run(project, SPEC)
    assert r.returncode == 3
    assert (
        "specs/tiny/tiny.yaml:1:10: error: cannot read spec 'specs/tiny/parent.yaml': "
        "is a FIFO (named pipe), not a regular file\n"
    ) in r.stderr


def test_oversized_patch_file_is_refused(project):
    big = "def mlp_forward(self, x):\n    return x\n" + "# padding\n" * (430 * 1024)
    assert len(big) > 4 << 20
    project.write("specs/tiny/patches/big.py", big)
    point_patch_file_at(project, "patches/big.py")
    r = run(project, "--all")
    assert r.returncode == 3
    assert (
        "error: cannot read patch file 'specs/tiny/patches/big.py': the file is larger than the "
        f"limit of 4 MiB ({len(big)} bytes)\n"
    ) in r.stderr


def test_oversized_spec_is_refused(project):
    project.write(SPEC, project.read(SPEC) + "#" * (4 << 20) + "\n")
    r = run(project, "--all")
    assert r.returncode == 5  # an I/O error, like a spec that cannot be read
    assert "specs/tiny/tiny.yaml: error: cannot read spec: the file is larger than the limit of 4 MiB" in r.stderr


def test_deep_extends_chain_is_bounded(project):
    spec = project.read(SPEC)
    project.write(SPEC, "extends: p1.yaml\n" + spec)
    for i in range(1, 40):
        project.write(f"specs/tiny/p{i}.yaml", f"extends: p{i + 1}.yaml\n")
    project.write("specs/tiny/p40.yaml", "version: 1\n")
    r = run(project, "--all")
    assert r.returncode == 3
    chain = " -> ".join(["specs/tiny/tiny.yaml"] + [f"specs/tiny/p{i}.yaml" for i in range(1, 33)])
    assert "specs/tiny/p31.yaml:1:10: error: 'extends' chain is deeper than the limit of 32 specs\n" in r.stderr, (
        r.stderr
    )
    assert f"help: the chain: {chain}\n" in r.stderr
    assert not os.path.exists(project.path(PY))


def test_output_over_the_upstream_file_is_refused(project):
    upstream = "upstream/tinypkg/models/tiny/modeling_tiny.py"
    before = project.snapshot()
    project.write(SPEC, project.read(SPEC).replace("output: patched_modeling_tiny.py", "output: modeling_tiny.py"))
    r = run(project, "specs/tiny/tiny.yaml", "-o", "upstream/tinypkg/models/tiny")
    assert r.returncode == 3, r.stderr
    assert r.stderr == (
        f"specs/tiny/tiny.yaml:3:9: error: output '{upstream}' would overwrite the upstream file '{upstream}'\n"
        "    3 | output: modeling_tiny.py\n"
        "      |         ^~~~~~~~~~~~~~~~\n"
        "help: patchgen never writes over its inputs; choose another `output:` name or output folder\n"
    )
    assert project.read(upstream) == before[upstream][0].decode()


def test_output_over_a_patch_file_is_refused(project):
    patch = "specs/tiny/patches/mlp.py"
    before = project.read(patch)
    project.write(SPEC, project.read(SPEC).replace("output: patched_modeling_tiny.py", "output: mlp.py"))
    r = run(project, "--all", "--diff", "-o", "specs/tiny/patches")
    assert r.returncode == 3, r.stderr
    assert f"error: output '{patch}' would overwrite the patch file '{patch}'\n" in r.stderr
    assert project.read(patch) == before
    assert not os.path.exists(project.path("specs/tiny/patches/mlp.diff"))


def test_output_over_the_spec_itself_via_symlink_is_refused(project):
    os.makedirs(project.path("out"))
    os.symlink(project.path(SPEC), project.path("out/patched_modeling_tiny.py"))
    before = project.read(SPEC)
    r = run(project, "--all", "-o", "out")
    assert r.returncode == 3, r.stderr
    assert "error: output 'out/patched_modeling_tiny.py' would overwrite the spec 'specs/tiny/tiny.yaml'\n" in r.stderr
    assert project.read(SPEC) == before


def test_two_specs_with_one_output_fail_both_and_write_nothing(project):
    spec = project.read(SPEC)
    project.write("specs/tiny/other.yaml", spec)  # same output name, same folder
    r = run(project, "--all", "-o", "out")
    assert r.returncode == 3, r.stderr
    assert r.stderr == (
        "specs/tiny/other.yaml:3:9: error: output 'out/patched_modeling_tiny.py' is also written by the spec "
        "'specs/tiny/tiny.yaml'\n"
        "    3 | output: patched_modeling_tiny.py\n"
        "      |         ^~~~~~~~~~~~~~~~~~~~~~~~\n"
        "specs/tiny/tiny.yaml:3:9: note: its output is set here\n"
        "help: two specs cannot write one file; give one of them another `output:` name\n"
        "specs/tiny/tiny.yaml:3:9: error: output 'out/patched_modeling_tiny.py' is also written by the spec "
        "'specs/tiny/other.yaml'\n"
        "    3 | output: patched_modeling_tiny.py\n"
        "      |         ^~~~~~~~~~~~~~~~~~~~~~~~\n"
        "specs/tiny/other.yaml:3:9: note: its output is set here\n"
        "help: two specs cannot write one file; give one of them another `output:` name\n"
    )
    assert "2 specs: 0 written, 0 unchanged, 0 skipped, 2 failed" in r.stdout
    assert not os.path.exists(project.path("out"))


def test_check_fails_when_a_configured_source_root_is_missing(project):
    r = run(project, "--all")
    assert r.returncode == 0, r.stderr
    os.rename(project.path("upstream"), project.path("upstream-moved"))
    before = project.snapshot()
    r = run(project, "--check")
    assert r.returncode == 2
    assert r.stderr == (
        "pyproject.toml:7:17: error: source root 'upstream' does not exist\n"
        '    7 | source_roots = ["upstream"]\n'
        "      |                 ^~~~~~~~~~\n"
        "help: --check would skip every spec whose upstream package lives there; create it "
        "(e.g. `make upstream`) or remove it from `source_roots`\n"
    )
    assert project.snapshot() == before


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
        (lambda p: os.mkdir(p), "is a folder, not a file"),
        (lambda p: os.symlink("/dev/zero", p), "is a character device, not a regular file"),
    ],
)
def test_named_spec_that_is_no_regular_file_is_refused_at_once(project, make, what):
    make(project.path("specs/odd.yaml"))
    r = run(project, "specs/odd.yaml")
    assert r.returncode == 5
    assert r.stderr == f"specs/odd.yaml: error: cannot read spec: {what}\n"


def test_one_spec_named_twice_is_no_output_clash(project):
    r = run(project, SPEC, SPEC)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(project.path(PY))
