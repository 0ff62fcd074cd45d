// LineIndex maps byte offsets to 1-based line:column for printing. Columns count Unicode code
// points (a tab counts as one), so non-ASCII text lines up with what editors show.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace patchgen {

struct LineCol {
  uint32_t line = 1;  ///< 1-based.
  uint32_t col = 1;   ///< 1-based, in code points.
};

class LineIndex {
 public:
  explicit LineIndex(std::string_view text);
  LineCol At(uint32_t offset) const;
  /// 0-based line number containing `offset`.
  uint32_t LineOf(uint32_t offset) const;
  /// Byte offset of the first byte of 0-based line `line`.
  uint32_t LineStart(uint32_t line) const { return starts_[line]; }
  /// Text of 0-based line `line` without its line terminator.
  std::string_view LineText(uint32_t line) const;
  uint32_t line_count() const { return static_cast<uint32_t>(starts_.size()); }

 private:
  std::string_view text_;
  std::vector<uint32_t> starts_;
};

/// LineIndex::At for offsets asked in ascending order: the column of each is counted on from the
/// previous one on its line, so that thousands of offsets on one long line cost the line's length
/// once, not once each.
class LineColCursor {
 public:
  LineColCursor(std::string_view text, const LineIndex& lines) : text_(text), lines_(lines) {}
  LineCol At(uint32_t offset);

 private:
  std::string_view text_;
  const LineIndex& lines_;
  uint32_t line_ = UINT32_MAX;  ///< 0-based line of `offset_`.
  uint32_t offset_ = 0;
  uint32_t col_ = 1;
};

/// Number of code points in `s` (UTF-8; invalid bytes count one each).
uint32_t CodePointCount(std::string_view s);

}  // namespace patchgen
