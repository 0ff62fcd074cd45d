"""opslot states its minimum torch and refuses older ones at import."""

import re
from pathlib import Path

import pytest
import torch

import opslot


def test_minimum_torch_matches_the_package_metadata():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    pin = re.search(r'"torch>=(\d+)\.(\d+)"', text)
    assert pin and (int(pin.group(1)), int(pin.group(2))) == opslot.MIN_TORCH == (2, 4)


@pytest.mark.parametrize("version", ["2.4.0", "2.11.0+cu130", "2.12.0.dev20261201", "3.0.0a0"])
def test_supported_versions_import(version):
    opslot._check_torch(version)


@pytest.mark.parametrize("version", ["1.13.0a0+git", "2.3.1+cpu", "2.0.0"])
def test_older_versions_are_refused(version):
    with pytest.raises(ImportError, match=rf"^opslot needs torch >= 2\.4, found torch {re.escape(version)}$"):
        opslot._check_torch(version)


def test_the_running_torch_is_supported():
    assert tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= opslot.MIN_TORCH
