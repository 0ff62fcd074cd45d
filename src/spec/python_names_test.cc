#include "spec/python_names.h"

#include <catch2/catch.hpp>

namespace patchgen::spec {
namespace {

TEST_CASE("IsIdentifier and IsDotted: keywords refused, non-ASCII allowed", "[spec]") {
  CHECK(IsIdentifier("Qwen3MLP"));
  CHECK(IsIdentifier("_x1"));
  CHECK(IsIdentifier("caf\xC3\xA9"));
  CHECK_FALSE(IsIdentifier(""));
  CHECK_FALSE(IsIdentifier("1x"));
  CHECK_FALSE(IsIdentifier("class"));
  CHECK_FALSE(IsIdentifier("a-b"));
  CHECK(IsDotted("transformers.models.qwen3"));
  CHECK(IsDotted("x"));
  CHECK_FALSE(IsDotted("a..b"));
  CHECK_FALSE(IsDotted("a."));
  CHECK_FALSE(IsDotted("a.def"));
  CHECK(CountDots("a.b.c") == 2);
}

TEST_CASE("FirstDefName: the first top-level def or class", "[spec]") {
  CHECK(FirstDefName("# comment\n@decorator\ndef f(x):\n    pass\n") == "f");
  CHECK(FirstDefName("async def g():\n    pass\n") == "g");
  CHECK(FirstDefName("class  A(B):\n    pass\n") == "A");
  CHECK(FirstDefName("    def indented(): pass\nclass C: pass\n") == "C");
  CHECK(FirstDefName("x = 1\ndef f(): pass\n") == std::nullopt);
  CHECK(FirstDefName("def (") == std::nullopt);
  CHECK(FirstDefName("") == std::nullopt);
  CHECK(LeadingName("  name(rest") == "name");
  CHECK(LeadingName("   ") == std::nullopt);
}

}  // namespace
}  // namespace patchgen::spec
