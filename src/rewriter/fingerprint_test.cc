#include "rewriter/fingerprint.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "parser/py_module.h"
#include "parser/tree_queries.h"

namespace {

using patchgen::rewriter::AbsentFingerprint;
using patchgen::rewriter::Fingerprint;
using patchgen::rewriter::FingerprintOf;

const char* kBase = R"(import torch


class RMSNorm(torch.nn.Module):
    def forward(self, hidden_states):
        """Normalizes the last dimension."""
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
)";

/// Fingerprint of RMSNorm.forward in `source` (whole definition, docstring left out).
Fingerprint Of(const std::string& source) {
  auto m = patchgen::parser::PyModule::Parse("m.py", source);
  REQUIRE(m.ok());
  const patchgen::parser::Definition* def = (*m)->Find("RMSNorm.forward");
  REQUIRE(def != nullptr);
  std::vector<patchgen::ByteRange> skip;
  if (def->docstring) skip.push_back(*def->docstring);
  return FingerprintOf(**m, {def->definition}, skip);
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("fingerprint ignores comments, the docstring and formatting", "[fingerprint]") {
  Fingerprint base = Of(kBase);
  CHECK(base.sha256.size() == 64);
  CHECK(base.text ==
        "def forward(self, hidden_states):\n"
        "  input_dtype = hidden_states.dtype\n"
        "  hidden_states = hidden_states.to(torch.float32)\n"
        "  variance = hidden_states.pow(2).mean(-1, keepdim=True)\n"
        "  hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)\n"
        "  return self.weight * hidden_states.to(input_dtype)");
  // Comments (own line and trailing), another docstring, no docstring.
  CHECK(Of(Replace(kBase, "        input_dtype", "        # keep the dtype\n        input_dtype"))
            .sha256 == base.sha256);
  CHECK(Of(Replace(kBase, "keepdim=True)", "keepdim=True)  # mean of squares")).sha256 ==
        base.sha256);
  CHECK(Of(Replace(kBase, "\"\"\"Normalizes the last dimension.\"\"\"",
                   "\"\"\"\n        Something else entirely.\n        \"\"\""))
            .sha256 == base.sha256);
  CHECK(Of(Replace(kBase, "        \"\"\"Normalizes the last dimension.\"\"\"\n", "")).sha256 ==
        base.sha256);
  // Formatting: spaces, line breaks inside brackets, blank lines.
  CHECK(Of(Replace(kBase, "mean(-1, keepdim=True)", "mean( -1,\n            keepdim = True )"))
            .sha256 == base.sha256);
  CHECK(Of(Replace(kBase, "        variance =", "\n\n        variance =")).sha256 == base.sha256);
  // A trailing comma in a parameter or argument list is formatting.
  CHECK(Of(Replace(kBase,
                   "(self, hidden_states):", "(\n        self,\n        hidden_states,\n    ):"))
            .sha256 == base.sha256);
  CHECK(Of(Replace(kBase, "keepdim=True)", "keepdim=True,)")).sha256 == base.sha256);
}

TEST_CASE("fingerprint detects any token change", "[fingerprint]") {
  Fingerprint base = Of(kBase);
  // The cast order of the RMSNorm output: one pair of parentheses moved.
  Fingerprint cast = Of(Replace(kBase, "return self.weight * hidden_states.to(input_dtype)",
                                "return (self.weight * hidden_states).to(input_dtype)"));
  CHECK(cast.sha256 != base.sha256);
  CHECK(cast.text.find("return (self.weight * hidden_states).to(input_dtype)") !=
        std::string::npos);
  CHECK(Of(Replace(kBase, "pow(2)", "pow(3)")).sha256 != base.sha256);
  CHECK(Of(Replace(kBase, "keepdim=True", "keepdim=False")).sha256 != base.sha256);
  // In a tuple a trailing comma is not formatting: `(x,)` is not `(x)`.
  CHECK(Of(Replace(kBase, "pow(2)", "pow((2,))")).sha256 !=
        Of(Replace(kBase, "pow(2)", "pow((2))")).sha256);
  CHECK(Of(Replace(kBase, "torch.float32", "torch.float16")).sha256 != base.sha256);
  CHECK(Of(Replace(kBase, "(self, hidden_states)", "(self, hidden_states, eps=None)")).sha256 !=
        base.sha256);
  // A decorator is part of the definition.
  CHECK(Of(Replace(kBase, "    def forward", "    @torch.no_grad()\n    def forward")).sha256 !=
        base.sha256);
  // A string literal that is not the docstring counts, byte for byte.
  std::string with_string =
      Replace(kBase, "        input_dtype", "        tag = \"a\"\n        input_dtype");
  CHECK(Of(with_string).sha256 != base.sha256);
  CHECK(Of(Replace(with_string, "\"a\"", "\"b\"")).sha256 != Of(with_string).sha256);
}

TEST_CASE("fingerprint of something absent is fixed", "[fingerprint]") {
  CHECK(AbsentFingerprint().sha256 == AbsentFingerprint().sha256);
  CHECK(AbsentFingerprint().text == "(absent)");
  CHECK(AbsentFingerprint().sha256 != Of(kBase).sha256);
}

TEST_CASE("fingerprint sees block structure and statement boundaries", "[fingerprint]") {
  // Issue #28: the token stream alone was the same for these pairs.
  std::string in_if = Replace(kBase, "        hidden_states = hidden_states.to(torch.float32)\n",
                              "        if self.training:\n"
                              "            hidden_states = hidden_states.to(torch.float32)\n"
                              "            variance = hidden_states\n");
  std::string after_if = Replace(in_if, "            variance = hidden_states\n",
                                 "        variance = hidden_states\n");
  CHECK(Of(in_if).sha256 != Of(after_if).sha256);
  // `y = x - eps` is not `y = x` followed by the statement `- eps`.
  std::string one =
      Replace(kBase, "variance + self.variance_epsilon)",
              "variance)\n        hidden_states = hidden_states - self.variance_epsilon");
  std::string two = Replace(one, "hidden_states = hidden_states - self.variance_epsilon",
                            "hidden_states = hidden_states\n        - self.variance_epsilon");
  CHECK(Of(one).sha256 != Of(two).sha256);
  // A `;` between statements is one way of writing the boundary a line break writes.
  CHECK(Of(Replace(kBase, "        input_dtype = hidden_states.dtype\n",
                   "        input_dtype = hidden_states.dtype; x = 1\n"))
            .sha256 == Of(Replace(kBase, "        input_dtype = hidden_states.dtype\n",
                                  "        input_dtype = hidden_states.dtype\n        x = 1\n"))
                           .sha256);
}

TEST_CASE("fingerprint walks the deepest nesting a module may have", "[fingerprint]") {
  // Issue #28: 50,000 nested parentheses overflowed the stack of the recursive walk. Parse now
  // refuses nesting deeper than kMaxNesting, and the walk is iterative.
  auto deep_paren = [](int depth) {
    return Replace(kBase, "return self.weight * hidden_states.to(input_dtype)",
                   "return self.weight * " + std::string(depth, '(') + "hidden_states" +
                       std::string(depth, ')'));
  };
  auto refused = patchgen::parser::PyModule::Parse("m.py", deep_paren(50000));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.errors()[0].message == "cannot parse Python: nesting deeper than 4000 levels");
  constexpr int kDepth = 3980;  // with the def, class, blocks and statements: just within 4000
  Fingerprint fp = Of(deep_paren(kDepth));
  CHECK(fp.tokens == Of(kBase).tokens - 6 + 2 * kDepth + 1);  // `.to(input_dtype)` out
  CHECK(fp.sha256 != Of(kBase).sha256);
}
