"""Hostile input, round 2 (issue #28), generator side, part b: discovery for `--all`.

A parent spec meant only to be extended (no `output` of its own) may live inside the specs root:
`--all` and `--check` skip it with a note instead of failing on its missing `output`. A spec
without `output` that nothing extends is still an error. The test failed before its fix.
"""

SPEC = "specs/tiny/tiny.yaml"


def split_into_parent_and_child(project):
    text = project.read(SPEC)
    parent = text.replace("output: patched_modeling_tiny.py\n", "").replace(
        "file: patches/mlp.py", "file: ../tiny/patches/mlp.py"
    )
    project.write("specs/base/tiny_base.yaml", parent)
    project.write(SPEC, "extends: ../base/tiny_base.yaml\noutput: patched_modeling_tiny.py\n")


def test_all_skips_an_abstract_parent_inside_the_specs_root_with_a_note(project):
    split_into_parent_and_child(project)
    r = project.run("--all", "--diff")
    assert r.returncode == 0, r.stderr  # was: exit 3, "missing required key 'output'"
    assert r.stderr == (
        "note: specs/base/tiny_base.yaml: skipped: a parent spec without `output` "
        "(extended by specs/tiny/tiny.yaml), generated only through its children\n"
    )
    assert project.read("generated/tiny/patched_modeling_tiny.py")
    r = project.run("--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "check: 1 up to date, 0 stale, 0 skipped, 0 failed\n"


def test_a_spec_without_output_that_nothing_extends_is_still_an_error(project):
    text = project.read(SPEC)
    project.write("specs/base/lonely.yaml", text.replace("output: patched_modeling_tiny.py\n", ""))
    r = project.run("--all")
    assert r.returncode == 3
    assert "specs/base/lonely.yaml:1:1: error: missing required key 'output'" in r.stderr
