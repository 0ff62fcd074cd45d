#include "rewriter/reindent.h"

#include <catch2/catch.hpp>

using namespace patchgen::rewriter;

TEST_CASE("Dedent removes the common indentation but leaves docstring lines alone", "[rewriter]") {
  const char* code =
      "    def forward(self, x):\n"
      "        \"\"\"Doc.\n"
      "\n"
      "  indented two in the string\n"
      "        \"\"\"\n"
      "        return x\n";
  CHECK(CommonIndent(code) == 4);
  CHECK(Dedent(code) ==
        "def forward(self, x):\n"
        "    \"\"\"Doc.\n"
        "\n"
        "  indented two in the string\n"
        "        \"\"\"\n"
        "    return x\n");
}

TEST_CASE("ReindentTo moves code to a column, skipping lines inside strings", "[rewriter]") {
  const char* code =
      "def f():\n"
      "    s = '''a\n"
      "b'''\n"
      "  \n"
      "    return (1,\n"
      "      2)\n";
  CHECK(ReindentTo(code, 4) ==
        "    def f():\n"
        "        s = '''a\n"
        "b'''\n"
        "\n"
        "        return (1,\n"
        "          2)\n");
}

TEST_CASE("Indent and Dedent work on indented statement fragments", "[rewriter]") {
  const char* code =
      "        self.a = 1\n"
      "        self.b = \"\"\"x\n"
      "y\"\"\"\n";
  CHECK(CommonIndent(code) == 8);
  CHECK(Dedent(code) == "self.a = 1\nself.b = \"\"\"x\ny\"\"\"\n");
  CHECK(Indent("x = 1\n\nif x:\n    y = 2", "  ") == "  x = 1\n\n  if x:\n      y = 2");
}

TEST_CASE("Tabs count as one column each", "[rewriter]") {
  CHECK(CommonIndent("\tx = 1\n\ty = 2\n") == 1);
  CHECK(Dedent("\tx = 1\n\t\ty = 2\n") == "x = 1\n\ty = 2\n");
}
