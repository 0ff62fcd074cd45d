// The Indexer: one walk over a parsed module's tree that builds PyModule's byte-exact index
// (imports, top-level statements, classes and functions) that patchgen splices by.
//
// Range rules (see docs/parser.md):
// - A compound node's extent in the tree can run past its last statement: tree-sitter folds the
//   comments and blank lines that follow a block (before the dedent) into the block. Every end we
//   report is therefore "trimmed": the end of the last non-comment descendant along the last spine.
// - Leading comments attach to a definition when they form a contiguous block of comment-only
//   lines directly above its first decorator/keyword (no blank line between), each starting at
//   the definition's column.
// - `type(x).attr = v` parses as a type_alias_statement (grammar bug); a type alias is only
//   genuine when `type` is followed by a plain name.
// - Names (of definitions, imports, bound names) are stored as Python compares them: NFKC for a
//   non-ASCII identifier (PEP 3131; base/unicode_nfkc.h). Ranges still give upstream's bytes.
#include "parser/py_indexer.h"

#include <string_view>

#include "base/unicode_nfkc.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"

namespace patchgen::parser {

/// Walks the tree once and fills the PyModule's index.
class Indexer {
 public:
  explicit Indexer(PyModule& m) : m_(m), src_(m.source_) {}

  void Run() {
    TSNode root = m_.root();
    Walk(root, /*depth=*/0, /*parent=*/-1);
    IndexTopLevel(root);
  }

 private:
  void Walk(TSNode n, int depth, int parent) {
    uint32_t count = ts_node_named_child_count(n);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_named_child(n, i);
      if (IsImportStatement(c)) {
        AddImport(c, depth, parent);
      } else if (Is(c, "class_definition") || Is(c, "function_definition")) {
        int idx = AddDefinition(c, parent);
        TSNode body = Field(c, "body");
        if (!ts_node_is_null(body)) Walk(body, depth + 1, idx);
      } else if (IsContainer(c)) {
        // Only the statement adds a level; its blocks and clauses (else, except, case) do not.
        std::string_view type = ts_node_type(c);
        bool same_level = type == "block" || type == "decorated_definition" ||
                          (type.size() > 7 && type.substr(type.size() - 7) == "_clause");
        Walk(c, same_level ? depth : depth + 1, parent);
      }
    }
  }

  std::string Scope(int parent) const {
    return parent < 0 ? std::string() : m_.definitions_[parent].qualname;
  }

  void AddImport(TSNode n, int depth, int parent) {
    Import imp;
    imp.stmt = {ts_node_start_byte(n), TrimmedEnd(n, src_)};
    imp.depth = depth;
    imp.scope = Scope(parent);
    if (Is(n, "import_statement")) {
      imp.kind = Import::Kind::kImport;
      imp.module = {imp.stmt.start, imp.stmt.start};
    } else if (Is(n, "future_import_statement")) {
      IndexFutureModule(n, imp);
    } else {
      IndexFromModule(n, imp);
    }
    IndexImportedNames(n, imp);
    m_.imports_.push_back(std::move(imp));
  }

  /// `from __future__ import ...`: the module is the `__future__` token.
  static void IndexFutureModule(TSNode n, Import& imp) {
    imp.kind = Import::Kind::kFuture;
    imp.module_name = "__future__";
    for (uint32_t i = 0; i < ts_node_child_count(n); ++i) {
      TSNode c = ts_node_child(n, i);
      if (Is(c, "__future__")) imp.module = RangeOf(c);
    }
  }

  /// `from ..a.b import ...`: the module part with its leading dots, their count, and the name.
  void IndexFromModule(TSNode n, Import& imp) const {
    imp.kind = Import::Kind::kFrom;
    imp.module = RangeOf(Field(n, "module_name"));
    std::string_view text = imp.module.In(src_);
    size_t dots = 0;
    while (dots < text.size() && text[dots] == '.') ++dots;
    imp.relative_level = static_cast<int>(dots);
    size_t first = dots;
    while (first < text.size() && IsSpace(text[first])) ++first;
    imp.module_name = IdentifierKey(text.substr(first));
  }

  /// Names, wildcard and parentheses: the statement's direct children after `import` (for a plain
  /// `import a.b` every child is a name).
  void IndexImportedNames(TSNode n, Import& imp) const {
    bool after_import = imp.kind == Import::Kind::kImport;
    uint32_t count = ts_node_child_count(n);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_child(n, i);
      if (Is(c, "import")) {
        after_import = true;
      } else if (after_import) {
        IndexImportChild(c, imp);
      }
    }
  }

  void IndexImportChild(TSNode c, Import& imp) const {
    if (Is(c, "(")) imp.parenthesized = true;
    if (Is(c, "wildcard_import")) imp.wildcard = true;
    if (Is(c, "dotted_name")) {
      imp.names.push_back({IdentifierKey(RangeOf(c).In(src_)), "", RangeOf(c)});
    } else if (Is(c, "aliased_import")) {
      TSNode name = Field(c, "name");
      TSNode alias = Field(c, "alias");
      imp.names.push_back({IdentifierKey(RangeOf(name).In(src_)),
                           IdentifierKey(RangeOf(alias).In(src_)), RangeOf(c)});
    }
  }

  /// Offset of the `#` of the first comment line attached above 0-based line `def_line` (the
  /// definition's first line, at column `indent`); the start of `def_line` when none is attached.
  uint32_t AttachedCommentsStart(uint32_t def_line, uint32_t indent) const {
    const LineIndex& lines = m_.lines_;
    uint32_t start = lines.LineStart(def_line);
    TSNode root = m_.root();
    for (uint32_t line = def_line; line > 0; --line) {
      std::string_view text = lines.LineText(line - 1);
      size_t col = 0;
      while (col < text.size() && (text[col] == ' ' || text[col] == '\t')) ++col;
      if (col != indent || col >= text.size() || text[col] != '#') break;
      // Must be a real comment token, not a '#' line inside a multi-line string.
      uint32_t hash = lines.LineStart(line - 1) + static_cast<uint32_t>(col);
      TSNode at = ts_node_descendant_for_byte_range(root, hash, hash + 1);
      if (!IsComment(at)) break;
      start = hash;
    }
    return start;
  }

  int AddDefinition(TSNode n, int parent) {
    Definition d;
    d.kind = Is(n, "class_definition") ? Definition::Kind::kClass : Definition::Kind::kFunction;
    TSNode name = Field(n, "name");
    d.name = IdentifierKey(RangeOf(name).In(src_));
    d.qualname = parent < 0 ? d.name : m_.definitions_[parent].qualname + "." + d.name;
    d.name_range = RangeOf(name);
    d.is_async = ts_node_child_count(n) > 0 && Is(ts_node_child(n, 0), "async");

    TSNode outer = n;
    TSNode up = ts_node_parent(n);
    if (!ts_node_is_null(up) && Is(up, "decorated_definition")) outer = up;
    d.direct = IsDirectInScope(outer);
    uint32_t def_start = ts_node_start_byte(outer);
    d.indent = ts_node_start_point(outer).column;
    d.decorators = {def_start, ts_node_eq(outer, n) ? def_start : DecoratorsEnd(outer, def_start)};

    // Header: keyword through the colon before the body.
    TSNode body = Field(n, "body");
    HeaderColon colon = FindHeaderColon(n, body);
    d.header = {ts_node_start_byte(n), colon.end};
    TSNode params = Field(n, d.kind == Definition::Kind::kClass ? "superclasses" : "parameters");
    d.parameters =
        ts_node_is_null(params) ? ByteRange{d.name_range.end, d.name_range.end} : RangeOf(params);

    IndexBody(n, body, colon.row, d);

    d.definition = {def_start, d.body.end};
    uint32_t def_line = ts_node_start_point(outer).row;
    uint32_t comments_start = AttachedCommentsStart(def_line, d.indent);
    d.comments = comments_start < m_.lines_.LineStart(def_line)
                     ? ByteRange{comments_start, TrimmedLineEnd(def_line - 1)}
                     : ByteRange{def_start, def_start};
    d.whole = {d.comments.empty() ? def_start : d.comments.start, d.body.end};
    d.line = def_line + 1;
    d.parent = parent;

    int idx = static_cast<int>(m_.definitions_.size());
    if (parent >= 0) m_.definitions_[parent].children.push_back(idx);
    m_.definitions_.push_back(std::move(d));
    return idx;
  }

  /// True when the definition whose outermost node (decorators included) is `outer` sits directly
  /// in the body of the module or of a def/class, not under an `if`, `try`, `with`, ... there.
  static bool IsDirectInScope(TSNode outer) {
    TSNode scope = ts_node_parent(outer);
    if (ts_node_is_null(scope)) return false;
    if (!Is(scope, "block")) return Is(scope, "module");
    TSNode owner = ts_node_parent(scope);
    return !ts_node_is_null(owner) &&
           (Is(owner, "class_definition") || Is(owner, "function_definition"));
  }

  /// End of the last decorator of a decorated_definition (`def_start` when it has none).
  uint32_t DecoratorsEnd(TSNode decorated, uint32_t def_start) const {
    uint32_t end = def_start;
    for (uint32_t i = 0; i < ts_node_named_child_count(decorated); ++i) {
      TSNode c = ts_node_named_child(decorated, i);
      if (Is(c, "decorator")) end = TrimmedEnd(c, src_);
    }
    return end;
  }

  struct HeaderColon {
    uint32_t end;  ///< Byte just after the header's `:` (the body's start when there is none).
    uint32_t row;  ///< 0-based row of that colon.
  };

  /// The last `:` among the definition's children: the one that ends its header.
  static HeaderColon FindHeaderColon(TSNode def, TSNode body) {
    HeaderColon colon{ts_node_start_byte(body), ts_node_start_point(def).row};
    for (uint32_t i = 0; i < ts_node_child_count(def); ++i) {
      TSNode c = ts_node_child(def, i);
      if (Is(c, ":")) colon = {ts_node_end_byte(c), ts_node_end_point(c).row};
    }
    return colon;
  }

  /// End of 0-based line `line` without its terminator or trailing whitespace.
  uint32_t TrimmedLineEnd(uint32_t line) const {
    std::string_view text = m_.lines_.LineText(line);
    while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
    return m_.lines_.LineStart(line) + static_cast<uint32_t>(text.size());
  }

  /// The first comment on a line of its own between the header's colon and the body block:
  /// tree-sitter can hang such comments off the definition node instead of the block.
  static std::optional<TSNode> CommentBeforeBody(TSNode def, TSNode body, uint32_t colon_row) {
    for (uint32_t i = 0; i < ts_node_child_count(def); ++i) {
      TSNode c = ts_node_child(def, i);
      if (IsComment(c) && ts_node_start_point(c).row > colon_row &&
          ts_node_start_byte(c) < ts_node_start_byte(body)) {
        return c;
      }
    }
    return std::nullopt;
  }

  void IndexBody(TSNode def, TSNode body, uint32_t colon_row, Definition& d) {
    std::vector<TSNode> stmts;
    // The body starts at its first statement or at a comment on a line of its own before it.
    std::optional<TSNode> first_child = CommentBeforeBody(def, body, colon_row);
    uint32_t count = ts_node_child_count(body);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_child(body, i);
      if (ts_node_end_byte(c) == ts_node_start_byte(c)) continue;
      bool comment = IsComment(c);
      // A comment on the header's line (`def f():  # noqa`) is not part of the body.
      if (comment && ts_node_start_point(c).row == colon_row) continue;
      if (!first_child) first_child = c;
      if (!comment) stmts.push_back(c);
    }
    if (stmts.empty()) {  // Cannot happen in a parsed file; keep the ranges well-formed.
      d.body = {d.header.end, d.header.end};
      d.body_indent = d.indent + 4;
      return;
    }
    d.inline_body = ts_node_start_point(stmts.front()).row == colon_row;
    uint32_t start =
        d.inline_body ? ts_node_start_byte(stmts.front()) : ts_node_start_byte(*first_child);
    d.body = {start, TrimmedEnd(stmts.back(), src_)};
    d.body_indent = d.inline_body ? d.indent + 4 : ts_node_start_point(stmts.front()).column;
    IndexDocstringAndEmptyBody(stmts, d);
  }

  /// The docstring (a string expression as the first statement), and whether the rest of the body
  /// is a lone `pass` or `...`.
  void IndexDocstringAndEmptyBody(const std::vector<TSNode>& stmts, Definition& d) const {
    size_t next = 0;
    TSNode s0 = stmts.front();
    if (IsExpressionOf(s0, "string") || IsExpressionOf(s0, "concatenated_string")) {
      d.docstring = ByteRange{ts_node_start_byte(s0), TrimmedEnd(s0, src_)};
      next = 1;
    }
    if (stmts.size() == next + 1) {
      TSNode s = stmts[next];
      d.empty_body = Is(s, "pass_statement") || IsExpressionOf(s, "ellipsis");
    }
  }

  /// True when `stmt` is an expression statement made of one expression of type `type`.
  static bool IsExpressionOf(TSNode stmt, const char* type) {
    return Is(stmt, "expression_statement") && ts_node_named_child_count(stmt) == 1 &&
           Is(ts_node_named_child(stmt, 0), type);
  }

  /// definitions_ and imports_ are in document order, so one forward scan over each finds every
  /// top-level statement's definition or import.
  struct TopLevelCursor {
    size_t next_def = 0;
    size_t next_import = 0;
  };

  void IndexTopLevel(TSNode root) {
    TopLevelCursor cursor;
    uint32_t count = ts_node_named_child_count(root);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_named_child(root, i);
      if (IsComment(c)) continue;
      TopLevelStatement s;
      s.range = {ts_node_start_byte(c), TrimmedEnd(c, src_)};
      if (IsImportStatement(c)) {
        IndexTopLevelImport(s, cursor);
      } else if (Is(c, "class_definition") || Is(c, "function_definition") ||
                 Is(c, "decorated_definition")) {
        IndexTopLevelDefinition(c, s, cursor);
      } else {
        IndexTopLevelAssignment(c, s);
      }
      m_.top_level_.push_back(std::move(s));
    }
  }

  static bool IsImportStatement(TSNode n) {
    return Is(n, "import_statement") || Is(n, "import_from_statement") ||
           Is(n, "future_import_statement");
  }

  /// The names an import binds: `*`, an alias, the top package of `import a.b`, or the name.
  void IndexTopLevelImport(TopLevelStatement& s, TopLevelCursor& cursor) const {
    s.kind = TopLevelStatement::Kind::kImport;
    while (cursor.next_import < m_.imports_.size() &&
           m_.imports_[cursor.next_import].stmt.start != s.range.start) {
      ++cursor.next_import;
    }
    if (cursor.next_import == m_.imports_.size()) return;
    const Import& imp = m_.imports_[cursor.next_import];
    if (imp.wildcard) s.names.push_back("*");
    for (const ImportedName& n : imp.names) {
      if (!n.alias.empty()) {
        s.names.push_back(n.alias);
      } else if (imp.kind == Import::Kind::kImport) {
        s.names.push_back(n.name.substr(0, n.name.find('.')));
      } else {
        s.names.push_back(n.name);
      }
    }
  }

  void IndexTopLevelDefinition(TSNode c, TopLevelStatement& s, TopLevelCursor& cursor) const {
    s.decorated = Is(c, "decorated_definition");
    while (cursor.next_def < m_.definitions_.size() &&
           m_.definitions_[cursor.next_def].definition.start != s.range.start) {
      ++cursor.next_def;
    }
    s.definition = static_cast<int>(cursor.next_def);
    const Definition& d = m_.definitions_[s.definition];
    s.kind = d.kind == Definition::Kind::kClass ? TopLevelStatement::Kind::kClass
                                                : TopLevelStatement::Kind::kFunction;
    s.range = d.whole;
    s.names.push_back(d.name);
  }

  /// Assignments (plain, augmented, chained) and genuine `type X = ...` aliases bind names; every
  /// other statement stays kOther.
  void IndexTopLevelAssignment(TSNode c, TopLevelStatement& s) const {
    if (Is(c, "expression_statement") && ts_node_named_child_count(c) >= 1 &&
        IsAssignment(ts_node_named_child(c, 0))) {
      s.kind = TopLevelStatement::Kind::kAssignment;
      // Chained `a = b = 1` nests assignments on the right.
      for (TSNode a = ts_node_named_child(c, 0); !ts_node_is_null(a) && IsAssignment(a);
           a = Field(a, "right")) {
        CollectTargetNames(Field(a, "left"), src_, s.names);
      }
    } else if (Is(c, "type_alias_statement")) {
      std::string name;
      if (IsGenuineTypeAlias(c, src_, &name)) {
        s.kind = TopLevelStatement::Kind::kAssignment;
        s.names.push_back(std::move(name));
      }
    }
  }

  static bool IsAssignment(TSNode n) {
    return Is(n, "assignment") || Is(n, "augmented_assignment");
  }

  PyModule& m_;
  std::string_view src_;
};

void IndexModule(PyModule& m) { Indexer(m).Run(); }

}  // namespace patchgen::parser
