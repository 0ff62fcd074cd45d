#include "diff/unified_diff.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/file_util.h"

namespace patchgen::diff {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& p) { return ReadFile(p).value_or(""); }

void WriteAll(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

/// Applies UnifiedDiff(a, b) to a file holding `a` with GNU patch and returns the result.
std::string ApplyWithPatch(const std::string& a, const std::string& b) {
  char tmpl[] = "/tmp/patchgen_diff_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  fs::path dir = tmpl;
  WriteAll(dir / "f.txt", a);
  WriteAll(dir / "f.diff", UnifiedDiff(a, b, "a/f.txt", "b/f.txt"));
  std::string cmd = "cd '" + dir.string() + "' && patch -s -p1 < f.diff > /dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  std::string got = rc == 0 ? ReadAll(dir / "f.txt") : "<patch failed>";
  fs::remove_all(dir);
  return got;
}

TEST_CASE("UnifiedDiff of equal texts is empty") {
  CHECK(UnifiedDiff("a\nb\n", "a\nb\n", "a/x", "b/x").empty());
  CHECK(UnifiedDiff("", "", "a/x", "b/x").empty());
}

TEST_CASE("UnifiedDiff prints labels, one hunk with 3 lines of context") {
  std::string a = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
  std::string b = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
  CHECK(UnifiedDiff(a, b, "a/m.py", "b/out.py") ==
        "--- a/m.py\n+++ b/out.py\n"
        "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n");
}

TEST_CASE("UnifiedDiff merges changes at most 6 lines apart and splits farther ones") {
  std::string a, b_near, b_far;
  for (int i = 1; i <= 20; ++i) a += std::to_string(i) + "\n";
  b_near = a;
  b_near.replace(b_near.find("2\n"), 2, "X\n");
  b_near.replace(b_near.find("\n9\n") + 1, 2, "Y\n");  // 6 common lines between
  CHECK(UnifiedDiff(a, b_near, "a", "b") ==
        "--- a\n+++ b\n@@ -1,12 +1,12 @@\n 1\n-2\n+X\n 3\n 4\n 5\n 6\n 7\n 8\n-9\n+Y\n 10\n 11\n "
        "12\n");
  b_far = a;
  b_far.replace(b_far.find("2\n"), 2, "X\n");
  b_far.replace(b_far.find("\n10\n") + 1, 3, "Y\n");  // 7 common lines between
  CHECK(UnifiedDiff(a, b_far, "a", "b") ==
        "--- a\n+++ b\n@@ -1,5 +1,5 @@\n 1\n-2\n+X\n 3\n 4\n 5\n"
        "@@ -7,7 +7,7 @@\n 7\n 8\n 9\n-10\n+Y\n 11\n 12\n 13\n");
}

TEST_CASE("UnifiedDiff hunk headers for empty files and single lines") {
  CHECK(UnifiedDiff("", "a\nb\nc\n", "a/x", "b/x") ==
        "--- a/x\n+++ b/x\n@@ -0,0 +1,3 @@\n+a\n+b\n+c\n");
  CHECK(UnifiedDiff("a\nb\n", "", "a/x", "b/x") == "--- a/x\n+++ b/x\n@@ -1,2 +0,0 @@\n-a\n-b\n");
  CHECK(UnifiedDiff("a\n", "b\n", "a/x", "b/x") == "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n");
  // Pure insertion after line 1: the empty old side names the line before it.
  CHECK(UnifiedDiff("a\n", "a\nb\n", "a/x", "b/x") == "--- a/x\n+++ b/x\n@@ -1 +1,2 @@\n a\n+b\n");
}

TEST_CASE("UnifiedDiff marks a missing final newline on either side") {
  CHECK(UnifiedDiff("a\nb", "a\nb\n", "a/x", "b/x") ==
        "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n");
  CHECK(UnifiedDiff("a\nb\n", "a\nc", "a/x", "b/x") ==
        "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ No newline at end of file\n");
  CHECK(UnifiedDiff("x\na", "y\na", "a/x", "b/x") ==
        "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-x\n+y\n a\n\\ No newline at end of file\n");
}

TEST_CASE("GNU patch applies UnifiedDiff output and reproduces the target bytes") {
  std::string long_a, long_b;
  for (int i = 0; i < 60; ++i) {
    long_a += "line " + std::to_string(i) + "\n";
    if (i % 17 == 3) long_b += "changed " + std::to_string(i) + "\n";
    if (i % 23 != 5) long_b += "line " + std::to_string(i) + "\n";
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\nb\nc\n", "a\nB\nc\n"}, {"", "new\nfile\n"},    {"", "no newline"},
      {"old\nfile\n", ""},        {"a\nb", "a\nb\n"},     {"a\nb\n", "a\nb"},
      {"a\nb", "a\nc"},           {"x\ny\nz", "x\nY\nz"}, {long_a, long_b},
      {long_b, long_a + "tail"},
  };
  for (const auto& [a, b] : cases) {
    INFO("a=" << a << " b=" << b);
    CHECK(ApplyWithPatch(a, b) == b);
  }
}

}  // namespace
}  // namespace patchgen::diff
