#include "parser/tree_queries.h"

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
  // Simple statements on one line, after the header's colon, are statements of the body block.
  auto inline_body = ParseOk("def g(): a = 1; return a  # done\n");
  CHECK(Types(BlockStatements(BodyBlock(*inline_body, *inline_body->Find("g")))) ==
        Strings{"expression_statement", "return_statement"});
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

TEST_CASE("NestedStatements: every block's statements in order, not inside nested defs",
          "[parser]") {
  auto m = ParseOk(
      "def f(x):\n"                 // 1
      "    a = 1  # note\n"         // 2
      "    if x:\n"                 // 3
      "        b = 2\n"             // 4
      "    elif y:\n"               // 5
      "        c = 3\n"             // 6
      "    else:\n"                 // 7
      "        d = 4\n"             // 8
      "    for i in r:\n"           // 9
      "        e = 5\n"             // 10
      "    try:\n"                  // 11
      "        g = 6\n"             // 12
      "    except E:\n"             // 13
      "        h = 7\n"             // 14
      "    finally:\n"              // 15
      "        k = 8\n"             // 16
      "    with w: l = 9\n"         // 17
      "    while t:\n"              // 18
      "        # only a comment\n"  // 19
      "        m = 10\n"            // 20
      "    match v:\n"              // 21
      "        case 1:\n"           // 22
      "            n = 11\n"        // 23
      "    def inner():\n"          // 24
      "        o = 12\n"            // 25
      "    @dec\n"                  // 26
      "    class C:\n"              // 27
      "        p = 13\n"            // 28
      "    # comment\n"             // 29
      "    return a\n");            // 30
  std::vector<NestedStatement> stmts = NestedStatements(BodyBlock(*m, *m->Find("f")), m->lines());
  Strings got;
  for (const NestedStatement& s : stmts) {
    std::string_view text = m->Text(s.range);
    got.push_back(std::to_string(s.line) + ":" + std::to_string(s.index) + ":" +
                  std::string(text.substr(0, text.find('\n'))));
    CHECK(RangeOf(s.node) == s.range);
  }
  CHECK(got == Strings{"2:0:a = 1",   "3:1:if x:",         "4:0:b = 2",   "6:0:c = 3",
                       "8:0:d = 4",   "9:2:for i in r:",   "10:0:e = 5",  "11:3:try:",
                       "12:0:g = 6",  "14:0:h = 7",        "16:0:k = 8",  "17:4:with w: l = 9",
                       "17:0:l = 9",  "18:5:while t:",     "20:0:m = 10", "21:6:match v:",
                       "23:0:n = 11", "24:7:def inner():", "26:8:@dec",   "30:9:return a"});
  // `a = 1` and `return a` share the body block; `b = 2` is in the `if`'s.
  CHECK(ts_node_eq(stmts.front().block, stmts.back().block));
  CHECK_FALSE(ts_node_eq(stmts.front().block, stmts[2].block));
  CHECK(TypeOf(stmts[2].block) == "block");
  CHECK(NestedStatements(TSNode{}, m->lines()).empty());
}

TEST_CASE("NameReferences: the bare name, not attribute or keyword names, strings or comments",
          "[parser]") {
  std::string code =
      "x = slot(a, slot=slot) + obj.slot + slot.attr + f(slots, 'slot')  # slot\n"
      "y = [slot for _ in r]\n";
  TreePtr tree = ParseTree(code);
  REQUIRE(tree);
  std::vector<ByteRange> refs = NameReferences(ts_tree_root_node(tree.get()), code, "slot");
  std::vector<uint32_t> starts;
  for (ByteRange r : refs) {
    CHECK(r.In(code) == "slot");
    starts.push_back(r.start);
  }
  // `slot(`, the keyword's value `=slot)`, `slot.attr` and the comprehension's element.
  CHECK(starts == std::vector<uint32_t>{4, 17, 36, 78});
  CHECK(NameReferences(ts_tree_root_node(tree.get()), code, "absent").empty());
  CHECK(NameReferences(TSNode{}, code, "slot").empty());
}

TEST_CASE("IdentifiersIn: identifiers overlapping a region in every role, not in strings",
          "[parser]") {
  auto m = ParseOk(
      "import torch\n"
      "def f(x, *, k=None):\n"
      "    # x in a comment\n"
      "    y = torch.cat(x, dim=k)\n"
      "    return f\"{y} x\"\n"
      "z = 1\n");
  auto names = [&](ByteRange region) {
    Strings out;
    for (ByteRange r : IdentifiersIn(m->root(), region)) out.emplace_back(m->Text(r));
    return out;
  };
  const Definition& f = *m->Find("f");
  CHECK(names(f.whole) == Strings{"f", "x", "k", "y", "torch", "cat", "x", "dim", "k", "y"});
  // An identifier only partly inside the region counts (overlap, not containment).
  uint32_t cat = static_cast<uint32_t>(m->source().find("cat("));
  CHECK(names({cat + 2, cat + 3}) == Strings{"cat"});
  CHECK(names({0, 0}).empty());
  CHECK(IdentifiersIn(TSNode{}, f.whole).empty());
}

TEST_CASE("EllipsisLines: `...` statements alone on their line, at any depth", "[parser]") {
  auto lines_of = [](const PyModule& m) {
    std::vector<uint32_t> out;
    for (TSNode n : EllipsisLines(m)) {
      CHECK(m.Text(RangeOf(n)) == "...");
      out.push_back(m.lines().LineOf(ts_node_start_byte(n)) + 1);
    }
    return out;
  };
  auto wrap = ParseOk(
      "with torch.no_grad():\n"
      "    ...\n"
      "y = 1\n");
  CHECK(lines_of(*wrap) == std::vector<uint32_t>{2});
  // Nested blocks, a comment after it, blanks before it; in document order.
  auto nested = ParseOk(
      "...\n"
      "if a:\n"
      "    for x in y:\n"
      "        ...  # the statements go here\n"
      "else:\n"
      "\t...\n"
      "def f():\n"
      "    ...\n");
  CHECK(lines_of(*nested) == std::vector<uint32_t>{1, 4, 6, 8});
  // Not alone on its line, or not a statement of its own.
  auto others = ParseOk(
      "x = ...\n"
      "f(...)\n"
      "...; y = 1\n"
      "y = 1; ...\n"
      "if a: ...\n"
      "def g(): ...\n"
      "z[...]\n"
      "'...'\n"
      "# ...\n");
  CHECK(EllipsisLines(*others).empty());
}

TEST_CASE("Parameters: names, annotations and defaults as written, splats and separators",
          "[parser]") {
  auto m = ParseOk(
      "class A:\n"
      "    def __init__(self, config, x: int, y=1, z: Optional[str] = 'a', /, *args: int,\n"
      "                 k=(1,\n"
      "                    2),  # a comment between parameters\n"
      "                 **kwargs):\n"
      "        pass\n"
      "def f():\n"
      "    pass\n"
      "def g(*, only):\n"
      "    pass\n");
  // name|plain|annotation|default, "-" for none.
  auto shown = [&](const Definition& def) {
    Strings out;
    for (const Parameter& p : Parameters(*m, def)) {
      auto text = [&](const std::optional<ByteRange>& r) {
        return r ? std::string(m->Text(*r)) : std::string("-");
      };
      out.push_back(std::string(m->Text(p.name)) + "|" + (p.plain ? "plain" : "other") + "|" +
                    text(p.annotation) + "|" + text(p.default_value));
    }
    return out;
  };
  CHECK(shown(*m->Find("A.__init__")) ==
        Strings{"self|plain|-|-", "config|plain|-|-", "x|plain|int|-", "y|plain|-|1",
                "z|plain|Optional[str]|'a'", "/|other|-|-", "*args|other|int|-",
                "k|plain|-|(1,\n                    2)", "**kwargs|other|-|-"});
  CHECK(Parameters(*m, *m->Find("f")).empty());
  CHECK(shown(*m->Find("g")) == Strings{"*|other|-|-", "only|plain|-|-"});
  // A class has no parameter list.
  CHECK(Parameters(*m, *m->Find("A")).empty());
  // ParameterNames is the plain names.
  CHECK(ParameterNames(*m, *m->Find("A.__init__")) ==
        Strings{"self", "config", "x", "y", "z", "k"});
}

TEST_CASE("FirstErrorNode and ParseTree on clean and broken input", "[parser]") {
  TreePtr clean = ParseTree("x = 1\n");
  REQUIRE(clean != nullptr);
  CHECK_FALSE(FirstErrorNode(ts_tree_root_node(clean.get())).has_value());
  TreePtr broken = ParseTree("x = = 1\n");
  REQUIRE(broken != nullptr);
  auto err = FirstErrorNode(ts_tree_root_node(broken.get()));
  REQUIRE(err.has_value());
  CHECK(ts_node_start_byte(*err) == 4);  // the second '='
  CHECK(std::string(ts_node_type(*err)) == "ERROR");
}

TEST_CASE("FirstTabIndentation: code lines only, not strings, comments or blank lines") {
  CHECK_FALSE(FirstTabIndentation(*ParseOk("def f():\n    return 1\n")).has_value());
  auto strings = ParseOk("X = '''\n\tin a string\n'''\n\t# a comment\n\t\n");
  CHECK_FALSE(FirstTabIndentation(*strings).has_value());
  auto tabbed = ParseOk("class A:\n    x = 1\n\tdef f(self):\n\t\treturn 1\n");
  auto r = FirstTabIndentation(*tabbed);
  REQUIRE(r.has_value());
  CHECK(*r == ByteRange{19, 20});
  CHECK(tabbed->lines().At(r->start).line == 3);
}

TEST_CASE("ParameterNames: plain, typed and default parameters; no splats or separators",
          "[parser]") {
  auto m = ParseOk(
      "class A:\n"
      "    def __init__(self, config, x: int, y=1, z: str = 'a', /, *args, k, **kwargs):\n"
      "        pass\n"
      "def f():\n"
      "    pass\n"
      "def g(*, only):\n"
      "    pass\n");
  using Names = std::vector<std::string>;
  CHECK(ParameterNames(*m, *m->Find("A.__init__")) == Names{"self", "config", "x", "y", "z", "k"});
  CHECK(ParameterNames(*m, *m->Find("f")).empty());
  CHECK(ParameterNames(*m, *m->Find("g")) == Names{"only"});
}

TEST_CASE("NodeAt, DefNode and BodyBlock find the nodes of index ranges", "[parser]") {
  auto m = ParseOk(
      "@dec\n"
      "class A(B):\n"
      "    x = 1\n"
      "    async def f(self):\n"
      "        return 2\n");
  const Definition& a = *m->Find("A");
  const Definition& f = *m->Find("A.f");
  TSNode a_node = DefNode(*m, a);
  REQUIRE_FALSE(ts_node_is_null(a_node));
  CHECK(TypeOf(a_node) == "class_definition");
  CHECK(RangeOf(a_node).start == a.header.start);
  TSNode f_node = DefNode(*m, f);
  CHECK(TypeOf(f_node) == "function_definition");
  CHECK(m->Text(RangeOf(f_node)).starts_with("async def f(self):"));
  TSNode block = BodyBlock(*m, f);
  CHECK(TypeOf(block) == "block");
  CHECK(m->Text(RangeOf(block)) == "return 2");
  CHECK(TypeOf(BodyBlock(*m, a)) == "block");
  // The smallest named node covering exactly `x = 1` is the expression statement's assignment.
  uint32_t x = static_cast<uint32_t>(m->source().find("x = 1"));
  TSNode assign = NodeAt(m->root(), ByteRange{x, x + 5});
  CHECK(TypeOf(assign) == "assignment");
  // A range inside a token walks up to the first named node covering all of it.
  TSNode name = NodeAt(m->root(), ByteRange{x, x + 1});
  CHECK(TypeOf(name) == "identifier");
  TSNode stmt = NodeAt(m->root(), ByteRange{x, x + 7});
  CHECK(RangeOf(stmt).start <= x);
  CHECK(RangeOf(stmt).end >= x + 7);
}

}  // namespace
}  // namespace patchgen::parser
