#include "base/text_util.h"

#include <algorithm>

namespace patchgen {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::optional<std::string> DidYouMean(std::string_view name,
                                      const std::vector<std::string>& candidates) {
  size_t best = static_cast<size_t>(-1);
  const std::string* pick = nullptr;
  size_t limit = std::max<size_t>(1, name.size() / 3);
  for (const std::string& c : candidates) {
    size_t d = EditDistance(name, c);
    if (d <= limit && d < best) {
      best = d;
      pick = &c;
    }
  }
  if (!pick) return std::nullopt;
  return *pick;
}

std::string WithDidYouMean(std::string_view name, const std::vector<std::string>& candidates,
                           std::string help) {
  std::optional<std::string> near = DidYouMean(name, candidates);
  return near ? "did you mean '" + *near + "'? " + help : help;
}

std::string DidYouMeanOr(std::string_view name, const std::vector<std::string>& candidates,
                         std::string otherwise) {
  std::optional<std::string> near = DidYouMean(name, candidates);
  return near ? "did you mean '" + *near + "'?" : otherwise;
}

std::string JoinNames(const std::vector<std::string>& names, size_t limit) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    if (i) out += ", ";
    out += names[i];
  }
  if (names.size() > limit) out += ", ... (" + std::to_string(names.size() - limit) + " more)";
  return out;
}

uint32_t LineStartOf(std::string_view text, uint32_t offset) {
  while (offset > 0 && text[offset - 1] != '\n') --offset;
  return offset;
}

uint32_t LineEndOf(std::string_view text, uint32_t offset) {
  size_t nl = text.find('\n', offset);
  return static_cast<uint32_t>(nl == std::string_view::npos ? text.size() : nl);
}

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) {
      lines.push_back(text.substr(pos));
      break;
    }
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

}  // namespace patchgen
