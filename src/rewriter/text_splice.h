// Text the stages write and splice: one-line descriptions, the parts of a qualified name, the
// whole lines of a range, a range with local replacements, and the items removed from a
// comma-separated list with their separators.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/byte_range.h"

namespace patchgen::rewriter {

/// One line for headers and markers: newlines folded, non-ASCII kept (the output is UTF-8).
std::string OneLine(std::string s);
std::string TrimTrailingNewlines(std::string s);
/// "A.B" of "A.B.m" ("" for a top-level name) and "m".
std::string Owner(const std::string& qualname);
std::string LastComponent(const std::string& qualname);

/// Range that removes the whole lines `r` lies on, with the last one's newline.
ByteRange WholeLines(const std::string& src, ByteRange r);
/// `range` of `src` with `local` replacements (disjoint) applied.
std::string SpliceRange(const std::string& src, ByteRange range,
                        std::vector<std::pair<ByteRange, std::string>> local);
/// Ranges that remove `items[i]` for i in `removed` (sorted; not all of them) from a
/// comma-separated list, with their separators, so that the rest keeps its layout.
std::vector<std::pair<ByteRange, std::string>> RemoveListItems(const std::vector<ByteRange>& items,
                                                               const std::vector<size_t>& removed);

}  // namespace patchgen::rewriter
