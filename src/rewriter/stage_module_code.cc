// The module-level code stage: imports.add, slot declarations, blocks and helpers after the
// imports, then helpers placed after a named top-level definition; and the top-level bindings
// it and the exclude stage look up (stages.h).
#include <algorithm>

#include "base/text_util.h"
#include "rewriter/stages.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::Import;
using parser::PyModule;
using parser::TopLevelStatement;

/// Where added imports, slot declarations, blocks and helpers without `after` go: the end of
/// the line of the last top-level import that stays; without one, after the module docstring;
/// without that, in front of the first top-level statement (after a licence comment block).
/// `before_statement` is true in the last case: pieces are then followed by blank lines
/// instead of preceded by them.
struct Anchor {
  uint32_t offset = 0;
  bool before_statement = false;
};

Anchor AfterImports(const PyModule& up, const std::set<size_t>& removed_imports) {
  const std::string& src = up.source();
  std::optional<uint32_t> at;
  for (size_t i = 0; i < up.imports().size(); ++i) {
    const Import& imp = up.imports()[i];
    if (imp.depth == 0 && !removed_imports.count(i)) at = LineEndOf(src, imp.stmt.end);
  }
  if (at) return {*at, false};
  if (up.top_level().empty()) return {static_cast<uint32_t>(src.size()), true};
  const TopLevelStatement& first = up.top_level().front();
  std::string_view text = up.Text(first.range);
  size_t quote = text.find_first_of("\"'");
  if (first.kind == TopLevelStatement::Kind::kOther && quote != std::string_view::npos &&
      quote <= 3 && text.find_first_not_of("rRbBuUfF") == quote) {
    return {LineEndOf(src, first.range.end), false};
  }
  return {LineStartOf(src, first.range.start), true};
}

/// What the stage builds: its output and the spec-level name_map it renames with.
struct ModuleCode {
  const PyModule& up;
  NameMap spec_map;
  StageOutput out;

  /// Parses standalone code (blocks, helpers, added imports) and re-indents it to column 0.
  std::optional<Snippet> Standalone(const std::string& text, const spec::TextOrigin& origin,
                                    std::unique_ptr<PyModule>* keep = nullptr) {
    std::unique_ptr<PyModule> m = ParseCode(text, origin, out.errors);
    if (!m) return std::nullopt;
    Snippet s = WholeSnippet(*m, origin, {nullptr, &spec_map}, 0);
    if (keep) *keep = std::move(m);
    return s;
  }

  std::optional<Snippet> Helper(const spec::Helper& h) {
    if (h.body.source != spec::Body::Source::kFile) return Standalone(h.body.text, h.body.origin);
    std::unique_ptr<PyModule> m = ParseCode(h.body.text, h.body.origin, out.errors);
    if (!m) return std::nullopt;
    const Definition* def = BodyDefinition(*m, h.body, "helper " + h.name, out.errors);
    if (!def) return std::nullopt;
    return MakeSnippet(*m, def->whole, h.body.origin, {nullptr, &spec_map}, std::nullopt, 0);
  }

  /// An imports.add entry: its snippet, or nullopt (with an error) when it is not only imports;
  /// `future`: whether it is `from __future__` imports (which must stay first in the module).
  std::optional<Snippet> AddedImport(const spec::Block& b, bool* future = nullptr) {
    std::unique_ptr<PyModule> m;
    auto s = Standalone(b.code, b.origin, &m);
    if (!s) return std::nullopt;
    std::optional<bool> only_future = OnlyFutureImports(*m);
    if (!only_future) {
      out.errors.push_back(ErrorAt(b.loc,
                                   "an imports.add entry mixes `from __future__` imports "
                                   "with other statements",
                                   "give `from __future__` imports an entry of their own: "
                                   "patchgen puts them at the top of the module"));
      return std::nullopt;
    }
    if (future) *future = *only_future;
    bool only_imports = !m->top_level().empty();
    for (const TopLevelStatement& t : m->top_level()) {
      if (t.kind != TopLevelStatement::Kind::kImport) only_imports = false;
    }
    if (only_imports) return s;
    out.errors.push_back(ErrorAt(b.loc, "imports.add entries must be import statements",
                                 "put other code into `blocks:` or `helpers:`"));
    return std::nullopt;
  }

  /// imports.add entries of `from __future__` imports, after upstream's own (Python accepts
  /// them only at the top of a module).
  void AddFutureImports(const spec::PatchSpec& spec) {
    FutureAnchor a = AfterFutureImports(up);
    for (const spec::Block& b : spec.import_adds) {
      std::vector<Diagnostic> ignored;
      std::unique_ptr<PyModule> m = ParseCode(b.code, b.origin, ignored);
      if (!m || OnlyFutureImports(*m) != std::optional<bool>(true)) continue;
      Snippet s = WholeSnippet(*m, b.origin, {nullptr, &spec_map}, 0);
      out.edits.push_back(SnippetEdit({a.offset, a.offset}, a.before_statement ? "" : "\n", s,
                                      a.before_statement ? "\n" : "", b.loc, "imports.add"));
      out.applied.push_back(
          {"imports.add", OneLine(std::string(TrimTrailingNewlines(b.code))), ""});
    }
  }

  void AfterTheImports(const spec::PatchSpec& spec, Anchor anchor,
                       const std::string& declarations) {
    uint32_t at = anchor.offset;
    bool at_top = anchor.before_statement;
    // Each piece is preceded by its separator; in front of the first statement of a file the
    // first piece has none, and two blank lines end the inserted code.
    bool first = true;
    auto add = [&](const std::string& sep, const Snippet& s, const SourceLoc& loc,
                   const std::string& what) {
      out.edits.push_back(SnippetEdit({at, at}, at_top && first ? "" : sep, s, "", loc, what));
      first = false;
    };
    AddFutureImports(spec);
    for (const spec::Block& b : spec.import_adds) {
      bool future = false;
      auto s = AddedImport(b, &future);
      if (!s || future) continue;
      add("\n", *s, b.loc, "imports.add");
      out.applied.push_back(
          {"imports.add", OneLine(std::string(TrimTrailingNewlines(b.code))), ""});
    }
    if (!declarations.empty()) {
      out.edits.push_back(
          TextEdit{{at, at},
                   (at_top && first ? "" : "\n\n") + TrimTrailingNewlines(declarations),
                   spec.slots.empty() ? spec.upstream_loc : spec.slots.front().loc,
                   "slot declarations",
                   std::nullopt});
      first = false;
    }
    for (const spec::Block& b : spec.blocks) {
      if (auto s = Standalone(b.code, b.origin)) {
        add("\n\n", *s, b.loc, "block");
        out.applied.push_back({"block", "after the imports (" + b.loc.PathLine() + ")", ""});
      }
    }
    for (const spec::Helper& h : spec.helpers) {
      if (h.after) continue;
      if (auto s = Helper(h)) {
        add("\n\n\n", *s, h.loc, "helper " + h.name);
        out.applied.push_back({"helper", h.name, "after the imports"});
      }
    }
    if (at_top && !first) {
      out.edits.push_back(
          TextEdit{{at, at}, "\n\n\n", spec.upstream_loc, "code after the imports", std::nullopt});
    }
  }

  void HelpersAfter(const spec::PatchSpec& spec) {
    for (const spec::Helper& h : spec.helpers) {
      if (!h.after) continue;
      const TopLevelStatement* anchor = TopLevelBinding(up, *h.after);
      if (!anchor) {
        out.errors.push_back(
            MissingTopLevel(up, h.after_loc, "helper after '" + *h.after + "'", *h.after));
        continue;
      }
      if (auto s = Helper(h)) {
        uint32_t end = LineEndOf(up.source(), anchor->range.end);
        out.edits.push_back(SnippetEdit({end, end}, "\n\n\n", *s, "", h.loc, "helper " + h.name));
        out.applied.push_back({"helper", h.name, "after " + *h.after});
      }
    }
  }
};

}  // namespace

StageOutput PlanModuleCode(const spec::PatchSpec& spec, const PyModule& up,
                           const std::set<size_t>& removed_imports,
                           const std::string& declarations) {
  ModuleCode code{up, NameMap(spec.name_map), {}};
  code.AfterTheImports(spec, AfterImports(up, removed_imports), declarations);
  code.HelpersAfter(spec);
  code.out.used_keys = code.spec_map.UsedKeys();
  return std::move(code.out);
}

using parser::PyModule;
using parser::TopLevelStatement;

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

}  // namespace patchgen::rewriter
