#include "rewriter/reindent.h"

#include <tree_sitter/api.h>

#include <algorithm>
#include <set>
#include <vector>

#include "base/line_index.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"

namespace patchgen::rewriter {
namespace {

/// One line of `code`: [start, end) without its '\n'; `in_string` when it starts inside a
/// multi-line string literal.
struct Line {
  size_t start = 0;
  size_t end = 0;
  bool in_string = false;
};

/// Splits `code` into lines and marks those that start inside a multi-line string. Indented
/// fragments are parsed under an `if 1:` so that tree-sitter sees a well-formed block.
std::vector<Line> Lines(std::string_view code) {
  std::vector<Line> lines;
  size_t pos = 0;
  while (pos < code.size()) {
    size_t nl = code.find('\n', pos);
    size_t end = nl == std::string_view::npos ? code.size() : nl;
    lines.push_back({pos, end, false});
    pos = end + 1;
  }
  if (code.find('\n') == std::string_view::npos) return lines;
  bool indented = !code.empty() && (code[0] == ' ' || code[0] == '\t');
  std::string prefix = indented ? "if 1:\n" : "";
  std::string source = prefix + std::string(code);
  parser::TreePtr tree = parser::ParseTree(source);
  if (!tree) return lines;
  std::set<uint32_t> in_string;
  parser::MarkLinesInsideStrings(ts_tree_root_node(tree.get()),
                                 {0, static_cast<uint32_t>(source.size())}, LineIndex(source),
                                 in_string);
  uint32_t prefix_lines = prefix.empty() ? 0 : 1;
  for (size_t i = 0; i < lines.size(); ++i) {
    lines[i].in_string = in_string.count(static_cast<uint32_t>(i) + prefix_lines) > 0;
  }
  return lines;
}

size_t LeadingWhitespace(std::string_view line) {
  size_t n = 0;
  while (n < line.size() && (line[n] == ' ' || line[n] == '\t')) ++n;
  return n;
}

bool Blank(std::string_view line) { return LeadingWhitespace(line) == line.size(); }

size_t CommonIndentOf(std::string_view code, const std::vector<Line>& lines) {
  size_t common = std::string_view::npos;
  for (const Line& l : lines) {
    std::string_view text = code.substr(l.start, l.end - l.start);
    if (l.in_string || Blank(text)) continue;
    common = std::min(common, LeadingWhitespace(text));
  }
  return common == std::string_view::npos ? 0 : common;
}

/// Rebuilds `code` line by line; `fn(text)` returns the new text of a line outside strings.
template <class Fn>
std::string Rebuild(std::string_view code, const std::vector<Line>& lines, Fn fn) {
  std::string out;
  out.reserve(code.size() + lines.size() * 8);
  for (const Line& l : lines) {
    std::string_view text = code.substr(l.start, l.end - l.start);
    if (l.in_string) {
      out += text;
    } else {
      out += fn(text);
    }
    if (l.end < code.size()) out += '\n';
  }
  return out;
}

}  // namespace

size_t CommonIndent(std::string_view code) { return CommonIndentOf(code, Lines(code)); }

std::string Dedent(std::string_view code) {
  std::vector<Line> lines = Lines(code);
  size_t n = CommonIndentOf(code, lines);
  return Rebuild(code, lines, [&](std::string_view text) {
    if (Blank(text)) return std::string();
    return std::string(text.substr(std::min(n, LeadingWhitespace(text))));
  });
}

std::string Indent(std::string_view code, std::string_view indent) {
  return Rebuild(code, Lines(code), [&](std::string_view text) {
    if (Blank(text)) return std::string();
    return std::string(indent) + std::string(text);
  });
}

std::string ReindentTo(std::string_view code, size_t column) {
  return Indent(Dedent(code), std::string(column, ' '));
}

}  // namespace patchgen::rewriter
