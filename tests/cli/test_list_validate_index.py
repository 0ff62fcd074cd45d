"""--list statuses, --validate (no upstream needed) and the `index` subcommand."""

import json
import shutil

SPEC = "specs/tiny/tiny.yaml"
MODULE = "tinypkg.models.tiny.modeling_tiny"


def test_list_statuses(project):
    for name in ["a", "b", "c"]:
        project.write(f"specs/tiny/{name}.yaml", project.read(SPEC).replace("patched_modeling_tiny.py", f"{name}.py"))
    project.write(
        "specs/real/llama.yaml",
        "version: 1\nupstream: transformers.models.llama.modeling_llama\noutput: patched_llama.py\n",
    )
    assert project.run("--all").returncode == 0
    project.write("generated/tiny/b.py", "old\n")
    shutil.os.remove(project.path("generated/tiny/c.py"))
    before = project.snapshot()
    r = project.run("--list")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (
        "SPEC                   UPSTREAM                                  OUTPUT                                   STATUS\n"
        "specs/real/llama.yaml  transformers.models.llama.modeling_llama  generated/real/patched_llama.py          upstream not found\n"
        "specs/tiny/a.yaml      tinypkg.models.tiny.modeling_tiny         generated/tiny/a.py                      up to date\n"
        "specs/tiny/b.yaml      tinypkg.models.tiny.modeling_tiny         generated/tiny/b.py                      stale\n"
        "specs/tiny/c.yaml      tinypkg.models.tiny.modeling_tiny         generated/tiny/c.py                      missing\n"
        "specs/tiny/tiny.yaml   tinypkg.models.tiny.modeling_tiny         generated/tiny/patched_modeling_tiny.py  up to date\n"
    )
    assert project.snapshot() == before
    report = json.loads(project.run("--list", "--json").stdout)
    assert [(e["spec"], e["status"]) for e in report["specs"]] == [
        ("specs/real/llama.yaml", "upstream not found"),
        ("specs/tiny/a.yaml", "up to date"),
        ("specs/tiny/b.yaml", "stale"),
        ("specs/tiny/c.yaml", "missing"),
        ("specs/tiny/tiny.yaml", "up to date"),
    ]


def test_validate_needs_no_upstream(project):
    shutil.rmtree(project.path("upstream"))
    r = project.run("--validate")
    assert (r.returncode, r.stdout, r.stderr) == (0, "validate: 1 of 1 specs valid\n", "")
    r = project.run("--validate", "-v", SPEC)
    assert r.stdout == f"valid: {SPEC}\nvalidate: 1 of 1 specs valid\n"


def test_validate_reports_python_and_slot_errors(project):
    shutil.rmtree(project.path("upstream"))
    project.write(
        "specs/tiny/bad.yaml",
        """\
version: 1
upstream: tinypkg.models.tiny.modeling_tiny
output: bad.py

slots:
  - name: rms_norm_slot
    op: rms_norm
    variant: standard
    scope: instance
    guards:
      - in: rms_helper
        call: rms_norm_slot(hidden_states)

patches:
  - replace_class: TinyMLP
    code: |
      class TinyMLP(nn.Module):
          def forward(self, x)
              return x
  - override_method: TinyRMSNorm.forward
    file: patches/mlp.py
    symbol: mlp_forwrd
""",
    )
    r = project.run("--validate")
    assert r.returncode == 3
    assert r.stdout == "validate: 1 of 2 specs valid\n"
    assert (
        r.stderr
        == """\
specs/tiny/bad.yaml:11:13: error: slot 'rms_norm_slot' has scope: instance, so it can only guard methods
   11 |       - in: rms_helper
      |             ^~~~~~~~~~
help: write the target as Class.method, or use scope: module
specs/tiny/bad.yaml:18:11: error: body of replace_class TinyMLP does not parse as Python
   18 |           def forward(self, x)
      |           ^
help: fix the syntax error at this position
specs/tiny/bad.yaml:22:13: error: no def or class 'mlp_forwrd' in 'patches/mlp.py'
   22 |     symbol: mlp_forwrd
      |             ^~~~~~~~~~
help: did you mean 'mlp_forward'? definitions in patches/mlp.py: mlp_forward
"""
    )


def test_validate_parses_statement_edits(project):
    """`--validate` parses every edit_body edit's code, as it parses patch bodies (no upstream needed)."""
    shutil.rmtree(project.path("upstream"))
    project.write(
        "specs/tiny/edits.yaml",
        """\
version: 1
upstream: tinypkg.models.tiny.modeling_tiny
output: edits.py

patches:
  - edit_body: TinyMLP.forward
    edits:
      - insert_after: "x = self.up(x)"
        code: |
          if x.isnan().any()
              raise ValueError("nan")
      - delete: "return x"
""",
    )
    r = project.run("--validate")
    assert r.returncode == 3
    assert r.stdout == "validate: 1 of 2 specs valid\n"
    assert (
        r.stderr
        == """\
specs/tiny/edits.yaml:10:11: error: code of edit_body TinyMLP.forward insert_after does not parse as Python
   10 |           if x.isnan().any()
      |           ^
help: fix the syntax error at this position
"""
    )


def test_validate_yaml_error_exits_3(project):
    project.write("specs/tiny/broken.yaml", "version: 1\nupstream: [unclosed\n")
    r = project.run("--validate")
    assert r.returncode == 3
    assert r.stderr.startswith("specs/tiny/broken.yaml:")


def test_index_text_and_json(project):
    f = "upstream/tinypkg/activations.py"
    r = project.run("index", f)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{f}: ")
    assert "def silu" in r.stdout
    r = project.run("index", f, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["path"] == f
    assert [d["name"] for d in doc["definitions"]] == ["silu"]
    r = project.run("index", "--json", f, "upstream/tinypkg/models/tiny/modeling_tiny.py")
    docs = json.loads(r.stdout)
    assert [d["path"] for d in docs] == [f, "upstream/tinypkg/models/tiny/modeling_tiny.py"]


def test_index_refuses_a_file_that_does_not_parse(project):
    project.write("broken.py", "def f(:\n    pass\n")
    r = project.run("index", "broken.py")
    assert r.returncode == 4
    assert r.stdout == ""
    assert r.stderr.startswith("broken.py:1:")
    assert project.run("index").returncode == 2
    assert project.run("index", "missing.py").returncode == 5


def test_index_output_does_not_depend_on_jobs(project):
    files = [
        "upstream/tinypkg/activations.py",
        "upstream/tinypkg/models/tiny/modeling_tiny.py",
        "upstream/tinypkg/__init__.py",
    ]
    one = project.run("index", "-j", "1", *files)
    many = project.run("index", "--jobs", "4", *files)
    assert one.returncode == many.returncode == 0
    assert one.stdout == many.stdout
    assert one.stdout.count("\n\n") >= 2  # files separated by a blank line, in argument order
    assert one.stdout.index("activations.py") < one.stdout.index("modeling_tiny.py") < one.stdout.index("__init__.py")
