#include "rewriter/edit_plan.h"

#include <catch2/catch.hpp>

using patchgen::ByteRange;
using patchgen::FormatDiagnostic;
using patchgen::SourceLoc;
using patchgen::rewriter::EditPlan;
using patchgen::rewriter::TextEdit;

namespace {

TextEdit Edit(uint32_t start, uint32_t end, std::string text, uint32_t line, std::string what) {
  TextEdit e;
  e.range = ByteRange{start, end};
  e.text = std::move(text);
  e.origin = SourceLoc{"spec.yaml", line, 3, 4, "  - entry"};
  e.what = std::move(what);
  return e;
}

}  // namespace

TEST_CASE("EditPlan applies sorted edits in one pass", "[rewriter]") {
  EditPlan plan;
  plan.Add(Edit(6, 11, "there", 2, "b"));
  plan.Add(Edit(0, 5, "HELLO", 1, "a"));
  plan.Add(Edit(11, 11, "!", 3, "c"));
  plan.Add(Edit(11, 11, "?", 4, "d"));
  REQUIRE(plan.Validate().empty());
  CHECK(plan.Apply("hello world") == "HELLO there!?");
  auto ranges = plan.OutputRanges();
  REQUIRE(ranges.size() == 4);
  CHECK(ranges[0] == ByteRange{0, 5});
  CHECK(ranges[1] == ByteRange{6, 11});
  CHECK(ranges[2] == ByteRange{11, 12});
  CHECK(ranges[3] == ByteRange{12, 13});
}

TEST_CASE("EditPlan puts an insertion before a replacement at the same offset", "[rewriter]") {
  EditPlan plan;
  plan.Add(Edit(0, 5, "X", 1, "replace"));
  plan.Add(Edit(0, 0, ">", 2, "insert"));
  plan.Add(Edit(5, 5, "<", 3, "insert at end"));
  REQUIRE(plan.Validate().empty());
  CHECK(plan.Apply("hello") == ">X<");
}

TEST_CASE("EditPlan reports overlapping edits at the later origin", "[rewriter]") {
  EditPlan plan;
  plan.Add(Edit(4, 20, "", 9, "override_method A.forward"));
  plan.Add(Edit(0, 10, "", 4, "replace_class A"));
  auto diags = plan.Validate();
  REQUIRE(diags.size() == 1);
  CHECK(FormatDiagnostic(diags[0]) ==
        "spec.yaml:9:3: error: edits overlap: override_method A.forward and replace_class A\n"
        "    9 |   - entry\n"
        "      |   ^~~~\n"
        "note: replace_class A is at spec.yaml:4:3\n"
        "help: each upstream region can be changed by one spec entry only; remove or merge one "
        "of them\n");
}

TEST_CASE("EditPlan: an insertion strictly inside a replaced range overlaps", "[rewriter]") {
  EditPlan plan;
  plan.Add(Edit(0, 10, "", 2, "exclude A"));
  plan.Add(Edit(5, 5, "x", 7, "guard A.f"));
  plan.Add(Edit(10, 10, "y", 8, "helper after A"));
  auto diags = plan.Validate();
  REQUIRE(diags.size() == 1);
  CHECK(diags[0].message == "edits overlap: guard A.f and exclude A");
  CHECK(diags[0].loc.line == 7);
}
