"""patchgen as Python users install it: pre-commit installs this repository, at its committed HEAD,
as a hook repository (a fresh venv, `pip install .`, which builds the static binary with
scikit-build-core) and runs `patchgen --check` / `--check --fix` in a scratch git repository whose
.pre-commit-config.yaml names this repository the way a user's would.

Slow (one C++ build inside pre-commit's venv, a few minutes on 2 cores): ctest `packaging`.
"""

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "cli", "fixtures", "project")


CONFIG = """repos:
  - repo: {root}
    rev: {rev}
    hooks:
      - id: patchgen-check
      - id: patchgen-fix
        stages: [manual]
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, request):
    """A git repository holding the CLI fixture project with its outputs generated and committed,
    and a pre-commit config that uses this repository's hooks at its HEAD commit."""
    patchgen = os.path.abspath(request.config.getoption("--patchgen"))
    repo = tmp_path_factory.mktemp("scratch")
    shutil.copytree(FIXTURE, repo, dirs_exist_ok=True)
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    rev = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    (repo / ".pre-commit-config.yaml").write_text(CONFIG.format(root=ROOT, rev=rev))
    subprocess.run([patchgen, "--all", "--diff"], cwd=repo, check=True, capture_output=True)
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "init"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    return repo, env, tmp_path_factory.mktemp("pre-commit-home")


def hook(scratch, hook_id):
    repo, env, home = scratch
    env = dict(env, PRE_COMMIT_HOME=str(home))
    stage = ["--hook-stage", "manual"] if hook_id == "patchgen-fix" else []
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", hook_id, "--all-files", *stage],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )


def generated(repo):
    (path,) = glob.glob(os.path.join(repo, "generated", "**", "*.py"), recursive=True)
    return path


def test_clean_tree_passes(scratch):
    proc = hook(scratch, "patchgen-check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "patchgen --check (generated modeling files match their specs)" in proc.stdout
    assert "Passed" in proc.stdout


def test_drifted_file_fails_and_fix_restores_it(scratch):
    repo = scratch[0]
    path = generated(repo)
    with open(path, encoding="utf-8") as fh:
        committed = fh.read()
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("# edited by hand\n")
    proc = hook(scratch, "patchgen-check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Failed" in proc.stdout and "stale: " in proc.stdout
    assert "+# edited by hand" not in proc.stdout and "-# edited by hand" in proc.stdout
    proc = hook(scratch, "patchgen-fix")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # pre-commit fails a hook that changed files
    assert "files were modified by this hook" in proc.stdout
    with open(path, encoding="utf-8") as fh:
        assert fh.read() == committed
    assert hook(scratch, "patchgen-check").returncode == 0


def test_the_installed_command_is_the_static_binary(scratch):
    home = scratch[2]
    found = glob.glob(os.path.join(home, "repo*", "py_env-*", "bin", "patchgen"))
    assert len(found) == 1, found
    out = subprocess.run([found[0], "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "patchgen 0.1.0"
    ldd = subprocess.run(["ldd", found[0]], capture_output=True, text=True)
    assert "not a dynamic executable" in (ldd.stdout + ldd.stderr)
    # the spec schema, for editors, at <prefix>/share/patchgen/
    prefix = os.path.dirname(os.path.dirname(found[0]))
    with open(os.path.join(prefix, "share", "patchgen", "patch-spec.schema.json"), encoding="utf-8") as fh:
        installed = fh.read()
    with open(os.path.join(ROOT, "schemas", "patch-spec.schema.json"), encoding="utf-8") as fh:
        assert installed == fh.read()
