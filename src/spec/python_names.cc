#include "spec/python_names.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "base/text_util.h"
#include "base/unicode_nfkc.h"

namespace patchgen::spec {
namespace {

const std::set<std::string>& PythonKeywords() {
  static const std::set<std::string> kw = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};
  return kw;
}

}  // namespace

bool IsPythonKeyword(std::string_view s) { return PythonKeywords().count(std::string(s)) > 0; }

bool IsIdentifier(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    bool ok = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80 ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return !PythonKeywords().count(std::string(s));
}

bool IsDotted(std::string_view s) {
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    if (!IsIdentifier(s.substr(start, dot == std::string_view::npos ? dot : dot - start))) {
      return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

size_t CountDots(std::string_view s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '.'));
}

std::optional<std::string> LeadingName(std::string_view rest) {
  size_t i = rest.find_first_not_of(' ');
  if (i == std::string_view::npos) return std::nullopt;
  rest = rest.substr(i);
  size_t end = 0;
  auto name_byte = [](char c) {
    auto u = static_cast<unsigned char>(c);
    return c == '_' || std::isalnum(u) || u >= 0x80;
  };
  while (end < rest.size() && name_byte(rest[end])) ++end;
  if (end == 0) return std::nullopt;
  return IdentifierKey(rest.substr(0, end));
}

// The name of the first top-level def/class in `code` (decorators and comments skipped).
std::optional<std::string> FirstDefName(std::string_view code) {
  for (std::string_view line : SplitLines(code)) {
    if (line.empty() || line[0] == ' ' || line[0] == '\t' || line[0] == '#' || line[0] == '@') {
      continue;
    }
    if (line.substr(0, 6) == "async " || line.substr(0, 6) == "async\t") {
      size_t def = line.find_first_not_of(" \t", 5);
      if (def == std::string_view::npos) return std::nullopt;
      line = line.substr(def);
    }
    for (std::string_view kw : {"def ", "class "}) {
      if (line.substr(0, kw.size()) == kw) return LeadingName(line.substr(kw.size()));
    }
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace patchgen::spec
