"""Options and fixtures of the distributed tests (tests/distributed/test_distributed.py).

--patchgen PATH     the patchgen binary (default $PATCHGEN_BIN, else .device-bin/patchgen, else build/tools/patchgen/patchgen)
--source-root DIR   folder holding the `transformers` package to generate against (default: the imported one's)
--device DEV        cpu (gloo, torch kernels, fp32) or cuda (NCCL, cuda kernels, bf16, 2 GPUs); default
                    $OPSLOT_TEST_DEVICE, else cpu
--results-json PATH also write every scenario's measurements there
"""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "runtime"))


def _default_patchgen() -> str:
    env = os.environ.get("PATCHGEN_BIN")
    if env:
        return env
    for cand in (ROOT / ".device-bin" / "patchgen", ROOT / "build" / "tools" / "patchgen" / "patchgen"):
        if cand.is_file():
            return str(cand)
    return str(ROOT / "build" / "tools" / "patchgen" / "patchgen")


def pytest_addoption(parser):
    for name, kw in (
        ("--patchgen", dict(default=_default_patchgen(), help="the patchgen binary")),
        ("--source-root", dict(default=None, help="folder holding the transformers package")),
        ("--device", dict(default=os.environ.get("OPSLOT_TEST_DEVICE", "cpu"), help="cpu or cuda")),
        ("--results-json", dict(default=None, help="write the scenarios' measurements here")),
    ):
        try:
            parser.addoption(name, **kw)
        except ValueError:  # another conftest of the same run defines it
            pass


@pytest.fixture(scope="session")
def device(request):
    dev = request.config.getoption("--device")
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            pytest.skip("--device cuda needs 2 CUDA GPUs")
    return dev


@pytest.fixture(scope="session")
def module_dir(request, tmp_path_factory):
    import harness

    patchgen = Path(request.config.getoption("--patchgen")).resolve()
    if not patchgen.is_file():
        pytest.fail(f"no patchgen binary at {patchgen} (build it, or pass --patchgen / set PATCHGEN_BIN)")
    root = request.config.getoption("--source-root")
    if not root:
        import importlib.util

        root = str(Path(importlib.util.find_spec("transformers").origin).resolve().parents[1])
    return str(harness.generate(str(patchgen), root, tmp_path_factory.mktemp("generated")))
