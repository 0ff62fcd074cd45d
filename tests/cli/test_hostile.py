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
        return subprocess.run([project.binary, *args], cwd=project.root, env=env,
                              capture_output=True, text=True, timeout=30)
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
    assert ("specs/tiny/tiny.yaml:17:11: error: cannot read patch file 'specs/tiny/patches/pipe.py': "
            "is a FIFO (named pipe), not a regular file\n") in r.stderr
    assert not os.path.exists(project.path(PY))


def test_extends_fifo_is_refused_without_blocking(project):
    os.mkfifo(project.path("specs/tiny/parent.yaml"))
    project.write(SPEC, "extends: parent.yaml\n" + project.read(SPEC))
    r = run(project, "--all")
    assert r.returncode == 3
    assert ("specs/tiny/tiny.yaml:1:10: error: cannot read spec 'specs/tiny/parent.yaml': "
            "is a FIFO (named pipe), not a regular file\n") in r.stderr


def test_oversized_patch_file_is_refused(project):
    big = "def mlp_forward(self, x):\n    return x\n" + "# padding\n" * (430 * 1024)
    assert len(big) > 4 << 20
    project.write("specs/tiny/patches/big.py", big)
    point_patch_file_at(project, "patches/big.py")
    r = run(project, "--all")
    assert r.returncode == 3
    assert ("error: cannot read patch file 'specs/tiny/patches/big.py': the file is larger than the "
            f"limit of 4 MiB ({len(big)} bytes)\n") in r.stderr


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
    assert ("specs/tiny/p31.yaml:1:10: error: 'extends' chain is deeper than the limit of 32 specs\n"
            in r.stderr), r.stderr
    assert f"help: the chain: {chain}\n" in r.stderr
    assert not os.path.exists(project.path(PY))
