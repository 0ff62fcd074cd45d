// The imports stage: relative imports made absolute, `imports.drop` names removed.
#include "base/text_util.h"
#include "parser/tree_queries.h"
#include "rewriter/stages.h"

namespace patchgen::rewriter {
namespace {

using parser::Import;
using parser::PyModule;

/// Package of the upstream module: the module's parent, or the module itself for `__init__`.
std::vector<std::string> UpstreamPackage(const std::string& upstream,
                                         const std::string& upstream_path) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (true) {
    size_t dot = upstream.find('.', pos);
    parts.push_back(upstream.substr(pos, dot - pos));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  bool is_init = upstream_path.size() >= 11 && upstream_path.ends_with("__init__.py");
  if (!is_init) parts.pop_back();
  return parts;
}

/// `from ..x import y` -> the absolute module; nullopt (and an error) when it climbs too high.
std::optional<std::string> AbsoluteModule(const spec::PatchSpec& spec, const PyModule& up,
                                          const std::string& upstream_path, const Import& imp,
                                          std::vector<Diagnostic>& errors) {
  std::vector<std::string> base = UpstreamPackage(spec.upstream, upstream_path);
  size_t levels = static_cast<size_t>(imp.relative_level - 1);
  if (levels >= base.size()) {
    errors.push_back(MakeDiagnostic(up.path(), up.source(), up.lines(), imp.module,
                                    "relative import climbs above the top package '" +
                                        (base.empty() ? spec.upstream : base.front()) + "'",
                                    "module '" + spec.upstream + "' is only " +
                                        std::to_string(base.size()) +
                                        " package level(s) deep; check `upstream:` in " + spec.path,
                                    ErrorKind::kUpstream));
    return std::nullopt;
  }
  base.resize(base.size() - levels);
  std::string out;
  for (const std::string& p : base) out += (out.empty() ? "" : ".") + p;
  // The module part as upstream wrote it (`module_name` is held in NFKC, as Python compares
  // names): the rewrite changes only the leading dots.
  std::string_view written = up.Text(imp.module);
  written.remove_prefix(std::min(written.size(), written.find_first_not_of('.')));
  written.remove_prefix(std::min(written.size(), written.find_first_not_of(" \t\n\r\f\v")));
  if (!written.empty()) out += "." + std::string(written);
  return out;
}

std::string BoundName(const parser::ImportedName& n) { return n.alias.empty() ? n.name : n.alias; }

/// The import statement with names `dropped` removed (keeping the formatting of the rest) and
/// the module part made absolute.
std::string RebuildImport(const PyModule& up, const Import& imp, const std::vector<size_t>& dropped,
                          const std::optional<std::string>& absolute) {
  std::vector<ByteRange> items;
  for (const auto& n : imp.names) items.push_back(n.range);
  std::vector<std::pair<ByteRange, std::string>> local = RemoveListItems(items, dropped);
  if (absolute) local.push_back({imp.module, *absolute});
  return SpliceRange(up.source(), imp.stmt, local);
}

void ReportUnusedDrop(const PyModule& up, const spec::LocatedName& drop,
                      std::vector<Diagnostic>& errors) {
  std::vector<std::string> names;
  for (const Import& imp : up.imports()) {
    for (const auto& n : imp.names) names.push_back(BoundName(n));
  }
  std::string help =
      DidYouMeanOr(drop.name, names, "imports.drop removes names imported by the upstream module");
  errors.push_back(
      ErrorAt(drop.loc, "imports.drop: '" + drop.name + "' is not imported in " + up.path(), help));
}

/// The names of one import statement that `imports.drop` entries match (by alias or by the name
/// as written), ascending, and the first matching entry (it names the edit).
struct DropMatch {
  std::vector<size_t> names;
  const spec::LocatedName* first = nullptr;
};

/// Matches the drops against `imp`, marking in `used` the drops that match.
DropMatch MatchDrops(const Import& imp, const std::vector<spec::LocatedName>& drops,
                     std::vector<bool>& used) {
  DropMatch m;
  for (size_t n = 0; n < imp.names.size(); ++n) {
    for (size_t d = 0; d < drops.size(); ++d) {
      if (drops[d].name != BoundName(imp.names[n]) && drops[d].name != imp.names[n].name) continue;
      used[d] = true;
      if (!m.first) m.first = &drops[d];
      if (m.names.empty() || m.names.back() != n) m.names.push_back(n);
    }
  }
  return m;
}

/// The edit of one import statement: its module made absolute, or names dropped (the whole
/// statement when all of them are: its lines go, or `pass` keeps its block alive); none when
/// neither applies.
std::optional<TextEdit> ImportEdit(const spec::PatchSpec& spec, const PyModule& up,
                                   const Import& imp, const DropMatch& drop,
                                   const std::optional<std::string>& absolute) {
  if (drop.names.empty()) {
    if (!absolute) return std::nullopt;
    return TextEdit{
        imp.module, *absolute, spec.upstream_loc,
        "relative import at " +
            SourceLoc::AtLine(up.path(), up.lines().At(imp.module.start).line).PathLine(),
        std::nullopt};
  }
  std::string what = "imports.drop " + drop.first->name;
  if (drop.names.size() < imp.names.size()) {
    return TextEdit{imp.stmt, RebuildImport(up, imp, drop.names, absolute), drop.first->loc, what,
                    std::nullopt};
  }
  if (parser::OnlyStatementInBlock(up, imp.stmt)) {  // `pass` keeps the block alive
    return TextEdit{imp.stmt, "pass", drop.first->loc, what, std::nullopt};
  }
  return TextEdit{WholeLines(up.source(), imp.stmt), "", drop.first->loc, what, std::nullopt};
}

/// True when top-level statement `t` of `m` is a string on its own (the module docstring when
/// first).
bool IsDocstring(const PyModule& m, const parser::TopLevelStatement& t) {
  std::string_view text = m.Text(t.range);
  size_t quote = text.find_first_of("\"'");
  return t.kind == parser::TopLevelStatement::Kind::kOther && quote != std::string_view::npos &&
         quote <= 3 && text.find_first_not_of("rRbBuUfF") == quote;
}

}  // namespace

FutureAnchor AfterFutureImports(const PyModule& up) {
  const std::string& src = up.source();
  std::optional<uint32_t> at;
  for (const Import& imp : up.imports()) {
    if (imp.depth == 0 && imp.kind == Import::Kind::kFuture) at = LineEndOf(src, imp.stmt.end);
  }
  if (at) return {*at, false};
  if (up.top_level().empty()) return {static_cast<uint32_t>(src.size()), true};
  const parser::TopLevelStatement& first = up.top_level().front();
  if (IsDocstring(up, first)) return {LineEndOf(src, first.range.end), false};
  return {LineStartOf(src, first.range.start), true};
}

std::optional<bool> OnlyFutureImports(const PyModule& m) {
  size_t future = 0;
  for (const Import& imp : m.imports()) future += imp.kind == Import::Kind::kFuture ? 1 : 0;
  if (future == 0) return false;
  if (future == m.imports().size() && future == m.top_level().size()) return true;
  return std::nullopt;
}

ImportsStage PlanImports(const spec::PatchSpec& spec, const PyModule& up,
                         const std::string& upstream_path) {
  ImportsStage st;
  std::vector<bool> drop_used(spec.import_drops.size(), false);
  for (size_t i = 0; i < up.imports().size(); ++i) {
    const Import& imp = up.imports()[i];
    DropMatch drop = MatchDrops(imp, spec.import_drops, drop_used);
    std::optional<std::string> absolute;
    if (imp.kind == Import::Kind::kFrom && imp.relative_level > 0) {
      absolute = AbsoluteModule(spec, up, upstream_path, imp, st.out.errors);
      if (!absolute) continue;
    }
    if (std::optional<TextEdit> edit = ImportEdit(spec, up, imp, drop, absolute)) {
      st.out.edits.push_back(std::move(*edit));
    }
    if (!drop.names.empty() && drop.names.size() == imp.names.size()) st.removed_imports.insert(i);
  }
  for (size_t d = 0; d < spec.import_drops.size(); ++d) {
    if (drop_used[d]) st.out.applied.push_back({"imports.drop", spec.import_drops[d].name, ""});
  }
  for (size_t d = 0; d < spec.import_drops.size(); ++d) {
    if (!drop_used[d]) ReportUnusedDrop(up, spec.import_drops[d], st.out.errors);
  }
  return st;
}

}  // namespace patchgen::rewriter
