#include "parser/py_module.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "parser/tree_queries.h"
#include "parser/ts_node.h"

namespace patchgen::parser {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string FixturePath(const std::string& name) {
  return std::string(PATCHGEN_SOURCE_DIR) + "/tests/fixtures/parser/" + name;
}

std::unique_ptr<PyModule> ParseOk(std::string source, std::string path = "test.py") {
  auto r = PyModule::Parse(std::move(path), std::move(source));
  if (!r) FAIL(FormatDiagnostic(r.errors()[0]));
  return std::move(*r);
}

std::unique_ptr<PyModule> Toy() {
  return ParseOk(ReadFile(FixturePath("toy_modeling.py")), "toy_modeling.py");
}

std::string ParseError(std::string source) {
  auto r = PyModule::Parse("bad.py", std::move(source));
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.errors().size() == 1);
  CHECK(r.errors()[0].kind == ErrorKind::kUpstream);
  return FormatDiagnostic(r.errors()[0]);
}

TEST_CASE("Imports at every depth with modules, levels, names and aliases", "[parser]") {
  auto m = Toy();
  const auto& im = m->imports();
  REQUIRE(im.size() == 13);

  CHECK(im[0].kind == Import::Kind::kFuture);
  CHECK(m->Text(im[0].stmt) == "from __future__ import annotations");
  CHECK(m->Text(im[0].module) == "__future__");
  CHECK(im[0].module_name == "__future__");
  REQUIRE(im[0].names.size() == 1);
  CHECK(im[0].names[0].name == "annotations");

  CHECK(im[1].kind == Import::Kind::kImport);
  CHECK(m->Text(im[1].stmt) == "import math");
  CHECK(im[1].module.empty());

  REQUIRE(im[2].names.size() == 1);
  CHECK(im[2].names[0].name == "torch.nn");
  CHECK(im[2].names[0].alias == "nn");
  CHECK(m->Text(im[2].names[0].range) == "torch.nn as nn");

  CHECK(im[4].kind == Import::Kind::kFrom);
  CHECK(m->Text(im[4].module) == "...activations");
  CHECK(im[4].relative_level == 3);
  CHECK(im[4].module_name == "activations");
  CHECK(im[5].relative_level == 4);
  CHECK(im[5].module_name == "integrations");

  // Parenthesized, multi-line, with an alias.
  CHECK(m->Text(im[6].stmt) ==
        "from ..utils import (\n    auto_docstring,\n    logging as hf_logging,\n)");
  CHECK(im[6].parenthesized);
  CHECK(im[6].relative_level == 2);
  REQUIRE(im[6].names.size() == 2);
  CHECK(im[6].names[0].name == "auto_docstring");
  CHECK(im[6].names[0].alias == "");
  CHECK(m->Text(im[6].names[0].range) == "auto_docstring");
  CHECK(im[6].names[1].name == "logging");
  CHECK(im[6].names[1].alias == "hf_logging");
  CHECK(m->Text(im[6].names[1].range) == "logging as hf_logging");

  // `from . import x`
  CHECK(m->Text(im[7].module) == ".");
  CHECK(im[7].relative_level == 1);
  CHECK(im[7].module_name == "");
  CHECK(im[7].names[0].name == "configuration_toy");

  CHECK(im[8].wildcard);
  CHECK(im[8].names.empty());
  CHECK_FALSE(im[8].parenthesized);

  // Under `if TYPE_CHECKING:` and `try:`.
  CHECK(m->Text(im[9].stmt) == "from .configuration_toy import ToyConfig");
  CHECK(im[9].depth == 1);
  CHECK(im[9].scope == "");
  CHECK(m->Text(im[10].stmt) == "import flash_attn");
  CHECK(im[10].depth == 1);

  // Function-local, three levels down in nested classes.
  CHECK(m->Text(im[11].stmt) == "import os");
  CHECK(im[11].depth == 3);
  CHECK(im[11].scope == "ToyConfigLike.Inner.method");
  CHECK(m->Text(im[12].stmt) == "from .. import sibling as sib");
  CHECK(im[12].relative_level == 2);
  CHECK(im[12].names[0].alias == "sib");
}

TEST_CASE("Import depth counts statements, not their clauses", "[parser]") {
  auto m = ParseOk(
      "try:\n"
      "    import a\n"
      "except ImportError:\n"
      "    if b:\n"
      "        pass\n"
      "    else:\n"
      "        import c\n"
      "finally:\n"
      "    import d\n"
      "match x:\n"
      "    case 1:\n"
      "        import e\n"
      "class K:\n"
      "    import f\n");
  std::vector<std::pair<std::string, int>> got;
  for (const Import& i : m->imports()) got.emplace_back(std::string(m->Text(i.stmt)), i.depth);
  CHECK(got ==
        std::vector<std::pair<std::string, int>>{
            {"import a", 1}, {"import c", 2}, {"import d", 1}, {"import e", 1}, {"import f", 1}});
  CHECK(m->imports()[4].scope == "K");
}

TEST_CASE("Top-level statements in order with kinds and names", "[parser]") {
  auto m = Toy();
  std::vector<std::string> got;
  for (const TopLevelStatement& s : m->top_level()) {
    std::string line = KindName(s.kind);
    if (s.decorated) line += " decorated";
    for (const std::string& n : s.names) line += " " + n;
    got.push_back(line);
  }
  std::vector<std::string> want = {"other",  // module docstring
                                   "import annotations",
                                   "import math",
                                   "import nn",
                                   "import TYPE_CHECKING Optional",
                                   "import ACT2FN",
                                   "import use_kernel_forward_from_hub",
                                   "import auto_docstring hf_logging",
                                   "import configuration_toy",
                                   "import *",
                                   "other",  // if TYPE_CHECKING
                                   "other",  // try/except
                                   "assignment logger",
                                   "assignment __all__",
                                   "assignment _CHECKPOINT",
                                   "assignment a b rest",
                                   "class decorated ToyRMSNorm",
                                   "class ToyCache",
                                   "class ToyOutput",
                                   "class ToyConfigLike",
                                   "class decorated ToyModel",
                                   "function helper",
                                   "other",  // type(helper).attr = 3: grammar bug, not a type alias
                                   "assignment Alias",  // type Alias = int
                                   "other"};
  CHECK(got == want);

  const auto& top = m->top_level();
  CHECK(m->Text(top[13].range) == "__all__ = [\"ToyRMSNorm\", \"ToyModel\"]");
  CHECK(m->Text(top[14].range) == "_CHECKPOINT: str = \"toy/toy-1b\"");
  CHECK(m->Text(top[11].range) ==
        "try:\n    import flash_attn\nexcept ImportError:\n    flash_attn = None");
  CHECK(m->Text(top[22].range) == "type(helper).attr = 3");
  // The file has no final newline: the last statement ends at the last byte.
  CHECK(m->Text(top[24].range) == "print(\"日本語\")");
  CHECK(top[24].range.end == m->source().size());
  // A definition's statement range is its whole range, leading comments included.
  CHECK(top[16].range == m->Find("ToyRMSNorm")->whole);
  CHECK(top[16].definition == 0);
}

TEST_CASE("Decorated class with attached comments: whole, definition, header, body", "[parser]") {
  auto m = Toy();
  const Definition* d = m->Find("ToyRMSNorm");
  REQUIRE(d != nullptr);
  CHECK(d->kind == Definition::Kind::kClass);
  CHECK(d->line == 37);
  CHECK(m->Text(d->comments) == "# Norm used by every layer.\n# Second comment line.");
  CHECK(m->Text(d->decorators) == "@use_kernel_forward_from_hub(\"RMSNorm\")");
  CHECK(m->Text(d->header) == "class ToyRMSNorm(nn.Module):");
  CHECK(m->Text(d->name_range) == "ToyRMSNorm");
  CHECK(m->Text(d->parameters) == "(nn.Module)");
  std::string_view whole = m->Text(d->whole);
  CHECK(whole.substr(0, 27) == "# Norm used by every layer.");
  // The body ends at its last statement: the deeper trailing comment and the comment after the
  // method are not part of it.
  std::string_view tail = "        return x * torch.rsqrt(variance + self.eps)";
  CHECK(whole.substr(whole.size() - tail.size()) == tail);
  CHECK(m->Text(d->definition).substr(0, 9) == "@use_kern");
  CHECK(d->definition.start == d->decorators.start);
  CHECK(d->whole.end == d->body.end);
  CHECK(d->body_indent == 4);
  CHECK(d->indent == 0);
  CHECK_FALSE(d->docstring.has_value());
  CHECK_FALSE(d->inline_body);
  CHECK_FALSE(d->empty_body);
  CHECK(m->ChildNames(*d, Definition::Kind::kFunction) ==
        std::vector<std::string>{"__init__", "forward"});
}

TEST_CASE("Methods: docstring with non-ASCII text, header comment excluded from body", "[parser]") {
  auto m = Toy();
  const Definition* init = m->Find("ToyRMSNorm.__init__");
  REQUIRE(init != nullptr);
  CHECK(m->Text(init->header) == "def __init__(self, hidden_size, eps=1e-6):");
  CHECK(m->Text(init->parameters) == "(self, hidden_size, eps=1e-6)");
  REQUIRE(init->docstring.has_value());
  CHECK(m->Text(*init->docstring) == "\"\"\"RMSNorm (\"é\" 中文).\"\"\"");
  CHECK(m->Text(init->body) ==
        "\"\"\"RMSNorm (\"é\" 中文).\"\"\"\n        super().__init__()\n        self.eps = eps");
  CHECK(init->indent == 4);
  CHECK(init->body_indent == 8);
  CHECK(init->parent == 0);

  const Definition* fwd = m->Find("ToyRMSNorm.forward");
  REQUIRE(fwd != nullptr);
  CHECK(m->Text(fwd->header) == "def forward(self, x):");
  CHECK(m->Text(fwd->body) ==
        "variance = x.pow(2).mean(-1, keepdim=True)\n"
        "        return x * torch.rsqrt(variance + self.eps)");
  CHECK(m->Text(fwd->whole) == "def forward(self, x):  # noqa: D102\n" + std::string(8, ' ') +
                                   std::string(m->Text(fwd->body)));
}

TEST_CASE("Empty bodies: inline `...`, `pass`, docstring then pass is not empty", "[parser]") {
  auto m = Toy();
  const Definition* cache = m->Find("ToyCache");
  REQUIRE(cache != nullptr);
  CHECK(m->Text(cache->whole) == "class ToyCache(Cache): ...");
  CHECK(m->Text(cache->header) == "class ToyCache(Cache):");
  CHECK(m->Text(cache->body) == "...");
  CHECK(cache->inline_body);
  CHECK(cache->empty_body);
  CHECK(cache->body_indent == 4);

  const Definition* out = m->Find("ToyOutput");
  REQUIRE(out != nullptr);
  // A comment at a deeper column than the class is not attached.
  CHECK(out->comments.empty());
  CHECK(m->Text(out->whole) == "class ToyOutput:\n    pass");
  CHECK(m->Text(out->parameters) == "");
  CHECK(out->parameters.start == out->name_range.end);
  CHECK(out->empty_body);
  CHECK_FALSE(out->inline_body);

  const Definition* like = m->Find("ToyConfigLike");
  REQUIRE(like != nullptr);
  // A comment at an odd column with a blank line... here: at column 2, directly above, not
  // attached.
  CHECK(like->comments.empty());
  CHECK(m->Text(like->whole).substr(0, 28) == "class ToyConfigLike(object):");
  REQUIRE(like->docstring.has_value());
  CHECK(m->Text(*like->docstring) == "\"\"\"Docstring only, then pass.\"\"\"");
  CHECK_FALSE(like->empty_body);  // has a nested class after `pass`

  const Definition* deeper = m->Find("ToyConfigLike.Inner.Deeper");
  REQUIRE(deeper != nullptr);
  CHECK(m->Text(deeper->whole) == "class Deeper(Base): ...");
  CHECK(deeper->indent == 8);
  CHECK(deeper->body_indent == 12);
  CHECK(deeper->inline_body);
  CHECK(deeper->empty_body);
}

TEST_CASE("Nesting: parents, children and qualified names", "[parser]") {
  auto m = Toy();
  const Definition* like = m->Find("ToyConfigLike");
  const Definition* inner = m->Find("ToyConfigLike.Inner");
  REQUIRE(like != nullptr);
  REQUIRE(inner != nullptr);
  CHECK(m->ChildNames(*like, Definition::Kind::kClass) == std::vector<std::string>{"Inner"});
  CHECK(m->ChildNames(*inner, Definition::Kind::kClass) == std::vector<std::string>{"Deeper"});
  CHECK(m->ChildNames(*inner, Definition::Kind::kFunction) == std::vector<std::string>{"method"});
  CHECK(&m->definitions()[inner->parent] == like);
  const Definition* method = m->Find("ToyConfigLike.Inner.method");
  REQUIRE(method != nullptr);
  CHECK(m->Text(method->whole) ==
        "def method(self):\n"
        "            import os\n"
        "            from .. import sibling as sib\n"
        "            return os.sep");
  CHECK(m->TopLevelNames() == std::vector<std::string>{"ToyRMSNorm", "ToyCache", "ToyOutput",
                                                       "ToyConfigLike", "ToyModel", "helper"});
  CHECK(m->TopLevelNames(Definition::Kind::kFunction) == std::vector<std::string>{"helper"});
  CHECK(m->FindTopLevel("Inner") == nullptr);
  CHECK(m->FindTopLevel("helper") == m->Find("helper"));
  CHECK(m->Find("Nope") == nullptr);
}

TEST_CASE("Stacked decorators, trailing comments in else, async def with tab body", "[parser]") {
  auto m = Toy();
  const Definition* model = m->Find("ToyModel");
  REQUIRE(model != nullptr);
  CHECK(m->Text(model->decorators) == "@auto_docstring\n@torch.no_grad()");
  CHECK(model->comments.empty());
  CHECK(m->Text(model->definition).substr(0, 16) == "@auto_docstring\n");

  const Definition* fwd = m->Find("ToyModel.forward");
  REQUIRE(fwd != nullptr);
  // `type(self).calls = 1` stays a plain statement of the body; the trailing comment of the
  // `else` block is not part of the body.
  CHECK(m->Text(fwd->body) ==
        "type(self).calls = 1\n"
        "        if x is None:\n"
        "            return None\n"
        "        else:\n"
        "            return x");

  const Definition* stream = m->Find("ToyModel.stream");
  REQUIRE(stream != nullptr);
  CHECK(stream->is_async);
  CHECK(m->Text(stream->comments) == "# Streams tokens (attached).");
  CHECK(m->Text(stream->whole) ==
        "# Streams tokens (attached).\n    async def stream(self):\n\tpass");
  CHECK(m->Text(stream->definition) == "async def stream(self):\n\tpass");
  CHECK(m->Text(stream->header) == "async def stream(self):");
  CHECK(stream->body_indent == 1);  // one tab: columns are bytes
  CHECK(stream->empty_body);

  const Definition* helper = m->Find("helper");
  REQUIRE(helper != nullptr);
  CHECK(m->Text(helper->header) == "def helper(a,\n           b):");
  CHECK(m->Text(helper->body) == "return a + b");
}

TEST_CASE("type(x).attr = v is an expression statement, never a type alias", "[parser]") {
  auto m = ParseOk("type(x).attr = v\ntype X = int\ntype Pair[T] = tuple[T, T]\n");
  REQUIRE(m->top_level().size() == 3);
  CHECK(m->top_level()[0].kind == TopLevelStatement::Kind::kOther);
  CHECK(m->top_level()[0].names.empty());
  CHECK(m->Text(m->top_level()[0].range) == "type(x).attr = v");
  CHECK(m->top_level()[1].kind == TopLevelStatement::Kind::kAssignment);
  CHECK(m->top_level()[1].names == std::vector<std::string>{"X"});
  CHECK(m->top_level()[2].names == std::vector<std::string>{"Pair"});
  CHECK(m->definitions().empty());
}

TEST_CASE("Assignment targets: chained, tuples, annotations, attributes, augmented", "[parser]") {
  auto m =
      ParseOk("a = b = 1\n(c, [d, *e]) = f\nx: int\nobj.attr = 2\n__all__ += [\"y\"]\nk[0] = 1\n");
  std::vector<std::vector<std::string>> names;
  for (const auto& s : m->top_level()) {
    CHECK(s.kind == TopLevelStatement::Kind::kAssignment);
    names.push_back(s.names);
  }
  CHECK(names == std::vector<std::vector<std::string>>{
                     {"a", "b"}, {"c", "d", "e"}, {"x"}, {}, {"__all__"}, {}});
}

TEST_CASE("Comment attachment: blank line, string lines and column rules", "[parser]") {
  auto m = ParseOk(
      "# detached\n"
      "\n"
      "# attached 1\n"
      "# attached 2\n"
      "def f():\n"
      "    pass\n"
      "s = \"\"\"text\n"
      "# inside a string\"\"\"\n"
      "def g():\n"
      "    pass\n"
      "class C:\n"
      "    x = 1\n"
      "    # at the method's column\n"
      "  # odd column breaks the block\n"
      "    # attached to m\n"
      "    def m(self):\n"
      "        pass\n");
  CHECK(m->Text(m->Find("f")->whole) == "# attached 1\n# attached 2\ndef f():\n    pass");
  CHECK(m->Text(m->Find("f")->comments) == "# attached 1\n# attached 2");
  CHECK(m->Find("g")->comments.empty());
  CHECK(m->Text(m->Find("g")->whole) == "def g():\n    pass");
  CHECK(m->Text(m->Find("C.m")->whole) == "# attached to m\n    def m(self):\n        pass");
  // Comments whose block ends the class body are not part of it.
  CHECK(m->Text(m->Find("C")->body) ==
        "x = 1\n    # at the method's column\n  # odd column breaks the block\n"
        "    # attached to m\n    def m(self):\n        pass");
}

TEST_CASE("Body starting with a comment, CRLF endings and definitions under if", "[parser]") {
  auto m = ParseOk(
      "if flag:\r\n"
      "    def f():\r\n"
      "        # first\r\n"
      "        return 1\r\n"
      "        # last\r\n");
  const Definition* f = m->Find("f");
  REQUIRE(f != nullptr);
  CHECK(m->Text(f->body) == "# first\r\n        return 1");
  CHECK(m->Text(f->whole) == "def f():\r\n        # first\r\n        return 1");
  CHECK(f->body_indent == 8);
  CHECK(m->FindTopLevel("f") == nullptr);  // not directly in the module body
  CHECK(m->TopLevelNames().empty());
  REQUIRE(m->top_level().size() == 1);
  CHECK(m->Text(m->top_level()[0].range) ==
        "if flag:\r\n    def f():\r\n        # first\r\n        return 1");
}

TEST_CASE("Refuses syntax errors with location, excerpt and help", "[parser]") {
  CHECK(ParseError("x = 1\nclass A:\n    def f(self)\n        return 1\n") ==
        "bad.py:3:5: error: cannot parse Python: syntax error\n"
        "    3 |     def f(self)\n"
        "      |     ^~~~~~~~~~~\n"
        "help: patchgen indexes only valid Python; check the file with `python3 -m py_compile "
        "bad.py`\n");
  CHECK(ParseError("def f(:\n    pass\n") ==
        "bad.py:1:7: error: cannot parse Python: missing ')'\n"
        "    1 | def f(:\n"
        "      |       ^\n"
        "help: patchgen indexes only valid Python; check the file with `python3 -m py_compile "
        "bad.py`\n");
}

TEST_CASE("Refuses what CPython's compiler rejects and tree-sitter accepts", "[parser]") {
  // A starred expression alone as an assignment or `for` target (found by the fuzz suite).
  CHECK(ParseError("class A:\n    def f(self, k):\n        *self.k = k\n") ==
        "bad.py:3:9: error: cannot parse Python: starred assignment target must be in a list or "
        "tuple\n"
        "    3 |         *self.k = k\n"
        "      |         ^~~~~~~\n"
        "help: patchgen indexes only valid Python; check the file with `python3 -m py_compile "
        "bad.py`\n");
  CHECK(ParseError("for *a in b:\n    pass\n").find(":1:5: error: cannot parse Python: starred") !=
        std::string::npos);
  CHECK(ParseError("x = [y for *y in z]\n").find(":1:12: error: cannot parse Python: starred") !=
        std::string::npos);
  // Where no starred expression may stand (CPython 3.11's messages).
  CHECK(ParseError("*a.b\n").find(":1:1: error: cannot parse Python: can't use starred expression "
                                  "here") != std::string::npos);
  CHECK(ParseError("(*a).b = 1\n")
            .find(":1:2: error: cannot parse Python: cannot use starred "
                  "expression here") != std::string::npos);
  CHECK(ParseError("x = *a\n").find(":1:5: error: cannot parse Python: can't use starred") !=
        std::string::npos);
  CHECK(ParseError("x = {1: *a}\n")
            .find(":1:9: error: cannot parse Python: cannot use a starred "
                  "expression in a dictionary value") != std::string::npos);
  // A starred operand of an operator (an edit_body text found by the fuzz suite).
  CHECK(ParseError("x = a.coe& * b.float()\n")
            .find(":1:12: error: cannot parse Python: invalid syntax") != std::string::npos);
  for (const char* bad :
       {"x = a + *b\n", "x = a < *b\n", "x = a and *b\n", "x = not *a\n", "x = -*a\n",
        "x = a if *b else c\n", "f(a & *b)\n", "x = [a | *b]\n", "x = [*a or b]\n"}) {
    INFO(bad);
    CHECK(ParseError(bad).find("error: cannot parse Python: invalid syntax") != std::string::npos);
  }
  // A header without a body (tree-sitter accepts it at the end of a file; found by the fuzz suite).
  CHECK(ParseError("x = 1\nclass A(B):\n")
            .find(":2:1: error: cannot parse Python: expected an "
                  "indented block after class definition") != std::string::npos);
  CHECK(ParseError("if x:\n    pass\nelse:\n    # nothing\n")
            .find(":3:1: error: cannot parse Python: expected an indented block after 'else' "
                  "statement") != std::string::npos);
  // Deep inside statements and expressions the walk still finds them: a subtree is skipped only
  // when its bytes hold no `*` and it holds no statement.
  CHECK(ParseError("class A:\n    @dec(lambda: 0)\n    def f(self, a=lambda: {1: *b}):\n"
                   "        pass\n")
            .find(":3:31: error: cannot parse Python: cannot use a starred expression in a "
                  "dictionary value") != std::string::npos);
  CHECK(ParseError("if x:\n    while y:\n        z = [f(q) for *q in r]\n")
            .find(":3:23: error: cannot parse Python: starred") != std::string::npos);
  CHECK(ParseError("x = y\ntry:\n    pass\nexcept E:\n    def f():\n        with a:\n"
                   "            if b:\n")
            .find(":7:13: error: cannot parse Python: expected an indented block after 'if' "
                  "statement") != std::string::npos);
  CHECK(ParseError("def f(*args, **kw):\n    return g(*args) * 2\n\nclass B:\n"
                   "    x = (*a)\n")
            .find(":5:10: error: cannot parse Python: cannot use starred expression here") !=
        std::string::npos);
  // `(*a)` is a tuple to tree-sitter-python, a starred expression in parentheses to CPython.
  for (const char* bad :
       {"(*a)\n", "x = (*a)\n", "(*a) = b\n", "for (*a) in b:\n    pass\n", "x = [(*a)]\n"}) {
    INFO(bad);
    CHECK(
        ParseError(bad).find(": error: cannot parse Python: cannot use starred expression here") !=
        std::string::npos);
  }
  CHECK(ParseError("x = (*a)\n").find(":1:6: error:") != std::string::npos);
  // In a list or tuple it is valid Python.
  for (const char* ok : {"a, *b = c\n", "*a, = c\n", "[*a] = c\n", "for a, *b in c:\n    pass\n",
                         "f(*a)\n", "x = [*a, *b]\n", "a[*b] = 1\n", "x = {**a}\n",
                         "print(*a, sep='')\n", "return_value = (*a, b)\n", "*a, b\n", "x = *a,\n",
                         "a, b = *m.shape, v\n", "f([*x.size()[:-1]])\n", "y = [*zip(*f)][1]\n",
                         "x = {1: [*a]}\n", "(*a,)\n", "x = (*a, *b)\n", "(*a,) = b\n"}) {
    INFO(ok);
    CHECK(PyModule::Parse("ok.py", ok).ok());
  }
  // So is an operator inside a starred expression.
  for (const char* ok : {"print(*a + b)\n", "f(*a.b & c)\n", "x = a * -b ** c\n",
                         "f(*a if b else c)\n", "f(*a or b)\n", "f(*a < b)\n", "f(*not a)\n"}) {
    INFO(ok);
    CHECK(PyModule::Parse("ok.py", ok).ok());
  }
}

/// Checks the range invariants of every definition of `m`; returns the number of failures and
/// describes the first ones in `report`.
int CheckDefinitionRanges(const PyModule& m, std::string& report) {
  int failures = 0;
  auto fail = [&](const Definition& d, const std::string& what) {
    if (++failures <= 5) {
      report += m.path() + ":" + std::to_string(d.line) + ": " + d.qualname + ": " + what + "\n";
    }
  };
  auto starts_with = [](std::string_view s, std::string_view p) {
    return s.substr(0, p.size()) == p;
  };
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
  };
  for (const Definition& d : m.definitions()) {
    std::string_view whole = m.Text(d.whole);
    std::string_view def = m.Text(d.definition);
    bool whole_ok = starts_with(whole, "#") || starts_with(whole, "@") ||
                    starts_with(whole, "def") || starts_with(whole, "class") ||
                    starts_with(whole, "async");
    bool def_ok = starts_with(def, "@") || starts_with(def, "def") || starts_with(def, "class") ||
                  starts_with(def, "async");
    if (!whole_ok) fail(d, "whole starts with '" + std::string(whole.substr(0, 10)) + "'");
    if (!def_ok) fail(d, "definition starts with '" + std::string(def.substr(0, 10)) + "'");
    if (d.whole.end != d.body.end || d.definition.end != d.body.end)
      fail(d, "does not end at the body");
    if (def.empty() || is_space(def.back())) fail(d, "ends with whitespace");
    // The body's end is its last statement's end: nothing but whitespace and comments follow on
    // deeper-indented lines before the next code at the definition's level or shallower.
    const LineIndex& lines = m.lines();
    uint32_t last_line = lines.LineOf(d.body.end - 1);
    std::string_view rest_of_line =
        lines.LineText(last_line).substr(d.body.end - lines.LineStart(last_line));
    size_t hash = rest_of_line.find('#');
    std::string_view code = rest_of_line.substr(0, hash);
    for (char c : code) {
      if (!is_space(c) && c != ';') {
        fail(d, "code after the body end on its line: '" + std::string(rest_of_line) + "'");
        break;
      }
    }
    for (uint32_t l = last_line + 1; l < lines.line_count(); ++l) {
      std::string_view t = lines.LineText(l);
      size_t col = t.find_first_not_of(" \t\f\r");
      if (col == std::string_view::npos || t[col] == '#') continue;
      if (col > d.indent && (d.inline_body || col >= d.body_indent)) {
        fail(d, "a statement at the body's indentation follows the body end (line " +
                    std::to_string(l + 1) + ")");
      }
      break;
    }
  }
  return failures;
}

TEST_CASE("Every fixture definition satisfies the range invariants", "[parser]") {
  auto m = Toy();
  std::string report;
  CHECK(CheckDefinitionRanges(*m, report) == 0);
  INFO(report);
}

TEST_CASE("Corpus: every .py under PATCHGEN_CORPUS indexes with exact definition ranges",
          "[parser][corpus]") {
  const char* root = std::getenv("PATCHGEN_CORPUS");
  if (root == nullptr || *root == '\0') {
    WARN("PATCHGEN_CORPUS is not set; corpus test skipped");
    return;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  REQUIRE_FALSE(files.empty());
  size_t bytes = 0;
  size_t definitions = 0;
  int failures = 0;
  std::string report;
  std::chrono::duration<double> parse_time{0};
  std::clock_t parse_cpu = 0;
  for (const auto& path : files) {
    std::string text = ReadFile(path.string());
    bytes += text.size();
    auto t0 = std::chrono::steady_clock::now();
    std::clock_t c0 = std::clock();
    auto r = PyModule::Parse(path.string(), std::move(text));
    parse_cpu += std::clock() - c0;
    parse_time += std::chrono::steady_clock::now() - t0;
    if (!r) {
      ++failures;
      report += FormatDiagnostic(r.errors()[0]);
      continue;
    }
    definitions += (*r)->definitions().size();
    failures += CheckDefinitionRanges(**r, report);
  }
  // Time of Parse() (parse + error scan + index) alone, single thread.
  double cpu_s = static_cast<double>(parse_cpu) / CLOCKS_PER_SEC;
  WARN("corpus: " << files.size() << " files, " << bytes << " bytes, " << definitions
                  << " definitions, parse+index " << parse_time.count() << " s wall, " << cpu_s
                  << " s CPU");
  INFO(report);
  CHECK(failures == 0);
}

}  // namespace
}  // namespace patchgen::parser

namespace patchgen::parser {
namespace {

std::vector<uint32_t> RedefinitionLines(const PyModule& m, std::string_view qualname) {
  std::vector<uint32_t> lines;
  for (const Definition* d : m.Redefinitions(*m.Find(qualname))) lines.push_back(d->line);
  return lines;
}

TEST_CASE("Redefinitions: a name bound twice in one scope, not accessors, overloads or branches") {
  auto m = ParseOk(
      "def f():\n    pass\n"                                 // 1
      "class A:\n"                                           // 3
      "    def m(self):\n        pass\n"                     // 4
      "    @property\n    def p(self):\n        return 1\n"  // 6
      "    @p.setter\n    def p(self, v):\n        pass\n"   // 9
      "    def m(self):\n        return 2\n"                 // 12
      "if X:\n    def g():\n        pass\n"                  // 14
      "else:\n    def g():\n        pass\n"                  // 17
      "@overload\ndef h(x: int): ...\n"                      // 20
      "def h(x):\n    return x\n"                            // 22
      "def f():\n    return 1\n");                           // 24
  CHECK(RedefinitionLines(*m, "f") == std::vector<uint32_t>{24});
  CHECK(RedefinitionLines(*m, "A.m") == std::vector<uint32_t>{12});
  CHECK(RedefinitionLines(*m, "A.p").empty());
  CHECK(RedefinitionLines(*m, "g").empty());
  CHECK(RedefinitionLines(*m, "h").empty());
  CHECK(m->Find("A")->direct);
  CHECK_FALSE(m->Find("g")->direct);
}

TEST_CASE("Find: @overload stubs give way to the implementation (issue #28)") {
  auto m = ParseOk(
      "@overload\ndef h(x: int): ...\n"                    // 1
      "@typing.overload\ndef h(x: str): ...\n"             // 3
      "def h(x):\n    return x\n"                          // 5
      "class A:\n"                                         // 7
      "    @t.overload\n    def m(self, x: int): ...\n"    // 8
      "    def m(self, x):\n        return x\n"            // 10
      "@overload\ndef only(x: int): ...\n"                 // 12
      "@overload_cache\ndef cached(x):\n    return x\n");  // 14
  CHECK(m->Find("h")->line == 5);
  CHECK(m->FindTopLevel("h")->line == 5);
  CHECK(m->Find("A.m")->line == 10);
  CHECK(m->Find("only")->line == 12);  // No implementation: the stub itself.
  CHECK_FALSE(m->IsOverloadStub(*m->Find("cached")));
  CHECK(m->IsOverloadStub(m->definitions()[0]));
}

std::vector<uint32_t> RebindingLines(const PyModule& m, std::string_view qualname) {
  std::vector<uint32_t> lines;
  for (ByteRange r : m.Rebindings(*m.Find(qualname))) lines.push_back(m.lines().At(r.start).line);
  return lines;
}

TEST_CASE("Rebindings: later bindings of a definition's name in its scope (issue #28)") {
  auto m = ParseOk(
      "def f():\n    pass\n"              // 1
      "class A:\n"                        // 3
      "    def m(self):\n        pass\n"  // 4
      "    m = staticmethod(m)\n"         // 6: refers to m
      "    n = 1\n"                       // 7
      "    m = other\n"                   // 8
      "def g():\n    pass\n"              // 9
      "g = wrap(g)\n"                     // 11: refers to g
      "x, f = 1, 2\n"                     // 12
      "from m import g as g\n"            // 13
      "if X:\n    f = 3\n"                // 14: conditional, not counted
      "A.m = other\n"                     // 16
      "A.m = wrap(A.m)\n"                 // 17: refers to A.m
      "del g\n");                         // 18
  CHECK(RebindingLines(*m, "f") == std::vector<uint32_t>{12});
  CHECK(RebindingLines(*m, "A.m") == std::vector<uint32_t>{8, 16});
  CHECK(RebindingLines(*m, "g") == std::vector<uint32_t>{13, 18});
  CHECK(RebindingLines(*m, "A").empty());
}

}  // namespace
}  // namespace patchgen::parser

namespace patchgen::parser {
namespace {

TEST_CASE("The index holds names as Python compares them (NFKC), ranges give upstream's bytes",
          "[parser]") {
  // U+FB01 LATIN SMALL LIGATURE FI and fullwidth letters: `ﬁnd` is `find`, `ｆｏｏ` is `foo`.
  const std::string fi = "\xEF\xAC\x81";
  const std::string foo = "\xEF\xBD\x86\xEF\xBD\x8F\xEF\xBD\x8F";
  auto m = ParseOk("from .m" + fi + " import " + foo + " as b" + fi + "\n" + foo + ", x = 1, 2\n" +
                   "class A:\n    def " + fi + "nd(self, " + foo + "):\n        pass\n\n" +
                   "    @" + fi + "nd.setter\n    def find(self, v):\n        pass\n");
  const Import& imp = m->imports()[0];
  CHECK(imp.module_name == "mfi");
  CHECK(imp.names[0].name == "foo");
  CHECK(imp.names[0].alias == "bfi");
  CHECK(m->top_level()[1].names == std::vector<std::string>{"foo", "x"});
  const Definition* d = m->Find("A.find");
  REQUIRE(d != nullptr);
  CHECK(d->name == "find");
  CHECK(m->Text(d->name_range) == fi + "nd");  // upstream's bytes
  CHECK(m->Find("A." + fi + "nd") == d);       // a spelling Python reads the same
  CHECK(ParameterNames(*m, *d) == std::vector<std::string>{"self", "foo"});
  // `@ﬁnd.setter def find` is a property accessor of `find`, not a redefinition.
  CHECK(m->Redefinitions(*d).empty());
}

}  // namespace
}  // namespace patchgen::parser
