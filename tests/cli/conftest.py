"""Fixtures for the patchgen CLI tests: each test runs the built binary in a fresh copy of
fixtures/project (a tiny upstream package `tinypkg`, one spec, a pyproject.toml).

`--patchgen` names the binary under test.
"""

import os
import shutil
import subprocess

import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def pytest_addoption(parser):
    parser.addoption("--patchgen", required=True, help="the patchgen binary under test")


class Project:
    """A temporary project tree and a way to run patchgen in it."""

    def __init__(self, root, binary):
        self.root = str(root)
        self.binary = binary

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def read(self, *parts):
        with open(self.path(*parts), "rb") as f:
            return f.read().decode()

    def write(self, rel, text):
        p = self.path(rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)

    def run(self, *args, cwd=None, env=None):
        full_env = {k: v for k, v in os.environ.items() if k != "PATCHGEN_SOURCE_PATH"}
        # An interpreter without the fixture packages, so sys.path never finds them by accident.
        full_env["PATH"] = "/usr/bin:/bin"
        full_env.update(env or {})
        return subprocess.run([self.binary, *args], cwd=cwd or self.root, env=full_env, capture_output=True, text=True)

    def snapshot(self):
        """{relative path: (bytes, mtime_ns)} of every file in the tree."""
        out = {}
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                p = os.path.join(dirpath, name)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, self.root)] = (f.read(), os.stat(p).st_mtime_ns)
        return out


@pytest.fixture
def patchgen(request):
    return os.path.abspath(request.config.getoption("--patchgen"))


@pytest.fixture
def project(tmp_path, patchgen):
    root = tmp_path / "project"
    shutil.copytree(os.path.join(FIXTURES, "project"), root)
    return Project(root, patchgen)
