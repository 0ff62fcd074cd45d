// The output check: the generated text re-parsed, incrementally from the upstream tree; parse
// errors and undefined names in inserted code located in the spec through the edits' CodeSpans
// (docs/rewriter.md, "Validation").
#include <tree_sitter/api.h>

#include <algorithm>
#include <memory>
#include <tuple>

#include "base/line_index.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"
#include "rewriter/name_resolution.h"
#include "rewriter/reparse_edits.h"
#include "rewriter/stages.h"

namespace patchgen::rewriter {
namespace {

/// What the checks locate by: the plan, the output and its lines, the edits' output ranges.
struct OutputText {
  const EditPlan& plan;
  const std::string& out;
  const LineIndex& lines;
  std::vector<ByteRange> ranges;  ///< EditPlan::OutputRanges (without the header).
  uint32_t header_size;
  const std::string& path;  ///< The output as printed.

  /// A location in the output file (its line cropped to what an excerpt shows).
  SourceLoc At(uint32_t offset) const { return LocOf(path, out, lines, {offset, offset + 1}); }

  /// The spec location of output byte `offset` (at `at` in the output) when it lies in inserted
  /// text, else nullopt. Without `with_line`, only the position (no excerpt text): sorting
  /// thousands of locations must not copy a line for each.
  std::optional<SourceLoc> Inserted(uint32_t offset, LineCol at, bool with_line = true) const {
    const std::vector<TextEdit>& edits = plan.edits();
    for (size_t i = 0; i < edits.size(); ++i) {
      ByteRange r{ranges[i].start + header_size, ranges[i].end + header_size};
      if (!r.Contains(offset)) continue;
      const TextEdit& e = edits[i];
      for (const std::optional<CodeSpan>* span : {&e.code, &e.tail_code}) {
        const std::optional<CodeSpan>& c = *span;
        if (!c || c->begin > offset - r.start || offset - r.start >= c->end) continue;
        uint32_t line0 = (at.line - 1) - lines.LineOf(r.start + c->begin);
        int32_t col = static_cast<int32_t>(at.col) - c->col_shift;
        spec::TextOrigin o = c->origin;
        o.first_line = c->first_line;
        o.col_offset = 0;
        if (!with_line) o.file_text = nullptr;
        return OriginLoc(o, line0, static_cast<uint32_t>(std::max(1, col)));
      }
      SourceLoc loc = e.origin;
      if (!with_line) loc.source_line.clear();
      return loc;
    }
    return std::nullopt;
  }
  std::optional<SourceLoc> Inserted(uint32_t offset) const {
    return Inserted(offset, lines.At(offset));
  }

  /// "generated line N: <the line as an excerpt shows it>".
  static Note GeneratedLine(const SourceLoc& at) {
    return Note::Text("generated line " + std::to_string(at.line) + ": " + ShownLine(at));
  }
};

/// Excluded definitions and dropped imports must not leave names behind that now resolve
/// nowhere (a name bound again by a helper or an added import is fine). At most
/// kMaxDiagnosticsOfAKind uses of one removed name are reported.
void CheckRemovedNames(const spec::PatchSpec& spec,
                       const std::vector<const spec::LocatedName*>& excluded, TSNode root,
                       const OutputText& o, std::vector<Diagnostic>& errors) {
  std::vector<std::pair<const spec::LocatedName*, std::string>> removed;
  for (const spec::LocatedName* ex : excluded) removed.push_back({ex, "excluded name"});
  for (const spec::LocatedName& d : spec.import_drops) removed.push_back({&d, "dropped import"});
  if (removed.empty()) return;
  std::vector<NameUse> unresolved = FindUnresolvedNames(
      root, o.out, {ByteRange{o.header_size, static_cast<uint32_t>(o.out.size())}});
  for (const auto& [name, noun] : removed) {
    size_t uses = 0;
    for (const NameUse& use : unresolved) {
      if (use.name != name->name) continue;  // both as Python compares names (NFKC)
      if (++uses > kMaxDiagnosticsOfAKind) continue;
      SourceLoc at = o.At(use.offset);
      Diagnostic d = ErrorAt(name->loc,
                             noun + " '" + name->name + "' is still used at line " +
                                 std::to_string(at.line) + " of the output",
                             "remove or patch the code that uses it, or keep '" + name->name + "'");
      d.notes.push_back(Note::Text(at.PathLine() + ": " + ShownLine(at)));
      errors.push_back(std::move(d));
    }
    if (uses > kMaxDiagnosticsOfAKind) {
      errors.back().notes.push_back(
          MoreOfAKind(uses - kMaxDiagnosticsOfAKind, "uses of '" + name->name + "'"));
    }
  }
}

/// Undefined names in inserted code: the first kMaxDiagnosticsOfAKind by spec location, each
/// located and quoted, the last with "... and K more"; the others are only counted. Positions
/// are found for every use without copying a line (columns counted on along the output), so
/// that 10,000 names on one long line cost time and memory linear in the input (issue #28).
void ReportUndefinedNames(const std::vector<NameUse>& uses, const OutputText& o,
                          std::vector<Diagnostic>& errors) {
  struct Found {
    SourceLoc pos;  ///< Path, line and column only.
    size_t use;
  };
  std::vector<Found> found;
  LineColCursor cursor(o.out, o.lines);
  for (size_t i = 0; i < uses.size(); ++i) {
    LineCol at = cursor.At(uses[i].offset);
    std::optional<SourceLoc> pos = o.Inserted(uses[i].offset, at, /*with_line=*/false);
    found.push_back({pos ? std::move(*pos) : SourceLoc{o.path, at.line, at.col, 1, {}}, i});
  }
  auto key = [](const Found& f) { return std::tie(f.pos.path, f.pos.line, f.pos.col); };
  std::stable_sort(found.begin(), found.end(),
                   [&](const Found& a, const Found& b) { return key(a) < key(b); });
  size_t shown = std::min(found.size(), kMaxDiagnosticsOfAKind);
  for (size_t k = 0; k < shown; ++k) {
    const NameUse& use = uses[found[k].use];
    SourceLoc at = o.At(use.offset);
    SourceLoc loc = o.Inserted(use.offset).value_or(at);
    loc.length = std::max<uint32_t>(
        1, CodePointCount(std::string_view(o.out).substr(use.offset, use.end - use.offset)));
    Diagnostic d = ErrorAt(loc, "undefined name '" + use.name + "' in inserted code",
                           "import it with `imports.add`, define it in `helpers:`, or map it "
                           "with `name_map`");
    d.notes.push_back(OutputText::GeneratedLine(at));
    if (k + 1 == shown && found.size() > shown) {
      d.notes.push_back(MoreOfAKind(found.size() - shown, "undefined names in inserted code"));
    }
    errors.push_back(std::move(d));
  }
}

/// A statement CPython rejects where tree-sitter accepts it, found in inserted code.
struct Misplaced {
  TSNode node;
  std::string message;
  std::string help;
};

bool IsFunctionDef(TSNode n) { return parser::Is(n, "function_definition"); }
bool IsAsyncDef(TSNode n) {
  return IsFunctionDef(n) && ts_node_child_count(n) > 0 && parser::Is(ts_node_child(n, 0), "async");
}
bool IsScopeBoundary(TSNode n) {
  return IsFunctionDef(n) || parser::Is(n, "class_definition") || parser::Is(n, "lambda") ||
         parser::Is(n, "module");
}

/// The nearest enclosing function, class, lambda or module of `n`.
TSNode EnclosingScope(TSNode n) {
  for (TSNode p = ts_node_parent(n); !ts_node_is_null(p); p = ts_node_parent(p)) {
    if (IsScopeBoundary(p)) return p;
  }
  return n;
}

/// True when `n` is in the body (not the `else`) of a loop of its own scope.
bool InLoopBody(TSNode n) {
  TSNode prev = n;
  for (TSNode p = ts_node_parent(n); !ts_node_is_null(p); prev = p, p = ts_node_parent(p)) {
    if (IsScopeBoundary(p)) return false;
    bool loop = parser::Is(p, "for_statement") || parser::Is(p, "while_statement");
    if (loop && ts_node_eq(parser::Field(p, "body"), prev)) return true;
  }
  return false;
}

/// What is wrong with `n` where it stands, if anything (return/await/break/continue).
std::optional<Misplaced> MisplacedStatement(TSNode n) {
  if (parser::Is(n, "return_statement") && !IsFunctionDef(EnclosingScope(n))) {
    return Misplaced{n, "'return' outside a function",
                     "Python rejects it (SyntaxError); `return` belongs in a def's body"};
  }
  if (ts_node_is_named(n) && parser::Is(n, "await") && !IsAsyncDef(EnclosingScope(n))) {
    return Misplaced{n, "'await' outside an async function",
                     "Python rejects it (SyntaxError); `await` belongs in an `async def` body"};
  }
  for (const char* kw : {"break", "continue"}) {
    if (parser::Is(n, (std::string(kw) + "_statement").c_str()) && !InLoopBody(n)) {
      return Misplaced{n, "'" + std::string(kw) + "' outside a loop",
                       "Python rejects it (SyntaxError); `" + std::string(kw) +
                           "` belongs in the body of a `for` or `while` loop of the same function"};
    }
  }
  return std::nullopt;
}

bool Overlaps(ByteRange r, const std::vector<ByteRange>& ranges) {
  return std::any_of(ranges.begin(), ranges.end(),
                     [&](ByteRange o) { return r.start < o.end && o.start < r.end; });
}

/// Misplaced statements inside `inserted`, walked without recursion (deep nesting is allowed).
std::vector<Misplaced> FindMisplaced(TSNode root, const std::vector<ByteRange>& inserted) {
  std::vector<Misplaced> out;
  std::vector<TSNode> stack{root};
  while (!stack.empty()) {
    TSNode n = stack.back();
    stack.pop_back();
    if (!Overlaps(parser::RangeOf(n), inserted)) continue;
    if (auto m = MisplacedStatement(n)) out.push_back(*m);
    for (uint32_t i = ts_node_child_count(n); i > 0; --i) stack.push_back(ts_node_child(n, i - 1));
  }
  return out;
}

/// True when top-level statement `n` may precede a `from __future__` import: a comment, another
/// future import, or the module docstring (`first`).
bool MayPrecedeFuture(TSNode n, bool first) {
  if (parser::Is(n, "comment") || parser::Is(n, "future_import_statement")) return true;
  return first && parser::Is(n, "expression_statement") && ts_node_named_child_count(n) == 1 &&
         (parser::Is(ts_node_named_child(n, 0), "string") ||
          parser::Is(ts_node_named_child(n, 0), "concatenated_string"));
}

/// `from __future__` imports that are not at the top of the module (Python rejects them): the
/// first statement before one that may not precede it, or the import itself when nested.
std::vector<Misplaced> FindMisplacedFuture(TSNode root, const std::vector<ByteRange>& inserted) {
  std::vector<Misplaced> out;
  const std::string help =
      "Python accepts `from __future__` imports only at the top of a module, after its docstring "
      "and other `from __future__` imports; add it with `imports.add`, which places it there";
  std::optional<TSNode> blocker;
  uint32_t statements = 0;
  for (uint32_t i = 0; i < ts_node_named_child_count(root); ++i) {
    TSNode n = ts_node_named_child(root, i);
    bool future = parser::Is(n, "future_import_statement");
    bool involved =
        future && blocker &&
        (Overlaps(parser::RangeOf(n), inserted) || Overlaps(parser::RangeOf(*blocker), inserted));
    if (involved) {
      TSNode at = Overlaps(parser::RangeOf(n), inserted) ? n : *blocker;
      out.push_back({at, "`from __future__` import after other statements", help});
    }
    if (!blocker && !MayPrecedeFuture(n, statements == 0)) blocker = n;
    if (!parser::Is(n, "comment")) ++statements;
  }
  std::vector<TSNode> stack{root};
  while (!stack.empty()) {
    TSNode n = stack.back();
    stack.pop_back();
    if (!Overlaps(parser::RangeOf(n), inserted)) continue;
    if (parser::Is(n, "future_import_statement") && !ts_node_eq(ts_node_parent(n), root)) {
      out.push_back({n, "`from __future__` import inside a block", help});
    }
    for (uint32_t i = ts_node_named_child_count(n); i > 0; --i) {
      stack.push_back(ts_node_named_child(n, i - 1));
    }
  }
  return out;
}

}  // namespace

parser::TreePtr ParseOutputTree(const parser::PyModule& upstream, const EditPlan& plan,
                                const std::string& out, uint32_t header_size) {
  // The edits grown to where the old tree can be reused again (reparse_edits.h), in upstream
  // coordinates, last first; the header is an insertion at 0.
  parser::TreePtr edited(ts_tree_copy(upstream.tree()));
  ApplyReparseEdits(
      edited.get(), upstream.lines(),
      ReparseEdits(upstream.source(), plan, std::string_view(out).substr(0, header_size)));
  TSParser* parser = ts_parser_new();
  ts_parser_set_language(parser, parser::PythonLanguage());
  parser::TreePtr tree(
      ts_parser_parse_string(parser, edited.get(), out.data(), static_cast<uint32_t>(out.size())));
  ts_parser_delete(parser);
  return tree;
}

namespace {

void AppendSignature(TSNode n, std::string& out) {
  TSPoint a = ts_node_start_point(n), b = ts_node_end_point(n);
  out += ts_node_type(n);
  out += ts_node_is_named(n) ? "" : "'";
  out += ts_node_is_missing(n) ? "!" : "";
  out += "[" + std::to_string(ts_node_start_byte(n)) + "," + std::to_string(ts_node_end_byte(n)) +
         " " + std::to_string(a.row) + ":" + std::to_string(a.column) + "-" +
         std::to_string(b.row) + ":" + std::to_string(b.column) + "](";
  uint32_t count = ts_node_child_count(n);
  for (uint32_t i = 0; i < count; ++i) AppendSignature(ts_node_child(n, i), out);
  out += ")";
}

}  // namespace

std::string TreeSignature(TSTree* tree) {
  std::string out;
  if (tree) AppendSignature(ts_tree_root_node(tree), out);
  return out;
}

std::vector<Diagnostic> CheckOutput(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                                    const EditPlan& plan, const std::string& out,
                                    uint32_t header_size,
                                    const std::vector<const spec::LocatedName*>& excluded,
                                    bool verify_incremental) {
  std::vector<Diagnostic> errors;
  parser::TreePtr tree = ParseOutputTree(upstream, plan, out, header_size);
  if (verify_incremental && tree && !ts_node_has_error(ts_tree_root_node(tree.get()))) {
    parser::TreePtr scratch = parser::ParseTree(out);
    if (TreeSignature(tree.get()) != TreeSignature(scratch.get())) {
      errors.push_back(ErrorAt(SourceLoc::InFile(spec.path),
                               "the incremental parse of the output differs from a parse from "
                               "scratch",
                               {}, ErrorKind::kInternal));
      return errors;
    }
  }
  // A parse error is located on a tree parsed from scratch: error recovery is the one place where
  // an incremental parse may build other ERROR nodes than a parse from scratch, and the message
  // must not depend on how the tree was made.
  if (tree && ts_node_has_error(ts_tree_root_node(tree.get()))) tree = parser::ParseTree(out);
  if (!tree) {
    errors.push_back(ErrorAt(SourceLoc::InFile(spec.path), "tree-sitter returned no tree", {},
                             ErrorKind::kInternal));
    return errors;
  }
  LineIndex lines(out);
  OutputText o{plan, out, lines, plan.OutputRanges(), header_size, spec.output};
  TSNode root = ts_tree_root_node(tree.get());
  if (auto err = parser::FirstErrorNode(root)) {
    uint32_t offset = ts_node_start_byte(*err);
    SourceLoc at = o.At(offset);
    std::optional<SourceLoc> spec_loc = o.Inserted(offset);
    Diagnostic d = ErrorAt(spec_loc ? *spec_loc : at, "generated code does not parse",
                           "check the indentation and completeness of the inserted code");
    if (spec_loc) {
      d.notes.push_back(Note::Text("at " + at.PathLineCol() + ": " + ShownLine(at)));
    }
    errors.push_back(std::move(d));
    return errors;
  }
  std::vector<ByteRange> inserted;
  for (const ByteRange& r : o.ranges) {
    if (!r.empty()) inserted.push_back({r.start + header_size, r.end + header_size});
  }
  ReportUndefinedNames(FindUnresolvedNames(root, out, inserted), o, errors);
  std::vector<Misplaced> misplaced = FindMisplaced(root, inserted);
  for (Misplaced& m : FindMisplacedFuture(root, inserted)) misplaced.push_back(std::move(m));
  size_t first_misplaced = errors.size();
  for (const Misplaced& m : misplaced) {
    uint32_t offset = ts_node_start_byte(m.node);
    SourceLoc at = o.At(offset);
    Diagnostic d = ErrorAt(o.Inserted(offset).value_or(at), m.message, m.help);
    d.notes.push_back(OutputText::GeneratedLine(at));
    errors.push_back(std::move(d));
  }
  CapDiagnostics(errors, first_misplaced, "statements Python rejects in inserted code");
  CheckRemovedNames(spec, excluded, root, o, errors);
  return errors;
}

}  // namespace patchgen::rewriter
