"""docs/runtime.md starts with installation and a five-line quick start: the snippet runs as written
(from the repository root, opslot importable) and prints what the doc shows."""

import os
import re
import subprocess
import sys

from example_models import REPO

DOC = os.path.join(REPO, "docs", "runtime.md")


def quick_start():
    text = open(DOC, encoding="utf-8").read()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    output = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    return text, code, output


def test_doc_starts_with_installation_and_quick_start():
    text, code, _ = quick_start()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] == ["Installation", "Quick start"]
    assert len(code.strip().splitlines()) == 5


def test_quick_start_runs_as_written():
    _, code, output = quick_start()
    # PYTHONPATH: what `pip install ./runtime` gives; no GPU: the doc shows a CPU's defaults
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "runtime"), CUDA_VISIBLE_DEVICES="")
    env.pop("OPSLOT_FORCE_IMPL", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == output


def test_training_snippet_runs_as_written():
    """docs/runtime.md, "Training a real model": a generated Qwen3 found by opslot.AutoModelForCausalLM
    (the checkout's generated/, made by `make run` / `make test`) trains five steps on the CPU."""
    text = open(DOC, encoding="utf-8").read()
    section = text.split("## Training a real model", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    output = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "runtime"), CUDA_VISIBLE_DEVICES="")
    for name in ("OPSLOT_FORCE_IMPL", "OPSLOT_GENERATED_DIR"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == output


def test_migration_guide_runs_as_written():
    """docs/migration.md, "From a reference config to a training step": the reference trainer's full
    Qwen3-MoE ops section, unchanged but for attention, builds through opslot.AutoModelForCausalLM and
    takes a step on the CPU; the plan printed is the page's."""
    text = open(os.path.join(REPO, "docs", "migration.md"), encoding="utf-8").read()
    section = text.split("## From a reference config to a training step", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    output = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "runtime"), CUDA_VISIBLE_DEVICES="")
    for name in ("OPSLOT_FORCE_IMPL", "OPSLOT_GENERATED_DIR"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == output
