// PyModule: parses one Python file with tree-sitter-python and builds the byte-exact index
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
#include "parser/py_module.h"

#include <cctype>
#include <cstring>
#include <string_view>

#include "parser/ts_node.h"

namespace patchgen::parser {

extern "C" const TSLanguage* tree_sitter_python(void);

namespace {

bool IsComment(TSNode n) { return Is(n, "comment"); }

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/// The node's end without trailing comments, blank lines or whitespace folded into it.
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

/// Python statements that can hold other statements (where imports and definitions can nest).
bool IsContainer(TSNode n) {
  static const char* const kTypes[] = {"module",
                                       "block",
                                       "if_statement",
                                       "elif_clause",
                                       "else_clause",
                                       "for_statement",
                                       "while_statement",
                                       "try_statement",
                                       "except_clause",
                                       "except_group_clause",
                                       "finally_clause",
                                       "with_statement",
                                       "function_definition",
                                       "class_definition",
                                       "decorated_definition",
                                       "match_statement",
                                       "case_clause"};
  const char* t = ts_node_type(n);
  for (const char* k : kTypes) {
    if (std::strcmp(t, k) == 0) return true;
  }
  return false;
}

/// Names bound by an assignment target (identifiers in patterns; attributes/subscripts bind none).
void CollectTargetNames(TSNode n, std::string_view src, std::vector<std::string>& out) {
  if (Is(n, "identifier")) {
    out.emplace_back(RangeOf(n).In(src));
    return;
  }
  if (Is(n, "pattern_list") || Is(n, "tuple_pattern") || Is(n, "list_pattern") ||
      Is(n, "list_splat_pattern") || Is(n, "parenthesized_expression")) {
    for (uint32_t i = 0; i < ts_node_named_child_count(n); ++i) {
      CollectTargetNames(ts_node_named_child(n, i), src, out);
    }
  }
}

/// A type_alias_statement is genuine only when `type` is followed by a (possibly generic) name;
/// `type(x).attr = v` is an assignment the grammar misreads.
bool IsGenuineTypeAlias(TSNode n, std::string_view src, std::string* name) {
  TSNode left = ts_node_child_by_field_name(n, "left", 4);
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
  *name = std::string(text.substr(0, i));
  return true;
}

}  // namespace

const char* KindName(TopLevelStatement::Kind kind) {
  switch (kind) {
    case TopLevelStatement::Kind::kImport:
      return "import";
    case TopLevelStatement::Kind::kClass:
      return "class";
    case TopLevelStatement::Kind::kFunction:
      return "function";
    case TopLevelStatement::Kind::kAssignment:
      return "assignment";
    case TopLevelStatement::Kind::kOther:
      return "other";
  }
  return "other";
}

const TSLanguage* PythonLanguage() { return tree_sitter_python(); }

TSTree* ParseTree(std::string_view source) {
  TSParser* parser = ts_parser_new();
  ts_parser_set_language(parser, PythonLanguage());
  TSTree* tree =
      ts_parser_parse_string(parser, nullptr, source.data(), static_cast<uint32_t>(source.size()));
  ts_parser_delete(parser);
  return tree;
}

void MarkLinesInsideStrings(TSNode node, ByteRange within, const LineIndex& lines,
                            std::set<uint32_t>& out) {
  if (ts_node_end_byte(node) <= within.start || ts_node_start_byte(node) >= within.end) return;
  if (Is(node, "string")) {
    uint32_t first = lines.LineOf(ts_node_start_byte(node));
    uint32_t last = lines.LineOf(ts_node_end_byte(node));
    for (uint32_t l = first + 1; l <= last; ++l) out.insert(l);
    return;
  }
  uint32_t n = ts_node_child_count(node);
  for (uint32_t i = 0; i < n; ++i)
    MarkLinesInsideStrings(ts_node_child(node, i), within, lines, out);
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

/// Walks the tree once and fills the PyModule's index.
class Indexer {
 public:
  explicit Indexer(PyModule& m) : m_(m), src_(m.source_) {}

  void Run() {
    TSNode root = ts_tree_root_node(m_.tree_);
    Walk(root, /*depth=*/0, /*parent=*/-1);
    IndexTopLevel(root);
  }

 private:
  void Walk(TSNode n, int depth, int parent) {
    uint32_t count = ts_node_named_child_count(n);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_named_child(n, i);
      if (Is(c, "import_statement") || Is(c, "import_from_statement") ||
          Is(c, "future_import_statement")) {
        AddImport(c, depth, parent);
      } else if (Is(c, "class_definition") || Is(c, "function_definition")) {
        int idx = AddDefinition(c, parent);
        TSNode body = ts_node_child_by_field_name(c, "body", 4);
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
      imp.kind = Import::Kind::kFuture;
      imp.module_name = "__future__";
      for (uint32_t i = 0; i < ts_node_child_count(n); ++i) {
        TSNode c = ts_node_child(n, i);
        if (Is(c, "__future__")) imp.module = RangeOf(c);
      }
    } else {
      imp.kind = Import::Kind::kFrom;
      TSNode mod = ts_node_child_by_field_name(n, "module_name", 11);
      imp.module = RangeOf(mod);
      std::string_view text = imp.module.In(src_);
      size_t dots = 0;
      while (dots < text.size() && text[dots] == '.') ++dots;
      imp.relative_level = static_cast<int>(dots);
      size_t first = dots;
      while (first < text.size() && IsSpace(text[first])) ++first;
      imp.module_name = std::string(text.substr(first));
    }
    // Names, wildcard and parentheses: walk the statement's direct children after `import`.
    bool after_import = imp.kind == Import::Kind::kImport;
    uint32_t count = ts_node_child_count(n);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_child(n, i);
      if (Is(c, "import")) {
        after_import = true;
        continue;
      }
      if (!after_import) continue;
      if (Is(c, "(")) imp.parenthesized = true;
      if (Is(c, "wildcard_import")) imp.wildcard = true;
      if (Is(c, "dotted_name")) {
        imp.names.push_back({std::string(RangeOf(c).In(src_)), "", RangeOf(c)});
      } else if (Is(c, "aliased_import")) {
        TSNode name = ts_node_child_by_field_name(c, "name", 4);
        TSNode alias = ts_node_child_by_field_name(c, "alias", 5);
        imp.names.push_back({std::string(RangeOf(name).In(src_)),
                             std::string(RangeOf(alias).In(src_)), RangeOf(c)});
      }
    }
    m_.imports_.push_back(std::move(imp));
  }

  /// Offset of the `#` of the first comment line attached above 0-based line `def_line` (the
  /// definition's first line, at column `indent`); the start of `def_line` when none is attached.
  uint32_t AttachedCommentsStart(uint32_t def_line, uint32_t indent) const {
    const LineIndex& lines = m_.lines_;
    uint32_t start = lines.LineStart(def_line);
    TSNode root = ts_tree_root_node(m_.tree_);
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
    TSNode name = ts_node_child_by_field_name(n, "name", 4);
    d.name = std::string(RangeOf(name).In(src_));
    d.qualname = parent < 0 ? d.name : m_.definitions_[parent].qualname + "." + d.name;
    d.name_range = RangeOf(name);
    d.is_async = ts_node_child_count(n) > 0 && Is(ts_node_child(n, 0), "async");

    TSNode outer = n;
    TSNode up = ts_node_parent(n);
    if (!ts_node_is_null(up) && Is(up, "decorated_definition")) outer = up;
    TSNode scope = ts_node_parent(outer);
    if (!ts_node_is_null(scope) && Is(scope, "block")) {
      TSNode owner = ts_node_parent(scope);
      d.direct = !ts_node_is_null(owner) &&
                 (Is(owner, "class_definition") || Is(owner, "function_definition"));
    } else {
      d.direct = !ts_node_is_null(scope) && Is(scope, "module");
    }
    uint32_t def_start = ts_node_start_byte(outer);
    d.indent = ts_node_start_point(outer).column;

    // Decorators: first `@` through the end of the last decorator.
    d.decorators = {def_start, def_start};
    if (!ts_node_eq(outer, n)) {
      for (uint32_t i = 0; i < ts_node_named_child_count(outer); ++i) {
        TSNode c = ts_node_named_child(outer, i);
        if (Is(c, "decorator")) d.decorators.end = TrimmedEnd(c, src_);
      }
    }

    // Header: keyword through the colon before the body.
    TSNode body = ts_node_child_by_field_name(n, "body", 4);
    uint32_t colon_end = ts_node_start_byte(body);
    uint32_t colon_row = ts_node_start_point(n).row;
    for (uint32_t i = 0; i < ts_node_child_count(n); ++i) {
      TSNode c = ts_node_child(n, i);
      if (Is(c, ":")) {
        colon_end = ts_node_end_byte(c);
        colon_row = ts_node_end_point(c).row;
      }
    }
    d.header = {ts_node_start_byte(n), colon_end};
    TSNode params = ts_node_child_by_field_name(
        n, d.kind == Definition::Kind::kClass ? "superclasses" : "parameters",
        d.kind == Definition::Kind::kClass ? 12 : 10);
    d.parameters =
        ts_node_is_null(params) ? ByteRange{d.name_range.end, d.name_range.end} : RangeOf(params);

    IndexBody(n, body, colon_row, d);

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

  /// End of 0-based line `line` without its terminator or trailing whitespace.
  uint32_t TrimmedLineEnd(uint32_t line) const {
    std::string_view text = m_.lines_.LineText(line);
    while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
    return m_.lines_.LineStart(line) + static_cast<uint32_t>(text.size());
  }

  void IndexBody(TSNode def, TSNode body, uint32_t colon_row, Definition& d) {
    std::vector<TSNode> stmts;
    TSNode first_child = {};
    bool have_first = false;
    // Comments between the colon and the first statement can hang off the definition node
    // instead of the block; the first one on a line of its own starts the body.
    for (uint32_t i = 0; i < ts_node_child_count(def); ++i) {
      TSNode c = ts_node_child(def, i);
      if (IsComment(c) && ts_node_start_point(c).row > colon_row &&
          ts_node_start_byte(c) < ts_node_start_byte(body)) {
        first_child = c;
        have_first = true;
        break;
      }
    }
    uint32_t count = ts_node_child_count(body);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_child(body, i);
      if (ts_node_end_byte(c) == ts_node_start_byte(c)) continue;
      bool comment = IsComment(c);
      // A comment on the header's line (`def f():  # noqa`) is not part of the body.
      if (comment && ts_node_start_point(c).row == colon_row) continue;
      if (!have_first) {
        first_child = c;
        have_first = true;
      }
      if (!comment) stmts.push_back(c);
    }
    if (stmts.empty()) {  // Cannot happen in a parsed file; keep the ranges well-formed.
      d.body = {d.header.end, d.header.end};
      d.body_indent = d.indent + 4;
      return;
    }
    d.inline_body = ts_node_start_point(stmts.front()).row == colon_row;
    uint32_t start =
        d.inline_body ? ts_node_start_byte(stmts.front()) : ts_node_start_byte(first_child);
    d.body = {start, TrimmedEnd(stmts.back(), src_)};
    d.body_indent = d.inline_body ? d.indent + 4 : ts_node_start_point(stmts.front()).column;

    size_t next = 0;
    TSNode s0 = stmts.front();
    if (Is(s0, "expression_statement") && ts_node_named_child_count(s0) == 1) {
      TSNode e = ts_node_named_child(s0, 0);
      if (Is(e, "string") || Is(e, "concatenated_string")) {
        d.docstring = ByteRange{ts_node_start_byte(s0), TrimmedEnd(s0, src_)};
        next = 1;
      }
    }
    if (stmts.size() == next + 1) {
      TSNode s = stmts[next];
      if (Is(s, "pass_statement")) d.empty_body = true;
      if (Is(s, "expression_statement") && ts_node_named_child_count(s) == 1 &&
          Is(ts_node_named_child(s, 0), "ellipsis")) {
        d.empty_body = true;
      }
    }
  }

  void IndexTopLevel(TSNode root) {
    // definitions_ are in document order, so one forward scan finds each statement's definition.
    size_t next_def = 0;
    auto def_at = [&](uint32_t start) {
      while (next_def < m_.definitions_.size() &&
             m_.definitions_[next_def].definition.start != start) {
        ++next_def;
      }
      return static_cast<int>(next_def);
    };
    size_t next_import = 0;
    uint32_t count = ts_node_named_child_count(root);
    for (uint32_t i = 0; i < count; ++i) {
      TSNode c = ts_node_named_child(root, i);
      if (IsComment(c)) continue;
      TopLevelStatement s;
      s.range = {ts_node_start_byte(c), TrimmedEnd(c, src_)};
      if (Is(c, "import_statement") || Is(c, "import_from_statement") ||
          Is(c, "future_import_statement")) {
        s.kind = TopLevelStatement::Kind::kImport;
        while (next_import < m_.imports_.size() &&
               m_.imports_[next_import].stmt.start != s.range.start) {
          ++next_import;
        }
        if (next_import < m_.imports_.size()) {
          const Import& imp = m_.imports_[next_import];
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
      } else if (Is(c, "class_definition") || Is(c, "function_definition") ||
                 Is(c, "decorated_definition")) {
        s.decorated = Is(c, "decorated_definition");
        s.definition = def_at(s.range.start);
        const Definition& d = m_.definitions_[s.definition];
        s.kind = d.kind == Definition::Kind::kClass ? TopLevelStatement::Kind::kClass
                                                    : TopLevelStatement::Kind::kFunction;
        s.range = d.whole;
        s.names.push_back(d.name);
      } else if (Is(c, "expression_statement") && ts_node_named_child_count(c) >= 1 &&
                 (Is(ts_node_named_child(c, 0), "assignment") ||
                  Is(ts_node_named_child(c, 0), "augmented_assignment"))) {
        s.kind = TopLevelStatement::Kind::kAssignment;
        // Chained `a = b = 1` nests assignments on the right.
        TSNode a = ts_node_named_child(c, 0);
        while (!ts_node_is_null(a) && (Is(a, "assignment") || Is(a, "augmented_assignment"))) {
          CollectTargetNames(ts_node_child_by_field_name(a, "left", 4), src_, s.names);
          a = ts_node_child_by_field_name(a, "right", 5);
        }
      } else if (Is(c, "type_alias_statement")) {
        std::string name;
        if (IsGenuineTypeAlias(c, src_, &name)) {
          s.kind = TopLevelStatement::Kind::kAssignment;
          s.names.push_back(std::move(name));
        }
      }
      m_.top_level_.push_back(std::move(s));
    }
  }

  PyModule& m_;
  std::string_view src_;
};

Result<std::unique_ptr<PyModule>> PyModule::Parse(std::string path, std::string source) {
  std::unique_ptr<PyModule> m(new PyModule());
  m->path_ = std::move(path);
  m->source_ = std::move(source);
  m->lines_ = LineIndex(m->source_);  // After source_ is final: LineIndex views it.
  m->tree_ = ParseTree(m->source_);
  if (m->tree_ == nullptr) {
    Diagnostic d;
    d.kind = ErrorKind::kInternal;
    d.path = m->path_;
    d.message = "tree-sitter returned no tree";
    return d;
  }
  if (auto err = FirstErrorNode(ts_tree_root_node(m->tree_))) {
    std::string message = "cannot parse Python: ";
    if (ts_node_is_missing(*err)) {
      message += "missing ";
      // Named tokens read as words ("missing identifier"), punctuation is quoted ("missing ')'").
      message += ts_node_is_named(*err) ? std::string(ts_node_type(*err))
                                        : "'" + std::string(ts_node_type(*err)) + "'";
    } else {
      message += "syntax error";
    }
    ByteRange r = RangeOf(*err);
    // An ERROR node can span many lines; the caret covers its part on the first line.
    return MakeDiagnostic(m->path_, m->source_, m->lines_, r, std::move(message),
                          "patchgen indexes only valid Python; check the file with "
                          "`python3 -m py_compile " +
                              m->path_ + "`",
                          ErrorKind::kUpstream);
  }
  Indexer(*m).Run();
  return m;
}

PyModule::~PyModule() {
  if (tree_ != nullptr) ts_tree_delete(tree_);
}

TSNode PyModule::root() const { return ts_tree_root_node(tree_); }

const Definition* PyModule::FindTopLevel(std::string_view name) const {
  for (const TopLevelStatement& s : top_level_) {
    if (s.definition >= 0 && definitions_[s.definition].name == name)
      return &definitions_[s.definition];
  }
  return nullptr;
}

const Definition* PyModule::Find(std::string_view qualname) const {
  for (const Definition& d : definitions_) {
    if (d.qualname == qualname) return &d;
  }
  return nullptr;
}

std::vector<const Definition*> PyModule::Redefinitions(const Definition& def) const {
  // A definition that does not rebind the name as a plain new object: property accessors keep the
  // property (`@x.setter def x`), typing.overload stubs are replaced by the implementation.
  auto exempt = [&](const Definition& d) {
    std::string_view decorators = Text(d.decorators);
    for (std::string_view accessor : {".setter", ".getter", ".deleter"}) {
      if (decorators.find("@" + d.name + std::string(accessor)) != std::string_view::npos)
        return true;
    }
    return decorators.find("overload") != std::string_view::npos;
  };
  std::vector<const Definition*> out;
  if (!def.direct || exempt(def)) return out;
  for (const Definition& d : definitions_) {
    if (&d == &def || !d.direct || d.parent != def.parent || d.qualname != def.qualname ||
        exempt(d)) {
      continue;
    }
    out.push_back(&d);
  }
  return out;
}

std::vector<std::string> PyModule::ChildNames(const Definition& def, Definition::Kind kind) const {
  std::vector<std::string> out;
  for (int c : def.children) {
    if (definitions_[c].kind == kind) out.push_back(definitions_[c].name);
  }
  return out;
}

std::vector<std::string> PyModule::TopLevelNames(std::optional<Definition::Kind> kind) const {
  std::vector<std::string> out;
  for (const TopLevelStatement& s : top_level_) {
    if (s.definition < 0) continue;
    const Definition& d = definitions_[s.definition];
    if (!kind || d.kind == *kind) out.push_back(d.name);
  }
  return out;
}

}  // namespace patchgen::parser
