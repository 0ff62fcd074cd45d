"""Options and fixtures of the real-model pytest suites (tests/models/test_*.py).

--patchgen PATH     the patchgen binary (default $PATCHGEN_BIN, else build/tools/patchgen/patchgen)
--source-root DIR   folder holding the `transformers` package to generate against (default: the
                    folder of the imported transformers)
--device DEV        torch device the models run on (default $OPSLOT_TEST_DEVICE, else cpu)
"""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # e2e.py, hf_checkpoints.py
sys.path.insert(0, str(ROOT / "runtime"))  # opslot


def pytest_addoption(parser):
    parser.addoption(
        "--patchgen",
        default=os.environ.get("PATCHGEN_BIN", str(ROOT / "build/tools/patchgen/patchgen")),
        help="the patchgen binary",
    )
    parser.addoption("--source-root", default=None, help="folder holding the transformers package")
    parser.addoption("--device", default=os.environ.get("OPSLOT_TEST_DEVICE", "cpu"), help="torch device")


@pytest.fixture(scope="session")
def patchgen(request):
    path = Path(request.config.getoption("--patchgen")).resolve()
    if not path.is_file():
        pytest.fail(f"no patchgen binary at {path} (build it, or pass --patchgen / set PATCHGEN_BIN)")
    return str(path)


@pytest.fixture(scope="session")
def source_root(request):
    root = request.config.getoption("--source-root")
    if root:
        return str(Path(root).resolve())
    import transformers

    return str(Path(transformers.__file__).resolve().parents[1])


@pytest.fixture(scope="session")
def device(request):
    import torch

    dev = torch.device(request.config.getoption("--device"))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("--device cuda without CUDA")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)  # with e2e's CUBLAS_WORKSPACE_CONFIG
    return dev
