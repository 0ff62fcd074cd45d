// The generator's stages on their own: each returns data (edits, applied entries, errors and the
// facts later stages need), and every dependency between stages is an argument. Also the patch
// planners' table against the spec's kind table, and the header written and read back.
#include "rewriter/stages.h"

#include <catch2/catch.hpp>

#include "rewriter/header.h"
#include "rewriter/patch_planners.h"
#include "spec/patch_kinds.h"
#include "spec/spec_loader.h"

namespace patchgen::rewriter {
namespace {

const char* kModule = R"(from .configuration_x import XConfig
from ...utils import drop_me

__all__ = ["A", "B", "f"]


class A:
    def forward(self, x):
        y = x + 1
        return y


class B:
    pass


def f():
    return 1
)";

std::unique_ptr<parser::PyModule> Module() {
  auto m = parser::PyModule::Parse("transformers/models/x/modeling_x.py", kModule);
  REQUIRE(m.ok());
  return std::move(m.value());
}

spec::PatchSpec Spec(const std::string& rest) {
  auto s = spec::LoadSpecFromString(
      "s.yaml", "upstream: transformers.models.x.modeling_x\noutput: o.py\n" + rest);
  if (!s.ok()) FAIL(FormatDiagnostic(s.errors().front()));
  return std::move(s.value());
}

TEST_CASE("every patch kind has a planner with a plan and an absent test", "[rewriter]") {
  for (const spec::PatchKindInfo& info : spec::kPatchKinds) {
    INFO(info.key);
    const PatchPlanner* planner = PlannerOf(info.kind);
    REQUIRE(planner);
    CHECK(planner->kind == info.kind);
    CHECK(planner->plan != nullptr);
    CHECK(planner->absent != nullptr);
  }
}

TEST_CASE("imports stage: absolute modules, drops, and the removed statements as data",
          "[rewriter]") {
  auto up = Module();
  ImportsStage st = PlanImports(Spec("imports:\n  drop: [drop_me]\n"), *up,
                                "transformers/models/x/modeling_x.py");
  CHECK(st.out.errors.empty());
  REQUIRE(st.out.edits.size() == 2);
  CHECK(st.out.edits[0].text == "transformers.models.x.configuration_x");
  // How an overlap error names the import edit: its upstream line.
  CHECK(st.out.edits[0].what == "relative import at transformers/models/x/modeling_x.py:1");
  CHECK(st.out.edits[1].text.empty());  // The whole `from ...utils import drop_me` line.
  CHECK(st.removed_imports == std::set<size_t>{1});
  REQUIRE(st.out.applied.size() == 1);
  CHECK(st.out.applied[0].kind == "imports.drop");
}

TEST_CASE("module code goes after the imports that stay (an argument, not a shared field)",
          "[rewriter]") {
  auto up = Module();
  spec::PatchSpec s = Spec("blocks:\n  - |\n    X = 1\n");
  StageOutput kept = PlanModuleCode(s, *up, {}, "");
  StageOutput dropped = PlanModuleCode(s, *up, {1}, "");
  REQUIRE(kept.edits.size() == 1);
  REQUIRE(dropped.edits.size() == 1);
  CHECK(kept.edits[0].range.start > dropped.edits[0].range.start);
  CHECK(kept.edits[0].text == "\n\nX = 1");
}

TEST_CASE("patches stage returns replaced targets; the guard stage takes them as an argument",
          "[rewriter]") {
  auto up = Module();
  spec::PatchSpec s = Spec(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: A.forward
        call: s(x)
patches:
  - override_method: A.forward
    code: |
      def forward(self, x):
          return x
)");
  PatchesStage patches = PlanPatches(s, *up);
  CHECK(patches.out.errors.empty());
  REQUIRE(patches.replaced.size() == 1);
  CHECK(patches.replaced[0].first == "A.forward");
  REQUIRE(patches.contract.size() == 1);
  CHECK(patches.contract[0].region == "signature");
  GuardsStage alone = PlanGuardStage(s, *up, "opslot", {}, {});
  CHECK(alone.out.errors.empty());
  CHECK(alone.regions.size() == 1);
  CHECK(alone.unguarded_slots.empty());
  GuardsStage with = PlanGuardStage(s, *up, "opslot", patches.replaced, patches.added_methods);
  REQUIRE(with.out.errors.size() == 1);
  CHECK(with.out.errors[0].message ==
        "guard on A.forward conflicts with override_method A.forward at s.yaml:11");
}

TEST_CASE("a slot that patch code dispatches through is not listed as without a guard",
          "[rewriter]") {
  auto up = Module();
  spec::PatchSpec s = Spec(R"(slots:
  - name: loss_slot
    op: o
    variant: v
  - name: loss
    op: o
    variant: w
  - name: other_slot
    op: o
    variant: u
patches:
  - add_method: A.loss_function
    code: |
      @property
      def loss_function(self):
          return loss_slot if loss_slot.use_non_eager_impl else other_slot_2
)");
  GuardsStage st = PlanGuardStage(s, *up, "opslot", {}, {});
  CHECK(st.out.errors.empty());
  // `loss_slot` is named by the added method; `loss` only as a prefix of it, `other_slot` only as a
  // prefix of `other_slot_2`: still without a guard.
  REQUIRE(st.unguarded_slots.size() == 2);
  CHECK(st.unguarded_slots[0]->name == "loss");
  CHECK(st.unguarded_slots[1]->name == "other_slot");
}

TEST_CASE("optional patches with an absent target are returned as skipped", "[rewriter]") {
  auto up = Module();
  PatchesStage st = PlanPatches(Spec(R"(patches:
  - add_method: A.forward
    optional: true
    reason: older releases
    code: |
      def forward(self): pass
)"),
                                *up);
  CHECK(st.out.edits.empty());
  REQUIRE(st.skipped.size() == 1);
  CHECK(st.skipped[0].why == "optional: upstream already defines 'A.forward'; older releases");
}

TEST_CASE("exclude stage returns the excluded names for the output check", "[rewriter]") {
  auto up = Module();
  spec::PatchSpec s = Spec("exclude: [B]\n");
  ExcludeStage st = PlanExcludes(s, *up);
  CHECK(st.out.errors.empty());
  REQUIRE(st.excluded.size() == 1);
  CHECK(st.excluded[0]->name == "B");
  REQUIRE(st.out.edits.size() == 2);
  CHECK(st.out.edits[1].text == R"(["A", "f"])");
}

TEST_CASE("spec-level name_map keys used by a stage are returned with its output", "[rewriter]") {
  auto up = Module();
  spec::PatchSpec s = Spec("name_map:\n  Old: New\n  Unused: X\nblocks:\n  - |\n    y = Old\n");
  StageOutput out = PlanModuleCode(s, *up, {}, "");
  CHECK(out.used_keys == std::set<std::string>{"Old"});
  std::vector<Diagnostic> errors;
  NameMap(s.name_map).ReportUnused(out.used_keys, errors);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].message == "name_map key 'Unused' is never used");
}

TEST_CASE("the header is written and read back in one place", "[rewriter]") {
  std::string sha(64, 'a');
  HeaderFacts f;
  f.spec_path = "specs/x/version 2.yaml";
  f.upstream = "transformers.models.x.modeling_x";
  f.upstream_path = "transformers/models/x/modeling_x.py";
  f.upstream_version = "5.17.0";
  f.upstream_sha256 = sha;
  f.description = "about version 9";
  f.applied = {{"exclude", "B", ""}};
  std::string h = WriteHeader(f);
  CHECK(h.starts_with("# ====="));
  CHECK(h.find("#   applied:\n#   - exclude B\n") != std::string::npos);
  HeaderUpstream read = ReadHeaderUpstream(h + "import x\n");
  CHECK(read.sha256 == sha);
  CHECK(read.version == "5.17.0");
  CHECK(CarriesGeneratedHeader(h));
  CHECK_FALSE(CarriesGeneratedHeader("# ====\n# something else\n"));
  f.applied.clear();
  CHECK(WriteHeader(f).find("#   applied:  nothing (upstream with absolute imports)\n") !=
        std::string::npos);
}

}  // namespace
}  // namespace patchgen::rewriter
