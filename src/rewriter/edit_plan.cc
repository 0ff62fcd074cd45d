#include "rewriter/edit_plan.h"

#include <algorithm>
#include <tuple>

namespace patchgen::rewriter {
namespace {

/// True when `a` and `b` (a before b in plan order) touch the same upstream bytes.
bool Overlap(const TextEdit& a, const TextEdit& b) {
  if (a.range.empty() && b.range.empty()) return false;
  if (a.range.empty()) return b.range.start < a.range.start && a.range.start < b.range.end;
  if (b.range.empty()) return a.range.start < b.range.start && b.range.start < a.range.end;
  return a.range.Overlaps(b.range);
}

/// Indentation (columns) of the first non-blank line of an inserted text.
size_t InsertIndent(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    size_t first = text.find_first_not_of(" \t", pos);
    if (first != std::string::npos && first < end) return first - pos;
    pos = end + 1;
  }
  return 0;
}

}  // namespace

Diagnostic OverlapError(const SourceLoc& later, const std::string& later_what,
                        const SourceLoc& earlier, const std::string& earlier_what) {
  Diagnostic d = ErrorAt(later, "edits overlap: " + later_what + " and " + earlier_what,
                         "each upstream region can be changed by one spec entry only; "
                         "remove or merge one of them");
  d.notes.push_back(Note::Text(earlier_what + " is at " + earlier.PathLineCol()));
  return d;
}

std::vector<Diagnostic> EditPlan::Validate() {
  // Insertions sort before a replacement starting at the same offset, so the forward splice
  // puts their text in front of it. Among insertions at one offset, deeper-indented text goes
  // first: at the end of a class, statements appended to its last method (`modify_init`, an
  // instance slot's binding) must come before a new method (`add_method`), which must come before
  // a module-level helper. Insertions of equal indentation keep plan (spec) order.
  std::stable_sort(edits_.begin(), edits_.end(), [](const TextEdit& a, const TextEdit& b) {
    size_t ia = a.range.empty() ? InsertIndent(a.text) : 0;
    size_t ib = b.range.empty() ? InsertIndent(b.text) : 0;
    return std::make_tuple(a.range.start, !a.range.empty(), static_cast<size_t>(-1) - ia) <
           std::make_tuple(b.range.start, !b.range.empty(), static_cast<size_t>(-1) - ib);
  });
  std::vector<Diagnostic> diags;
  for (size_t i = 0; i < edits_.size(); ++i) {
    for (size_t j = i + 1; j < edits_.size(); ++j) {
      const TextEdit& a = edits_[i];
      const TextEdit& b = edits_[j];
      if (b.range.start > a.range.end) break;
      if (!Overlap(a, b)) continue;
      auto key = [](const SourceLoc& l) { return std::tie(l.path, l.line, l.col); };
      bool b_later = !(key(b.origin) < key(a.origin));
      const TextEdit& later = b_later ? b : a;
      const TextEdit& earlier = b_later ? a : b;
      diags.push_back(OverlapError(later.origin, later.what, earlier.origin, earlier.what));
    }
  }
  return diags;
}

std::string EditPlan::Apply(const std::string& source) const {
  std::string out;
  out.reserve(source.size() + 1024);
  uint32_t cursor = 0;
  for (const TextEdit& e : edits_) {
    out.append(source, cursor, e.range.start - cursor);
    out += e.text;
    cursor = e.range.end;
  }
  out.append(source, cursor, std::string::npos);
  return out;
}

std::vector<ByteRange> EditPlan::OutputRanges() const {
  std::vector<ByteRange> ranges;
  int64_t delta = 0;
  for (const TextEdit& e : edits_) {
    auto start = static_cast<uint32_t>(e.range.start + delta);
    ranges.push_back({start, start + static_cast<uint32_t>(e.text.size())});
    delta += static_cast<int64_t>(e.text.size()) - e.range.size();
  }
  return ranges;
}

}  // namespace patchgen::rewriter
