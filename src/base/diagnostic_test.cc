#include "base/diagnostic.h"

#include <catch2/catch.hpp>

#include "base/text_util.h"

namespace patchgen {
namespace {

TEST_CASE("FormatDiagnostic prints location, excerpt, caret and help") {
  std::string text = "version: 1\npatches:\n  - override_method: Qwen3MLP.fowrard\n";
  LineIndex lines(text);
  uint32_t start = static_cast<uint32_t>(text.find("Qwen3MLP.fowrard"));
  Diagnostic d = MakeDiagnostic("specs/q.yaml", text, lines, {start, start + 16},
                                "no method 'fowrard' in class 'Qwen3MLP'",
                                "did you mean 'forward'? Methods of Qwen3MLP: __init__, forward");
  CHECK(FormatDiagnostic(d) ==
        "specs/q.yaml:3:22: error: no method 'fowrard' in class 'Qwen3MLP'\n"
        "    3 |   - override_method: Qwen3MLP.fowrard\n"
        "      |                      ^~~~~~~~~~~~~~~~\n"
        "help: did you mean 'forward'? Methods of Qwen3MLP: __init__, forward\n");
}

TEST_CASE("Columns count code points and carets copy tabs") {
  std::string text = "\tx = 'é' + y\n";
  LineIndex lines(text);
  uint32_t start = static_cast<uint32_t>(text.find('y'));
  Diagnostic d = MakeDiagnostic("a.py", text, lines, {start, start + 1}, "undefined name 'y'");
  CHECK(d.col == 12);
  CHECK(FormatDiagnostic(d) ==
        "a.py:1:12: error: undefined name 'y'\n"
        "    1 | \tx = 'é' + y\n"
        "      | \t          ^\n");
}

TEST_CASE("SortDiagnostics orders by location and drops duplicates") {
  std::vector<Diagnostic> ds(3);
  ds[0].path = "b"; ds[0].line = 1; ds[0].message = "x";
  ds[1].path = "a"; ds[1].line = 9; ds[1].message = "y";
  ds[2] = ds[0];
  SortDiagnostics(ds);
  REQUIRE(ds.size() == 2);
  CHECK(ds[0].path == "a");
}

TEST_CASE("DidYouMean finds close names only") {
  CHECK(DidYouMean("fowrard", {"__init__", "forward"}) == std::optional<std::string>("forward"));
  CHECK(!DidYouMean("zzz", {"__init__", "forward"}).has_value());
  CHECK(EditDistance("kitten", "sitting") == 3);
  CHECK(JoinNames({"a", "b", "c"}, 2) == "a, b, ... (1 more)");
}

}  // namespace
}  // namespace patchgen
