// Helpers shared by the generator's stages (stage.h).
#include "rewriter/stage.h"

#include <algorithm>

#include "base/text_util.h"
#include "base/unicode_nfkc.h"
#include "parser/py_cst_queries.h"
#include "parser/ts_node.h"
#include "rewriter/fingerprint.h"
#include "rewriter/reindent.h"
#include "rewriter/statements.h"
#include "spec/python_names.h"

namespace patchgen::rewriter {

using parser::Definition;
using parser::PyModule;
using parser::TopLevelStatement;

// ----- name_map ------------------------------------------------------------------------------

NameMap::NameMap(const std::vector<spec::NameMapEntry>& entries) {
  for (const spec::NameMapEntry& e : entries) uses_.push_back({&e, false, {}});
}

namespace {

/// The prefix of the UsedKeys() element that records a rename of `e` into a keyword.
std::string KeywordMark(const spec::NameMapEntry& e) { return "\x01keyword " + e.Key() + "\x01"; }

}  // namespace

std::optional<std::string> NameMap::Map(std::string_view name) {
  // As Python compares names (the entries are NFKC already): `ｆｏｏ` is mapped like `foo`.
  std::string key;
  name = IdentifierKeyView(name, key);
  for (Use& u : uses_) {
    if (!u.entry->prefix && u.entry->from == name) {
      u.used = true;
      return u.entry->to;
    }
  }
  Use* best = nullptr;
  for (Use& u : uses_) {
    if (!u.entry->prefix || !name.starts_with(u.entry->from)) continue;
    // `Qwen3_5*: Qwen3_5Moe*` leaves Qwen3_5MoeMLP alone: it is a name of the new family.
    if (u.entry->to.starts_with(u.entry->from) && name.starts_with(u.entry->to)) continue;
    if (!best || u.entry->from.size() > best->entry->from.size()) best = &u;
  }
  if (!best) return std::nullopt;
  best->used = true;
  std::string to = best->entry->to + std::string(name.substr(best->entry->from.size()));
  if (spec::IsPythonKeyword(to)) {  // never rename into a keyword: an error (ReportUnused)
    if (best->keyword_from.empty()) best->keyword_from = std::string(name);
    return std::nullopt;
  }
  return to;
}

std::string NameMap::MapDotted(const std::string& dotted) {
  std::string out;
  for (size_t pos = 0; pos <= dotted.size();) {
    size_t dot = std::min(dotted.find('.', pos), dotted.size());
    std::string part = dotted.substr(pos, dot - pos);
    if (std::optional<std::string> to = Map(part)) part = *to;
    out += (pos == 0 ? "" : ".") + part;
    pos = dot + 1;
  }
  return out;
}

std::set<std::string> NameMap::UsedKeys() const {
  std::set<std::string> out;
  for (const Use& u : uses_) {
    if (u.used) out.insert(u.entry->Key());
    // A rename into a keyword travels with the keys to the stage that reports (ReportUnused).
    if (!u.keyword_from.empty()) out.insert(KeywordMark(*u.entry) + u.keyword_from);
  }
  return out;
}

void NameMap::ReportUnused(const std::set<std::string>& used_elsewhere,
                           std::vector<Diagnostic>& errors) const {
  for (const Use& u : uses_) {
    std::string keyword_from = u.keyword_from;
    auto mark = used_elsewhere.lower_bound(KeywordMark(*u.entry));
    if (keyword_from.empty() && mark != used_elsewhere.end() &&
        mark->starts_with(KeywordMark(*u.entry))) {
      keyword_from = mark->substr(KeywordMark(*u.entry).size());
    }
    if (!keyword_from.empty()) {
      const spec::NameMapEntry& e = *u.entry;
      std::string to = e.to + keyword_from.substr(e.from.size());
      errors.push_back(
          ErrorAt(e.loc,
                  "name_map rule '" + e.Key() + "' renames '" + keyword_from +
                      "' to the Python keyword '" + to + "'",
                  "a keyword cannot be a name; map '" + keyword_from +
                      "' to a name of its own with a whole-name key, which wins over the rule"));
    }
    if (u.used || used_elsewhere.count(u.entry->Key())) continue;
    const spec::NameMapEntry& e = *u.entry;
    if (e.prefix) {
      errors.push_back(ErrorAt(
          e.loc, "name_map rule '" + e.Key() + "' is never used",
          "name_map renames identifiers in patch bodies, helpers, blocks and guard targets; "
          "none of them starts with '" +
              e.from + "'" +
              (e.to.starts_with(e.from)
                   ? " (identifiers that already start with '" + e.to + "' are left alone)"
                   : std::string())));
      continue;
    }
    errors.push_back(ErrorAt(e.loc, "name_map key '" + e.from + "' is never used",
                             "name_map renames identifiers in patch bodies, helpers, blocks and "
                             "guard targets; no identifier '" +
                                 e.from + "' appears in them"));
  }
}

// ----- code from a spec ----------------------------------------------------------------------

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

// ----- text ----------------------------------------------------------------------------------

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string TrimTrailingNewlines(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string Owner(const std::string& qualname) {
  size_t dot = qualname.rfind('.');
  return dot == std::string::npos ? "" : qualname.substr(0, dot);
}

std::string LastComponent(const std::string& qualname) {
  size_t dot = qualname.rfind('.');
  return dot == std::string::npos ? qualname : qualname.substr(dot + 1);
}

ByteRange WholeLines(const std::string& src, ByteRange r) {
  uint32_t start = LineStartOf(src, r.start);
  uint32_t end = LineEndOf(src, r.end);
  if (end < src.size()) ++end;
  return {start, end};
}

std::string SpliceRange(const std::string& src, ByteRange range,
                        std::vector<std::pair<ByteRange, std::string>> local) {
  std::sort(local.begin(), local.end(),
            [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
  std::string out;
  uint32_t cursor = range.start;
  for (const auto& [r, text] : local) {
    out.append(src, cursor, r.start - cursor);
    out += text;
    cursor = r.end;
  }
  out.append(src, cursor, range.end - cursor);
  return out;
}

std::vector<std::pair<ByteRange, std::string>> RemoveListItems(const std::vector<ByteRange>& items,
                                                               const std::vector<size_t>& removed) {
  std::vector<bool> gone(items.size(), false);
  for (size_t i : removed) gone[i] = true;
  size_t last_kept = items.size();
  for (size_t i = items.size(); i-- > 0;) {
    if (!gone[i]) {
      last_kept = i;
      break;
    }
  }
  std::vector<std::pair<ByteRange, std::string>> out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!gone[i]) continue;
    if (i < last_kept) {
      out.push_back({{items[i].start, items[i + 1].start}, ""});
    } else {
      out.push_back({{items[last_kept].end, items.back().end}, ""});
      break;
    }
  }
  return out;
}

const TopLevelStatement* TopLevelBinding(const PyModule& up, const std::string& name) {
  for (const TopLevelStatement& s : up.top_level()) {
    if (s.kind != TopLevelStatement::Kind::kClass && s.kind != TopLevelStatement::Kind::kFunction &&
        s.kind != TopLevelStatement::Kind::kAssignment) {
      continue;
    }
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) return &s;
  }
  return nullptr;
}

Diagnostic MissingTopLevel(const PyModule& up, const SourceLoc& loc, const std::string& context,
                           const std::string& name) {
  std::vector<std::string> names;
  for (const TopLevelStatement& s : up.top_level()) {
    if (s.kind == TopLevelStatement::Kind::kImport || s.kind == TopLevelStatement::Kind::kOther) {
      continue;
    }
    names.insert(names.end(), s.names.begin(), s.names.end());
  }
  std::string help = DidYouMeanOr(name, names, "top-level definitions: " + JoinNames(names));
  return ErrorAt(loc,
                 context + ": no top-level definition or assignment '" + name + "' in " + up.path(),
                 help);
}

ContractPin MakePin(const PyModule& up, std::string key, std::string region, std::string expects,
                    std::string qualname, const SourceLoc& loc,
                    const std::vector<ByteRange>& ranges, const std::vector<ByteRange>& skip) {
  ContractPin pin{std::move(key),
                  std::move(region),
                  std::move(expects),
                  std::move(qualname),
                  loc,
                  0,
                  0,
                  {},
                  {}};
  Fingerprint fp = ranges.empty() ? AbsentFingerprint() : FingerprintOf(up, ranges, skip);
  if (!ranges.empty()) {
    pin.first_line = up.lines().LineOf(ranges.front().start) + 1;
    uint32_t last = 0;
    for (const ByteRange& r : ranges) {
      last = std::max(last, up.lines().LineOf(r.end > r.start ? r.end - 1 : r.start) + 1);
    }
    pin.last_line = last;
  }
  pin.sha256 = std::move(fp.sha256);
  pin.text = std::move(fp.text);
  return pin;
}

}  // namespace patchgen::rewriter
