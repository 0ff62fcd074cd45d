"""Hostile input, round 2 (issue #28), the generator side: names are compared as Python compares
them. Python normalises identifiers with NFKC when it parses them (PEP 3131): `ﬁnd` (U+FB01 LATIN
SMALL LIGATURE FI) and `find` are one name, so are `ｆｏｏ` and `foo`. patchgen compares names in
NFKC wherever it compares them (the upstream index, spec names, name resolution, name_map) and
never rewrites upstream's bytes. Each test failed before its fix (the names were different).
"""

import ast
import unicodedata

SPEC = "specs/tiny/tiny.yaml"
MODEL = "upstream/tinypkg/models/tiny/modeling_tiny.py"
PY = "out/patched_modeling_tiny.py"
FI = "\ufb01"  # LATIN SMALL LIGATURE FI
FOO = "\uff46\uff4f\uff4f"  # ｆｏｏ, fullwidth


def edit(project, rel, old, new):
    text = project.read(rel)
    assert old in text, old
    project.write(rel, text.replace(old, new, 1))


def generate(project):
    return project.run(SPEC, "-o", "out")


def test_the_names_are_one_name_for_python():
    # What the tests rely on, from CPython itself.
    assert unicodedata.normalize("NFKC", FI + "nd") == "find"
    assert unicodedata.normalize("NFKC", FOO) == "foo"
    tree = ast.parse(f"def {FI}nd(): pass\n{FOO} = 1\n")
    assert [tree.body[0].name, tree.body[1].targets[0].id] == ["find", "foo"]


def test_a_guard_in_a_method_named_with_a_ligature_guards_upstreams_plain_name(project):
    edit(project, SPEC, "      - in: TinyRMSNorm.forward", f"      - in: TinyRMSNorm.{FI}nd")
    edit(
        project,
        MODEL,
        "    def forward(self, hidden_states):\n        variance",
        "    def find(self, hidden_states):\n        variance",
    )
    r = generate(project)
    assert (r.returncode, r.stderr) == (0, "")  # was: "no method 'ﬁnd' in class 'TinyRMSNorm'"
    out = project.read(PY)
    assert "    def find(self, hidden_states):\n" in out
    assert "        return rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)\n" in out
    assert "#   - guard TinyRMSNorm.find: rms_norm_slot -> rms_norm/standard\n" in out


def test_upstream_spelling_is_kept_when_the_spec_names_the_plain_form(project):
    edit(
        project,
        MODEL,
        "    def forward(self, hidden_states):\n        variance",
        f"    def {FI}nd(self, hidden_states):\n        variance",
    )
    edit(project, SPEC, "      - in: TinyRMSNorm.forward", "      - in: TinyRMSNorm.find")
    r = generate(project)
    assert (r.returncode, r.stderr) == (0, "")  # was: "no method 'find' in class 'TinyRMSNorm'"
    out = project.read(PY)
    assert f"    def {FI}nd(self, hidden_states):\n" in out  # upstream's bytes, not rewritten
    assert "rms_norm_slot(hidden_states" in out
    ast.parse(out)


def test_inserted_code_reading_a_fullwidth_name_finds_upstreams_plain_one(project):
    edit(project, MODEL, '__all__ = ["TinyRMSNorm", "TinyMLP"]', 'foo = 2.0\n\n__all__ = ["TinyRMSNorm", "TinyMLP"]')
    project.write(SPEC, project.read(SPEC) + f"blocks:\n  - |\n    scaled = {FOO} * 3\n")
    r = generate(project)
    assert (r.returncode, r.stderr) == (0, "")  # was: "undefined name 'ｆｏｏ' in inserted code"
    assert f"scaled = {FOO} * 3\n" in project.read(PY)  # the spec's bytes, not rewritten


def test_an_undefined_name_is_reported_as_python_names_it(project):
    project.write(SPEC, project.read(SPEC) + f"blocks:\n  - |\n    scaled = {FOO} * 3\n")
    r = generate(project)
    assert r.returncode == 3
    # Python's own message: NameError: name 'foo' is not defined. The caret covers the three
    # characters as written (nine bytes).
    assert r.stderr.startswith(
        "specs/tiny/tiny.yaml:21:14: error: undefined name 'foo' in inserted code\n"
        f"   21 |     scaled = {FOO} * 3\n"
        "      |              ^~~\n"
        f"note: generated line 24: scaled = {FOO} * 3\n"
    ), r.stderr


def test_two_upstream_definitions_that_are_one_name_for_python_are_one_name(project):
    # Python keeps the later one; patchgen refuses to patch the first, as for any redefinition.
    edit(
        project,
        MODEL,
        '__all__ = ["TinyRMSNorm", "TinyMLP"]',
        f'def {FI}nd():\n    return 1\n\n\ndef find():\n    return 2\n\n\n__all__ = ["TinyRMSNorm", "TinyMLP"]',
    )
    project.write(
        SPEC, project.read(SPEC) + "  - replace_function: find\n    code: |\n      def find():\n          return 3\n"
    )
    r = generate(project)
    assert r.returncode == 4, r.stderr  # was: 0, the second `find` replaced, `ﬁnd` left alone
    assert r.stderr.startswith(
        "specs/tiny/tiny.yaml:19:5: error: function 'find' is defined 2 times in the upstream "
        f"module {MODEL}: Python keeps the last (line 35), patchgen would patch the first "
        "(line 31)\n"
    ), r.stderr
    r = project.run("index", MODEL)
    assert "  31:1-32:13 function find\n  35:1-36:13 function find\n" in r.stdout


def test_a_later_plain_assignment_rebinds_a_ligature_definition(project):
    # `find = other` after `def ﬁnd` rebinds it for Python: patching `ﬁnd` would patch dead code.
    edit(
        project,
        MODEL,
        '__all__ = ["TinyRMSNorm", "TinyMLP"]',
        f'def {FI}nd():\n    return 1\n\n\nfind = len\n\n\n__all__ = ["TinyRMSNorm", "TinyMLP"]',
    )
    project.write(
        SPEC,
        project.read(SPEC) + f"  - replace_function: {FI}nd\n    code: |\n      def {FI}nd():\n          return 3\n",
    )
    r = generate(project)
    assert r.returncode == 4, r.stderr  # was: 0
    assert "error: 'find' (line 31) is rebound at line 35 of the upstream module" in r.stderr


def test_exclude_and_name_map_compare_names_as_python(project):
    edit(
        project,
        MODEL,
        '__all__ = ["TinyRMSNorm", "TinyMLP"]',
        f'def {FI}nd():\n    return 1\n\n\n__all__ = ["TinyRMSNorm", "TinyMLP", "find"]',
    )
    project.write(
        SPEC,
        project.read(SPEC)
        + "exclude: [find]\n"
        + f"name_map:\n  {FOO}: helper_value\nblocks:\n  - |\n    helper_value = 1\n"
        f"    y = {FOO} + 1\n",
    )
    r = generate(project)
    assert (r.returncode, r.stderr) == (0, "")  # was: "no top-level ... 'find'", "never used"
    out = project.read(PY)
    assert f"def {FI}nd" not in out
    assert '__all__ = ["TinyRMSNorm", "TinyMLP"]' in out
    assert "y = helper_value + 1\n" in out


def test_two_name_map_keys_that_are_one_name_are_a_duplicate(project):
    project.write(SPEC, project.read(SPEC) + f"name_map:\n  {FI}nd: a\n  find: b\n")
    r = project.run("--validate", SPEC)
    assert r.returncode == 3
    assert r.stderr.startswith("specs/tiny/tiny.yaml:21:3: error: duplicate key 'find'\n"), r.stderr
