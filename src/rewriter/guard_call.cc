// PrepareGuardCall (guard_call.h): a guard's `call` parsed with tree-sitter, its shape checked and
// its lines made ready to splice, with errors located in the spec's `call` text.
#include "rewriter/guard_call.h"

#include <algorithm>
#include <string_view>

#include "base/line_index.h"
#include "base/text_util.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"

namespace patchgen::rewriter {
namespace {

using parser::TypeOf;
using spec::Guard;
using spec::Slot;

/// Location of byte range [col_start, col_end) of 0-based line `line` of a guard's `call` text.
SourceLoc CallLoc(const Guard& g, const std::vector<std::string_view>& call_lines, uint32_t line,
                  uint32_t col_start, uint32_t col_end) {
  const spec::TextOrigin& o = g.call_origin;
  if (!o.file_text || line >= call_lines.size()) return g.loc;
  std::string_view text = call_lines[line];
  col_start = std::min<uint32_t>(col_start, static_cast<uint32_t>(text.size()));
  SourceLoc loc;
  loc.path = o.path;
  loc.line = o.first_line + line;
  loc.col = CodePointCount(text.substr(0, col_start)) + 1 + o.col_offset;
  col_end = std::clamp<uint32_t>(col_end, col_start, static_cast<uint32_t>(text.size()));
  loc.length = std::max<uint32_t>(1, CodePointCount(text.substr(col_start, col_end - col_start)));
  LineIndex file_lines(*o.file_text);
  if (loc.line >= 1 && loc.line <= file_lines.line_count()) {
    SetSourceLine(loc, file_lines.LineText(loc.line - 1));
  }
  return loc;
}

/// Nullopt when the parsed code `root` is one expression statement (no assignment, no yield);
/// otherwise the offset to point at: the second statement, or the one that is not an expression.
std::optional<uint32_t> NotOneExpression(TSNode root) {
  std::vector<TSNode> stmts = parser::BlockStatements(root);
  bool single = stmts.size() == 1 && TypeOf(stmts[0]) == "expression_statement";
  for (uint32_t i = 0; single && i < ts_node_named_child_count(stmts[0]); ++i) {
    std::string_view t = TypeOf(ts_node_named_child(stmts[0], i));
    if (t == "assignment" || t == "augmented_assignment" || t == "yield") single = false;
  }
  if (single) return std::nullopt;
  return stmts.empty() ? 0 : ts_node_start_byte(stmts[stmts.size() > 1 ? 1 : 0]);
}

}  // namespace

std::vector<std::string> DedentLines(std::string_view code) {
  std::vector<std::string> lines;
  for (std::string_view l : SplitLines(code)) lines.emplace_back(l);
  while (!lines.empty() && IsBlank(lines.back())) lines.pop_back();
  while (!lines.empty() && IsBlank(lines.front())) lines.erase(lines.begin());
  size_t common = std::string::npos;
  for (const std::string& l : lines) {
    if (IsBlank(l)) continue;
    common = std::min(common, l.find_first_not_of(" \t"));
  }
  for (std::string& l : lines) l = IsBlank(l) ? std::string() : l.substr(common);
  return lines;
}

std::optional<PreparedCall> PrepareGuardCall(const Slot& slot, const Guard& g, bool entry,
                                             std::vector<Diagnostic>& errors) {
  std::vector<std::string> lines = DedentLines(g.call);
  std::string code;
  for (const std::string& l : lines) code += l + "\n";
  // Where line i of `code` is in the YAML text, for error locations.
  std::vector<std::string_view> raw = SplitLines(g.call);
  uint32_t skipped = 0;
  while (skipped < raw.size() && IsBlank(raw[skipped])) ++skipped;
  size_t common = skipped < raw.size() ? raw[skipped].size() - lines.front().size() : 0;
  auto error_at_line = [&](uint32_t i, uint32_t col, std::string msg, std::string help) {
    uint32_t raw_line = skipped + i;
    uint32_t start = static_cast<uint32_t>(common + col);
    uint32_t end = raw_line < raw.size() ? static_cast<uint32_t>(raw[raw_line].size()) : start + 1;
    errors.push_back(
        ErrorAt(CallLoc(g, raw, raw_line, start, end), std::move(msg), std::move(help)));
  };
  if (lines.empty()) {
    errors.push_back(ErrorAt(g.loc, "guard in '" + g.in + "' has an empty `call`",
                             "write the statement(s) that call the slot"));
    return std::nullopt;
  }
  parser::TreePtr tree = parser::ParseTree(code);
  if (!tree) {
    errors.push_back(
        ErrorAt(g.loc, "could not parse the guard's `call`", {}, ErrorKind::kInternal));
    return std::nullopt;
  }
  TSNode root = ts_tree_root_node(tree.get());
  LineIndex code_lines(code);
  if (std::optional<TSNode> bad = parser::FirstErrorNode(root)) {
    uint32_t off = ts_node_start_byte(*bad);
    uint32_t line = code_lines.LineOf(std::min<uint32_t>(off, code.empty() ? 0 : code.size() - 1));
    uint32_t col = off - code_lines.LineStart(line);
    error_at_line(line, col, "`call` is not valid Python",
                  entry ? "an entry guard's `call` is one expression; it becomes `return <call>`"
                        : "a call-site guard's `call` is one or more statements");
    return std::nullopt;
  }
  if (std::optional<uint32_t> off = entry ? NotOneExpression(root) : std::nullopt) {
    uint32_t line = code_lines.LineOf(*off);
    uint32_t col = *off - code_lines.LineStart(line);
    error_at_line(line, col, "an entry guard's `call` must be a single expression",
                  "it becomes `return <call>`; to run statements instead, add `at:` to make a "
                  "call-site guard");
    return std::nullopt;
  }
  if (slot.scope == Slot::Scope::kInstance) {
    std::vector<ByteRange> refs = parser::NameReferences(root, code, slot.name);
    for (auto it = refs.rbegin(); it != refs.rend(); ++it) code.insert(it->start, "self.");
    lines.clear();
    for (std::string_view l : SplitLines(code)) lines.emplace_back(l);
  }
  return PreparedCall{std::move(lines), g.call_origin.first_line + skipped,
                      -static_cast<int32_t>(common + g.call_origin.col_offset)};
}

std::optional<CodeSpan> GuardCallSpan(const Guard& g, const PreparedCall& call, size_t begin,
                                      size_t end, size_t column) {
  if (!g.call_origin.file_text) return std::nullopt;
  return CodeSpan{static_cast<uint32_t>(begin), static_cast<uint32_t>(end), g.call_origin,
                  call.first_line, static_cast<int32_t>(column) + call.col_shift};
}

}  // namespace patchgen::rewriter
