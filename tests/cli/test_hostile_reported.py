"""Hostile and broken input (issue #17): findings fixed in src/spec and src/rewriter (commit
2d7e144, issue #18's helper). Written first as strict xfail tests, which failed on the code before that
commit: a slot's op string injected code, a trailing comment of a patch body was dropped, a broken
parent gave its child a false error, a parent with a byte order mark had its positions shifted.
"""

import ast
import os
import subprocess

SPEC = "specs/tiny/tiny.yaml"
PY = "generated/tiny/patched_modeling_tiny.py"


def run(project, *args):
    env = {k: v for k, v in os.environ.items() if k != "PATCHGEN_SOURCE_PATH"}
    env["PATH"] = "/usr/bin:/bin"
    return subprocess.run(
        [project.binary, *args], cwd=project.root, env=env, capture_output=True, text=True, timeout=60
    )


def test_slot_op_string_cannot_inject_code(project):
    project.write(SPEC, project.read(SPEC).replace("    op: rms_norm", "    op: 'x\" + str(1) + \"'"))
    r = run(project, "--all")
    if r.returncode == 3:
        assert r.stderr.startswith("specs/tiny/tiny.yaml:8:9: error: "), r.stderr
        return
    assert r.returncode == 0, r.stderr
    tree = ast.parse(project.read(PY))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "OpSlot"]
    assert calls and isinstance(calls[0].args[0], ast.Constant)  # today: a BinOp that calls str()
    assert calls[0].args[0].value == 'x" + str(1) + "'


def test_trailing_comment_on_the_last_line_of_a_patch_body_is_kept(project):
    project.write(
        "specs/tiny/patches/mlp.py", "def mlp_forward(self, x):\n    return self.down_proj(x)  # keep this comment\n"
    )
    r = run(project, "--all")
    assert r.returncode == 0, r.stderr
    assert "return self.down_proj(x)  # keep this comment\n" in project.read(PY)


def test_broken_parent_spec_gives_only_its_own_error(project):
    project.write(
        "specs/tiny/parent.yaml",
        "version: 1\nupstream: tinypkg.models.tiny.modeling_tiny\noutput: parent.py\nslots: [\n",
    )
    spec = project.read(SPEC).replace("upstream: tinypkg.models.tiny.modeling_tiny\n", "extends: parent.yaml\n")
    project.write(SPEC, spec)
    r = run(project, SPEC)
    assert r.returncode == 3
    assert "specs/tiny/parent.yaml:5:1: error: invalid YAML: end of sequence flow not found\n" in r.stderr
    assert "missing required key 'upstream'" not in r.stderr, r.stderr


def test_parent_spec_with_a_byte_order_mark_keeps_its_columns(project):
    parent = project.read(SPEC).replace("TinyMLP.forward", "TinyMLP.fowrard")
    with open(project.path("specs/tiny/parent.yaml"), "wb") as f:
        f.write(b"\xef\xbb\xbf" + parent.encode())
    project.write(SPEC, "version: 1\nextends: parent.yaml\noutput: child.py\n")
    r = run(project, SPEC)
    assert r.returncode == 3
    assert r.stderr.startswith("specs/tiny/parent.yaml:15:22: error: no method 'fowrard' in class 'TinyMLP'\n"), (
        r.stderr
    )
