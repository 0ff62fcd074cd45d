"""`patchgen pin`, contract pins under generation and --check, and `patchgen audit` (issue #15).

The upstream is the toy of tests/golden/inputs/toy_pins (version 1.0.0, "old"); each test copies
it to `new/` with one drift applied (bumped to 2.0.0) and checks what pins and audit say, and that
neither audit nor --check writes anything.
"""

import json
import os
import shutil

import pytest

from conftest import Project

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
TOY = os.path.join(GOLDEN, "inputs", "toy_pins")
MODEL = os.path.join("toypkg", "models", "toy", "modeling_toy.py")

SPEC = """\
upstream: toypkg.models.toy.modeling_toy
output: patched_modeling_toy.py
imports:
  add:
    - from ...utils import can_return_tuple as _crt
  drop: [old_helper]
slots:
  - name: rms_norm_slot
    op: rms_norm
    variant: standard
    guards:
      - in: ToyRMSNorm.forward
        call: rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
  - name: loss_slot
    op: cross_entropy_loss
    variant: causal
    guards:
      - in: ToyForCausalLM.forward
        at: "logits = self.lm_head("
        through: "if labels is not None:"
        call: |
          logits, loss = loss_slot(self, hidden_states[:, slice_indices, :], labels)
patches:
  - override_method: ToyAttention.forward
    code: |
      def forward(self, hidden_states, attention_mask=None):
          return hidden_states * (self.scale * 2.0)
  - add_method: ToyRMSNorm.extra_repr
    code: |
      def extra_repr(self):
          return "toy"
"""

# Spec line numbers of the entries (for the locations audit must report).
LINE_RMS_GUARD = 12
LINE_LOSS_GUARD = 18
LINE_LOSS_AT = 19
LINE_OVERRIDE = 24
LINE_ADD_METHOD = 28
LINE_IMPORT_ADD = 5
LINE_DROP = 6


@pytest.fixture
def toy(tmp_path, patchgen):
    root = tmp_path / "toy"
    root.mkdir()
    shutil.copytree(TOY, root / "old")
    shutil.copytree(TOY, root / "new")
    p = Project(root, patchgen)
    p.write("specs/toy/toy.yaml", SPEC)
    p.write("pyproject.toml", '[tool.patchgen]\nspecs = "specs"\noutput = "generated"\n')
    p.write("new/toypkg/__init__.py", '__version__ = "2.0.0"\n')
    return p


def drift(p, old, new, rel=MODEL):
    text = p.read("new", rel)
    assert old in text, old
    p.write(os.path.join("new", rel), text.replace(old, new, 1))


def pin(p, root="old"):
    r = p.run("pin", "specs/toy/toy.yaml", "--source-root", root)
    assert r.returncode == 0, r.stderr
    return r


def audit(p, *extra):
    before = p.snapshot()
    r = p.run("audit", "--source-root", "new", "--source-root-old", "old", "--json", *extra)
    assert p.snapshot() == before, "audit wrote something"
    return r, json.loads(r.stdout)


def findings(report):
    (spec,) = [s for s in report["specs"] if s["spec"] == "specs/toy/toy.yaml"]
    return spec["findings"]


def test_pin_writes_a_reviewable_file_and_is_idempotent(toy):
    r = pin(toy)
    assert "pinned specs/toy/toy.pins (4 entries, 4 new fingerprints" in r.stdout
    text = toy.read("specs/toy/toy.pins")
    assert '- key: "guard rms_norm_slot in ToyRMSNorm.forward"' in text
    assert "return self.weight * hidden_states.to(input_dtype)" in text
    assert '- key: "add_method ToyRMSNorm.extra_repr"\n    region: absent' in text
    before = toy.snapshot()
    r = pin(toy)
    assert "unchanged specs/toy/toy.pins" in r.stdout
    assert toy.snapshot() == before
    # A second version with the same contracts adds the version, not new fingerprints.
    r = pin(toy, "new")
    assert "0 new fingerprints" in r.stdout
    assert '["1.0.0", "2.0.0"]' in toy.read("specs/toy/toy.pins")


def test_pin_keeps_the_comments_a_reviewer_wrote_in_place(toy):
    # Issue #28: `pin` rewrote the file from its entries and dropped every comment.
    pin(toy)
    text = toy.read("specs/toy/toy.pins")
    guard = '  - key: "guard rms_norm_slot in ToyRMSNorm.forward"\n'
    record = '      - versions: ["1.0.0"]\n        sha256: 2a946c26'
    assert guard in text and record in text
    text = text.replace("pins:\n", "# Reviewed by alice on 2026-12-01.\npins:\n", 1)
    text = text.replace(guard, "  # The RMSNorm body: checked against the op's reference.\n" + guard, 1)
    text = text.replace(guard + "    region: function\n", guard + "    region: function  # the whole body\n", 1)
    text = text.replace(record, "      # fp32 on the CPU, bit-exact\n" + record, 1)
    text += "# end of the pins\n"
    toy.write("specs/toy/toy.pins", text)
    # A new upstream whose RMSNorm body differs: a new record is appended, the file rewritten.
    drift(
        toy,
        "return self.weight * hidden_states.to(input_dtype)",
        "return (self.weight * hidden_states).to(input_dtype)",
    )
    r = toy.run("pin", "specs/toy/toy.yaml", "--source-root", "new")
    assert r.returncode == 0, r.stderr
    assert "1 new fingerprints" in r.stdout
    after = toy.read("specs/toy/toy.pins")
    assert "# Reviewed by alice on 2026-12-01.\npins:\n" in after  # was: every comment dropped
    assert "  # The RMSNorm body: checked against the op's reference.\n" + guard in after
    assert guard + "    region: function  # the whole body\n" in after
    assert '      # fp32 on the CPU, bit-exact\n      - versions: ["1.0.0"]\n        sha256: 2a946c26' in after
    assert after.endswith("# end of the pins\n")
    assert after.count("(absent)") == 1 and after.count("Contract pins of") == 1
    # The rewritten file is a valid pin file that verifies the new upstream, and stays as it is.
    r = toy.run("--check", "--source-root", "new")
    assert r.returncode == 1 and "error" not in r.stderr  # missing outputs only
    before = toy.snapshot()
    r = toy.run("pin", "specs/toy/toy.yaml", "--source-root", "new")
    assert "unchanged specs/toy/toy.pins" in r.stdout
    assert toy.snapshot() == before


def test_generation_and_check_never_write_pins(toy):
    r = toy.run("specs/toy/toy.yaml", "--source-root", "old")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(toy.path("specs/toy/toy.pins"))
    r = toy.run("--check", "--source-root", "old")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not os.path.exists(toy.path("specs/toy/toy.pins"))


def test_body_change_under_a_guard_fails_check_and_generation_without_writing(toy):
    pin(toy)
    assert toy.run("specs/toy/toy.yaml", "--source-root", "old").returncode == 0
    drift(
        toy,
        "return self.weight * hidden_states.to(input_dtype)",
        "return (self.weight * hidden_states).to(input_dtype)",
    )
    before = toy.snapshot()
    r = toy.run("--check", "--source-root", "new")
    assert r.returncode == 3
    assert toy.snapshot() == before
    assert (
        f"specs/toy/toy.yaml:{LINE_RMS_GUARD}:9: error: upstream changed the guarded function "
        "this guard relies on: rms_norm_slot in ToyRMSNorm.forward"
    ) in r.stderr
    assert "-  return self.weight * hidden_states.to(input_dtype)" in r.stderr
    assert "+  return (self.weight * hidden_states).to(input_dtype)" in r.stderr
    assert (
        "re-verify that the upstream body still computes rms_norm/standard, then run "
        "`patchgen pin specs/toy/toy.yaml`" in r.stderr
    )
    r = toy.run("specs/toy/toy.yaml", "--source-root", "new")
    assert r.returncode == 3
    assert toy.snapshot() == before
    # After re-verifying, pinning the new upstream accepts it (and keeps the old fingerprint).
    pin(toy, "new")
    assert toy.run("specs/toy/toy.yaml", "--source-root", "new").returncode == 0
    assert toy.run("specs/toy/toy.yaml", "--source-root", "old").returncode == 0


def test_unpinned_entry_is_a_warning(toy):
    pin(toy)
    toy.write(
        "specs/toy/toy.yaml",
        SPEC + "  - add_method: ToyAttention.extra_repr\n"
        "    code: |\n      def extra_repr(self):\n          return 'a'\n",
    )
    r = toy.run("specs/toy/toy.yaml", "--source-root", "old")
    assert r.returncode == 0
    assert "warning: no contract pin for 'add_method ToyAttention.extra_repr' in specs/toy/toy.pins" in r.stderr


def test_audit_clean(toy):
    pin(toy)
    r, report = audit(toy)
    assert r.returncode == 0, r.stdout
    assert [f for f in findings(report) if f["attention"]] == []


@pytest.mark.parametrize(
    "old,new,kind,line,entry",
    [
        (
            "return self.weight * hidden_states.to(input_dtype)",
            "return (self.weight * hidden_states).to(input_dtype)",
            "body changed under a guard",
            LINE_RMS_GUARD,
            "guard rms_norm_slot in ToyRMSNorm.forward",
        ),
        (
            "def forward(self, hidden_states, attention_mask=None):",
            "def forward(self, hidden_states, position_ids, attention_mask=None):",
            "signature changed",
            LINE_OVERRIDE,
            "override_method ToyAttention.forward",
        ),
        (
            "    def forward(self, hidden_states, attention_mask=None):",
            "    @torch.no_grad()\n    def forward(self, hidden_states, attention_mask=None):",
            "signature changed",
            LINE_OVERRIDE,
            "override_method ToyAttention.forward",
        ),
        (
            "            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())",
            "            loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())",
            "guarded statements changed",
            LINE_LOSS_GUARD,
            "guard loss_slot in ToyForCausalLM.forward at 'logits = self.lm_head(' through 'if labels is not None:'",
        ),
    ],
)
def test_audit_reports_each_drift_with_its_location(toy, old, new, kind, line, entry):
    for pinned in (True, False):  # against the pins, and against the old upstream alone
        if pinned:
            pin(toy)
        elif os.path.exists(toy.path("specs/toy/toy.pins")):
            os.remove(toy.path("specs/toy/toy.pins"))
        if pinned:
            drift(toy, old, new)
        r, report = audit(toy)
        assert r.returncode == 1
        hits = [f for f in findings(report) if f["kind"] == kind and f["entry"] == entry]
        assert len(hits) == 1, findings(report)
        assert hits[0]["line"] == line
        assert hits[0]["spec"] == "specs/toy/toy.yaml"
        assert hits[0]["upstream"].startswith("new/toypkg/models/toy/modeling_toy.py:")
        assert hits[0]["upstream"].endswith("(2.0.0)")


def test_audit_signature_details(toy):
    drift(
        toy,
        "def forward(self, hidden_states, attention_mask=None):",
        "def forward(self, attention_mask=1, hidden_states=None, position_ids=None):",
    )
    r, report = audit(toy)
    (hit,) = [f for f in findings(report) if f["kind"] == "signature changed"]
    details = "\n".join(hit["details"])
    assert "ToyAttention.forward: parameter 'position_ids' added (default None)" in details
    assert (
        "ToyAttention.forward: parameters reordered: self, hidden_states, attention_mask -> "
        "self, attention_mask, hidden_states" in details
    )
    assert "ToyAttention.forward: default of 'attention_mask' changed: None -> 1" in details


def test_audit_anchor_gone_target_gone_import_gone(toy):
    pin(toy)
    drift(
        toy,
        "        logits = self.lm_head(hidden_states[:, slice_indices, :])",
        "        hidden_states = hidden_states[:, slice_indices, :]\n        logits = self.output_head(hidden_states)",
    )
    drift(toy, "from ...utils import can_return_tuple, old_helper\n", "from ...utils import can_return_tuple\n")
    # The body a guard relies on changes too: still reported although the spec no longer generates.
    drift(
        toy,
        "return self.weight * hidden_states.to(input_dtype)",
        "return (self.weight * hidden_states).to(input_dtype)",
    )
    r, report = audit(toy)
    assert r.returncode == 1
    by_kind = {}
    for f in findings(report):
        by_kind.setdefault(f["kind"], []).append(f)
    assert by_kind["anchor gone"][0]["line"] == LINE_LOSS_AT
    assert "starts with 'logits = self.lm_head('" in by_kind["anchor gone"][0]["message"]
    assert by_kind["import gone"][0]["line"] == LINE_DROP
    assert [f["line"] for f in by_kind["body changed under a guard"]] == [LINE_RMS_GUARD]

    # Target gone, and an added import the new upstream no longer provides.
    shutil.rmtree(toy.path("new"))
    shutil.copytree(TOY, toy.path("new"))
    toy.write("new/toypkg/__init__.py", '__version__ = "2.0.0"\n')
    drift(toy, "class ToyAttention(nn.Module):", "class ToySelfAttention(nn.Module):")
    drift(toy, "def can_return_tuple(fn):", "def can_return_tuple_v2(fn):", rel="toypkg/utils.py")
    drift(
        toy,
        "from ...utils import can_return_tuple, old_helper",
        "from ...utils import can_return_tuple_v2 as can_return_tuple, old_helper",
    )
    r, report = audit(toy)
    assert r.returncode == 1
    kinds = {(f["kind"], f["line"]) for f in findings(report)}
    assert ("target missing", LINE_OVERRIDE) in kinds, findings(report)
    assert ("import gone", LINE_IMPORT_ADD) in kinds, findings(report)
    (gone,) = [f for f in findings(report) if f["kind"] == "import gone"]
    assert gone["message"] == "'can_return_tuple' not defined in toypkg.utils"


def test_audit_text_report_and_added_method_now_upstream(toy):
    pin(toy)
    drift(
        toy,
        '    def forward(self, hidden_states):\n        """Root',
        "    def extra_repr(self):\n        return 'upstream'\n\n"
        '    def forward(self, hidden_states):\n        """Root',
    )
    before = toy.snapshot()
    r = toy.run("audit", "--source-root", "new", "--source-root-old", "old")
    assert toy.snapshot() == before
    assert r.returncode == 1
    assert "specs/toy/toy.yaml (toypkg.models.toy.modeling_toy 1.0.0 -> 2.0.0): needs attention" in r.stdout
    assert f"! target added upstream: (specs/toy/toy.yaml:{LINE_ADD_METHOD}:" in r.stdout
    assert "audit: 1 specs: 1 need attention, 0 ok, 0 skipped" in r.stdout


def test_pin_usage_errors(toy):
    assert toy.run("pin").returncode == 2
    assert toy.run("pin", "--all", "specs/toy/toy.yaml").returncode == 2
    assert toy.run("audit").returncode == 2  # --source-root is required


def test_every_real_model_spec_is_pinned():
    """The repository's own real-model specs carry pins (verified against the pinned release)."""
    root = os.path.dirname(os.path.dirname(GOLDEN))
    specs = os.path.join(root, "specs")
    missing = []
    for model in sorted(os.listdir(specs)):
        if model == "example" or not os.path.isdir(os.path.join(specs, model)):
            continue
        for name in sorted(os.listdir(os.path.join(specs, model))):
            if name.endswith(".yaml"):
                pins = os.path.join(specs, model, name[: -len(".yaml")] + ".pins")
                if not os.path.isfile(pins):
                    missing.append(f"specs/{model}/{name}")
                else:
                    with open(pins) as f:
                        assert '"5.17.0"' in f.read(), pins
    assert missing == [], "run `patchgen pin` for: " + ", ".join(missing)


def test_audit_with_pins_only_finds_changed_bodies_of_a_spec_that_no_longer_generates(toy):
    pin(toy)
    drift(
        toy,
        "        logits = self.lm_head(hidden_states[:, slice_indices, :])",
        "        hidden_states = hidden_states[:, slice_indices, :]\n        logits = self.output_head(hidden_states)",
    )
    drift(
        toy,
        "return self.weight * hidden_states.to(input_dtype)",
        "return (self.weight * hidden_states).to(input_dtype)",
    )
    before = toy.snapshot()
    r = toy.run("audit", "--source-root", "new", "--json")
    assert toy.snapshot() == before
    assert r.returncode == 1
    kinds = [(f["kind"], f["entry"]) for f in findings(json.loads(r.stdout)) if f["attention"]]
    assert ("anchor gone", "") in kinds
    assert ("body changed under a guard", "guard rms_norm_slot in ToyRMSNorm.forward") in kinds
    # The unchanged override and the still-absent added method are not reported.
    assert len(kinds) == 2, kinds


def test_audit_names_a_changed_edit_anchor_as_edited_statements(toy):
    """An edit_body edit is pinned on the statements it anchors on; when upstream changes them,
    audit reports 'edited statements changed' (not the call-site guard's wording)."""
    toy.write(
        "specs/toy/toy.yaml",
        """\
upstream: toypkg.models.toy.modeling_toy
output: patched_modeling_toy.py
patches:
  - edit_body: ToyAttention.__init__
    edits:
      - insert_after: "self.scale = config.head_dim"
        code: |
          self.extra = 1
""",
    )
    pin(toy)
    drift(toy, "self.scale = config.head_dim**-0.5", "self.scale = config.head_dim**-0.25")
    r, report = audit(toy)
    assert r.returncode == 1
    kinds = [(f["kind"], f["entry"], f["line"]) for f in findings(report)]
    assert kinds == [
        ("edited statements changed", "edit_body ToyAttention.__init__ insert_after 'self.scale = config.head_dim'", 6)
    ], kinds
