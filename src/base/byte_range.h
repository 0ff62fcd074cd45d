// ByteRange: the one coordinate type of patchgen. Offsets are 0-based bytes into a UTF-8
// buffer; `start` is inclusive and `end` exclusive. Lines and columns appear only when printing.
#pragma once

#include <cstdint>
#include <string_view>

namespace patchgen {

struct ByteRange {
  uint32_t start = 0;  ///< 0-based byte offset, inclusive.
  uint32_t end = 0;    ///< 0-based byte offset, exclusive.

  constexpr uint32_t size() const { return end - start; }
  constexpr bool empty() const { return start == end; }
  constexpr bool Contains(uint32_t offset) const { return start <= offset && offset < end; }
  constexpr bool Contains(ByteRange other) const {
    return start <= other.start && other.end <= end;
  }
  constexpr bool Overlaps(ByteRange other) const { return start < other.end && other.start < end; }
  std::string_view In(std::string_view text) const { return text.substr(start, end - start); }
  friend constexpr bool operator==(ByteRange, ByteRange) = default;
};

}  // namespace patchgen
