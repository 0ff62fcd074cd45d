// The edits the output check gives tree-sitter before reparsing (reparse_edits.h says why they
// are grown).
#include "rewriter/reparse_edits.h"

#include <algorithm>
#include <cctype>

namespace patchgen::rewriter {
namespace {

/// The tree-sitter point (0-based row, column in bytes) of byte `offset` of the upstream text.
TSPoint PointAt(const LineIndex& lines, uint32_t offset) {
  uint32_t row = lines.LineOf(offset);
  return {row, offset - lines.LineStart(row)};
}

/// The point just after `text` written from `start`.
TSPoint PointAfter(TSPoint start, std::string_view text) {
  size_t last_nl = text.rfind('\n');
  if (last_nl == std::string_view::npos) {
    return {start.row, start.column + static_cast<uint32_t>(text.size())};
  }
  auto rows = static_cast<uint32_t>(std::count(text.begin(), text.end(), '\n'));
  return {start.row + rows, static_cast<uint32_t>(text.size() - last_nl - 1)};
}

}  // namespace

uint32_t ResyncPoint(std::string_view upstream, uint32_t end) {
  size_t i = end;
  while (i < upstream.size()) {
    char c = upstream[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f') {
      ++i;
    } else if (c == '#') {
      i = upstream.find('\n', i);
      if (i == std::string_view::npos) return static_cast<uint32_t>(upstream.size());
    } else {
      break;
    }
  }
  auto word = [&](size_t k) {
    auto c = static_cast<unsigned char>(upstream[k]);
    return c == '_' || c >= 0x80 || std::isalnum(c);
  };
  if (i < upstream.size() && !word(i)) return static_cast<uint32_t>(i + 1);
  while (i < upstream.size() && word(i)) ++i;
  return static_cast<uint32_t>(i);
}

uint32_t ReparseStart(std::string_view upstream, uint32_t start) {
  size_t i = start;
  while (i > 0 && std::string_view(" \t\r\n\f").find(upstream[i - 1]) != std::string_view::npos)
    --i;
  if (i == 0) return 0;
  --i;
  while (i > 0 && (static_cast<unsigned char>(upstream[i]) & 0xC0) == 0x80) --i;
  return static_cast<uint32_t>(i);
}

std::vector<ReparseEdit> ReparseEdits(std::string_view upstream, const EditPlan& plan,
                                      std::string_view header) {
  std::vector<ReparseEdit> out;
  uint32_t written = 0;  // Upstream bytes before this are in out.back().text or before it.
  auto add = [&](ByteRange range, std::string_view text) {
    uint32_t from = ReparseStart(upstream, range.start);
    if (!out.empty() && from <= out.back().range.end) {
      ReparseEdit& last = out.back();
      last.text.append(upstream.substr(written, range.start - written));
      last.text.append(text);
    } else {
      if (!out.empty()) {
        ReparseEdit& last = out.back();
        last.text.append(upstream.substr(written, last.range.end - written));
      }
      out.push_back({{from, from}, std::string(upstream.substr(from, range.start - from))});
      out.back().text.append(text);
    }
    written = range.end;
    ReparseEdit& last = out.back();
    last.range.end = std::max(last.range.end, ResyncPoint(upstream, range.end));
  };
  if (!header.empty()) add({0, 0}, header);
  for (const TextEdit& e : plan.edits()) add(e.range, e.text);
  if (!out.empty()) {
    ReparseEdit& last = out.back();
    last.text.append(upstream.substr(written, last.range.end - written));
  }
  return out;
}

void ApplyReparseEdits(TSTree* tree, const LineIndex& lines,
                       const std::vector<ReparseEdit>& edits) {
  for (size_t i = edits.size(); i-- > 0;) {
    const ReparseEdit& e = edits[i];
    TSInputEdit edit;
    edit.start_byte = e.range.start;
    edit.old_end_byte = e.range.end;
    edit.new_end_byte = e.range.start + static_cast<uint32_t>(e.text.size());
    edit.start_point = PointAt(lines, e.range.start);
    edit.old_end_point = PointAt(lines, e.range.end);
    edit.new_end_point = PointAfter(edit.start_point, e.text);
    ts_tree_edit(tree, &edit);
  }
}

}  // namespace patchgen::rewriter
