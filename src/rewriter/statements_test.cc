// BodyStatements: anchors at any depth, exact errors with the caller's key names, whole-block
// detection, and ShiftLines leaving string contents alone.
#include "rewriter/statements.h"

#include <catch2/catch.hpp>

#include "base/text_util.h"

namespace patchgen::rewriter {
namespace {

const char* const kUpstream =
    "class A:\n"
    "    def f(self, x):\n"
    "        y = x + 1\n"
    "        if y:\n"
    "            z = 2  # two\n"
    "            w = 3\n"
    "        doc = \"\"\"\n"
    "keep\n"
    "\"\"\"\n"
    "        def inner():\n"
    "            z = 4\n"
    "        return y; q = 1\n";

struct Fixture {
  std::unique_ptr<parser::PyModule> m;
  const parser::Definition* f = nullptr;
  Fixture() {
    auto parsed = parser::PyModule::Parse("up.py", kUpstream);
    REQUIRE(parsed.ok());
    m = std::move(parsed.value());
    f = m->Find("A.f");
    REQUIRE(f != nullptr);
  }
};

AnchorQuery Query(std::string_view at, std::optional<std::string_view> through = std::nullopt) {
  AnchorQuery q;
  q.at = at;
  q.at_loc = SourceLoc{"s.yaml", 3, 5, 1, "    at"};
  q.at_key = "replace";
  q.through = through;
  q.through_loc = SourceLoc{"s.yaml", 4, 5, 1, "    through"};
  q.noun = "edited";
  q.why = "an edit works on whole lines";
  return q;
}

std::string Errors(const std::vector<Diagnostic>& diags) {
  std::string out;
  for (const Diagnostic& d : diags) out += FormatDiagnostic(d);
  return out;
}

TEST_CASE("anchors are found at any depth but not in nested defs", "[rewriter]") {
  Fixture fx;
  BodyStatements stmts(*fx.m, *fx.f);
  REQUIRE(stmts.ok());
  std::vector<Diagnostic> errors;
  auto r = stmts.Locate(Query("z = 2", "w = 3"), errors);
  REQUIRE(r);
  CHECK(errors.empty());
  CHECK(r->first->line == 5);
  CHECK(r->last->line == 6);
  CHECK(stmts.WholeBlock(*r));
  auto y = stmts.Locate(Query("y = x"), errors);
  REQUIRE(y);
  CHECK_FALSE(stmts.WholeBlock(*y));
  CHECK(stmts.Matching("z = ").size() == 1);  // `z = 4` is inside `inner`.
  CHECK(stmts.Absent(Query("nothing")) ==
        std::optional<std::string>("no statement starting with 'nothing' in A.f"));
  CHECK_FALSE(stmts.Absent(Query("w = 3")));
}

TEST_CASE("anchor errors name the caller's key", "[rewriter]") {
  Fixture fx;
  BodyStatements stmts(*fx.m, *fx.f);
  std::vector<Diagnostic> errors;
  CHECK_FALSE(stmts.Locate(Query("w = 3", "y = x"), errors));
  CHECK_FALSE(stmts.Locate(Query("q = 1"), errors));
  CHECK(Errors(errors) ==
        "s.yaml:4:5: error: `through` statement (line 3) is not a later sibling of the `replace` "
        "statement (line 6) in A.f\n"
        "    4 |     through\n"
        "      |     ^\n"
        "note: `replace` is line 6: w = 3\n"
        "note: line 3: y = x + 1\n"
        "help: `replace` and `through` must be statements of the same block, `through` at or "
        "after `replace`\n"
        "s.yaml:3:5: error: the `replace` statement (line 12) does not start its line; an edit "
        "works on whole lines\n"
        "    3 |     at\n"
        "      |     ^\n");
}

TEST_CASE("ShiftLines shifts code lines, not lines inside strings", "[rewriter]") {
  Fixture fx;
  BodyStatements stmts(*fx.m, *fx.f);
  std::vector<Diagnostic> errors;
  auto r = stmts.Locate(Query("doc = "), errors);
  REQUIRE(r);
  uint32_t start = fx.m->lines().LineStart(r->first->line - 1);
  uint32_t end = LineEndOf(fx.m->source(), r->last->range.end);
  CHECK(ShiftLines(*fx.m, {start, end}, "  ") == "          doc = \"\"\"\nkeep\n\"\"\"");
  CHECK(IndentAt(*fx.m, r->first->range.start) == "        ");
  CHECK(TrimSpace("  a b \n") == "a b");
}

}  // namespace
}  // namespace patchgen::rewriter
