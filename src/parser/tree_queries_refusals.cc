// Tree queries that refuse input (tree_queries.h): the first ERROR or MISSING node, the first
// construct CPython's compiler rejects, nesting deeper than the walks may recurse, tab
// indentation; and the lines inside string literals, which re-indenting leaves alone.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parser/tree_queries.h"
#include "parser/ts_node.h"

namespace patchgen::parser {

// Walked with a cursor, without recursion: code may nest (parentheses) thousands deep.
void MarkLinesInsideStrings(TSNode node, ByteRange within, const LineIndex& lines,
                            std::set<uint32_t>& out) {
  TSTreeCursor c = ts_tree_cursor_new(node);
  uint32_t depth = 0;
  while (true) {
    TSNode n = ts_tree_cursor_current_node(&c);
    bool overlaps = ts_node_end_byte(n) > within.start && ts_node_start_byte(n) < within.end;
    if (overlaps && Is(n, "string")) {
      uint32_t first = lines.LineOf(ts_node_start_byte(n));
      uint32_t last = lines.LineOf(ts_node_end_byte(n));
      for (uint32_t l = first + 1; l <= last; ++l) out.insert(l);
    } else if (overlaps && ts_tree_cursor_goto_first_child(&c)) {
      ++depth;
      continue;
    }
    while (depth > 0 && !ts_tree_cursor_goto_next_sibling(&c)) {
      ts_tree_cursor_goto_parent(&c);
      --depth;
    }
    if (depth == 0) break;
  }
  ts_tree_cursor_delete(&c);
}

std::optional<ByteRange> FirstTabIndentation(const PyModule& m) {
  const LineIndex& lines = m.lines();
  std::set<uint32_t> in_strings;
  bool any_tab = false;
  for (uint32_t l = 0; l < lines.line_count() && !any_tab; ++l) {
    std::string_view t = lines.LineText(l);
    any_tab = t.find_first_not_of(" \t\f") > t.find('\t');
  }
  if (!any_tab) return std::nullopt;
  MarkLinesInsideStrings(m.root(), {0, static_cast<uint32_t>(m.source().size())}, lines,
                         in_strings);
  for (uint32_t l = 0; l < lines.line_count(); ++l) {
    std::string_view t = lines.LineText(l);
    size_t code = t.find_first_not_of(" \t\f");
    if (code == std::string_view::npos || t[code] == '#' || in_strings.count(l)) continue;
    if (t.substr(0, code).find('\t') != std::string_view::npos) {
      uint32_t start = lines.LineStart(l);
      return ByteRange{start, start + static_cast<uint32_t>(code)};
    }
  }
  return std::nullopt;
}

std::optional<TSNode> FirstErrorNode(TSNode root) {
  if (ts_node_is_missing(root) || Is(root, "ERROR")) return root;
  if (!ts_node_has_error(root)) return std::nullopt;
  uint32_t count = ts_node_child_count(root);
  for (uint32_t i = 0; i < count; ++i) {
    if (auto found = FirstErrorNode(ts_node_child(root, i))) return found;
  }
  return std::nullopt;
}

namespace {

// Whether `n` is a starred expression alone: `*a` itself, or an attribute/subscript/call chain
// whose innermost object is `*a` (tree-sitter-python reads `*a.b` as `(*a).b`, where CPython
// stars the whole `a.b`).
bool LoneStarred(TSNode n) {
  while (!ts_node_is_null(n)) {
    if (Is(n, "list_splat_pattern") || Is(n, "list_splat")) return true;
    if (Is(n, "attribute")) {
      n = ts_node_child_by_field_name(n, "object", 6);
    } else if (Is(n, "subscript")) {
      n = ts_node_child_by_field_name(n, "value", 5);
    } else if (Is(n, "call")) {
      n = ts_node_child_by_field_name(n, "function", 8);
    } else {
      return false;
    }
  }
  return false;
}

// What CPython names the statement `n` is ("class definition", "'if' statement", ...), as in its
// "expected an indented block after ..." message; null when `n` has no block of its own.
const char* BlockOwner(TSNode n) {
  static constexpr std::pair<const char*, const char*> kOwners[] = {
      {"class_definition", "class definition"}, {"function_definition", "function definition"},
      {"if_statement", "'if' statement"},       {"elif_clause", "'elif' statement"},
      {"else_clause", "'else' statement"},      {"for_statement", "'for' statement"},
      {"while_statement", "'while' statement"}, {"with_statement", "'with' statement"},
      {"try_statement", "'try' statement"},     {"except_clause", "'except' statement"},
      {"finally_clause", "'finally' statement"}};
  for (const auto& [type, name] : kOwners)
    if (Is(n, type)) return name;
  return nullptr;
}

// Whether block `b` holds no statement (nothing, or comments only: tree-sitter-python accepts a
// header with an empty body at the end of a file, CPython does not).
bool EmptyBlock(TSNode b) {
  uint32_t count = ts_node_named_child_count(b);
  for (uint32_t i = 0; i < count; ++i)
    if (!Is(ts_node_named_child(b, i), "comment")) return false;
  return true;
}

// Whether tuple `n` is `(*a)`: one starred element and no comma (tree-sitter-python reads it as
// a tuple; CPython only as a starred expression in parentheses, which it refuses).
bool LoneStarredInParentheses(TSNode n) {
  if (ts_node_named_child_count(n) != 1) return false;
  TSNode only = ts_node_named_child(n, 0);
  if (!Is(only, "list_splat") && !Is(only, "list_splat_pattern")) return false;
  uint32_t count = ts_node_child_count(n);
  for (uint32_t i = 0; i < count; ++i)
    if (Is(ts_node_child(n, i), ",")) return false;
  return true;
}

// Whether `n` is an operator whose operands CPython reads as expressions: binary, boolean,
// comparison, unary, `not`, conditional.
bool IsOperator(TSNode n) {
  static const std::vector<bool> kTable =
      SymbolTable(PythonLanguage(), {"binary_operator", "boolean_operator", "comparison_operator",
                                     "unary_operator", "not_operator", "conditional_expression"});
  return InTable(kTable, n);
}

// The first operand of `n`, when an operator (IsOperator), that is a starred expression alone
// (`a & *b`, which CPython refuses); else null.
TSNode StarredOperand(TSNode n) {
  if (!IsOperator(n)) return TSNode{};
  uint32_t count = ts_node_named_child_count(n);  // the operands
  for (uint32_t i = 0; i < count; ++i)
    if (LoneStarred(ts_node_named_child(n, i))) return ts_node_named_child(n, i);
  return TSNode{};
}

// CPython's complaint about node `n` (met in document order), if it is one.
std::optional<std::string> CompileError(TSNode n, const char* field) {
  if (const char* owner = BlockOwner(n)) {
    // Its own blocks (a clause's block belongs to the clause, an owner itself).
    uint32_t count = ts_node_named_child_count(n);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode child = ts_node_named_child(n, i);
      if (Is(child, "block") && EmptyBlock(child))
        return std::string("expected an indented block after ") + owner;
    }
  }
  if (Is(n, "assignment") || Is(n, "for_statement") || Is(n, "for_in_clause")) {
    if (LoneStarred(ts_node_child_by_field_name(n, "left", 4)))
      return "starred assignment target must be in a list or tuple";
    if (Is(n, "assignment") && LoneStarred(ts_node_child_by_field_name(n, "right", 5)))
      return "can't use starred expression here";  // `x = *a`
    return std::nullopt;
  }
  if (Is(n, "expression_statement") && ts_node_named_child_count(n) == 1 &&
      LoneStarred(ts_node_named_child(n, 0)))
    return "can't use starred expression here";  // `*a` alone
  if (Is(n, "parenthesized_expression") && ts_node_named_child_count(n) == 1 &&
      Is(ts_node_named_child(n, 0), "list_splat"))
    return "cannot use starred expression here";  // `(*a)`
  if ((Is(n, "tuple") || Is(n, "tuple_pattern")) && LoneStarredInParentheses(n))
    return "cannot use starred expression here";  // `(*a)`, read by tree-sitter as a tuple
  if (Is(n, "list_splat") && field && std::strcmp(field, "value") == 0 &&
      Is(ts_node_parent(n), "pair"))
    return "cannot use a starred expression in a dictionary value";  // `{k: *v}`
  if (!ts_node_is_null(StarredOperand(n))) return "invalid syntax";  // `a & *b`
  return std::nullopt;
}

// Whether CompileError can return anything for `n`.
bool MayBeCompileError(TSNode n) {
  static const std::vector<bool> kTable = SymbolTable(
      PythonLanguage(),
      {"class_definition", "function_definition", "if_statement", "elif_clause", "else_clause",
       "for_statement", "while_statement", "with_statement", "try_statement", "except_clause",
       "finally_clause", "assignment", "for_in_clause", "expression_statement",
       "parenthesized_expression", "tuple", "tuple_pattern", "list_splat"});
  return InTable(kTable, n) || IsOperator(n);
}

// Where the complaint about `n` points: the starred expression alone in a statement or in
// parentheses, the starred target or value of an assignment or `for`, else `n` itself.
TSNode ComplaintLocation(TSNode n) {
  if (Is(n, "expression_statement") || Is(n, "parenthesized_expression") || Is(n, "tuple") ||
      Is(n, "tuple_pattern"))
    return ts_node_named_child(n, 0);
  for (const char* f : {"left", "right"}) {
    TSNode side = ts_node_child_by_field_name(n, f, static_cast<uint32_t>(std::strlen(f)));
    if (!ts_node_is_null(side) && LoneStarred(side)) return side;
  }
  TSNode operand = StarredOperand(n);
  return ts_node_is_null(operand) ? n : operand;
}

// The byte offsets of every `*` of a source, and whether a node's bytes hold one.
class StarOffsets {
 public:
  explicit StarOffsets(std::string_view source) {
    for (size_t i = source.find('*'); i != std::string_view::npos; i = source.find('*', i + 1))
      offsets_.push_back(static_cast<uint32_t>(i));
  }
  bool In(TSNode n) const {
    auto it = std::lower_bound(offsets_.begin(), offsets_.end(), ts_node_start_byte(n));
    return it != offsets_.end() && *it < ts_node_end_byte(n);
  }

 private:
  std::vector<uint32_t> offsets_;
};

}  // namespace

std::optional<std::pair<TSNode, std::string>> FirstCompileError(TSNode root,
                                                                std::string_view source) {
  // Every complaint but the empty block is about a starred expression, whose text starts with
  // `*`; only statements and clauses can hold an empty block. So a node that is neither and whose
  // bytes hold no `*` is skipped with its subtree: most expressions are (docs/benchmarks.md).
  const StarOffsets stars(source);
  TSTreeCursor c = ts_tree_cursor_new(root);
  std::optional<std::pair<TSNode, std::string>> found;
  for (bool more = true; more;) {
    TSNode n = ts_tree_cursor_current_node(&c);
    bool visit = IsContainer(n) || stars.In(n);
    std::optional<std::string> why;
    if (visit && MayBeCompileError(n)) why = CompileError(n, ts_tree_cursor_current_field_name(&c));
    if (why) {
      found = {ComplaintLocation(n), *why};
      break;
    }
    if (visit && ts_tree_cursor_goto_first_child(&c)) continue;
    while (!ts_tree_cursor_goto_next_sibling(&c)) {
      if (!ts_tree_cursor_goto_parent(&c)) {
        more = false;
        break;
      }
    }
  }
  ts_tree_cursor_delete(&c);
  return found;
}

// Found without recursion. Such code is refused before anything walks it (issue #28: 50,000
// nested parentheses overflowed the stack of recursive walks); CPython refuses it too (200 nested
// parentheses, a recursion limit of about 3,000 operators in one chain when compiling).
std::optional<TSNode> NestedTooDeep(TSNode root) {
  TSTreeCursor c = ts_tree_cursor_new(root);
  uint32_t depth = 0;
  std::optional<TSNode> found;
  while (!found) {
    if (ts_tree_cursor_goto_first_child(&c)) {
      if (++depth > kMaxNesting) found = ts_tree_cursor_current_node(&c);
      continue;
    }
    while (depth > 0 && !ts_tree_cursor_goto_next_sibling(&c)) {
      ts_tree_cursor_goto_parent(&c);
      --depth;
    }
    if (depth == 0) break;
  }
  ts_tree_cursor_delete(&c);
  return found;
}

}  // namespace patchgen::parser
