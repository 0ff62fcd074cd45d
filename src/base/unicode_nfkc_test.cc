#include "base/unicode_nfkc.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace patchgen {
namespace {

std::string Utf8(const std::vector<char32_t>& cps) {
  std::string out;
  for (char32_t cp : cps) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::vector<char32_t> Hexes(std::istringstream& in) {
  std::vector<char32_t> out;
  std::string word;
  while (in >> word && word != ":")
    out.push_back(static_cast<char32_t>(std::stoul(word, nullptr, 16)));
  return out;
}

std::string Show(const std::string& s) {
  std::ostringstream out;
  out << '"' << s << "\" (";
  for (unsigned char c : s) out << std::hex << static_cast<int>(c) << ' ';
  out << ')';
  return out.str();
}

TEST_CASE("NFKC: the names of PEP 3131's examples") {
  CHECK(Nfkc("\xEF\xAC\x81nd") == "find");                       // U+FB01 LATIN SMALL LIGATURE FI
  CHECK(Nfkc("\xEF\xBD\x86\xEF\xBD\x8F\xEF\xBD\x8F") == "foo");  // fullwidth
  CHECK(Nfkc("e\xCC\x81") == "\xC3\xA9");                        // e + COMBINING ACUTE -> é
  CHECK(Nfkc("\xE2\x84\xAB") == "\xC3\x85");                     // ANGSTROM SIGN -> Å
  CHECK(Nfkc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // jamo -> 각
  CHECK(IdentifierKey("forward") == "forward");
  CHECK(SameIdentifier("\xEF\xAC\x81nd", "find"));
  CHECK(SameIdentifier("find", "\xEF\xAC\x81nd"));
  CHECK_FALSE(SameIdentifier("find", "fine"));
  CHECK(SameIdentifier("A.\xEF\xAC\x81nd", "A.find"));  // dotted names, component by component
  std::string name = "x_1";
  NormalizeIdentifier(name);
  CHECK(name == "x_1");
  CHECK(Nfkc("bad \xFF byte \xEF\xAC\x81") == "bad \xFF byte \xEF\xAC\x81");  // not UTF-8: as is
  CHECK(std::string(UnicodeVersion()).find('.') != std::string::npos);
}

// Every code point (surrogates excepted) and a sample of sequences, against Python's
// unicodedata.normalize("NFKC", ...) of the Python that generated the tables
// (scripts/gen_unicode_tables.py --expectations, written into the build tree).
TEST_CASE("NFKC agrees with Python's unicodedata on every code point") {
  std::ifstream in(PATCHGEN_UNICODE_EXPECTATIONS);
  REQUIRE(in.good());
  std::string line;
  size_t points = 0, mapped = 0, sequences = 0, failures = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line.substr(2));
    auto fail = [&](const std::string& input, const std::string& want) {
      if (++failures <= 20) {
        FAIL_CHECK(line << ": NFKC of " << Show(input) << " is " << Show(Nfkc(input))
                        << ", Python says " << Show(want));
      }
    };
    if (line[0] == 'R') {
      std::vector<char32_t> range = Hexes(fields);
      REQUIRE(range.size() == 2);
      for (char32_t cp = range[0]; cp <= range[1]; ++cp) {
        std::string s = Utf8({cp});
        if (Nfkc(s) != s) fail(s, s);
        ++points;
      }
    } else {
      std::vector<char32_t> input = Hexes(fields);
      std::vector<char32_t> want = Hexes(fields);
      std::string s = Utf8(input);
      if (Nfkc(s) != Utf8(want)) fail(s, Utf8(want));
      if (line[0] == 'M') {
        ++points;
        ++mapped;
      } else {
        ++sequences;
      }
    }
  }
  CHECK(failures == 0);
  CHECK(points == 0x110000 - 0x800);
  CHECK(mapped > 4000);
  CHECK(sequences > 30000);
}

TEST_CASE("IsWellFormedUtf8 and FirstInvalidUtf8") {
  CHECK(IsWellFormedUtf8(""));
  CHECK(IsWellFormedUtf8("ascii"));
  CHECK(IsWellFormedUtf8(Utf8({0xE9, 0x20AC, 0x1F600, 0x10FFFF})));
  CHECK_FALSE(
      IsWellFormedUtf8("a\x90"
                       "b"));                         // a stray continuation byte
  CHECK_FALSE(IsWellFormedUtf8("\xC3"));              // a sequence cut short
  CHECK_FALSE(IsWellFormedUtf8("\xC0\xAF"));          // an overlong form of '/'
  CHECK_FALSE(IsWellFormedUtf8("\xED\xA0\x80"));      // the surrogate U+D800
  CHECK_FALSE(IsWellFormedUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  CHECK(FirstInvalidUtf8(Utf8({0xE9}) + "x\x90") == 3);
  CHECK(FirstInvalidUtf8("ok") == std::string_view::npos);
}

TEST_CASE("NFKC: an ASCII name takes the fast path") {
  // No decoding, no lookup: a million ASCII keys in well under a second even unoptimised.
  std::string name = "hidden_states_and_more";
  auto start = std::chrono::steady_clock::now();
  size_t n = 0;
  for (int i = 0; i < 1000000; ++i) n += SameIdentifier(name, "hidden_states_and_more") ? 1 : 0;
  auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(n == 1000000);
  CHECK(elapsed < std::chrono::seconds(2));
}

}  // namespace
}  // namespace patchgen
