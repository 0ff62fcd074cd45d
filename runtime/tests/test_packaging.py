"""`pip install ./runtime` builds out of tree: nothing is written into runtime/ (no build/, no
*.egg-info), and the wheel holds the whole package. Needs flit_core (the build backend) importable,
since the test builds without network (--no-build-isolation); skipped otherwise."""

import os
import subprocess
import sys
import zipfile

import pytest

RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def listing():
    out = set()
    for root, dirs, files in os.walk(RUNTIME):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".pytest_cache")]
        out.update(os.path.relpath(os.path.join(root, f), RUNTIME) for f in files if not f.endswith(".pyc"))
        out.update(os.path.relpath(os.path.join(root, d), RUNTIME) + "/" for d in dirs)
    return out


def test_backend_builds_out_of_tree():
    text = open(os.path.join(RUNTIME, "pyproject.toml"), encoding="utf-8").read()
    assert 'build-backend = "flit_core.buildapi"' in text


def test_wheel_builds_without_touching_the_tree(tmp_path):
    pytest.importorskip("flit_core")
    before = listing()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), RUNTIME],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert listing() == before
    (wheel,) = tmp_path.glob("opslot-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "opslot/__init__.py",
        "opslot/plan.py",
        "opslot/kernels/torch_ops.py",
        "opslot/kernels/cuda/_lib.py",
    ):
        assert needed in names
