// Code from a spec or a patch file, ready to splice (snippet.h).
#include "rewriter/snippet.h"

#include "base/text_util.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"
#include "rewriter/reindent.h"
#include "rewriter/statements.h"
#include "rewriter/text_splice.h"

namespace patchgen::rewriter {

using parser::Definition;
using parser::PyModule;
using parser::TopLevelStatement;

TextEdit SnippetEdit(ByteRange range, const std::string& prefix, const Snippet& s,
                     const std::string& suffix, SourceLoc origin, std::string what) {
  TextEdit e;
  e.range = range;
  e.text = prefix + s.text + suffix;
  e.origin = std::move(origin);
  e.what = std::move(what);
  e.code = CodeSpan{static_cast<uint32_t>(prefix.size()),
                    static_cast<uint32_t>(prefix.size() + s.text.size()), s.origin, s.first_line,
                    s.col_shift};
  return e;
}

SourceLoc OriginLoc(const spec::TextOrigin& o, uint32_t line0, uint32_t col, uint32_t length) {
  SourceLoc loc;
  loc.path = o.path;
  loc.line = o.first_line + line0;
  loc.col = col + o.col_offset;
  loc.length = length;
  if (o.file_text && loc.line >= 1) {
    // Line `loc.line` of the file, found without splitting the whole file (a spec may locate
    // thousands of names), and kept only as far as an excerpt shows it.
    std::string_view text = *o.file_text;
    size_t start = 0;
    for (uint32_t l = 1; l < loc.line && start != std::string_view::npos; ++l) {
      start = text.find('\n', start);
      if (start != std::string_view::npos) ++start;
    }
    if (start != std::string_view::npos && start < text.size()) {
      size_t end = std::min(text.find('\n', start), text.size());
      SetSourceLine(loc, text.substr(start, end - start));
    }
  }
  return loc;
}

std::unique_ptr<PyModule> ParseCode(const std::string& text, const spec::TextOrigin& origin,
                                    std::vector<Diagnostic>& errors) {
  auto parsed = PyModule::Parse(origin.path, text);
  if (parsed) return std::move(parsed.value());
  for (Diagnostic d : parsed.errors()) {
    if (d.loc.line > 0) d.loc = OriginLoc(origin, d.loc.line - 1, d.loc.col, d.loc.length);
    d.kind = ErrorKind::kSpec;
    d.loc.path = origin.path;
    if (d.message.starts_with("cannot parse Python: ")) {
      d.message = "code does not parse: " + d.message.substr(21);
    }
    d.help = "the code must be valid Python on its own";
    errors.push_back(std::move(d));
  }
  return nullptr;
}

namespace {

/// True when identifier `r` is the name of a keyword argument (`f(name=...)`).
bool IsKeywordArgumentName(const PyModule& m, ByteRange r) {
  TSNode n = ts_node_descendant_for_byte_range(m.root(), r.start, r.end);
  TSNode parent = ts_node_parent(n);
  return !ts_node_is_null(parent) && parser::Is(parent, "keyword_argument") &&
         ts_node_eq(parser::Field(parent, "name"), n);
}

/// The name_map renames of the identifiers of `m` in `region` (the def/class name being renamed
/// to the target's, `rename`, excepted).
void CollectRenames(const PyModule& m, ByteRange region, Renames renames,
                    const std::optional<std::pair<ByteRange, std::string>>& rename,
                    std::vector<std::pair<ByteRange, std::string>>& out) {
  for (ByteRange r : parser::IdentifiersIn(m.root(), region)) {
    if (rename && rename->first == r) continue;
    if (IsKeywordArgumentName(m, r)) continue;  // names the callee's parameter, not the binding
    std::string_view text = m.Text(r);
    // Patch-level entries win over spec-level ones.
    for (NameMap* map : {renames.patch, renames.spec}) {
      if (!map) continue;
      if (std::optional<std::string> to = map->Map(text)) {
        out.push_back({r, *to});
        break;
      }
    }
  }
}

}  // namespace

Snippet MakeSnippet(const PyModule& m, ByteRange region, const spec::TextOrigin& origin,
                    Renames renames, std::optional<std::pair<ByteRange, std::string>> rename,
                    size_t column) {
  uint32_t start = LineStartOf(m.source(), region.start);
  // A comment after the region's last statement, on its line, belongs to it (tree-sitter ends a
  // definition before that comment).
  if (EndsLine(m, region.end)) region.end = LineEndOf(m.source(), region.end);
  std::vector<std::pair<ByteRange, std::string>> edits;
  if (rename) edits.push_back(*rename);
  CollectRenames(m, {start, region.end}, renames, rename, edits);
  std::string text = SpliceRange(m.source(), {start, region.end}, std::move(edits));
  Snippet s;
  size_t common = CommonIndent(text);
  s.text = TrimTrailingNewlines(ReindentTo(text, column));
  s.origin = origin;
  s.first_line = origin.first_line + m.lines().LineOf(start);
  s.col_shift = static_cast<int32_t>(column) - static_cast<int32_t>(common) -
                static_cast<int32_t>(origin.col_offset);
  return s;
}

Snippet WholeSnippet(const PyModule& m, const spec::TextOrigin& origin, Renames renames,
                     size_t column) {
  return MakeSnippet(m, {0, static_cast<uint32_t>(m.source().size())}, origin, renames,
                     std::nullopt, column);
}

const Definition* BodyDefinition(const PyModule& m, const spec::Body& body, const std::string& what,
                                 std::vector<Diagnostic>& errors) {
  if (body.source == spec::Body::Source::kFile) {
    const Definition* def = m.FindTopLevel(body.symbol);
    if (!def) {
      std::string help = WithDidYouMean(
          body.symbol, m.TopLevelNames(),
          "top-level definitions in " + body.origin.path + ": " + JoinNames(m.TopLevelNames()));
      errors.push_back(ErrorAt(
          body.symbol_loc, "no def or class '" + body.symbol + "' in " + body.origin.path, help));
    }
    return def;
  }
  size_t defs = 0;
  const Definition* def = nullptr;
  for (const TopLevelStatement& s : m.top_level()) {
    if (s.definition >= 0) {
      ++defs;
      def = &m.definitions()[static_cast<size_t>(s.definition)];
    }
  }
  if (defs == 1 && m.top_level().size() == 1) return def;
  errors.push_back(ErrorAt(body.loc,
                           "code of " + what + " must hold exactly one def or class; found " +
                               std::to_string(m.top_level().size()) + " top-level statement(s)",
                           "put other definitions into `helpers:`, imports into `imports.add`"));
  return nullptr;
}

}  // namespace patchgen::rewriter
