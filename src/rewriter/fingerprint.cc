#include "rewriter/fingerprint.h"

#include <algorithm>

#include "parser/ts_node.h"
#include "rewriter/sha256.h"

namespace patchgen::rewriter {
namespace {

using parser::RangeOf;
using parser::TypeOf;

struct Token {
  ByteRange range;
};

bool Inside(ByteRange r, const std::vector<ByteRange>& skip) {
  for (const ByteRange& s : skip) {
    if (s.start <= r.start && r.end <= s.end && s.end > s.start) return true;
  }
  return false;
}

bool Overlaps(ByteRange a, ByteRange b) { return a.start < b.end && b.start < a.end; }

/// Leaf tokens of the cursor's node inside `range` (strings whole, comments left out). The
/// children are walked with the cursor (tree-sitter 0.20's ts_node_child(i) walks the first i
/// children, which made a module's top level quadratic), and the walk stops at the first child
/// that starts after `range`; the cursor is back on the node when it returns.
void Collect(TSTreeCursor& cursor, ByteRange range, const std::vector<ByteRange>& skip,
             std::vector<Token>& out) {
  TSNode node = ts_tree_cursor_current_node(&cursor);
  ByteRange r = RangeOf(node);
  if (!Overlaps(r, range) && !(r.start == r.end && range.Contains(r.start))) return;
  std::string_view t = TypeOf(node);
  if (t == "comment") return;
  uint32_t n = ts_node_child_count(node);
  bool leaf = n == 0 || t == "string" || t == "concatenated_string";
  if (t == "concatenated_string") leaf = false;  // its parts are strings
  if (leaf) {
    if (r.start >= range.start && r.end <= range.end && r.end > r.start && !Inside(r, skip)) {
      out.push_back({r});
    }
    return;
  }
  // A trailing comma before the closing bracket of a parameter list, an argument list or a
  // list/dict/set display is formatting (black's "magic trailing comma"); in a tuple it is not.
  bool drop_trailing_comma = t == "parameters" || t == "argument_list" || t == "list" ||
                             t == "dictionary" || t == "set" || t == "lambda_parameters";
  if (!ts_tree_cursor_goto_first_child(&cursor)) return;
  uint32_t i = 0;
  do {
    TSNode c = ts_tree_cursor_current_node(&cursor);
    if (ts_node_start_byte(c) > range.end) break;  // neither it nor a later child is in range
    if (!(drop_trailing_comma && i + 2 == n && TypeOf(c) == ",")) Collect(cursor, range, skip, out);
    ++i;
  } while (ts_tree_cursor_goto_next_sibling(&cursor));
  ts_tree_cursor_goto_parent(&cursor);
}

}  // namespace

Fingerprint FingerprintOf(const parser::PyModule& module, const std::vector<ByteRange>& ranges,
                          const std::vector<ByteRange>& skip) {
  std::vector<Token> tokens;
  TSTreeCursor cursor = ts_tree_cursor_new(module.root());
  for (const ByteRange& range : ranges) Collect(cursor, range, skip, tokens);
  ts_tree_cursor_delete(&cursor);
  Fingerprint fp;
  fp.tokens = tokens.size();
  std::string stream;
  const LineIndex& lines = module.lines();
  // Display text: per source line, the source from its first token to its last (comments and
  // skipped tokens left out), indented two spaces per indentation step relative to the first line.
  std::vector<uint32_t> stack;  // Indentation columns seen, for steps.
  uint32_t group_start = 0, group_end = 0, group_line = UINT32_MAX, group_col = 0;
  auto flush = [&] {
    if (group_line == UINT32_MAX) return;
    if (stack.empty()) {
      stack = {group_col};
    } else {
      fp.text += '\n';
      uint32_t col = std::max(group_col, stack.front());
      while (stack.size() > 1 && stack.back() > col) stack.pop_back();
      if (stack.back() < col) stack.push_back(col);
    }
    fp.text += std::string(2 * (stack.size() - 1), ' ');
    fp.text += module.Text({group_start, group_end});
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    const ByteRange& r = tokens[i].range;
    if (i) stream += '\x1f';
    stream += module.Text(r);
    uint32_t line = lines.LineOf(r.start);
    uint32_t end_line_of_group = group_line == UINT32_MAX ? 0 : lines.LineOf(group_end - 1);
    if (group_line == UINT32_MAX || (line != group_line && line > end_line_of_group)) {
      flush();
      group_start = r.start;
      group_line = line;
      group_col = r.start - lines.LineStart(line);
    }
    group_end = r.end;
  }
  flush();
  fp.sha256 = Sha256Hex(stream);
  return fp;
}

Fingerprint AbsentFingerprint() {
  Fingerprint fp;
  fp.text = "(absent)";
  fp.sha256 = Sha256Hex("\x1f(absent)");
  return fp;
}

}  // namespace patchgen::rewriter
