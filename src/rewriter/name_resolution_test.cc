#include "rewriter/name_resolution.h"

#include <catch2/catch.hpp>
#include <string>

#include "parser/py_module.h"

using namespace patchgen;
using namespace patchgen::rewriter;

namespace {

/// Unresolved names in the part of `source` between the markers `#<` and `#>` (lines).
std::string Unresolved(const std::string& source) {
  auto begin = static_cast<uint32_t>(source.find("#<"));
  auto end = static_cast<uint32_t>(source.find("#>"));
  parser::TreePtr tree = parser::ParseTree(source);
  auto uses = FindUnresolvedNames(ts_tree_root_node(tree.get()), source, {ByteRange{begin, end}});
  std::string out;
  for (const NameUse& u : uses) out += u.name + "@" + std::to_string(u.offset) + " ";
  return out;
}

}  // namespace

TEST_CASE("Names bound at module level, under if/try, and builtins resolve", "[rewriter]") {
  CHECK(Unresolved("import torch.nn as nn\n"
                   "import os.path\n"
                   "from x import (a, b as c)\n"
                   "try:\n    from y import d\nexcept ImportError:\n    d = None\n"
                   "if True:\n    E = 1\n"
                   "for i, (j, k) in []:\n    pass\n"
                   "with open('f') as fh:\n    pass\n"
                   "#<\n"
                   "v = [nn, os, a, c, d, E, i, j, k, fh, len, __name__, __file__, Later]\n"
                   "#>\n"
                   "class Later:\n    pass\n") == "");
}

TEST_CASE("Parameters, locals and comprehension targets resolve in their scope", "[rewriter]") {
  CHECK(Unresolved("#<\n"
                   "def f(a, b: int = 1, *args, c=None, **kwargs):\n"
                   "    import math\n"
                   "    x = a + b + len(args) + c + kwargs['k'] + math.pi + later\n"
                   "    (y := 2)\n"
                   "    try:\n        pass\n    except Exception as e:\n        print(e)\n"
                   "    g = lambda p, q=1: p + q + x\n"
                   "    return [z for z in range(y) if z] + [w for w in {}]\n"
                   "    later = 1\n"
                   "#>\n") == "");
}

TEST_CASE("Undefined names, attribute names and keyword names", "[rewriter]") {
  std::string src =
      "import torch\n"
      "#<\n"
      "def forward(self, x):\n"
      "    y = torch.nn.functional.silu(x, inplace=Flase)\n"
      "    return self.proj(y) + missing_fn(y).attr\n"
      "#>\n";
  CHECK(Unresolved(src) == "Flase@" + std::to_string(src.find("Flase")) + " missing_fn@" +
                               std::to_string(src.find("missing_fn")) + " ");
}

TEST_CASE("Class-body names resolve only in the class body, not in methods", "[rewriter]") {
  std::string src =
      "#<\n"
      "class A:\n"
      "    size = 4\n"
      "    doubled = size * 2\n"
      "    def f(self, n=size):\n"
      "        return size\n"
      "#>\n";
  CHECK(Unresolved(src) == "size@" + std::to_string(src.rfind("size")) + " ");
}

TEST_CASE("A function's default values resolve in the enclosing scope", "[rewriter]") {
  std::string src = "#<\ndef f(a=a):\n    return a\n#>\n";
  CHECK(Unresolved(src) == "a@" + std::to_string(src.find("=a") + 1) + " ");
}

TEST_CASE("Names declared global anywhere resolve, however the statement is spelled",
          "[rewriter]") {
  // The resolver looks for `global` statements only where the keyword occurs as a word followed
  // by a blank or a line continuation: every spelling CPython accepts.
  for (std::string decl : {"global counter", "global\tcounter", "global \\\n        counter",
                           "x = 1; global counter", "if True:global counter"}) {
    INFO(decl);
    CHECK(Unresolved("def f():\n    " + decl + "\n    counter = 1\n#<\nv = counter\n#>\n") == "");
  }
  CHECK(Unresolved("global_counter = 1\n# global counter\n#<\nv = counter\n#>\n")
            .starts_with("counter@"));
}

TEST_CASE("Names are compared as Python compares them: NFKC (PEP 3131)", "[rewriter]") {
  // `ｆｏｏ` (fullwidth) reads upstream's `foo`; `find` reads a `def ﬁnd` (U+FB01); a parameter
  // `ｘ` binds `x`; `ｌｅｎ` is the builtin `len`. An unknown name is reported in NFKC, as
  // Python's NameError names it.
  CHECK(Unresolved("foo = 1\n"
                   "def \xEF\xAC\x81nd(\xEF\xBD\x98):\n"
                   "#<\n"
                   "    return x + \xEF\xBD\x86\xEF\xBD\x8F\xEF\xBD\x8F + find(1) + "
                   "\xEF\xBD\x8C\xEF\xBD\x85\xEF\xBD\x8E([]) + \xEF\xBD\x82"
                   "ar\n"
                   "#>\n") == "bar@80 ");
}
