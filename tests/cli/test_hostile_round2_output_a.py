"""Hostile input, round 2 (issue #28), the generator side: the upstream lookup imports what
Python imports.

A module is found by Python's rules for source files over the source roots in order (the
`--source-root` flags, PATCHGEN_SOURCE_PATH, the config's roots, then sys.path): a regular package
(`__init__.py`) wins over namespace portions (folders without `__init__.py`) seen before it, and
a regular package that lacks the module hides the same module under a later root. Each test
failed before its fix: patchgen took the first root holding the file.
"""

import os
import shutil
import subprocess
import sys

SPEC = "specs/tiny/tiny.yaml"
PY = "generated/tiny/patched_modeling_tiny.py"
MODULE = "tinypkg.models.tiny.modeling_tiny"
MODELING = "tinypkg/models/tiny/modeling_tiny.py"
MARK = "# a namespace portion's copy: Python never imports it\n"


def python_origin(roots):
    """Where CPython itself finds MODULE with `roots` first on sys.path (parents imported; they
    hold nothing but a version string)."""
    code = (
        f"import importlib.util, sys; sys.path[:0] = sys.argv[1:]; print(importlib.util.find_spec({MODULE!r}).origin)"
    )
    r = subprocess.run([sys.executable, "-c", code, *roots], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def namespace_copy(project, folder):
    """`folder/tinypkg/...` holding the modeling file but no `tinypkg/__init__.py`."""
    src = project.path("upstream", MODELING)
    dst = project.path(folder, MODELING)
    os.makedirs(os.path.dirname(dst))
    with open(src) as f:
        text = f.read()
    with open(dst, "w") as f:
        f.write(MARK + text)


def test_a_regular_package_wins_over_an_earlier_namespace_portion(project):
    namespace_copy(project, "portion")
    # CPython agrees: the namespace portion comes first on the path, the regular package wins.
    assert python_origin([project.path("portion"), project.path("upstream")]) == project.path("upstream", MODELING)
    r = project.run("--all", "--source-root", "portion")
    assert r.returncode == 0, r.stderr
    out = project.read(PY)
    assert MARK not in out  # was: the portion's copy was generated from
    assert f"({MODELING})" in out and "version:  1.0.0" in out


def test_a_namespace_portion_is_used_when_no_root_has_a_regular_package(project):
    namespace_copy(project, "portion")
    shutil.rmtree(project.path("upstream"))
    shutil.copytree(project.path("portion"), project.path("upstream"))
    # The config root now holds a second namespace portion: Python takes the first root's file.
    with open(project.path("upstream", MODELING)) as f:
        text = f.read()
    with open(project.path("upstream", MODELING), "w") as f:
        f.write(text.replace(MARK, "# the second portion\n"))
    assert python_origin([project.path("portion"), project.path("upstream")]) == project.path("portion", MODELING)
    r = project.run("--all", "--source-root", "portion")
    assert r.returncode == 0, r.stderr
    assert MARK in project.read(PY)


def test_a_regular_package_without_the_module_hides_a_later_root(project):
    os.makedirs(project.path("first/tinypkg"))
    with open(project.path("first/tinypkg/__init__.py"), "w") as f:
        f.write('__version__ = "9.9.9"\n')
    # CPython: `tinypkg` is the first root's package, which has no `models`.
    assert python_origin([project.path("first"), project.path("upstream")]) is None
    r = project.run("--all", "--source-root", "first")
    assert r.returncode == 4, r.stdout + r.stderr  # was: 0, generated from the later root
    assert f"error: upstream module '{MODULE}' not found" in r.stderr
    assert not os.path.exists(project.path(PY))
