// Tree queries over a parsed module (tree_queries.h): the nodes of index ranges, the statements of
// a block or a body, a def's parameters, `__all__`, the `...` lines of a snippet, and the node
// tests the indexer builds on (trimmed ends, containers, assignment targets, type aliases).
#include "parser/tree_queries.h"

#include <algorithm>
#include <cctype>

#include "base/text_util.h"
#include "base/unicode_nfkc.h"
#include "parser/ts_node.h"

namespace patchgen::parser {

bool IsComment(TSNode n) { return Is(n, "comment"); }

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

uint32_t TrimmedEnd(TSNode n, std::string_view src) {
  for (;;) {
    uint32_t count = ts_node_child_count(n);
    TSNode last = {};
    bool found = false;
    for (uint32_t i = count; i > 0; --i) {
      TSNode c = ts_node_child(n, i - 1);
      if (IsComment(c) || ts_node_end_byte(c) == ts_node_start_byte(c)) continue;
      last = c;
      found = true;
      break;
    }
    if (!found) break;
    n = last;
  }
  uint32_t end = ts_node_end_byte(n);
  uint32_t start = ts_node_start_byte(n);
  while (end > start && IsSpace(src[end - 1])) --end;
  return end;
}

void CollectTargetNames(TSNode n, std::string_view src, std::vector<std::string>& out) {
  if (Is(n, "identifier")) {
    out.push_back(IdentifierKey(RangeOf(n).In(src)));
    return;
  }
  if (Is(n, "pattern_list") || Is(n, "tuple_pattern") || Is(n, "list_pattern") ||
      Is(n, "list_splat_pattern") || Is(n, "parenthesized_expression")) {
    for (uint32_t i = 0; i < ts_node_named_child_count(n); ++i) {
      CollectTargetNames(ts_node_named_child(n, i), src, out);
    }
  }
}

bool IsGenuineTypeAlias(TSNode n, std::string_view src, std::string* name) {
  TSNode left = Field(n, "left");
  if (ts_node_is_null(left)) return false;
  std::string_view text = RangeOf(left).In(src);
  size_t i = 0;
  while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_' ||
                             static_cast<unsigned char>(text[i]) >= 0x80)) {
    ++i;
  }
  if (i == 0 || std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  std::string_view rest = text.substr(i);
  if (!rest.empty() && rest.front() != '[') return false;
  // The keyword must be followed by whitespace, not `(` or `.`.
  uint32_t kw_end = ts_node_start_byte(n) + 4;
  if (kw_end >= src.size() || !IsSpace(src[kw_end])) return false;
  *name = IdentifierKey(text.substr(0, i));
  return true;
}

bool IsContainer(TSNode n) {
  // Compound statements, clauses and blocks: the nodes that hold statements (lambdas hold
  // expressions only).
  static const std::vector<bool> kTable =
      SymbolTable(PythonLanguage(),
                  {"module", "block", "if_statement", "elif_clause", "else_clause", "for_statement",
                   "while_statement", "try_statement", "except_clause", "except_group_clause",
                   "finally_clause", "with_statement", "function_definition", "class_definition",
                   "decorated_definition", "match_statement", "case_clause"});
  return InTable(kTable, n);
}

std::vector<std::string> ParameterNames(const PyModule& m, const Definition& def) {
  std::vector<std::string> names;
  for (const Parameter& p : Parameters(m, def)) {
    if (p.plain) names.push_back(IdentifierKey(m.Text(p.name)));
  }
  return names;
}

TSNode NodeAt(TSNode root, ByteRange r) {
  TSNode n = ts_node_named_descendant_for_byte_range(root, r.start, r.end);
  while (!ts_node_is_null(ts_node_parent(n)) &&
         (ts_node_start_byte(n) > r.start || ts_node_end_byte(n) < r.end)) {
    n = ts_node_parent(n);
  }
  return n;
}

TSNode DefNode(const PyModule& m, const Definition& def) {
  TSNode n = ts_node_descendant_for_byte_range(m.root(), def.header.start, def.header.start + 1);
  while (!ts_node_is_null(n) && !((Is(n, "function_definition") || Is(n, "class_definition")) &&
                                  ts_node_start_byte(n) == def.header.start)) {
    n = ts_node_parent(n);
  }
  return n;
}

TSNode BodyBlock(const PyModule& m, const Definition& def) {
  TSNode n = ts_node_descendant_for_byte_range(m.root(), def.name_range.start, def.name_range.end);
  while (!ts_node_is_null(n) && TypeOf(n) != "function_definition" &&
         TypeOf(n) != "class_definition") {
    n = ts_node_parent(n);
  }
  if (ts_node_is_null(n)) return n;
  return Field(n, "body");
}

namespace {

/// The named children of `n` other than comments, in order (one cursor pass: ts_node_named_child(i)
/// walks the first i children each time).
std::vector<TSNode> NamedChildrenButComments(TSNode n) {
  std::vector<TSNode> out;
  if (ts_node_is_null(n)) return out;
  TSTreeCursor c = ts_tree_cursor_new(n);
  for (bool more = ts_tree_cursor_goto_first_child(&c); more;
       more = ts_tree_cursor_goto_next_sibling(&c)) {
    TSNode child = ts_tree_cursor_current_node(&c);
    if (ts_node_is_named(child) && !Is(child, "comment")) out.push_back(child);
  }
  ts_tree_cursor_delete(&c);
  return out;
}

/// The `assignment` node of a top-level assignment statement (the statement's first named
/// descendant along first children), or a null node (e.g. `x += 1` is an augmented_assignment).
TSNode AssignmentOf(const PyModule& m, const TopLevelStatement& s) {
  TSNode n = NodeAt(m.root(), s.range);
  while (!ts_node_is_null(n) && !Is(n, "assignment")) {
    n = ts_node_named_child_count(n) > 0 ? ts_node_named_child(n, 0) : TSNode{};
  }
  return n;
}

bool IsDefinitionNode(std::string_view t) {
  return t == "function_definition" || t == "class_definition" || t == "decorated_definition";
}

bool IsClause(std::string_view t) {
  return t == "elif_clause" || t == "else_clause" || t == "except_clause" ||
         t == "except_group_clause" || t == "finally_clause" || t == "case_clause";
}

void CollectBlock(TSNode block, const LineIndex& lines, std::vector<NestedStatement>& out);

/// Visits the blocks of a compound statement or clause.
void CollectNested(TSNode node, const LineIndex& lines, std::vector<NestedStatement>& out) {
  for (TSNode c : NamedChildrenButComments(node)) {
    std::string_view t = TypeOf(c);
    if (t == "block") {
      CollectBlock(c, lines, out);
    } else if (IsClause(t)) {
      CollectNested(c, lines, out);
    }
  }
}

void CollectBlock(TSNode block, const LineIndex& lines, std::vector<NestedStatement>& out) {
  uint32_t index = 0;
  for (TSNode c : NamedChildrenButComments(block)) {
    std::string_view t = TypeOf(c);
    if (t == "case_clause") {  // `match` bodies hold clauses, not statements.
      CollectNested(c, lines, out);
      continue;
    }
    ByteRange r = RangeOf(c);
    out.push_back(NestedStatement{c, block, index++, r, lines.LineOf(r.start) + 1});
    if (!IsDefinitionNode(t)) CollectNested(c, lines, out);
  }
}

/// True when `n` is an expression statement holding only `...`, alone on its line of `source`.
bool IsEllipsisLine(TSNode n, std::string_view source) {
  if (!Is(n, "expression_statement") || ts_node_named_child_count(n) != 1 ||
      !Is(ts_node_named_child(n, 0), "ellipsis")) {
    return false;
  }
  ByteRange r = RangeOf(n);
  uint32_t line_start = LineStartOf(source, r.start);
  if (!IsBlank(source.substr(line_start, r.start - line_start))) return false;
  std::string_view rest = source.substr(r.end, LineEndOf(source, r.end) - r.end);
  size_t first = rest.find_first_not_of(" \t\r");
  return first == std::string_view::npos || rest[first] == '#';
}

/// A range when `n` is not null.
std::optional<ByteRange> RangeIfAny(TSNode n) {
  if (ts_node_is_null(n)) return std::nullopt;
  return RangeOf(n);
}

/// One named child of a `parameters` node.
Parameter ParameterOf(TSNode p) {
  std::string_view t = TypeOf(p);
  bool with_default = t == "default_parameter" || t == "typed_default_parameter";
  bool typed = t == "typed_parameter" || t == "typed_default_parameter";
  TSNode name = p;  // identifier, *args, **kwargs, `*`, `/`
  if (with_default) {
    name = Field(p, "name");
  } else if (typed) {
    name = ts_node_named_child(p, 0);  // `x` or `*args` of `x: int` / `*args: int`
  }
  Parameter param;
  param.name = RangeIfAny(name).value_or(ByteRange{});
  param.plain = !ts_node_is_null(name) && Is(name, "identifier");
  if (typed) param.annotation = RangeIfAny(Field(p, "type"));
  if (with_default) param.default_value = RangeIfAny(Field(p, "value"));
  return param;
}

}  // namespace

std::vector<TSNode> BlockStatements(TSNode block) { return NamedChildrenButComments(block); }

TSNode LastStatement(const PyModule& m, const Definition& def) {
  std::vector<TSNode> stmts = BlockStatements(BodyBlock(m, def));
  return stmts.empty() ? TSNode{} : stmts.back();
}

std::optional<ByteRange> SuperInitStatement(const PyModule& m, const Definition& init) {
  for (TSNode s : BlockStatements(BodyBlock(m, init))) {
    if (!Is(s, "expression_statement")) continue;
    std::string key;  // as Python reads the names: `ｓｕｐｅｒ()` is `super()`
    std::string_view text = IdentifierKeyView(m.Text(RangeOf(s)), key);
    if (text.starts_with("super(") && text.find(".__init__(") != std::string_view::npos) {
      return RangeOf(s);
    }
  }
  return std::nullopt;
}

std::optional<DunderAll> FindDunderAll(const PyModule& m) {
  std::optional<DunderAll> found;
  for (const TopLevelStatement& s : m.top_level()) {
    if (s.kind != TopLevelStatement::Kind::kAssignment ||
        std::find(s.names.begin(), s.names.end(), "__all__") == s.names.end()) {
      continue;
    }
    TSNode assignment = AssignmentOf(m, s);
    if (ts_node_is_null(assignment)) continue;
    TSNode right = Field(assignment, "right");
    if (ts_node_is_null(right) || !(Is(right, "list") || Is(right, "tuple"))) continue;
    found = DunderAll{RangeOf(right), {}};
    for (TSNode item : NamedChildrenButComments(right)) found->items.push_back(RangeOf(item));
  }
  return found;
}

bool OnlyStatementInBlock(const PyModule& m, ByteRange stmt) {
  TSNode block = ts_node_parent(NodeAt(m.root(), stmt));
  if (ts_node_is_null(block) || !Is(block, "block")) return false;
  return BlockStatements(block).size() == 1;
}

std::vector<NestedStatement> NestedStatements(TSNode block, const LineIndex& lines) {
  std::vector<NestedStatement> out;
  if (!ts_node_is_null(block)) CollectBlock(block, lines, out);
  return out;
}

std::vector<TSNode> EllipsisLines(const PyModule& m) {
  std::vector<TSNode> found;
  std::vector<TSNode> stack = {m.root()};
  while (!stack.empty()) {
    TSNode n = stack.back();
    stack.pop_back();
    if (IsEllipsisLine(n, m.source())) {
      found.push_back(n);
      continue;
    }
    for (uint32_t i = ts_node_named_child_count(n); i-- > 0;) {
      stack.push_back(ts_node_named_child(n, i));
    }
  }
  return found;
}

std::vector<Parameter> Parameters(const PyModule& m, const Definition& def) {
  std::vector<Parameter> out;
  if (def.parameters.empty()) return out;
  TSNode n = ts_node_descendant_for_byte_range(m.root(), def.parameters.start, def.parameters.end);
  while (!ts_node_is_null(n) && TypeOf(n) != "parameters") n = ts_node_parent(n);
  for (TSNode p : NamedChildrenButComments(n)) out.push_back(ParameterOf(p));
  return out;
}

}  // namespace patchgen::parser
