// ReparseEdits: the edits the output check gives tree-sitter describe the same text as the plan,
// and grown to resync points they let the incremental parse reuse the rest of the module after an
// edit that changes the indentation (the tree itself is compared with a parse from scratch in
// output_check_test.cc).
#include "rewriter/reparse_edits.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "parser/py_module.h"
#include "rewriter/stages.h"

namespace patchgen::rewriter {
namespace {

std::string Applied(const std::string& upstream, const std::vector<ReparseEdit>& edits) {
  std::string out;
  uint32_t at = 0;
  for (const ReparseEdit& e : edits) {
    REQUIRE(e.range.start >= at);
    out += upstream.substr(at, e.range.start - at) + e.text;
    at = e.range.end;
  }
  return out + upstream.substr(at);
}

TextEdit Insert(uint32_t at, std::string text) {
  TextEdit e;
  e.range = {at, at};
  e.text = std::move(text);
  return e;
}

TextEdit Replace(uint32_t start, uint32_t end, std::string text) {
  TextEdit e;
  e.range = {start, end};
  e.text = std::move(text);
  return e;
}

// A module whose functions are long enough that re-lexing all of them shows.
std::string LongModule(int functions) {
  std::string s = "import os\n\n\n";
  for (int i = 0; i < functions; ++i) {
    std::string n = std::to_string(i);
    s += "def f" + n + "(x):\n    y = x + " + n + "\n    if y:\n        return os.sep * y\n" +
         "    return [y for y in range(x)]\n\n\n";
  }
  return s;
}

/// Tokens the incremental parse of `out` lexed (tree-sitter's "lexed_lookahead" log lines).
size_t LexedTokens(const parser::PyModule& up, const EditPlan& plan, const std::string& out,
                   const std::string& header) {
  parser::TreePtr edited(ts_tree_copy(up.tree()));
  ApplyReparseEdits(edited.get(), up.lines(), ReparseEdits(up.source(), plan, header));
  TSParser* p = ts_parser_new();
  ts_parser_set_language(p, parser::PythonLanguage());
  size_t lexed = 0;
  ts_parser_set_logger(p, {&lexed, [](void* n, TSLogType, const char* msg) {
                             if (std::strncmp(msg, "lexed_lookahead", 15) == 0)
                               ++*static_cast<size_t*>(n);
                           }});
  parser::TreePtr tree(
      ts_parser_parse_string(p, edited.get(), out.data(), static_cast<uint32_t>(out.size())));
  ts_parser_delete(p);
  REQUIRE(TreeSignature(tree.get()) == TreeSignature(parser::ParseTree(out).get()));
  return lexed;
}

}  // namespace

TEST_CASE("ResyncPoint: after the first token of the next code line", "[rewriter]") {
  std::string s = "def f():\n    # c\n\n    value = 1\n";
  CHECK(ResyncPoint(s, 9) == s.find("value") + 5);  // comment and blank line skipped
  CHECK(ResyncPoint(s, static_cast<uint32_t>(s.find("= 1"))) == s.find("= 1") + 1);  // punctuation
  CHECK(ResyncPoint(s, static_cast<uint32_t>(s.size())) == s.size());
  CHECK(ResyncPoint("x = 1\n# end", 6) == 11);  // only a comment left: the end
}

TEST_CASE("ReparseStart: on the last byte of the token before the edit", "[rewriter]") {
  std::string s = "def f():\n    value = 1\n";
  CHECK(ReparseStart(s, 9) == s.find(':'));  // before the newline and indent
  CHECK(ReparseStart(s, 0) == 0);
  CHECK(ReparseStart("  x", 2) == 0);
  CHECK(ReparseStart("a\xC3\xA9\n x", 5) == 1);  // the first byte of a UTF-8 character
}

TEST_CASE("ReparseEdits: the same text as the header and the plan", "[rewriter]") {
  std::string src = LongModule(4);
  EditPlan plan;
  uint32_t body = static_cast<uint32_t>(src.find("    y = x + 1"));
  uint32_t def2 = static_cast<uint32_t>(src.find("def f2"));
  plan.Add(Insert(0, "from a import b\n"));
  plan.Add(Replace(static_cast<uint32_t>(src.find("os.sep")),
                   static_cast<uint32_t>(src.find("os.sep") + 6), "b"));
  plan.Add(Insert(body, "    if b:\n        return b(x)\n"));
  plan.Add(Insert(body, "    # second insertion at one offset\n"));
  plan.Add(Insert(def2, "def helper():\n    return 2\n\n\n"));
  plan.Add(Replace(def2 + 4, def2 + 6, "g2"));  // meets the grown edit before it: merged
  REQUIRE(plan.Validate().empty());
  const std::string header = "# header\n";
  std::vector<ReparseEdit> edits = ReparseEdits(src, plan, header);
  CHECK(Applied(src, edits) == header + plan.Apply(src));
  CHECK(edits.size() < plan.edits().size() + 1);
  CHECK(ReparseEdits(src, EditPlan(), "").empty());
  CHECK(Applied(src, ReparseEdits(src, EditPlan(), header)) == header + src);
}

TEST_CASE("ParseOutputTree's edits: reuse survives an edit that changes the indentation",
          "[rewriter]") {
  // An entry guard at the top of the first function (its text ends deeper than the line after
  // it) and a helper before the second: with the plan's own edits tree-sitter 0.20.7 re-lexes
  // everything after the first one (docs/rewriter.md); grown, only the lines around each edit.
  auto up = parser::PyModule::Parse("m.py", LongModule(200));
  REQUIRE(up.ok());
  const std::string& src = (*up)->source();
  EditPlan plan;
  plan.Add(Insert(static_cast<uint32_t>(src.find("    y = x + 0")),
                  "    if slot.on:\n        return slot(x)\n"));
  plan.Add(Insert(static_cast<uint32_t>(src.find("def f1(")), "def helper():\n    return 1\n\n\n"));
  REQUIRE(plan.Validate().empty());
  const std::string header = "# header\n";
  std::string out = header + plan.Apply(src);
  size_t lexed = LexedTokens(**up, plan, out, header);
  INFO("lexed " << lexed << " tokens");
  CHECK(lexed < 200);  // of about 8,000 tokens in the module
}

}  // namespace patchgen::rewriter
