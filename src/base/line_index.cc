#include "base/line_index.h"

#include <algorithm>

namespace patchgen {

LineIndex::LineIndex(std::string_view text) : text_(text) {
  starts_.push_back(0);
  for (uint32_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') starts_.push_back(i + 1);
  }
}

uint32_t LineIndex::LineOf(uint32_t offset) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
  return static_cast<uint32_t>(it - starts_.begin()) - 1;
}

LineCol LineIndex::At(uint32_t offset) const {
  uint32_t line = LineOf(offset);
  uint32_t start = starts_[line];
  uint32_t col = CodePointCount(text_.substr(start, offset - start));
  return {line + 1, col + 1};
}

std::string_view LineIndex::LineText(uint32_t line) const {
  uint32_t start = starts_[line];
  uint32_t end =
      line + 1 < starts_.size() ? starts_[line + 1] : static_cast<uint32_t>(text_.size());
  std::string_view s = text_.substr(start, end - start);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

LineCol LineColCursor::At(uint32_t offset) {
  uint32_t line = lines_.LineOf(offset);
  if (line != line_ || offset < offset_) {
    line_ = line;
    offset_ = lines_.LineStart(line);
    col_ = 1;
  }
  col_ += CodePointCount(text_.substr(offset_, offset - offset_));
  offset_ = offset;
  return {line + 1, col_};
}

uint32_t CodePointCount(std::string_view s) {
  uint32_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

}  // namespace patchgen
