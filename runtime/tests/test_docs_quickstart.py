"""Code blocks of the docs run as written (from the repository root, opslot importable, no GPU) and print
what the doc shows: docs/runtime.md's five-line quick start (the page starts with it) and its training
snippet, and docs/migration.md's walk from a reference-trainer config to a training step."""

import os
import re
import subprocess
import sys

from example_models import REPO

DOC = os.path.join(REPO, "docs", "runtime.md")


def doc_block(page: str, heading: str):
    """(the page's text, the first python block and the first text block of its `## heading` section)."""
    text = open(page, encoding="utf-8").read()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    output = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    return text, code, output


def run_as_written(code: str) -> str:
    """stdout of `code` run from the repository root. PYTHONPATH: what `pip install ./runtime` gives;
    no GPU: the docs show a CPU's defaults; no environment override of opslot's choices."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "runtime"), CUDA_VISIBLE_DEVICES="")
    for name in ("OPSLOT_FORCE_IMPL", "OPSLOT_GENERATED_DIR"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_doc_starts_with_installation_and_quick_start():
    text, code, _ = doc_block(DOC, "Quick start")
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] == ["Installation", "Quick start"]
    assert len(code.strip().splitlines()) == 5


def test_quick_start_runs_as_written():
    _, code, output = doc_block(DOC, "Quick start")
    assert run_as_written(code) == output


def test_training_snippet_runs_as_written():
    """docs/runtime.md, "Training a real model": a generated Qwen3 found by opslot.AutoModelForCausalLM
    (the checkout's generated/, made by `make run` / `make test`) trains five steps on the CPU."""
    _, code, output = doc_block(DOC, "Training a real model")
    assert run_as_written(code) == output


def test_migration_guide_runs_as_written():
    """docs/migration.md, "From a reference config to a training step": the reference trainer's full
    Qwen3-MoE ops section, unchanged but for attention, builds through opslot.AutoModelForCausalLM and
    takes a step on the CPU; the plan printed is the page's."""
    _, code, output = doc_block(
        os.path.join(REPO, "docs", "migration.md"), "From a reference config to a training step"
    )
    assert run_as_written(code) == output
