#include "parser/py_cst_queries.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "parser/ts_node.h"

namespace patchgen::parser {
namespace {

using Strings = std::vector<std::string>;

std::unique_ptr<PyModule> ParseOk(std::string source) {
  auto r = PyModule::Parse("test.py", std::move(source));
  if (!r) FAIL(FormatDiagnostic(r.errors()[0]));
  return std::move(*r);
}

std::string TextOf(const PyModule& m, TSNode n) { return std::string(m.Text(RangeOf(n))); }

Strings Types(const std::vector<TSNode>& nodes) {
  Strings out;
  for (TSNode n : nodes) out.emplace_back(TypeOf(n));
  return out;
}

TEST_CASE("BlockStatements: a block's or the module's statements, comments left out", "[parser]") {
  auto m = ParseOk(
      "# head\n"
      "import a\n"
      "def f(x):\n"
      "    # lead\n"
      "    y = x  # trailing\n"
      "    if y:\n"
      "        return 1\n"
      "    # tail\n"
      "match v:\n"
      "    case 1:\n"
      "        pass\n"
      "    case _:\n"
      "        pass\n");
  CHECK(Types(BlockStatements(m->root())) ==
        Strings{"import_statement", "function_definition", "match_statement"});
  CHECK(Types(BlockStatements(BodyBlock(*m, *m->Find("f")))) ==
        Strings{"expression_statement", "if_statement"});
  // A match statement's block holds its case clauses.
  TSNode match = BlockStatements(m->root())[2];
  CHECK(Types(BlockStatements(Field(match, "body"))) == Strings{"case_clause", "case_clause"});
  CHECK(BlockStatements(TSNode{}).empty());
}

TEST_CASE("LastStatement: decorated, inline, placeholder and compound bodies", "[parser]") {
  auto m = ParseOk(
      "@dec\n"
      "class A(B):\n"
      "    \"\"\"Doc.\"\"\"\n"
      "    x = 1\n"
      "    # a comment after the last statement\n"
      "class E(B): ...\n"
      "class P:\n"
      "    pass\n"
      "def one(): return 1\n"
      "def g(x):\n"
      "    if x:\n"
      "        return 1\n"
      "    else:\n"
      "        return 2\n"
      "    # after\n");
  CHECK(TextOf(*m, LastStatement(*m, *m->Find("A"))) == "x = 1");
  CHECK(TextOf(*m, LastStatement(*m, *m->Find("E"))) == "...");
  TSNode pass = LastStatement(*m, *m->Find("P"));
  CHECK(TypeOf(pass) == "pass_statement");
  CHECK(RangeOf(pass).start == m->source().find("    pass") + 4);
  CHECK(TextOf(*m, LastStatement(*m, *m->Find("one"))) == "return 1");
  TSNode last = LastStatement(*m, *m->Find("g"));
  CHECK(TypeOf(last) == "if_statement");
  CHECK(TextOf(*m, last).starts_with("if x:\n"));
  // A definition whose name is not in a def or class of the tree: no body, a null node.
  Definition outside;
  outside.name_range = ByteRange{0, 1};  // `@` of the decorator
  CHECK(ts_node_is_null(LastStatement(*m, outside)));
}

TEST_CASE("SuperInitStatement: directly in the body, first one, nullopt when nested or absent",
          "[parser]") {
  auto m = ParseOk(
      "class A(B):\n"
      "    def __init__(self, config):\n"
      "        # set up\n"
      "        x = 1\n"
      "        super().__init__(config)  # base\n"
      "        self.y = 2\n"
      "class C(B):\n"
      "    def __init__(self): super(C, self).__init__()\n"
      "class D(B):\n"
      "    def __init__(self):\n"
      "        if x:\n"
      "            super().__init__()\n"
      "        self.z = 1\n"
      "class E(B):\n"
      "    @deco\n"
      "    def __init__(self):\n"
      "        super().__init__(\n"
      "            a,\n"
      "        )\n"
      "        super().__init__()\n"
      "class F(B):\n"
      "    def __init__(self):\n"
      "        value = super().__init__()\n"
      "        super().setup()\n");
  auto text = [&](const char* init) -> std::string {
    std::optional<ByteRange> r = SuperInitStatement(*m, *m->Find(init));
    return r ? std::string(m->Text(*r)) : "<none>";
  };
  CHECK(text("A.__init__") == "super().__init__(config)");
  CHECK(text("C.__init__") == "super(C, self).__init__()");
  CHECK(text("D.__init__") == "<none>");
  CHECK(text("E.__init__") == "super().__init__(\n            a,\n        )");
  CHECK(text("F.__init__") == "<none>");
}

Strings Items(const PyModule& m, const std::optional<DunderAll>& all) {
  Strings out;
  for (ByteRange r : all->items) out.emplace_back(m.Text(r));
  return out;
}

TEST_CASE("FindDunderAll: the last list or tuple assigned at the top level, and its items",
          "[parser]") {
  auto m = ParseOk(
      "__all__ = [\"A\", \"B\"]\n"
      "x = 1\n"
      "__all__ = (\n"
      "    \"A\",  # a comment\n"
      "    \"C\",\n"
      ")\n"
      "__all__ = names()\n"
      "__all__ += [\"D\"]\n"
      "__all__ = y = [\"E\"]\n"
      "if X:\n"
      "    __all__ = [\"F\"]\n");
  std::optional<DunderAll> all = FindDunderAll(*m);
  REQUIRE(all.has_value());
  CHECK(m->Text(all->list) == "(\n    \"A\",  # a comment\n    \"C\",\n)");
  CHECK(Items(*m, all) == Strings{"\"A\"", "\"C\""});

  auto annotated = ParseOk("__all__: list[str] = ['A', *OTHER]\n");
  all = FindDunderAll(*annotated);
  REQUIRE(all.has_value());
  CHECK(annotated->Text(all->list) == "['A', *OTHER]");
  CHECK(Items(*annotated, all) == Strings{"'A'", "*OTHER"});

  auto empty = ParseOk("__all__ = []\n");
  all = FindDunderAll(*empty);
  REQUIRE(all.has_value());
  CHECK(empty->Text(all->list) == "[]");
  CHECK(all->items.empty());

  CHECK_FALSE(FindDunderAll(*ParseOk("x = [1]\nif X:\n    __all__ = ['F']\n")).has_value());
  CHECK_FALSE(FindDunderAll(*ParseOk("__all__ = names()\n")).has_value());
}

TEST_CASE("OnlyStatementInBlock: comments do not count, the module body is not a block",
          "[parser]") {
  auto m = ParseOk(
      "import a\n"
      "try:\n"
      "    import b\n"
      "except ImportError:\n"
      "    # only a comment besides\n"
      "    import c  # trailing\n"
      "if X: import d\n"
      "def f():\n"
      "    import e\n"
      "    return e\n"
      "class K:\n"
      "    import g\n");
  auto only = [&](const char* stmt) {
    uint32_t at = static_cast<uint32_t>(m->source().find(stmt));
    return OnlyStatementInBlock(*m, ByteRange{at, at + static_cast<uint32_t>(std::strlen(stmt))});
  };
  CHECK_FALSE(only("import a"));
  CHECK(only("import b"));
  CHECK(only("import c"));
  CHECK(only("import d"));
  CHECK_FALSE(only("import e"));
  CHECK(only("import g"));
  CHECK_FALSE(only("return e"));
  CHECK_FALSE(only("ImportError"));  // an expression, not a statement of a block
}

}  // namespace
}  // namespace patchgen::parser
