// Generate: builds the EditPlan for one spec against one upstream module, applies it, prepends
// the header and validates the output. docs/rewriter.md describes the output layout; every
// placement rule below is written there too.
#include "rewriter/generate.h"

#include <tree_sitter/api.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/text_util.h"
#include "parser/ts_node.h"
#include "rewriter/edit_plan.h"
#include "rewriter/fingerprint.h"
#include "rewriter/guards.h"
#include "rewriter/name_resolution.h"
#include "rewriter/reindent.h"
#include "rewriter/sha256.h"
#include "rewriter/statements.h"
#include "spec/version_condition.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::Import;
using parser::PyModule;
using parser::TopLevelStatement;
using spec::Body;
using spec::NameMapEntry;
using spec::Patch;
using spec::PatchKind;
using spec::StatementEdit;
using spec::TextOrigin;

using parser::Field;
using parser::Is;
using parser::RangeOf;

/// One line for headers and markers: newlines folded, non-ASCII kept (the output is UTF-8).
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

/// The smallest named node exactly covering `r` (walking up from the deepest one).
TSNode NodeAt(TSNode root, ByteRange r) {
  TSNode n = ts_node_named_descendant_for_byte_range(root, r.start, r.end);
  while (!ts_node_is_null(ts_node_parent(n)) &&
         (ts_node_start_byte(n) > r.start || ts_node_end_byte(n) < r.end)) {
    n = ts_node_parent(n);
  }
  return n;
}

/// The function_definition / class_definition node of `def`.
TSNode DefNode(const PyModule& m, const Definition& def) {
  TSNode n = ts_node_descendant_for_byte_range(m.root(), def.header.start, def.header.start + 1);
  while (!ts_node_is_null(n) &&
         !((Is(n, "function_definition") || Is(n, "class_definition")) &&
           ts_node_start_byte(n) == def.header.start)) {
    n = ts_node_parent(n);
  }
  return n;
}

/// `path:line` of a spec location, for markers and notes.
std::string Where(const SourceLoc& loc) { return loc.path + ":" + std::to_string(loc.line); }

/// A location inside code text: line `line0` (0-based, of the text), 1-based column `col`.
SourceLoc OriginLoc(const TextOrigin& o, uint32_t line0, uint32_t col, uint32_t length = 1) {
  SourceLoc loc;
  loc.path = o.path;
  loc.line = o.first_line + line0;
  loc.col = col + o.col_offset;
  loc.length = length;
  if (o.file_text) {
    std::vector<std::string_view> lines = SplitLines(*o.file_text);
    if (loc.line >= 1 && loc.line <= lines.size()) loc.source_line = std::string(lines[loc.line - 1]);
  }
  return loc;
}

/// Code taken from a body, ready to splice: re-indented lines (no final newline) and where
/// they came from.
struct Snippet {
  std::string text;
  TextOrigin origin;
  uint32_t first_line = 1;
  int32_t col_shift = 0;
};

/// Text with `prefix` in front of a snippet, as a TextEdit whose CodeSpan covers the snippet.
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

/// A name_map entry and whether anything used it (unused keys and rules are errors).
struct MapUse {
  const NameMapEntry* entry;
  bool used;
};

/// The new name of identifier `name` under `map` (marking the rule used), or nullopt. A whole-
/// name key wins over prefix rules, a longer prefix over a shorter one; when a rule's new prefix
/// extends the old one, an identifier that already starts with the new prefix is left alone.
std::optional<std::string> MapName(std::vector<MapUse>& map, std::string_view name) {
  for (MapUse& u : map) {
    if (!u.entry->prefix && u.entry->from == name) {
      u.used = true;
      return u.entry->to;
    }
  }
  MapUse* best = nullptr;
  for (MapUse& u : map) {
    if (!u.entry->prefix || !name.starts_with(u.entry->from)) continue;
    // `Qwen3_5*: Qwen3_5Moe*` leaves Qwen3_5MoeMLP alone: it is a name of the new family.
    if (u.entry->to.starts_with(u.entry->from) && name.starts_with(u.entry->to)) continue;
    if (!best || u.entry->from.size() > best->entry->from.size()) best = &u;
  }
  if (!best) return std::nullopt;
  best->used = true;
  return best->entry->to + std::string(name.substr(best->entry->from.size()));
}

/// `A.B.m` with every dotted component mapped by `map` (spec-level name_map on targets).
std::string MapDotted(std::vector<MapUse>& map, const std::string& dotted) {
  std::string out;
  for (size_t pos = 0; pos <= dotted.size();) {
    size_t dot = std::min(dotted.find('.', pos), dotted.size());
    std::string part = dotted.substr(pos, dot - pos);
    if (std::optional<std::string> to = MapName(map, part)) part = *to;
    out += (pos == 0 ? "" : ".") + part;
    pos = dot + 1;
  }
  return out;
}

class Generator {
 public:
  /// `used_keys`: name_map keys already used (by patch targets, mapped before generation).
  Generator(const spec::PatchSpec& spec, const PyModule& up, const GenerateOptions& options,
            std::vector<SkippedEntry> skipped, const std::set<std::string>& used_keys)
      : spec_(spec), up_(up), src_(up.source()), options_(options), skipped_(std::move(skipped)) {
    for (const NameMapEntry& e : spec.name_map) spec_map_.push_back({&e, used_keys.count(e.Key()) > 0});
    // A name_map key that only a version-skipped guard's target uses is not unused.
    for (const SkippedEntry& sk : skipped_) {
      if (sk.kind != "guard") continue;
      for (size_t pos = 0; pos <= sk.target.size();) {
        size_t dot = std::min(sk.target.find('.', pos), sk.target.size());
        std::string part = sk.target.substr(pos, dot - pos);
        MapName(spec_map_, part);
        pos = dot + 1;
      }
    }
  }

  Result<GenerateResult> Run() {
    PlanImports();
    CheckNestedInReplaced();
    for (const Patch& p : spec_.patches) {
      if (p.when.optional) {
        if (std::optional<std::string> why = PatchAbsent(p)) {
          skipped_.push_back({PatchKindKey(p.kind), p.target,
                              *why + (p.when.reason.empty() ? "" : "; " + p.when.reason), p.loc});
          continue;
        }
      }
      PlanPatch(p);
      PinPatch(p);
    }
    PlanGuardsAndConflicts();
    AddStatementEdits();
    FindSlotsWithoutGuards();
    PlanInsertionsAfterImports();
    PlanHelpersAfter();
    PlanExcludes();
    for (const MapUse& u : spec_map_) ReportUnusedKey(u);
    if (!errors_.empty()) return Finish();
    std::vector<Diagnostic> overlaps = plan_.Validate();
    if (!overlaps.empty()) {
      errors_ = std::move(overlaps);
      return Finish();
    }
    GenerateResult result;
    result.upstream_sha256 = Sha256Hex(src_);
    result.applied = applied_;
    std::stable_sort(skipped_.begin(), skipped_.end(),
                     [](const SkippedEntry& a, const SkippedEntry& b) {
                       return std::tie(a.loc.path, a.loc.line) < std::tie(b.loc.path, b.loc.line);
                     });
    result.skipped = skipped_;
    result.contract = contract_;
    std::string header = Header(result.upstream_sha256);
    result.text = header + plan_.Apply(src_);
    ValidateOutput(result.text, static_cast<uint32_t>(header.size()));
    if (!errors_.empty()) return Finish();
    return result;
  }

 private:
  Result<GenerateResult> Finish() {
    SortDiagnostics(errors_);
    return errors_;
  }

  void Error(const SourceLoc& loc, std::string message, std::string help = {},
             ErrorKind kind = ErrorKind::kSpec) {
    errors_.push_back(ErrorAt(loc, std::move(message), std::move(help), kind));
  }

  void ReportUnusedKey(const MapUse& u) {
    if (u.used) return;
    if (u.entry->prefix) {
      Error(u.entry->loc, "name_map rule '" + u.entry->Key() + "' is never used",
            "name_map renames identifiers in patch bodies, helpers, blocks and guard targets; "
            "none of them starts with '" + u.entry->from + "'" +
                (u.entry->to.starts_with(u.entry->from)
                     ? " (identifiers that already start with '" + u.entry->to + "' are left alone)"
                     : std::string()));
      return;
    }
    Error(u.entry->loc, "name_map key '" + u.entry->from + "' is never used",
          "name_map renames identifiers in patch bodies, helpers, blocks and guard targets; "
          "no identifier '" +
              u.entry->from + "' appears in them");
  }

  /// End of the line holding `offset` (its '\n', or the end of the file): edits after a
  /// statement go there, so a trailing `# comment` stays with its statement.
  uint32_t LineEndOf(uint32_t offset) const { return patchgen::LineEndOf(src_, offset); }

  // ----- imports -------------------------------------------------------------------------

  /// Package of the upstream module: the module's parent, or the module itself for `__init__`.
  std::vector<std::string> UpstreamPackage() const {
    std::vector<std::string> parts;
    size_t pos = 0;
    while (true) {
      size_t dot = spec_.upstream.find('.', pos);
      parts.push_back(spec_.upstream.substr(pos, dot - pos));
      if (dot == std::string::npos) break;
      pos = dot + 1;
    }
    bool is_init = options_.upstream_path.size() >= 11 &&
                   options_.upstream_path.ends_with("__init__.py");
    if (!is_init) parts.pop_back();
    return parts;
  }

  /// `from ..x import y` -> the absolute module; nullopt (and an error) when it climbs too high.
  std::optional<std::string> AbsoluteModule(const Import& imp) {
    std::vector<std::string> base = UpstreamPackage();
    size_t up = static_cast<size_t>(imp.relative_level - 1);
    if (up >= base.size()) {
      errors_.push_back(MakeDiagnostic(
          up_.path(), src_, up_.lines(), imp.module,
          "relative import climbs above the top package '" +
              (base.empty() ? spec_.upstream : base.front()) + "'",
          "module '" + spec_.upstream + "' is only " + std::to_string(base.size()) +
              " package level(s) deep; check `upstream:` in " + spec_.path,
          ErrorKind::kUpstream));
      return std::nullopt;
    }
    base.resize(base.size() - up);
    std::string out;
    for (const std::string& p : base) out += (out.empty() ? "" : ".") + p;
    if (!imp.module_name.empty()) out += "." + imp.module_name;
    return out;
  }

  static std::string BoundName(const parser::ImportedName& n) {
    return n.alias.empty() ? n.name : n.alias;
  }

  /// True when the statement at `r` is the only statement of its block (removing it would leave
  /// the block empty, so it is replaced by `pass`).
  bool OnlyStatementInBlock(ByteRange r) const {
    TSNode n = NodeAt(up_.root(), r);
    TSNode block = ts_node_parent(n);
    if (ts_node_is_null(block) || !Is(block, "block")) return false;
    uint32_t statements = 0;
    for (uint32_t i = 0; i < ts_node_named_child_count(block); ++i) {
      if (!Is(ts_node_named_child(block, i), "comment")) ++statements;
    }
    return statements == 1;
  }

  /// Range that removes whole lines `r` lies on, with its newline.
  ByteRange WholeLines(ByteRange r) const {
    uint32_t start = LineStartOf(src_, r.start);
    uint32_t end = LineEndOf(r.end);
    if (end < src_.size()) ++end;
    return {start, end};
  }

  void PlanImports() {
    std::vector<bool> drop_used(spec_.import_drops.size(), false);
    for (size_t i = 0; i < up_.imports().size(); ++i) {
      const Import& imp = up_.imports()[i];
      std::vector<size_t> dropped;
      const spec::LocatedName* first_drop = nullptr;
      for (size_t n = 0; n < imp.names.size(); ++n) {
        for (size_t d = 0; d < spec_.import_drops.size(); ++d) {
          const std::string& name = spec_.import_drops[d].name;
          if (name == BoundName(imp.names[n]) || name == imp.names[n].name) {
            drop_used[d] = true;
            if (!first_drop) first_drop = &spec_.import_drops[d];
            if (dropped.empty() || dropped.back() != n) dropped.push_back(n);
          }
        }
      }
      std::optional<std::string> absolute;
      if (imp.kind == Import::Kind::kFrom && imp.relative_level > 0) {
        absolute = AbsoluteModule(imp);
        if (!absolute) continue;
      }
      if (dropped.empty()) {
        if (absolute) {
          plan_.Add(TextEdit{imp.module, *absolute, spec_.upstream_loc,
                             "relative import at " + up_.path() + ":" +
                                 std::to_string(up_.lines().At(imp.module.start).line),
                             std::nullopt});
        }
        continue;
      }
      std::string what = "imports.drop " + first_drop->name;
      if (dropped.size() == imp.names.size()) {
        if (OnlyStatementInBlock(imp.stmt)) {
          plan_.Add(TextEdit{imp.stmt, "pass", first_drop->loc, what, std::nullopt});
        } else {
          plan_.Add(TextEdit{WholeLines(imp.stmt), "", first_drop->loc, what, std::nullopt});
        }
        removed_imports_.insert(i);
        continue;
      }
      plan_.Add(TextEdit{imp.stmt, RebuildImport(imp, dropped, absolute), first_drop->loc, what,
                         std::nullopt});
    }
    for (size_t d = 0; d < spec_.import_drops.size(); ++d) {
      if (drop_used[d]) applied_.push_back({"imports.drop", spec_.import_drops[d].name, ""});
    }
    for (size_t d = 0; d < spec_.import_drops.size(); ++d) {
      if (drop_used[d]) continue;
      std::vector<std::string> names;
      for (const Import& imp : up_.imports()) {
        for (const auto& n : imp.names) names.push_back(BoundName(n));
      }
      std::string help = "imports.drop removes names imported by the upstream module";
      if (auto dym = DidYouMean(spec_.import_drops[d].name, names)) {
        help = "did you mean '" + *dym + "'?";
      }
      Error(spec_.import_drops[d].loc,
            "imports.drop: '" + spec_.import_drops[d].name + "' is not imported in " +
                up_.path(),
            help);
    }
  }

  /// The import statement with names `dropped` removed (keeping the formatting of the rest) and
  /// the module part made absolute.
  std::string RebuildImport(const Import& imp, const std::vector<size_t>& dropped,
                            const std::optional<std::string>& absolute) const {
    std::vector<ByteRange> items;
    for (const auto& n : imp.names) items.push_back(n.range);
    std::vector<std::pair<ByteRange, std::string>> local = RemoveListItems(items, dropped);
    if (absolute) local.push_back({imp.module, *absolute});
    return Splice(imp.stmt, local);
  }

  /// Ranges that remove `items[i]` for i in `removed` (sorted; not all of them) from a
  /// comma-separated list, with their separators, so that the rest keeps its layout.
  static std::vector<std::pair<ByteRange, std::string>> RemoveListItems(
      const std::vector<ByteRange>& items, const std::vector<size_t>& removed) {
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

  /// `range` of upstream with `local` replacements (sorted, disjoint) applied.
  std::string Splice(ByteRange range, std::vector<std::pair<ByteRange, std::string>> local) const {
    std::sort(local.begin(), local.end(),
              [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
    std::string out;
    uint32_t cursor = range.start;
    for (const auto& [r, text] : local) {
      out.append(src_, cursor, r.start - cursor);
      out += text;
      cursor = r.end;
    }
    out.append(src_, cursor, range.end - cursor);
    return out;
  }

  // ----- bodies ----------------------------------------------------------------------------

  /// Parses code from a spec or patch file; a syntax error is reported at its place there.
  std::unique_ptr<PyModule> ParseCode(const std::string& text, const TextOrigin& origin) {
    auto parsed = PyModule::Parse(origin.path, text);
    if (parsed) return std::move(parsed.value());
    for (Diagnostic d : parsed.errors()) {
      if (d.line > 0) {
        SourceLoc loc = OriginLoc(origin, d.line - 1, d.col, d.length);
        d.line = loc.line;
        d.col = loc.col;
        d.source_line = loc.source_line;
      }
      d.kind = ErrorKind::kSpec;
      d.path = origin.path;
      if (d.message.starts_with("cannot parse Python: ")) {
        d.message = "code does not parse: " + d.message.substr(21);
      }
      d.help = "the code must be valid Python on its own";
      errors_.push_back(std::move(d));
    }
    return nullptr;
  }

  /// Renames identifiers in `region` of `m` (name_map keys; `rename` for one node) and
  /// re-indents the region's lines to `column`.
  Snippet MakeSnippet(const PyModule& m, ByteRange region, const TextOrigin& origin,
                      std::vector<MapUse>* patch_map,
                      std::optional<std::pair<ByteRange, std::string>> rename, size_t column) {
    uint32_t start = LineStartOf(m.source(), region.start);
    // A comment after the region's last statement, on its line, belongs to it (tree-sitter ends a
    // definition before that comment).
    if (EndsLine(m, region.end)) region.end = patchgen::LineEndOf(m.source(), region.end);
    std::vector<std::pair<ByteRange, std::string>> edits;
    if (rename) edits.push_back(*rename);
    CollectRenames(m.root(), m, {start, region.end}, patch_map, rename, edits);
    std::sort(edits.begin(), edits.end(),
              [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
    std::string text;
    uint32_t cursor = start;
    for (const auto& [r, t] : edits) {
      text.append(m.source(), cursor, r.start - cursor);
      text += t;
      cursor = r.end;
    }
    text.append(m.source(), cursor, region.end - cursor);
    Snippet s;
    size_t common = CommonIndent(text);
    s.text = TrimTrailingNewlines(ReindentTo(text, column));
    s.origin = origin;
    s.first_line = origin.first_line + m.lines().LineOf(start);
    s.col_shift = static_cast<int32_t>(column) - static_cast<int32_t>(common) -
                  static_cast<int32_t>(origin.col_offset);
    return s;
  }

  void CollectRenames(TSNode node, const PyModule& m, ByteRange region,
                      std::vector<MapUse>* patch_map,
                      const std::optional<std::pair<ByteRange, std::string>>& rename,
                      std::vector<std::pair<ByteRange, std::string>>& out) {
    ByteRange r = RangeOf(node);
    if (r.end <= region.start || r.start >= region.end) return;
    if (Is(node, "identifier")) {
      if (rename && rename->first == r) return;
      std::string_view text = m.Text(r);
      // Patch-level entries win over spec-level ones.
      for (std::vector<MapUse>* map : {patch_map, &spec_map_}) {
        if (!map) continue;
        if (std::optional<std::string> to = MapName(*map, text)) {
          out.push_back({r, *to});
          return;
        }
      }
      return;
    }
    for (uint32_t i = 0; i < ts_node_named_child_count(node); ++i) {
      CollectRenames(ts_node_named_child(node, i), m, region, patch_map, rename, out);
    }
  }

  /// The one def/class a body provides, or nullptr (with an error).
  const Definition* BodyDefinition(const PyModule& m, const Body& body, const std::string& what) {
    if (body.source == Body::Source::kFile) {
      const Definition* def = m.FindTopLevel(body.symbol);
      if (!def) {
        std::string help = "top-level definitions in " + body.origin.path + ": " +
                           JoinNames(m.TopLevelNames());
        if (auto dym = DidYouMean(body.symbol, m.TopLevelNames())) {
          help = "did you mean '" + *dym + "'? " + help;
        }
        Error(body.symbol_loc, "no def or class '" + body.symbol + "' in " + body.origin.path,
              help);
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
    Error(body.loc,
          "code of " + what + " must hold exactly one def or class; found " +
              std::to_string(m.top_level().size()) + " top-level statement(s)",
          "put other definitions into `helpers:`, imports into `imports.add`");
    return nullptr;
  }

  std::string Marker(const Patch& p, const std::string& indent) const {
    std::string m = indent + "# patchgen: " + PatchKindKey(p.kind) + " " + p.target;
    if (!p.description.empty()) m += " - " + OneLine(p.description);
    return m + " (" + Where(p.loc) + ")";
  }

  // ----- patches ---------------------------------------------------------------------------

  std::vector<MapUse> PatchMap(const Patch& p) {
    std::vector<MapUse> out;
    for (const NameMapEntry& e : p.name_map) out.push_back({&e, false});
    return out;
  }

  static std::string LastComponent(const std::string& qualname) {
    size_t dot = qualname.rfind('.');
    return dot == std::string::npos ? qualname : qualname.substr(dot + 1);
  }

  static std::string Owner(const std::string& qualname) {
    size_t dot = qualname.rfind('.');
    return dot == std::string::npos ? "" : qualname.substr(0, dot);
  }

  /// The class named `qualname` ("A" or "A.B"), or nullptr with an error at `loc`.
  const Definition* FindClass(const std::string& qualname, const SourceLoc& loc) {
    const Definition* def = up_.Find(qualname);
    if (def && def->kind == Definition::Kind::kClass) return def;
    std::vector<std::string> candidates;
    std::string owner = Owner(qualname);
    if (owner.empty()) {
      candidates = up_.TopLevelNames(Definition::Kind::kClass);
    } else if (const Definition* o = up_.Find(owner)) {
      candidates = up_.ChildNames(*o, Definition::Kind::kClass);
      for (std::string& c : candidates) c = owner + "." + c;
    }
    std::string help = "classes: " + JoinNames(candidates);
    if (auto dym = DidYouMean(qualname, candidates)) help = "did you mean '" + *dym + "'?";
    Error(loc, "no class '" + qualname + "' in " + up_.path(), help);
    return nullptr;
  }

  /// A patch on a member of a class that another patch replaces wholesale (e.g. `add_method X.m`
  /// with `replace_class X`) would edit text that is no longer there: the two overlap, even when
  /// their text edits only touch at the class's last byte.
  void CheckNestedInReplaced() {
    for (const Patch& outer : spec_.patches) {
      if (outer.kind != PatchKind::kReplaceClass && outer.kind != PatchKind::kReplaceFunction) {
        continue;
      }
      for (const Patch& inner : spec_.patches) {
        if (inner.target.size() <= outer.target.size() ||
            inner.target.compare(0, outer.target.size() + 1, outer.target + ".") != 0) {
          continue;
        }
        errors_.push_back(OverlapError(inner.loc, What(inner), outer.loc, What(outer)));
      }
    }
  }

  // ----- optional entries and contract pins ------------------------------------------------

  /// Why an optional patch cannot apply (its target is absent upstream, or for add_method the
  /// method already exists), or nullopt.
  std::optional<std::string> PatchAbsent(const Patch& p) const {
    const Definition* def = up_.Find(p.target);
    switch (p.kind) {
      case PatchKind::kReplaceClass:
      case PatchKind::kReplaceFunction: {
        Definition::Kind want = p.kind == PatchKind::kReplaceClass ? Definition::Kind::kClass
                                                                   : Definition::Kind::kFunction;
        const Definition* top = up_.FindTopLevel(p.target);
        if (!top || top->kind != want) return "optional: no top-level '" + p.target + "' upstream";
        return std::nullopt;
      }
      case PatchKind::kOverrideMethod:
        if (!def || def->kind != Definition::Kind::kFunction) {
          return "optional: no method '" + p.target + "' upstream";
        }
        return std::nullopt;
      case PatchKind::kAddMethod:
        if (!up_.Find(Owner(p.target))) return "optional: no class '" + Owner(p.target) + "' upstream";
        if (def) return "optional: upstream already defines '" + p.target + "'";
        return std::nullopt;
      case PatchKind::kModifyInit:
        if (!def || def->kind != Definition::Kind::kClass || !up_.Find(p.target + ".__init__")) {
          return "optional: no class '" + p.target + "' with an __init__ upstream";
        }
        return std::nullopt;
      case PatchKind::kEditBody: {
        if (!def || def->kind != Definition::Kind::kFunction) {
          return "optional: no function '" + p.target + "' upstream";
        }
        BodyStatements stmts(up_, *def);
        if (!stmts.ok()) return std::nullopt;
        for (const StatementEdit& e : p.edits) {
          if (std::optional<std::string> why = stmts.Absent(QueryOf(e))) return "optional: " + *why;
        }
        return std::nullopt;
      }
    }
    return std::nullopt;
  }

  void AddPin(std::string key, std::string region, std::string expects, std::string qualname,
              const SourceLoc& loc, const std::vector<ByteRange>& ranges,
              const std::vector<ByteRange>& skip) {
    ContractPin pin{std::move(key), std::move(region), std::move(expects), std::move(qualname),
                    loc, 0, 0, {}, {}};
    Fingerprint fp = ranges.empty() ? AbsentFingerprint() : FingerprintOf(up_, ranges, skip);
    if (!ranges.empty()) {
      pin.first_line = up_.lines().LineOf(ranges.front().start) + 1;
      uint32_t last = 0;
      for (const ByteRange& r : ranges) {
        last = std::max(last, up_.lines().LineOf(r.end > r.start ? r.end - 1 : r.start) + 1);
      }
      pin.last_line = last;
    }
    pin.sha256 = std::move(fp.sha256);
    pin.text = std::move(fp.text);
    contract_.push_back(std::move(pin));
  }

  /// Decorators through the header's colon: what callers of `def` rely on.
  static ByteRange SignatureOf(const Definition& def) {
    return {def.definition.start, def.header.end};
  }

  void PinPatch(const Patch& p) {
    std::string key = What(p);
    if (p.when.upstream_version) key += " for upstream " + *p.when.upstream_version;
    const Definition* def = up_.Find(p.target);
    switch (p.kind) {
      case PatchKind::kAddMethod:
        if (!def) AddPin(key, "absent", PatchKindKey(p.kind), p.target, p.loc, {}, {});
        return;
      case PatchKind::kEditBody:
        return;  // Pinned per edit by PlanEditBody (the statements each edit relies on).
      case PatchKind::kModifyInit: {
        const Definition* init = up_.Find(p.target + ".__init__");
        if (!def || !init) return;
        AddPin(key, "signature", PatchKindKey(p.kind), p.target, p.loc,
               {SignatureOf(*def), SignatureOf(*init)}, {});
        return;
      }
      default:
        if (def) AddPin(key, "signature", PatchKindKey(p.kind), p.target, p.loc, {SignatureOf(*def)}, {});
        return;
    }
  }

  /// "override_method Qwen3MLP.forward": how edits of a patch are named in errors.
  static std::string What(const Patch& p) { return std::string(PatchKindKey(p.kind)) + " " + p.target; }

  void PlanPatch(const Patch& p) {
    std::vector<MapUse> patch_map = PatchMap(p);
    std::string what = What(p);
    switch (p.kind) {
      case PatchKind::kReplaceClass:
      case PatchKind::kReplaceFunction: PlanReplace(p, patch_map, what); break;
      case PatchKind::kOverrideMethod: PlanOverride(p, patch_map, what); break;
      case PatchKind::kAddMethod: PlanAddMethod(p, patch_map, what); break;
      case PatchKind::kModifyInit: PlanModifyInit(p, patch_map, what); break;
      case PatchKind::kEditBody: PlanEditBody(p, patch_map, what); break;
    }
    for (const MapUse& u : patch_map) ReportUnusedKey(u);
    applied_.push_back({PatchKindKey(p.kind), p.target, OneLine(p.description)});
  }

  /// Parses a def/class body and returns its snippet at `column`, renamed to `target_name`.
  std::optional<Snippet> DefinitionSnippet(const Patch& p, std::vector<MapUse>& patch_map,
                                           const std::string& what, Definition::Kind want,
                                           size_t column, bool* has_decorators) {
    std::unique_ptr<PyModule> m = ParseCode(p.body.text, p.body.origin);
    if (!m) return std::nullopt;
    const Definition* def = BodyDefinition(*m, p.body, what);
    if (!def) return std::nullopt;
    if (def->kind != want) {
      Error(p.body.loc,
            what + " needs a " + (want == Definition::Kind::kClass ? "class" : "def") +
                ", but the code defines " +
                (def->kind == Definition::Kind::kClass ? "class '" : "function '") + def->name +
                "'");
      return std::nullopt;
    }
    if (has_decorators) *has_decorators = !def->decorators.empty();
    std::pair<ByteRange, std::string> rename{def->name_range, LastComponent(p.target)};
    return MakeSnippet(*m, def->whole, p.body.origin, &patch_map, rename, column);
  }

  void PlanReplace(const Patch& p, std::vector<MapUse>& patch_map, const std::string& what) {
    bool is_class = p.kind == PatchKind::kReplaceClass;
    Definition::Kind kind = is_class ? Definition::Kind::kClass : Definition::Kind::kFunction;
    const Definition* target = up_.FindTopLevel(p.target);
    if (!target || target->kind != kind) {
      std::vector<std::string> names = up_.TopLevelNames(kind);
      std::string noun = is_class ? "class" : "function";
      std::string help = std::string(is_class ? "top-level classes: " : "top-level functions: ") +
                         JoinNames(names);
      if (auto dym = DidYouMean(p.target, names)) help = "did you mean '" + *dym + "'? " + help;
      Error(p.target_loc, "no top-level " + noun + " '" + p.target + "' in " + up_.path(), help);
      return;
    }
    std::string indent(target->indent, ' ');
    ByteRange range{LineStartOf(src_, target->definition.start), LineEndOf(target->definition.end)};
    if (p.body.source == Body::Source::kFrom) {
      std::string stmt = "from " + p.body.from_module + " import " + p.body.from_name;
      if (p.body.from_name != p.target) stmt += " as " + p.target;
      plan_.Add(TextEdit{range, Marker(p, indent) + "\n" + indent + stmt, p.loc, what,
                         std::nullopt});
      return;
    }
    auto snippet = DefinitionSnippet(p, patch_map, what, kind, target->indent, nullptr);
    if (!snippet) return;
    plan_.Add(SnippetEdit(range, Marker(p, indent) + "\n", *snippet, "", p.loc, what));
    replaced_.push_back({p.target, &p});
  }

  /// The method `Class.m` named by an override/add target, with errors for a missing class.
  const Definition* TargetClass(const Patch& p) {
    std::string owner = Owner(p.target);
    if (owner.empty()) {
      Error(p.target_loc, "target '" + p.target + "' must be Class.method");
      return nullptr;
    }
    return FindClass(owner, p.target_loc);
  }

  void PlanOverride(const Patch& p, std::vector<MapUse>& patch_map, const std::string& what) {
    const Definition* cls = TargetClass(p);
    if (!cls) return;
    const Definition* method = up_.Find(p.target);
    if (!method || method->kind != Definition::Kind::kFunction || method->parent < 0 ||
        &up_.definitions()[static_cast<size_t>(method->parent)] != cls) {
      std::vector<std::string> methods = up_.ChildNames(*cls, Definition::Kind::kFunction);
      std::string help = "methods of " + cls->qualname + ": " + JoinNames(methods);
      if (auto dym = DidYouMean(LastComponent(p.target), methods)) {
        help = "did you mean '" + *dym + "'? " + help;
      }
      Error(p.target_loc,
            "no method '" + LastComponent(p.target) + "' in class '" + cls->qualname + "'",
            help + (p.kind == PatchKind::kOverrideMethod ? "; use add_method for a new method" : ""));
      return;
    }
    bool has_decorators = false;
    auto snippet = DefinitionSnippet(p, patch_map, what, Definition::Kind::kFunction,
                                     method->indent, &has_decorators);
    if (!snippet) return;
    std::string indent(method->indent, ' ');
    ByteRange range{LineStartOf(src_, method->definition.start), LineEndOf(method->definition.end)};
    std::string prefix = Marker(p, indent) + "\n";
    // Upstream decorators (`@can_return_tuple`, ...) stay unless the body brings its own.
    if (!has_decorators && !method->decorators.empty()) {
      prefix += src_.substr(LineStartOf(src_, method->decorators.start),
                            LineStartOf(src_, method->header.start) -
                                LineStartOf(src_, method->decorators.start));
    }
    plan_.Add(SnippetEdit(range, prefix, *snippet, "", p.loc, what));
    replaced_.push_back({p.target, &p});
  }

  /// The last statement of `def`'s body block.
  TSNode LastStatement(const Definition& def) const {
    TSNode block = Field(DefNode(up_, def), "body");
    TSNode last = block;
    for (uint32_t i = 0; i < ts_node_named_child_count(block); ++i) {
      TSNode c = ts_node_named_child(block, i);
      if (!Is(c, "comment")) last = c;
    }
    return last;
  }

  void PlanAddMethod(const Patch& p, std::vector<MapUse>& patch_map, const std::string& what) {
    const Definition* cls = TargetClass(p);
    if (!cls) return;
    if (up_.Find(p.target)) {
      Error(p.target_loc,
            "method '" + LastComponent(p.target) + "' already exists in class '" + cls->qualname +
                "'",
            "use override_method to replace an existing method");
      return;
    }
    auto snippet = DefinitionSnippet(p, patch_map, what, Definition::Kind::kFunction,
                                     cls->body_indent, nullptr);
    if (!snippet) return;
    std::string indent(cls->body_indent, ' ');
    std::string marker = Marker(p, indent) + "\n";
    if (cls->empty_body && cls->inline_body) {
      // `class A(B): ...` -> the placeholder is replaced by an indented body.
      plan_.Add(SnippetEdit({cls->header.end, LineEndOf(cls->body.end)}, "\n" + marker, *snippet, "", p.loc,
                            what));
    } else if (cls->empty_body) {
      TSNode placeholder = LastStatement(*cls);
      ByteRange r{LineStartOf(src_, ts_node_start_byte(placeholder)), LineEndOf(cls->body.end)};
      plan_.Add(SnippetEdit(r, marker, *snippet, "", p.loc, what));
    } else {
      uint32_t end = LineEndOf(cls->body.end);
      plan_.Add(SnippetEdit({end, end}, "\n\n" + marker, *snippet, "", p.loc,
                            what));
    }
    added_methods_.push_back({p.target, &p});
  }

  void PlanModifyInit(const Patch& p, std::vector<MapUse>& patch_map, const std::string& what) {
    const Definition* cls = FindClass(p.target, p.target_loc);
    if (!cls) return;
    const Definition* init = up_.Find(cls->qualname + ".__init__");
    if (!init) {
      Error(p.target_loc, "class '" + cls->qualname + "' has no __init__ to modify",
            "use add_method " + cls->qualname + ".__init__ to define one");
      return;
    }
    std::unique_ptr<PyModule> m = ParseCode(p.body.text, p.body.origin);
    if (!m) return;
    uint32_t at = LineEndOf(init->body.end);
    if (p.init_at == Patch::InitAt::kAfterSuperInit) {
      std::optional<uint32_t> super_end = SuperInitEnd(*init);
      if (!super_end) {
        Error(p.loc, "no super().__init__(...) call in " + init->qualname,
              "use `after: end` (the default) to append to __init__");
        return;
      }
      at = *super_end;
    }
    Snippet s = MakeSnippet(*m, {0, static_cast<uint32_t>(m->source().size())}, p.body.origin,
                            &patch_map, std::nullopt, init->body_indent);
    std::string indent(init->body_indent, ' ');
    std::string marker = Marker(p, indent) + "\n";
    if (init->inline_body) {
      // `def __init__(self): super().__init__()` -> the inline body moves to its own line.
      std::string moved = "\n" + indent + std::string(up_.Text(init->body)) + "\n";
      plan_.Add(SnippetEdit({init->header.end, LineEndOf(init->body.end)}, moved + marker, s, "",
                            p.loc, what));
      return;
    }
    plan_.Add(SnippetEdit({at, at}, "\n" + marker, s, "", p.loc, what));
  }

  /// End of the `super().__init__(...)` statement directly in `init`'s body.
  std::optional<uint32_t> SuperInitEnd(const Definition& init) const {
    TSNode block = Field(DefNode(up_, init), "body");
    for (uint32_t i = 0; i < ts_node_named_child_count(block); ++i) {
      TSNode c = ts_node_named_child(block, i);
      if (!Is(c, "expression_statement")) continue;
      std::string_view text = up_.Text(RangeOf(c));
      if (text.starts_with("super(") && text.find(".__init__(") != std::string_view::npos) {
        return LineEndOf(ts_node_end_byte(c));
      }
    }
    return std::nullopt;
  }


  // ----- statement edits (edit_body) -------------------------------------------------------

  /// An edit's anchor lookup, with the edit's keys in messages.
  static AnchorQuery QueryOf(const StatementEdit& e) {
    AnchorQuery q;
    q.at = e.at;
    q.at_loc = e.at_loc;
    q.at_key = spec::EditOpKey(e.op);
    if (e.through) q.through = *e.through;
    q.through_loc = e.through_loc;
    q.noun = "edited";
    q.why = "an edit works on whole lines";
    return q;
  }

  /// A planned statement edit, kept until the guards are planned (overlaps with call-site
  /// guards are errors; at one offset a guard's text comes first).
  struct PendingEdit {
    TextEdit edit;
    ByteRange lines;          ///< The anchor statements' whole lines.
    uint32_t first_line = 0;  ///< 1-based upstream lines of the anchor statements.
    uint32_t last_line = 0;
    bool modifies = false;    ///< replace / delete / wrap (insertions leave the anchor alone).
    const StatementEdit* op = nullptr;
    std::string qualname;
  };

  /// The function named by an edit_body target, or nullptr with an error.
  const Definition* EditTarget(const Patch& p) {
    const Definition* def = up_.Find(p.target);
    if (def && def->kind == Definition::Kind::kFunction) return def;
    if (def) {
      Error(p.target_loc, "edit_body target '" + p.target + "' is a class, not a function or method",
            "methods of " + def->qualname + ": " +
                JoinNames(up_.ChildNames(*def, Definition::Kind::kFunction)) +
                "; to edit its constructor, write `edit_body: " + p.target + ".__init__`");
      return nullptr;
    }
    std::string owner = Owner(p.target);
    if (owner.empty()) {
      std::vector<std::string> names = up_.TopLevelNames(Definition::Kind::kFunction);
      std::string help = "top-level functions: " + JoinNames(names);
      if (auto dym = DidYouMean(p.target, names)) help = "did you mean '" + *dym + "'? " + help;
      Error(p.target_loc, "no function '" + p.target + "' in " + up_.path(), help);
      return nullptr;
    }
    const Definition* o = up_.Find(owner);
    if (!o) {
      FindClass(owner, p.target_loc);
      return nullptr;
    }
    std::vector<std::string> methods = up_.ChildNames(*o, Definition::Kind::kFunction);
    std::string help = "methods of " + o->qualname + ": " + JoinNames(methods);
    if (auto dym = DidYouMean(LastComponent(p.target), methods)) {
      help = "did you mean '" + *dym + "'? " + help;
    }
    Error(p.target_loc,
          std::string("no ") + (o->kind == Definition::Kind::kClass ? "method '" : "nested function '") +
              LastComponent(p.target) + "' in " +
              (o->kind == Definition::Kind::kClass ? "class '" : "function '") + o->qualname + "'",
          help);
    return nullptr;
  }

  /// `code` of an edit, parsed and checked: its first statement must start at the code's
  /// smallest indentation (a deeper first line cannot be re-indented to one block).
  std::unique_ptr<PyModule> EditCode(const StatementEdit& e) {
    std::vector<std::string_view> lines = SplitLines(e.code);
    size_t common = CommonIndent(e.code);
    for (size_t i = 0; i < lines.size(); ++i) {
      std::string_view l = lines[i];
      size_t first = l.find_first_not_of(" \t");
      if (first == std::string_view::npos || l[first] == '#') continue;
      if (first > common) {
        Error(OriginLoc(e.code_origin, static_cast<uint32_t>(i), static_cast<uint32_t>(first + 1),
                        static_cast<uint32_t>(CodePointCount(l.substr(first)))),
              "the first statement of `code` is indented deeper than a later line",
              "write the statements of an edit at one column; patchgen indents them to the "
              "anchor statement's block");
        return nullptr;
      }
      break;
    }
    return ParseCode(e.code, e.code_origin);
  }

  /// The single `...` statement of a wrap's code (alone on its line), or nullopt with an error.
  std::optional<TSNode> WrapPlaceholder(const PyModule& m, const StatementEdit& e) {
    std::vector<TSNode> found;
    std::vector<TSNode> stack = {m.root()};
    while (!stack.empty()) {
      TSNode n = stack.back();
      stack.pop_back();
      if (Is(n, "expression_statement") && ts_node_named_child_count(n) == 1 &&
          Is(ts_node_named_child(n, 0), "ellipsis") && StartsLine(m, ts_node_start_byte(n)) &&
          EndsLine(m, ts_node_end_byte(n))) {
        found.push_back(n);
        continue;
      }
      for (uint32_t i = ts_node_named_child_count(n); i-- > 0;) {
        stack.push_back(ts_node_named_child(n, i));
      }
    }
    if (found.size() == 1) return found[0];
    Error(e.code_loc,
          "the code of `wrap` must have exactly one `...` line, where the wrapped statements go; "
          "found " + std::to_string(found.size()),
          "e.g. `with torch.no_grad():` and, indented below it, a line holding only `...`");
    return std::nullopt;
  }

  std::string EditMarker(const Patch& p, const StatementEdit& e, const std::string& indent) const {
    std::string m = indent + "# patchgen: edit_body " + p.target + ": " + spec::EditOpKey(e.op);
    if (!p.description.empty()) m += " - " + OneLine(p.description);
    return m + " (" + Where(e.loc) + ")";
  }

  void PlanEditBody(const Patch& p, std::vector<MapUse>& patch_map, const std::string& what) {
    const Definition* def = EditTarget(p);
    if (!def) return;
    BodyStatements stmts(up_, *def);
    if (!stmts.ok()) {
      Error(p.target_loc, "cannot find the body of '" + def->qualname + "'", {}, ErrorKind::kInternal);
      return;
    }
    size_t first_pending = pending_edits_.size();
    for (const StatementEdit& e : p.edits) {
      std::optional<AnchorRange> r = stmts.Locate(QueryOf(e), errors_);
      if (!r) continue;
      PendingEdit pe;
      pe.op = &e;
      pe.qualname = def->qualname;
      pe.first_line = r->first->line;
      pe.last_line = up_.lines().LineOf(r->last->range.end) + 1;
      uint32_t start = LineStartOf(src_, r->first->range.start);
      uint32_t end = LineEndOf(r->last->range.end);
      pe.lines = {start, end};
      pe.modifies = e.op != StatementEdit::Op::kInsertBefore && e.op != StatementEdit::Op::kInsertAfter;
      std::string key = what + " " + spec::EditOpKey(e.op) + " '" + e.at + "'";
      if (e.through) key += " through '" + *e.through + "'";
      if (p.when.upstream_version) key += " for upstream " + *p.when.upstream_version;
      AddPin(key, "statements", PatchKindKey(p.kind), def->qualname, e.loc,
             {ByteRange{r->first->range.start, r->last->range.end}}, {});
      // Two edits of one body must not touch the same statements (insertions next to each other
      // are fine: they keep spec order).
      bool clash = false;
      for (size_t i = first_pending; i < pending_edits_.size(); ++i) {
        const PendingEdit& o = pending_edits_[i];
        if (!(pe.modifies || o.modifies) || !LinesOverlap(pe.lines, o.lines)) continue;
        Diagnostic d = ErrorAt(e.loc,
                               "edits overlap: `" + std::string(spec::EditOpKey(e.op)) + "` of " +
                                   LineSpan(pe.first_line, pe.last_line) + " and `" +
                                   spec::EditOpKey(o.op->op) + "` of " +
                                   LineSpan(o.first_line, o.last_line) + " in " + def->qualname,
                               "edits of one body must touch disjoint statements; merge them into "
                               "one `replace`, or anchor the insertion elsewhere");
        d.notes.push_back("note: the `" + std::string(spec::EditOpKey(o.op->op)) + "` edit is at " +
                          Where(o.op->loc) + ":" + std::to_string(o.op->loc.col));
        errors_.push_back(std::move(d));
        clash = true;
      }
      if (clash) continue;
      if (!PlanOneEdit(p, e, stmts, *r, patch_map, what, pe)) continue;
      pending_edits_.push_back(std::move(pe));
    }
  }

  static bool LinesOverlap(ByteRange a, ByteRange b) { return a.start < b.end && b.start < a.end; }

  static std::string LineSpan(uint32_t first, uint32_t last) {
    return first == last ? "line " + std::to_string(first)
                         : "lines " + std::to_string(first) + "-" + std::to_string(last);
  }

  /// Builds the TextEdit of one statement edit into `pe.edit`; false on error (reported).
  bool PlanOneEdit(const Patch& p, const StatementEdit& e, const BodyStatements& stmts,
                   const AnchorRange& r, std::vector<MapUse>& patch_map, const std::string& what,
                   PendingEdit& pe) {
    std::string ind = IndentAt(up_, r.first->range.start);
    std::string marker = EditMarker(p, e, ind);
    std::string edit_what = what + " " + spec::EditOpKey(e.op);
    if (e.op == StatementEdit::Op::kDelete) {
      std::string text = marker;
      if (stmts.WholeBlock(r)) text += "\n" + ind + "pass";  // The block must keep a statement.
      pe.edit = TextEdit{pe.lines, std::move(text), e.loc, edit_what, std::nullopt};
      return true;
    }
    std::unique_ptr<PyModule> m = EditCode(e);
    if (!m) return false;
    std::optional<TSNode> placeholder;
    if (e.op == StatementEdit::Op::kWrap) {
      placeholder = WrapPlaceholder(*m, e);
      if (!placeholder) return false;
    }
    Snippet s = MakeSnippet(*m, {0, static_cast<uint32_t>(m->source().size())}, e.code_origin,
                            &patch_map, std::nullopt, ind.size());
    switch (e.op) {
      case StatementEdit::Op::kInsertBefore:
        pe.edit = SnippetEdit({pe.lines.start, pe.lines.start}, marker + "\n", s, "\n", e.loc, edit_what);
        return true;
      case StatementEdit::Op::kInsertAfter:
        pe.edit = SnippetEdit({pe.lines.end, pe.lines.end}, "\n" + marker + "\n", s, "", e.loc, edit_what);
        return true;
      case StatementEdit::Op::kReplace:
        pe.edit = SnippetEdit(pe.lines, marker + "\n", s, "", e.loc, edit_what);
        return true;
      case StatementEdit::Op::kDelete:
      case StatementEdit::Op::kWrap:
        break;
    }
    // Wrap: the snippet's lines before the placeholder, the anchor statements' upstream lines
    // shifted to the placeholder's column, then the snippet's lines after it.
    uint32_t hole = m->lines().LineOf(ts_node_start_byte(*placeholder));
    std::vector<std::string_view> lines = SplitLines(s.text);
    std::string before, after;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i < hole) before += std::string(lines[i]) + "\n";
      if (i > hole) after += (after.empty() ? "" : "\n") + std::string(lines[i]);
    }
    std::string_view hole_line = hole < lines.size() ? lines[hole] : std::string_view();
    size_t hole_col = hole_line.find_first_not_of(' ');
    if (hole_col == std::string_view::npos) hole_col = ind.size();
    std::string shift(hole_col > ind.size() ? hole_col - ind.size() : 0, ' ');
    std::string text = marker + "\n";
    std::optional<CodeSpan> head, tail;
    if (!before.empty()) {
      head = CodeSpan{static_cast<uint32_t>(text.size()),
                      static_cast<uint32_t>(text.size() + before.size() - 1), s.origin,
                      s.first_line, s.col_shift};
    }
    text += before + ShiftLines(up_, pe.lines, shift);
    if (!after.empty()) {
      text += "\n";
      tail = CodeSpan{static_cast<uint32_t>(text.size()), static_cast<uint32_t>(text.size() + after.size()),
                      s.origin, s.first_line + hole + 1, s.col_shift};
      text += after;
    }
    pe.edit = TextEdit{pe.lines, std::move(text), e.loc, edit_what, head ? head : tail};
    if (head && tail) pe.edit.tail_code = tail;
    return true;
  }

  /// Slots whose every guard was skipped (or that have none): declared, but nothing in this
  /// module dispatches through them; the header says so.
  void FindSlotsWithoutGuards() {
    std::set<std::string> seen;
    for (const spec::Slot& slot : spec_.slots) {
      if (!seen.insert(slot.name).second) continue;
      bool guarded = false;
      for (const GuardPlan::Region& r : guard_regions_) guarded |= r.slot == slot.name;
      if (!guarded) unguarded_slots_.push_back(&slot);
    }
  }

  /// Adds the planned statement edits after the guards, so that at one offset (the first
  /// statement of a body) an entry guard stays first; an edit touching the statements of a
  /// call-site guard is an error naming both.
  void AddStatementEdits() {
    for (PendingEdit& pe : pending_edits_) {
      bool clash = false;
      for (const GuardPlan::Region& g : guard_regions_) {
        if (!g.statements) continue;
        ByteRange guarded{LineStartOf(src_, g.statements->start), LineEndOf(g.statements->end)};
        if (!LinesOverlap(pe.lines, guarded)) continue;
        uint32_t first = up_.lines().LineOf(g.statements->start) + 1;
        uint32_t last = up_.lines().LineOf(g.statements->end) + 1;
        Diagnostic d = ErrorAt(
            pe.op->loc,
            "`" + std::string(spec::EditOpKey(pe.op->op)) + "` edit of " +
                LineSpan(pe.first_line, pe.last_line) + " in " + pe.qualname +
                " overlaps the call-site guard of slot '" + g.slot + "' on " + LineSpan(first, last),
            "the guard moves those statements into an `else:` branch; anchor the edit on "
            "statements outside the guarded lines, or guard other statements");
        d.notes.push_back("note: the guard is at " + Where(g.loc) + ":" + std::to_string(g.loc.col));
        errors_.push_back(std::move(d));
        clash = true;
      }
      if (!clash) plan_.Add(std::move(pe.edit));
    }
  }

  // ----- guards ----------------------------------------------------------------------------

  /// The spec's slots with the spec-level name_map applied to guard targets, component by
  /// component (`Qwen3_5MLP.forward` -> `Qwen3_5MoeMLP.forward` with `{Qwen3_5MLP: Qwen3_5MoeMLP}`),
  /// so that a sibling model can inherit another model's guards through `extends`.
  spec::PatchSpec SpecWithMappedGuardTargets() {
    spec::PatchSpec mapped = spec_;
    for (spec::Slot& slot : mapped.slots) {
      for (spec::Guard& g : slot.guards) {
        g.in = MapDotted(spec_map_, g.in);
      }
    }
    return mapped;
  }

  void PlanGuardsAndConflicts() {
    size_t errors_before = errors_.size();
    const spec::PatchSpec mapped = SpecWithMappedGuardTargets();
    for (const spec::Slot& slot : mapped.slots) {
      for (const spec::Guard& g : slot.guards) {
        for (const auto& [target, p] : added_methods_) {
          if (g.in == target) {
            Error(g.in_loc,
                  "guard on " + g.in + " is inside add_method " + target + " at " + Where(p->loc),
                  "guards edit upstream bodies; put the dispatch into the added method's code");
          }
        }
      }
    }
    // PlanGuards would only add "no method" for a guard inside an added method.
    if (mapped.slots.empty() || errors_.size() > errors_before) return;
    auto guards = PlanGuards(mapped, up_, spec_.runtime.value_or(options_.default_runtime));
    if (!guards) {
      for (Diagnostic& d : guards.errors()) errors_.push_back(std::move(d));
      return;
    }
    for (const auto& [qualname, loc] : guards->guarded_targets) {
      for (const auto& [target, p] : replaced_) {
        if (qualname == target || qualname.starts_with(target + ".")) {
          Error(loc,
                "guard on " + qualname + " conflicts with " + PatchKindKey(p->kind) + " " +
                    target + " at " + Where(p->loc),
                "the patch replaces the upstream body the guard would edit; dispatch inside the "
                "patch body instead, or drop one of them");
        }
      }
    }
    for (TextEdit& e : guards->edits) plan_.Add(std::move(e));
    guard_regions_ = guards->regions;
    declarations_ = guards->declarations;
    for (const GuardPlan::Skipped& sk : guards->skipped) {
      skipped_.push_back({"guard", sk.target, sk.why, sk.loc});
    }
    for (const GuardPlan::Region& r : guards->regions) {
      std::string key = "guard " + r.slot + " in " + r.in;
      if (r.at) key += " at '" + *r.at + "'";
      if (r.through) key += " through '" + *r.through + "'";
      if (r.upstream_version) key += " for upstream " + *r.upstream_version;
      const Definition& def = up_.definitions()[static_cast<size_t>(r.definition)];
      if (r.statements) {
        AddPin(key, "statements", r.op_variant, r.in, r.loc, {*r.statements}, {});
      } else {
        std::vector<ByteRange> skip;
        if (def.docstring) skip.push_back(*def.docstring);
        AddPin(key, "function", r.op_variant, r.in, r.loc, {def.definition}, skip);
      }
    }
    for (const auto& [target, description] : guards->applied) {
      applied_.push_back({"guard", target, OneLine(description)});
    }
  }

  // ----- code after the imports ------------------------------------------------------------

  /// Where added imports, slot declarations, blocks and helpers without `after` go: the end of
  /// the line of the last top-level import that stays; without one, after the module docstring;
  /// without that, in front of the first top-level statement (after a licence comment block).
  /// `before_statement` is true in the last case: pieces are then followed by blank lines
  /// instead of preceded by them.
  struct Anchor {
    uint32_t offset = 0;
    bool before_statement = false;
  };

  Anchor AfterImports() const {
    std::optional<uint32_t> at;
    for (size_t i = 0; i < up_.imports().size(); ++i) {
      const Import& imp = up_.imports()[i];
      if (imp.depth == 0 && !removed_imports_.count(i)) at = LineEndOf(imp.stmt.end);
    }
    if (at) return {*at, false};
    if (up_.top_level().empty()) return {static_cast<uint32_t>(src_.size()), true};
    const TopLevelStatement& first = up_.top_level().front();
    std::string_view text = up_.Text(first.range);
    size_t quote = text.find_first_of("\"'");
    if (first.kind == TopLevelStatement::Kind::kOther && quote != std::string_view::npos &&
        quote <= 3 && text.find_first_not_of("rRbBuUfF") == quote) {
      return {LineEndOf(first.range.end), false};
    }
    return {LineStartOf(src_, first.range.start), true};
  }

  /// Parses standalone code (blocks, helpers, added imports) and re-indents it to column 0.
  std::optional<Snippet> StandaloneSnippet(const std::string& text, const TextOrigin& origin,
                                           std::unique_ptr<PyModule>* keep = nullptr) {
    std::unique_ptr<PyModule> m = ParseCode(text, origin);
    if (!m) return std::nullopt;
    Snippet s = MakeSnippet(*m, {0, static_cast<uint32_t>(m->source().size())}, origin, nullptr,
                            std::nullopt, 0);
    if (keep) *keep = std::move(m);
    return s;
  }

  std::optional<Snippet> HelperSnippet(const spec::Helper& h) {
    if (h.body.source != Body::Source::kFile) return StandaloneSnippet(h.body.text, h.body.origin);
    std::unique_ptr<PyModule> m = ParseCode(h.body.text, h.body.origin);
    if (!m) return std::nullopt;
    const Definition* def = BodyDefinition(*m, h.body, "helper " + h.name);
    if (!def) return std::nullopt;
    return MakeSnippet(*m, def->whole, h.body.origin, nullptr, std::nullopt, 0);
  }

  void PlanInsertionsAfterImports() {
    Anchor anchor = AfterImports();
    uint32_t at = anchor.offset;
    bool at_top = anchor.before_statement;
    // Each piece is preceded by its separator; in front of the first statement of a file the
    // first piece has none, and two blank lines end the inserted code.
    bool first = true;
    auto add = [&](const std::string& sep, const Snippet& s, const SourceLoc& loc,
                   const std::string& what) {
      plan_.Add(SnippetEdit({at, at}, at_top && first ? "" : sep, s, "", loc, what));
      first = false;
    };
    for (const spec::Block& b : spec_.import_adds) {
      std::unique_ptr<PyModule> m;
      auto s = StandaloneSnippet(b.code, b.origin, &m);
      if (!s) continue;
      bool only_imports = !m->top_level().empty();
      for (const TopLevelStatement& t : m->top_level()) {
        if (t.kind != TopLevelStatement::Kind::kImport) only_imports = false;
      }
      if (!only_imports) {
        Error(b.loc, "imports.add entries must be import statements",
              "put other code into `blocks:` or `helpers:`");
        continue;
      }
      add("\n", *s, b.loc, "imports.add");
      applied_.push_back({"imports.add", OneLine(std::string(TrimTrailingNewlines(b.code))), ""});
    }
    if (!declarations_.empty()) {
      Snippet s;
      s.text = TrimTrailingNewlines(declarations_);
      SourceLoc loc = spec_.slots.front().loc;
      plan_.Add(TextEdit{{at, at}, (at_top && first ? "" : "\n\n") + s.text, loc,
                         "slot declarations", std::nullopt});
      first = false;
    }
    for (const spec::Block& b : spec_.blocks) {
      if (auto s = StandaloneSnippet(b.code, b.origin)) {
        add("\n\n", *s, b.loc, "block");
        applied_.push_back({"block", "after the imports (" + Where(b.loc) + ")", ""});
      }
    }
    for (const spec::Helper& h : spec_.helpers) {
      if (h.after) continue;
      if (auto s = HelperSnippet(h)) {
        add("\n\n\n", *s, h.loc, "helper " + h.name);
        applied_.push_back({"helper", h.name, "after the imports"});
      }
    }
    if (at_top && !first) {
      plan_.Add(TextEdit{{at, at}, "\n\n\n", spec_.upstream_loc, "code after the imports",
                         std::nullopt});
    }
  }

  /// The top-level statement binding `name` (class, def or assignment), or nullptr.
  const TopLevelStatement* TopLevelBinding(const std::string& name) const {
    for (const TopLevelStatement& s : up_.top_level()) {
      if (s.kind != TopLevelStatement::Kind::kClass && s.kind != TopLevelStatement::Kind::kFunction &&
          s.kind != TopLevelStatement::Kind::kAssignment) {
        continue;
      }
      if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) return &s;
    }
    return nullptr;
  }

  std::vector<std::string> TopLevelBoundNames() const {
    std::vector<std::string> names;
    for (const TopLevelStatement& s : up_.top_level()) {
      if (s.kind == TopLevelStatement::Kind::kImport || s.kind == TopLevelStatement::Kind::kOther) {
        continue;
      }
      names.insert(names.end(), s.names.begin(), s.names.end());
    }
    return names;
  }

  void MissingTopLevel(const SourceLoc& loc, const std::string& context, const std::string& name) {
    std::vector<std::string> names = TopLevelBoundNames();
    std::string help = "top-level definitions: " + JoinNames(names);
    if (auto dym = DidYouMean(name, names)) help = "did you mean '" + *dym + "'?";
    Error(loc, context + ": no top-level definition or assignment '" + name + "' in " + up_.path(),
          help);
  }

  void PlanHelpersAfter() {
    for (const spec::Helper& h : spec_.helpers) {
      if (!h.after) continue;
      const TopLevelStatement* anchor = TopLevelBinding(*h.after);
      if (!anchor) {
        MissingTopLevel(h.after_loc, "helper after '" + *h.after + "'", *h.after);
        continue;
      }
      if (auto s = HelperSnippet(h)) {
        uint32_t end = LineEndOf(anchor->range.end);
        plan_.Add(SnippetEdit({end, end}, "\n\n\n", *s, "", h.loc,
                              "helper " + h.name));
        applied_.push_back({"helper", h.name, "after " + *h.after});
      }
    }
  }

  // ----- exclude ---------------------------------------------------------------------------

  /// Range removing a top-level statement's lines (with its attached comments) and the blank
  /// lines before it, so that the blank lines that separated it from the next statement now
  /// separate the previous one from it: spacing stays as upstream had it.
  ByteRange ExcludedRange(ByteRange stmt) const {
    uint32_t start = LineStartOf(src_, stmt.start);
    while (start > 0) {
      uint32_t prev = LineStartOf(src_, start - 1);
      if (!IsBlank(std::string_view(src_).substr(prev, start - 1 - prev))) break;
      start = prev;
    }
    uint32_t end = LineEndOf(stmt.end);
    if (end < src_.size()) ++end;
    return {start, end};
  }

  void PlanExcludes() {
    std::vector<size_t> all_removed;
    const spec::LocatedName* first_in_all = nullptr;
    std::vector<ByteRange> all_items;
    ByteRange all_list{};
    FindAllList(all_list, all_items);
    for (const spec::LocatedName& ex : spec_.excludes) {
      const TopLevelStatement* s = TopLevelBinding(ex.name);
      if (!s) {
        MissingTopLevel(ex.loc, "exclude", ex.name);
        continue;
      }
      plan_.Add(TextEdit{ExcludedRange(s->range), "", ex.loc, "exclude " + ex.name, std::nullopt});
      applied_.push_back({"exclude", ex.name, ""});
      excluded_.push_back(&ex);
      for (size_t i = 0; i < all_items.size(); ++i) {
        std::string_view item = up_.Text(all_items[i]);
        if (item.size() >= 2 && item.substr(1, item.size() - 2) == ex.name) {
          all_removed.push_back(i);
          if (!first_in_all) first_in_all = &ex;
        }
      }
    }
    if (all_removed.empty()) return;
    std::sort(all_removed.begin(), all_removed.end());
    all_removed.erase(std::unique(all_removed.begin(), all_removed.end()), all_removed.end());
    std::string text;
    if (all_removed.size() == all_items.size()) {
      std::string_view list = up_.Text(all_list);
      text = std::string(1, list.front()) + std::string(1, list.back());
    } else {
      text = Splice(all_list, RemoveListItems(all_items, all_removed));
    }
    plan_.Add(TextEdit{all_list, text, first_in_all->loc, "exclude " + first_in_all->name + " from __all__",
                       std::nullopt});
  }

  /// The list/tuple literal of the last top-level `__all__ = [...]` and its string items.
  void FindAllList(ByteRange& list, std::vector<ByteRange>& items) const {
    for (const TopLevelStatement& s : up_.top_level()) {
      if (s.kind != TopLevelStatement::Kind::kAssignment ||
          std::find(s.names.begin(), s.names.end(), "__all__") == s.names.end()) {
        continue;
      }
      TSNode n = NodeAt(up_.root(), s.range);
      while (!ts_node_is_null(n) && !Is(n, "assignment")) {
        n = ts_node_named_child_count(n) > 0 ? ts_node_named_child(n, 0) : TSNode{};
        if (ts_node_is_null(n)) break;
      }
      if (ts_node_is_null(n)) continue;
      TSNode right = Field(n, "right");
      if (ts_node_is_null(right) || !(Is(right, "list") || Is(right, "tuple"))) continue;
      list = RangeOf(right);
      items.clear();
      for (uint32_t i = 0; i < ts_node_named_child_count(right); ++i) {
        TSNode c = ts_node_named_child(right, i);
        if (!Is(c, "comment")) items.push_back(RangeOf(c));
      }
    }
  }

  // ----- header and validation -------------------------------------------------------------

  std::string Header(const std::string& sha) const {
    std::string rule = "# " + std::string(76, '=') + "\n";
    std::string h = rule;
    h += "# GENERATED by patchgen - DO NOT EDIT. Edit the spec and regenerate instead.\n";
    h += "#   spec:     " + spec_.path + "\n";
    h += "#   upstream: " + spec_.upstream + " (" + options_.upstream_path + ")\n";
    h += "#   version:  " + options_.upstream_version + "\n";
    h += "#   sha256:   " + sha + "\n";
    if (!spec_.description.empty()) h += "#   about:    " + OneLine(spec_.description) + "\n";
    if (!skipped_.empty()) {
      h += "#   skipped:\n";
      for (const SkippedEntry& sk : skipped_) {
        h += "#   - " + sk.kind + " " + sk.target + " (" + Where(sk.loc) + "): " + OneLine(sk.why) +
             "\n";
      }
    }
    if (!unguarded_slots_.empty()) {
      h += "#   slots without a guard (declared; nothing here dispatches through them):\n";
      for (const spec::Slot* slot : unguarded_slots_) {
        h += "#   - " + slot->name + " -> " + slot->op + "/" + slot->variant + " (" + Where(slot->loc) +
             ")\n";
      }
    }
    if (applied_.empty()) {
      h += "#   applied:  nothing (upstream with absolute imports)\n";
    } else {
      h += "#   applied:\n";
      for (const AppliedPatch& a : applied_) {
        h += "#   - " + a.kind + " " + a.target;
        if (!a.description.empty()) h += ": " + a.description;
        h += "\n";
      }
    }
    return h + rule;
  }

  /// The spec location of output byte `offset` when it lies in inserted text, else nullopt.
  std::optional<SourceLoc> InsertedLoc(uint32_t offset, const LineIndex& out_lines,
                                       const std::vector<ByteRange>& ranges,
                                       uint32_t header_size) const {
    const std::vector<TextEdit>& edits = plan_.edits();
    for (size_t i = 0; i < edits.size(); ++i) {
      ByteRange r{ranges[i].start + header_size, ranges[i].end + header_size};
      if (!r.Contains(offset)) continue;
      const TextEdit& e = edits[i];
      for (const std::optional<CodeSpan>* span : {&e.code, &e.tail_code}) {
        const std::optional<CodeSpan>& c = *span;
        if (!c || c->begin > offset - r.start || offset - r.start >= c->end) continue;
        uint32_t span_start = r.start + c->begin;
        uint32_t line0 = out_lines.LineOf(offset) - out_lines.LineOf(span_start);
        int32_t col = static_cast<int32_t>(out_lines.At(offset).col) - c->col_shift;
        spec::TextOrigin o = c->origin;
        o.first_line = c->first_line;
        o.col_offset = 0;
        return OriginLoc(o, line0, static_cast<uint32_t>(std::max(1, col)));
      }
      return e.origin;
    }
    return std::nullopt;
  }

  void ValidateOutput(const std::string& out, uint32_t header_size) {
    TSTree* tree = parser::ParseTree(out);
    if (!tree) {
      Error(SourceLoc{spec_.path, 0, 0, 1, ""}, "tree-sitter returned no tree", {},
            ErrorKind::kInternal);
      return;
    }
    LineIndex lines(out);
    std::vector<ByteRange> ranges = plan_.OutputRanges();
    auto output_loc = [&](uint32_t offset) {
      return LocOf(spec_.output, out, lines, {offset, offset + 1});
    };
    TSNode root = ts_tree_root_node(tree);
    if (auto err = parser::FirstErrorNode(root)) {
      uint32_t offset = ts_node_start_byte(*err);
      SourceLoc at = output_loc(offset);
      std::optional<SourceLoc> spec_loc = InsertedLoc(offset, lines, ranges, header_size);
      Diagnostic d = ErrorAt(spec_loc ? *spec_loc : at, "generated code does not parse",
                             "check the indentation and completeness of the inserted code");
      if (spec_loc) {
        d.notes.push_back("note: at " + at.path + ":" + std::to_string(at.line) + ":" +
                          std::to_string(at.col) + ": " + at.source_line);
      }
      errors_.push_back(std::move(d));
      ts_tree_delete(tree);
      return;
    }
    std::vector<ByteRange> inserted;
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (!ranges[i].empty()) {
        inserted.push_back({ranges[i].start + header_size, ranges[i].end + header_size});
      }
    }
    for (const NameUse& use : FindUnresolvedNames(root, out, inserted)) {
      SourceLoc at = output_loc(use.offset);
      SourceLoc loc = InsertedLoc(use.offset, lines, ranges, header_size).value_or(at);
      loc.length = static_cast<uint32_t>(use.name.size());
      Diagnostic d = ErrorAt(loc, "undefined name '" + use.name + "' in inserted code",
                             "import it with `imports.add`, define it in `helpers:`, or map it "
                             "with `name_map`");
      d.notes.push_back("note: generated line " + std::to_string(at.line) + ": " + at.source_line);
      errors_.push_back(std::move(d));
    }
    // Excluded definitions and dropped imports must not leave names behind that now resolve
    // nowhere (a name bound again by a helper or an added import is fine).
    std::vector<std::pair<const spec::LocatedName*, std::string>> removed;
    for (const spec::LocatedName* ex : excluded_) removed.push_back({ex, "excluded name"});
    for (const spec::LocatedName& d : spec_.import_drops) removed.push_back({&d, "dropped import"});
    if (!removed.empty()) {
      std::vector<NameUse> unresolved = FindUnresolvedNames(
          root, out, {ByteRange{header_size, static_cast<uint32_t>(out.size())}});
      for (const auto& [name, noun] : removed) {
        for (const NameUse& use : unresolved) {
          if (use.name != name->name) continue;
          SourceLoc at = output_loc(use.offset);
          Diagnostic d = ErrorAt(name->loc,
                                 noun + " '" + name->name + "' is still used at line " +
                                     std::to_string(at.line) + " of the output",
                                 "remove or patch the code that uses it, or keep '" +
                                     name->name + "'");
          d.notes.push_back("note: " + at.path + ":" + std::to_string(at.line) + ": " +
                            at.source_line);
          errors_.push_back(std::move(d));
        }
      }
    }
    ts_tree_delete(tree);
  }

  const spec::PatchSpec& spec_;
  const PyModule& up_;
  const std::string& src_;
  const GenerateOptions& options_;
  EditPlan plan_;
  std::vector<Diagnostic> errors_;
  std::vector<AppliedPatch> applied_;
  std::vector<MapUse> spec_map_;
  std::set<size_t> removed_imports_;
  std::string declarations_;
  /// Targets whose upstream body a patch replaces (replace_* and override_method).
  std::vector<std::pair<std::string, const Patch*>> replaced_;
  std::vector<std::pair<std::string, const Patch*>> added_methods_;
  std::vector<const spec::LocatedName*> excluded_;
  std::vector<SkippedEntry> skipped_;
  std::vector<ContractPin> contract_;
  std::vector<PendingEdit> pending_edits_;           ///< Statement edits, added after the guards.
  std::vector<GuardPlan::Region> guard_regions_;     ///< What the planned guards wrap.
  std::vector<const spec::Slot*> unguarded_slots_;   ///< Declared slots no guard dispatches.
};

/// Keeps the entries whose `upstream_version` matches `version`; the others go to `skipped`.
/// A condition that cannot be evaluated (upstream version unknown) is an error.
template <class T, class Describe>
void FilterByVersion(std::vector<T>& entries, const std::string& version, Describe describe,
                     std::vector<SkippedEntry>& skipped, std::vector<Diagnostic>& errors) {
  std::vector<T> kept;
  for (T& e : entries) {
    if (!e.when.upstream_version) {
      kept.push_back(std::move(e));
      continue;
    }
    std::optional<bool> match = spec::VersionMatches(*e.when.upstream_version, version);
    if (!match) {
      errors.push_back(ErrorAt(e.when.version_loc,
                               "cannot evaluate upstream_version '" + *e.when.upstream_version +
                                   "': the upstream version is '" + version + "'",
                               "the version comes from __version__ in the package's "
                               "__init__.py or its dist-info METADATA"));
      continue;
    }
    if (*match) {
      kept.push_back(std::move(e));
      continue;
    }
    auto [kind, target, loc] = describe(e);
    skipped.push_back({kind, target,
                       "upstream_version \"" + *e.when.upstream_version + "\" does not match " +
                           version + (e.when.reason.empty() ? "" : "; " + e.when.reason),
                       loc});
  }
  entries = std::move(kept);
}

}  // namespace

std::optional<ContractPin> RefingerprintContract(const ContractPin& pin,
                                                 const parser::PyModule& upstream) {
  ContractPin out = pin;
  const Definition* def = upstream.Find(pin.qualname);
  std::vector<ByteRange> ranges, skip;
  if (pin.region == "absent") {
    if (!def) {
      Fingerprint fp = AbsentFingerprint();
      out.sha256 = fp.sha256;
      out.text = fp.text;
      return out;
    }
    out.text = "(defined upstream)";
    out.sha256 = Sha256Hex(out.text);
    out.first_line = out.last_line = def->line;
    return out;
  }
  if (!def || pin.region == "statements") return std::nullopt;
  if (pin.region == "function") {
    ranges.push_back(def->definition);
    if (def->docstring) skip.push_back(*def->docstring);
  } else {
    ranges.push_back({def->definition.start, def->header.end});
    if (pin.key.starts_with("modify_init ")) {
      const Definition* init = upstream.Find(pin.qualname + ".__init__");
      if (!init) return std::nullopt;
      ranges.push_back({init->definition.start, init->header.end});
    }
  }
  Fingerprint fp = FingerprintOf(upstream, ranges, skip);
  out.sha256 = fp.sha256;
  out.text = fp.text;
  out.first_line = upstream.lines().LineOf(ranges.front().start) + 1;
  out.last_line = upstream.lines().LineOf(ranges.back().end - 1) + 1;
  return out;
}

Result<GenerateResult> Generate(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                                const GenerateOptions& options) {
  spec::PatchSpec active = spec;
  // The spec-level name_map maps patch targets as it maps guard targets, so that a sibling
  // family inherits its parent's patches (`Qwen3_5*: Qwen3_5Moe*`).
  std::vector<MapUse> target_map;
  for (const NameMapEntry& e : active.name_map) target_map.push_back({&e, false});
  for (Patch& p : active.patches) p.target = MapDotted(target_map, p.target);
  std::set<std::string> used_keys;
  for (const MapUse& u : target_map) {
    if (u.used) used_keys.insert(u.entry->Key());
  }
  std::vector<SkippedEntry> skipped;
  std::vector<Diagnostic> errors;
  const std::string& v = options.upstream_version;
  for (spec::Slot& slot : active.slots) {
    FilterByVersion(slot.guards, v, [](const spec::Guard& g) {
      return std::make_tuple(std::string("guard"), g.in, g.loc.line > 0 ? g.loc : g.in_loc);
    }, skipped, errors);
  }
  FilterByVersion(active.patches, v, [](const Patch& p) {
    return std::make_tuple(std::string(PatchKindKey(p.kind)), p.target, p.loc);
  }, skipped, errors);
  FilterByVersion(active.helpers, v, [](const spec::Helper& h) {
    return std::make_tuple(std::string("helper"), h.name, h.loc);
  }, skipped, errors);
  // Two entries for one target must not both apply (their conditions overlap).
  std::map<std::string, const Patch*> targets;
  for (const Patch& p : active.patches) {
    auto [it, inserted] = targets.emplace(p.target, &p);
    if (inserted) continue;
    Diagnostic d = ErrorAt(p.target_loc,
                           "duplicate target '" + p.target + "' for upstream version " + v,
                           "entries of one target need upstream_version conditions that do not "
                           "overlap");
    d.notes.push_back(it->second->target_loc.path + ":" + std::to_string(it->second->target_loc.line) +
                      ":" + std::to_string(it->second->target_loc.col) + ": note: also applies");
    errors.push_back(std::move(d));
  }
  if (!errors.empty()) {
    SortDiagnostics(errors);
    return errors;
  }
  return Generator(active, upstream, options, std::move(skipped), used_keys).Run();
}

}  // namespace patchgen::rewriter
