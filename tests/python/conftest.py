"""Fixtures for tests that import generated example modules.

`--patchgen` names the binary under test. The example specs (specs/example/) are generated once
per session into a temporary folder; each test imports fresh copies of the generated modules (so
module-level slots start unbound) with the stub `opslot` package (stub_opslot/) first on sys.path
and the example upstream package (examples/upstream/) after it.
"""

import importlib.util
import itertools
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_opslot")
UPSTREAM_DIR = os.path.join(REPO, "examples", "upstream")
EXAMPLE_SPECS = ["toy_gpu.yaml", "toy_moe_gpu.yaml", "toy_moe_npu.yaml"]

# The tests import the upstream example (toyformers) as the reference; generated modules import it too.
sys.path.insert(0, UPSTREAM_DIR)


def pytest_addoption(parser):
    parser.addoption("--patchgen", required=True, help="the patchgen binary under test")


@pytest.fixture(scope="session")
def generated_dir(request, tmp_path_factory):
    """Folder holding the generated example modules (patched_modeling_*.py)."""
    patchgen = os.path.abspath(request.config.getoption("--patchgen"))
    out = tmp_path_factory.mktemp("generated")
    specs = [os.path.join("specs", "example", name) for name in EXAMPLE_SPECS]
    proc = subprocess.run(
        [patchgen, *specs, "--source-root", "examples/upstream", "-o", str(out), "--diff"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return str(out)


_fresh_names = itertools.count()


@pytest.fixture
def load_generated(generated_dir, monkeypatch):
    """load_generated("patched_modeling_toy_gpu") -> a freshly imported generated module."""
    monkeypatch.syspath_prepend(STUB_DIR)  # first: the stub wins over an installed opslot
    monkeypatch.delitem(sys.modules, "opslot", raising=False)

    def load(name):
        path = os.path.join(generated_dir, name + ".py")
        spec = importlib.util.spec_from_file_location("%s_%d" % (name, next(_fresh_names)), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.OpSlot.__module__ == "opslot" and "stub" in sys.modules["opslot"].__doc__
        return module

    return load
