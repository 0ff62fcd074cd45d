"""Project config discovery (pyproject.toml / patchgen.toml) and the upstream lookup order."""

import json
import os
import shutil

SPEC = "specs/tiny/tiny.yaml"
MODULE_REL = "tinypkg/models/tiny/modeling_tiny.py"


def copy_package(project, dest, version):
    """A second copy of tinypkg under `dest` with another version."""
    shutil.copytree(project.path("upstream", "tinypkg"), project.path(dest, "tinypkg"))
    project.write(f"{dest}/tinypkg/__init__.py", f'__version__ = "{version}"\n')


def upstream_of(project, *args, env=None):
    r = project.run(SPEC, "--json", "--dry-run", *args, env=env)
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["specs"][0]
    return entry["upstream_path"], entry["upstream_version"]


def fake_python(project, sys_path):
    """An 'interpreter' that logs each call and prints `sys_path` as JSON."""
    script = f"#!/bin/sh\necho called >> '{project.path('python_calls.log')}'\necho '{json.dumps(sys_path)}'\n"
    project.write("fakepy", script)
    os.chmod(project.path("fakepy"), 0o755)


def calls(project):
    try:
        return len(open(project.path("python_calls.log")).read().splitlines())
    except FileNotFoundError:
        return 0


def test_pyproject_found_from_a_subfolder(project):
    r = project.run("--all", cwd=project.path("specs", "tiny"))
    assert r.returncode == 0, r.stderr
    # Paths in messages are relative to the project root, wherever patchgen runs from.
    assert r.stdout.startswith("wrote generated/tiny/patched_modeling_tiny.py (")
    assert os.path.exists(project.path("generated/tiny/patched_modeling_tiny.py"))
    # The header names the spec relative to the project root, not to the working directory.
    assert "specs/tiny/tiny.yaml" in project.read("generated/tiny/patched_modeling_tiny.py")
    assert "../../specs" not in project.read("generated/tiny/patched_modeling_tiny.py")


def test_pyproject_without_table_is_skipped(project):
    project.write("specs/pyproject.toml", "[project]\nname = 'inner'\n")
    r = project.run("--all", cwd=project.path("specs"))
    assert r.returncode == 0, r.stderr
    assert os.path.exists(project.path("generated/tiny/patched_modeling_tiny.py"))


def test_patchgen_toml_with_top_level_keys(project):
    os.remove(project.path("pyproject.toml"))
    project.write("patchgen.toml", 'specs = "specs"\noutput = "out"\nsource_roots = ["upstream"]\n')
    r = project.run("--all")
    assert r.returncode == 0, r.stderr
    assert os.path.exists(project.path("out/tiny/patched_modeling_tiny.py"))


def test_nearer_patchgen_toml_wins_over_farther_pyproject(project):
    shutil.copytree(project.path("specs"), project.path("sub/specs"))
    project.write("sub/patchgen.toml", 'output = "gen2"\nsource_roots = ["../upstream"]\n')
    r = project.run("--all", cwd=project.path("sub"))
    assert r.returncode == 0, r.stderr
    assert os.path.exists(project.path("sub/gen2/tiny/patched_modeling_tiny.py"))


def test_unknown_config_key_suggests_the_right_one(project):
    project.write("pyproject.toml", '[tool.patchgen]\nspecs = "specs"\nsource_root = ["upstream"]\n')
    r = project.run("--all")
    assert r.returncode == 2
    assert r.stderr == (
        "pyproject.toml:3:1: error: unknown key 'source_root' in [tool.patchgen]\n"
        '    3 | source_root = ["upstream"]\n'
        "      | ^~~~~~~~~~~\n"
        "help: did you mean 'source_roots'? known keys: specs, output, source_roots, python, runtime\n"
    )


def test_config_value_of_wrong_type(project):
    project.write("pyproject.toml", "[tool.patchgen]\nspecs = 3\n")
    r = project.run("--all")
    assert r.returncode == 2
    assert r.stderr.startswith("pyproject.toml:2:9: error: 'specs' must be a string\n")


def test_invalid_toml(project):
    project.write("pyproject.toml", "[tool.patchgen]\nspecs = \n")
    r = project.run("--all")
    assert r.returncode == 2
    assert r.stderr.startswith("pyproject.toml:2:")
    assert "error: invalid TOML: " in r.stderr


def test_lookup_order_flag_env_config_syspath(project):
    for dest, version in [("flag", "4.0.0"), ("env", "3.0.0"), ("sys", "1.5.0")]:
        copy_package(project, dest, version)
    fake_python(project, [project.path("sys")])
    project.write("pyproject.toml", '[tool.patchgen]\nsource_roots = ["upstream"]\npython = "./fakepy"\n')
    env = {"PATCHGEN_SOURCE_PATH": "nonexistent:" + project.path("env")}
    assert upstream_of(project, "--source-root", "flag", env=env) == (f"flag/{MODULE_REL}", "4.0.0")
    assert upstream_of(project, env=env) == (f"env/{MODULE_REL}", "3.0.0")
    assert upstream_of(project) == (f"upstream/{MODULE_REL}", "1.0.0")
    assert calls(project) == 0  # found before sys.path: the interpreter is never asked
    shutil.rmtree(project.path("upstream"))
    assert upstream_of(project) == (f"sys/{MODULE_REL}", "1.5.0")
    assert calls(project) == 1


def test_interpreter_is_asked_once_per_run(project):
    copy_package(project, "sys", "1.5.0")
    shutil.rmtree(project.path("upstream", "tinypkg"))
    fake_python(project, ["", project.path("sys")])
    project.write("pyproject.toml", '[tool.patchgen]\npython = "./fakepy"\n')
    for name in ["a", "b", "c"]:
        project.write(f"specs/tiny/{name}.yaml", project.read(SPEC).replace("patched_modeling_tiny.py", f"{name}.py"))
    r = project.run("--all")
    assert r.returncode == 0, r.stderr
    assert calls(project) == 1


def test_version_from_dist_info_metadata(project):
    project.write("upstream/tinypkg/__init__.py", "")
    project.write(
        "upstream/tinypkg-2.3.4.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: tinypkg\nVersion: 2.3.4\n\nVersion: 9.9.9\n",
    )
    assert upstream_of(project) == (f"upstream/{MODULE_REL}", "2.3.4")


def test_package_as_init_module(project):
    # `a.b` may be a package: a/b/__init__.py.
    project.write("specs/tiny/pkg.yaml", "version: 1\nupstream: tinypkg.models.tiny\noutput: pkg.py\n")
    r = project.run("specs/tiny/pkg.yaml", "--json", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["specs"][0]["upstream_path"] == "upstream/tinypkg/models/tiny/__init__.py"


def test_not_found_lists_every_place_and_how_to_fix(project):
    fake_python(project, [project.path("nowhere")])
    project.write("pyproject.toml", '[tool.patchgen]\nsource_roots = ["upstream"]\npython = "./fakepy"\n')
    shutil.rmtree(project.path("upstream", "tinypkg"))
    r = project.run(SPEC, "--source-root", "flagdir", env={"PATCHGEN_SOURCE_PATH": project.path("envdir")})
    assert r.returncode == 4
    assert r.stdout == "1 specs: 0 written, 0 unchanged, 0 skipped, 1 failed\n"
    assert r.stderr == (
        "specs/tiny/tiny.yaml:2:11: error: upstream module 'tinypkg.models.tiny.modeling_tiny' not found\n"
        "    2 | upstream: tinypkg.models.tiny.modeling_tiny\n"
        "      |           ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\n"
        "looked in:\n"
        f"  flagdir/{MODULE_REL} (--source-root)\n"
        f"  envdir/{MODULE_REL} (PATCHGEN_SOURCE_PATH)\n"
        f"  upstream/{MODULE_REL} (source_roots in pyproject.toml)\n"
        f"  nowhere/{MODULE_REL} (sys.path of {project.path('fakepy')})\n"
        "help: add the folder that contains 'tinypkg/' with --source-root DIR, "
        'PATCHGEN_SOURCE_PATH=DIR[:DIR...], or source_roots = ["DIR"] in the project config '
        "([tool.patchgen] in pyproject.toml)\n"
    )


def test_messages_name_paths_relative_to_the_project_root_from_a_subfolder(project):
    sub = project.path("specs", "tiny")
    # A spec named relative to the working directory, its patch file read from its own folder.
    r = project.run("tiny.yaml", "--diff", "--json", cwd=sub)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)["specs"][0]
    assert (report["spec"], report["output"], report["upstream_path"]) == (
        "specs/tiny/tiny.yaml",
        "generated/tiny/patched_modeling_tiny.py",
        "upstream/tinypkg/models/tiny/modeling_tiny.py",
    )
    # --check: stale output and its spec.
    project.write(
        "generated/tiny/patched_modeling_tiny.py",
        project.read("generated/tiny/patched_modeling_tiny.py") + "# edited\n",
    )
    r = project.run("--check", cwd=sub)
    assert r.returncode == 1
    assert r.stdout.startswith(
        "stale: generated/tiny/patched_modeling_tiny.py (from specs/tiny/tiny.yaml)\n"
        "--- a/generated/tiny/patched_modeling_tiny.py\n"
    )
    # An error in the spec and one in its patch file.
    project.write(
        "specs/tiny/tiny.yaml",
        project.read("specs/tiny/tiny.yaml").replace("symbol: mlp_forward", "symbol: mlp_forwrd"),
    )
    r = project.run("--all", cwd=sub)
    assert r.returncode == 3
    assert r.stderr.startswith("specs/tiny/tiny.yaml:")
    assert "specs/tiny/patches/mlp.py" in r.stderr and "../" not in r.stderr
    # An upstream that is not found: the places looked.
    project.write(
        "specs/tiny/tiny.yaml",
        project.read("specs/tiny/tiny.yaml")
        .replace("symbol: mlp_forwrd", "symbol: mlp_forward")
        .replace("models.tiny.modeling_tiny", "models.tiny.gone"),
    )
    r = project.run("specs/tiny/tiny.yaml", cwd=project.root)
    from_root = r.stderr
    r = project.run("tiny.yaml", cwd=sub)
    assert r.returncode == 4
    assert "  upstream/tinypkg/models/tiny/gone.py (source_roots in pyproject.toml)\n" in r.stderr
    assert r.stderr == from_root
