#include "spec/version_condition.h"

#include <algorithm>
#include <cctype>
#include <climits>

namespace patchgen::spec {
namespace {

struct Clause {
  std::string op;
  std::vector<int> version;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

/// Parses the clauses of `condition`; an error message on failure.
std::optional<std::string> Parse(std::string_view condition, std::vector<Clause>& out) {
  if (Trim(condition).empty()) return "the condition is empty";
  size_t pos = 0;
  while (pos <= condition.size()) {
    size_t comma = std::min(condition.find(',', pos), condition.size());
    std::string_view part = Trim(condition.substr(pos, comma - pos));
    pos = comma + 1;
    Clause c;
    for (std::string_view op : {">=", "<=", "==", "!=", ">", "<"}) {
      if (part.starts_with(op)) {
        c.op = std::string(op);
        part = Trim(part.substr(op.size()));
        break;
      }
    }
    if (c.op.empty()) {
      return "clause '" + std::string(part) + "' has no comparison (>=, >, <=, <, ==, !=)";
    }
    bool digits = !part.empty();
    bool last_dot = true;
    for (char ch : part) {
      if (ch == '.') {
        if (last_dot) digits = false;
        last_dot = true;
      } else if (std::isdigit(static_cast<unsigned char>(ch))) {
        last_dot = false;
      } else {
        digits = false;
      }
    }
    if (!digits || last_dot) {
      return "'" + std::string(part) + "' is not a version like 5.23 or 5.23.0";
    }
    c.version = ParseVersion(part);
    out.push_back(std::move(c));
    if (comma == condition.size()) break;
  }
  return std::nullopt;
}

int Compare(std::vector<int> a, std::vector<int> b) {
  size_t n = std::max(a.size(), b.size());
  a.resize(n, 0);
  b.resize(n, 0);
  return a < b ? -1 : a > b ? 1 : 0;
}

}  // namespace

std::optional<std::string> CheckVersionCondition(std::string_view condition) {
  std::vector<Clause> clauses;
  return Parse(condition, clauses);
}

std::vector<int> ParseVersion(std::string_view version) {
  std::vector<int> out;
  size_t i = 0;
  while (i < version.size() && std::isdigit(static_cast<unsigned char>(version[i]))) {
    int v = 0;
    while (i < version.size() && std::isdigit(static_cast<unsigned char>(version[i]))) {
      // Saturate instead of overflowing: a component this long is no release number, and any
      // value above every real one compares the same way.
      v = v > (INT_MAX - 9) / 10 ? INT_MAX : v * 10 + (version[i] - '0');
      ++i;
    }
    out.push_back(v);
    if (i + 1 < version.size() && version[i] == '.' &&
        std::isdigit(static_cast<unsigned char>(version[i + 1]))) {
      ++i;
    } else {
      break;
    }
  }
  return out;
}

std::optional<bool> VersionMatches(std::string_view condition, std::string_view version) {
  std::vector<Clause> clauses;
  if (Parse(condition, clauses)) return std::nullopt;
  std::vector<int> v = ParseVersion(version);
  if (v.empty()) return std::nullopt;
  for (const Clause& c : clauses) {
    int cmp = Compare(v, c.version);
    bool ok = c.op == ">="   ? cmp >= 0
              : c.op == ">"  ? cmp > 0
              : c.op == "<=" ? cmp <= 0
              : c.op == "<"  ? cmp < 0
              : c.op == "==" ? cmp == 0
                             : cmp != 0;
    if (!ok) return false;
  }
  return true;
}

}  // namespace patchgen::spec
