// Text the stages write and splice (text_splice.h).
#include "rewriter/text_splice.h"

#include <algorithm>

#include "base/text_util.h"

namespace patchgen::rewriter {

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string TrimTrailingNewlines(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string Owner(const std::string& qualname) {
  size_t dot = qualname.rfind('.');
  return dot == std::string::npos ? "" : qualname.substr(0, dot);
}

std::string LastComponent(const std::string& qualname) {
  size_t dot = qualname.rfind('.');
  return dot == std::string::npos ? qualname : qualname.substr(dot + 1);
}

ByteRange WholeLines(const std::string& src, ByteRange r) {
  uint32_t start = LineStartOf(src, r.start);
  uint32_t end = LineEndOf(src, r.end);
  if (end < src.size()) ++end;
  return {start, end};
}

std::string SpliceRange(const std::string& src, ByteRange range,
                        std::vector<std::pair<ByteRange, std::string>> local) {
  std::sort(local.begin(), local.end(),
            [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
  std::string out;
  uint32_t cursor = range.start;
  for (const auto& [r, text] : local) {
    out.append(src, cursor, r.start - cursor);
    out += text;
    cursor = r.end;
  }
  out.append(src, cursor, range.end - cursor);
  return out;
}

std::vector<std::pair<ByteRange, std::string>> RemoveListItems(const std::vector<ByteRange>& items,
                                                               const std::vector<size_t>& removed) {
  std::vector<bool> gone(items.size(), false);
  for (size_t i : removed) gone[i] = true;
  size_t last_kept = items.size();
  for (size_t i = items.size(); i-- > 0;) {
    if (!gone[i]) {
      last_kept = i;
      break;
    }
  }
  std::vector<std::pair<ByteRange, std::string>> out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!gone[i]) continue;
    if (i < last_kept) {
      out.push_back({{items[i].start, items[i + 1].start}, ""});
    } else {
      out.push_back({{items[last_kept].end, items.back().end}, ""});
      break;
    }
  }
  return out;
}

}  // namespace patchgen::rewriter
