#include "validate.h"

#include <catch2/catch.hpp>

#include "spec/spec_loader.h"

namespace patchgen::cli {
namespace {

std::string Validate(const std::string& yaml) {
  auto spec = spec::LoadSpecFromString("specs/u.yaml", yaml);
  REQUIRE(spec.ok());
  std::string out;
  for (const Diagnostic& d : ValidateSpecWithoutUpstream(*spec)) out += FormatDiagnostic(d);
  return out;
}

TEST_CASE("--validate locates a syntax error in code points, after non-ASCII text") {
  // tree-sitter's column of '2' is 24 (bytes: 'é' is two); the column printed is 23, and the
  // caret sits under the '2'.
  CHECK(Validate("version: 1\n"
                 "upstream: tinypkg.mod\n"
                 "output: u.py\n"
                 "patches:\n"
                 "  - replace_class: A\n"
                 "    code: |\n"
                 "      class A:\n"
                 "          x = (\"\xc3\xa9\", 1 2)\n") ==
        "specs/u.yaml:8:23: error: body of replace_class A does not parse as Python\n"
        "    8 |           x = (\"\xc3\xa9\", 1 2)\n"
        "      |                       ^\n"
        "help: fix the syntax error at this position\n");
}

TEST_CASE("--validate locates a syntax error on a later line of a block, in code points") {
  // '€' is three bytes: tree-sitter's column of '2' on line 7 is 22, the code point column 18.
  CHECK(Validate("version: 1\n"
                 "upstream: tinypkg.mod\n"
                 "output: u.py\n"
                 "blocks:\n"
                 "  - |\n"
                 "    X = '\xe2\x82\xac'\n"
                 "    Y = ('\xe2\x82\xac\xe2\x82\xac', 1 2)\n") ==
        "specs/u.yaml:7:18: error: block does not parse as Python\n"
        "    7 |     Y = ('\xe2\x82\xac\xe2\x82\xac', 1 2)\n"
        "      |                  ^\n"
        "help: fix the syntax error at this position\n");
}

}  // namespace
}  // namespace patchgen::cli
