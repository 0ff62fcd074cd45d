// The patches stage: each patch planned by the functions of its kind (kPatchPlanners), in spec
// order. docs/rewriter.md, "Placement rules", describes where each kind's text goes.
#include <tree_sitter/api.h>

#include "base/text_util.h"
#include "parser/tree_queries.h"
#include "rewriter/fingerprint.h"
#include "rewriter/patch_planners.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::PyModule;
using spec::Body;
using spec::Patch;
using spec::PatchKind;

// ----- replace_class, replace_function, override_method, add_method, modify_init ------------

/// Parses a def/class body and returns its snippet at `column`, renamed to the target's name.
std::optional<Snippet> DefinitionSnippet(PatchContext& ctx, const Patch& p, NameMap& patch_map,
                                         const std::string& what, Definition::Kind want,
                                         size_t column, bool* has_decorators) {
  std::unique_ptr<PyModule> m = ParseCode(p.body.text, p.body.origin, ctx.st.out.errors);
  if (!m) return std::nullopt;
  const Definition* def = BodyDefinition(*m, p.body, what, ctx.st.out.errors);
  if (!def) return std::nullopt;
  if (def->kind != want) {
    ctx.Error(p.body.loc, what + " needs a " +
                              (want == Definition::Kind::kClass ? "class" : "def") +
                              ", but the code defines " +
                              (def->kind == Definition::Kind::kClass ? "class '" : "function '") +
                              def->name + "'");
    return std::nullopt;
  }
  if (has_decorators) *has_decorators = !def->decorators.empty();
  // The name as written when it already is the target's for Python (`ﬁnd` for `find`: the index
  // holds NFKC names), so that no byte of the body changes for nothing.
  std::string name = LastComponent(p.target);
  if (def->name == name) name = std::string(m->Text(def->name_range));
  std::pair<ByteRange, std::string> rename{def->name_range, std::move(name)};
  return MakeSnippet(*m, def->whole, p.body.origin, {&patch_map, &ctx.spec_map}, rename, column);
}

void PlanReplace(PatchContext& ctx, const Patch& p, NameMap& patch_map, const std::string& what) {
  const PyModule& up = ctx.up;
  const std::string& src = up.source();
  bool is_class = p.kind == PatchKind::kReplaceClass;
  Definition::Kind kind = is_class ? Definition::Kind::kClass : Definition::Kind::kFunction;
  const Definition* target = up.FindTopLevel(p.target);
  if (!target || target->kind != kind) {
    std::vector<std::string> names = up.TopLevelNames(kind);
    std::string noun = is_class ? "class" : "function";
    std::string help = WithDidYouMean(
        p.target, names,
        std::string(is_class ? "top-level classes: " : "top-level functions: ") + JoinNames(names));
    ctx.Error(p.target_loc, "no top-level " + noun + " '" + p.target + "' in " + up.path(), help);
    return;
  }
  std::string indent(target->indent, ' ');
  ByteRange range{LineStartOf(src, target->definition.start),
                  LineEndOf(src, target->definition.end)};
  if (p.body.source == Body::Source::kFrom) {
    std::string stmt = "from " + p.body.from_module + " import " + p.body.from_name;
    if (p.body.from_name != p.target) stmt += " as " + p.target;
    ctx.st.out.edits.push_back(
        TextEdit{range, Marker(p, indent) + "\n" + indent + stmt, p.loc, what, std::nullopt});
    return;
  }
  auto snippet = DefinitionSnippet(ctx, p, patch_map, what, kind, target->indent, nullptr);
  if (!snippet) return;
  ctx.st.out.edits.push_back(
      SnippetEdit(range, Marker(p, indent) + "\n", *snippet, "", p.loc, what));
  ctx.st.replaced.push_back({p.target, &p});
}

/// The class of an override/add target `Class.m`, with errors for a missing class.
const Definition* TargetClass(PatchContext& ctx, const Patch& p) {
  std::string owner = Owner(p.target);
  if (owner.empty()) {
    ctx.Error(p.target_loc, "target '" + p.target + "' must be Class.method");
    return nullptr;
  }
  return FindClass(ctx, owner, p.target_loc);
}

void PlanOverride(PatchContext& ctx, const Patch& p, NameMap& patch_map, const std::string& what) {
  const PyModule& up = ctx.up;
  const std::string& src = up.source();
  const Definition* cls = TargetClass(ctx, p);
  if (!cls) return;
  const Definition* method = up.Find(p.target);
  if (!method || method->kind != Definition::Kind::kFunction || method->parent < 0 ||
      &up.definitions()[static_cast<size_t>(method->parent)] != cls) {
    std::vector<std::string> methods = up.ChildNames(*cls, Definition::Kind::kFunction);
    std::string help = WithDidYouMean(LastComponent(p.target), methods,
                                      "methods of " + cls->qualname + ": " + JoinNames(methods));
    ctx.Error(
        p.target_loc,
        "no method '" + LastComponent(p.target) + "' in class '" + cls->qualname + "'",
        help + (p.kind == PatchKind::kOverrideMethod ? "; use add_method for a new method" : ""));
    return;
  }
  bool has_decorators = false;
  auto snippet = DefinitionSnippet(ctx, p, patch_map, what, Definition::Kind::kFunction,
                                   method->indent, &has_decorators);
  if (!snippet) return;
  std::string indent(method->indent, ' ');
  ByteRange range{LineStartOf(src, method->definition.start),
                  LineEndOf(src, method->definition.end)};
  std::string prefix = Marker(p, indent) + "\n";
  // Upstream decorators (`@can_return_tuple`, ...) stay unless the body brings its own.
  if (!has_decorators && !method->decorators.empty()) {
    prefix += src.substr(
        LineStartOf(src, method->decorators.start),
        LineStartOf(src, method->header.start) - LineStartOf(src, method->decorators.start));
  }
  ctx.st.out.edits.push_back(SnippetEdit(range, prefix, *snippet, "", p.loc, what));
  ctx.st.replaced.push_back({p.target, &p});
}

void PlanAddMethod(PatchContext& ctx, const Patch& p, NameMap& patch_map, const std::string& what) {
  const std::string& src = ctx.up.source();
  const Definition* cls = TargetClass(ctx, p);
  if (!cls) return;
  if (ctx.up.Find(p.target)) {
    ctx.Error(
        p.target_loc,
        "method '" + LastComponent(p.target) + "' already exists in class '" + cls->qualname + "'",
        "use override_method to replace an existing method");
    return;
  }
  auto snippet = DefinitionSnippet(ctx, p, patch_map, what, Definition::Kind::kFunction,
                                   cls->body_indent, nullptr);
  if (!snippet) return;
  std::string indent(cls->body_indent, ' ');
  std::string marker = Marker(p, indent) + "\n";
  std::vector<TextEdit>& edits = ctx.st.out.edits;
  if (cls->empty_body && cls->inline_body) {
    // `class A(B): ...` -> the placeholder is replaced by an indented body.
    edits.push_back(SnippetEdit({cls->header.end, LineEndOf(src, cls->body.end)}, "\n" + marker,
                                *snippet, "", p.loc, what));
  } else if (cls->empty_body) {
    TSNode placeholder = parser::LastStatement(ctx.up, *cls);
    ByteRange r{LineStartOf(src, ts_node_start_byte(placeholder)), LineEndOf(src, cls->body.end)};
    edits.push_back(SnippetEdit(r, marker, *snippet, "", p.loc, what));
  } else {
    uint32_t end = LineEndOf(src, cls->body.end);
    edits.push_back(SnippetEdit({end, end}, "\n\n" + marker, *snippet, "", p.loc, what));
  }
  ctx.st.added_methods.push_back({p.target, &p});
}

void PlanModifyInit(PatchContext& ctx, const Patch& p, NameMap& patch_map,
                    const std::string& what) {
  const PyModule& up = ctx.up;
  const Definition* cls = FindClass(ctx, p.target, p.target_loc);
  if (!cls) return;
  const Definition* init = up.Find(cls->qualname + ".__init__");
  if (!init) {
    ctx.Error(p.target_loc, "class '" + cls->qualname + "' has no __init__ to modify",
              "use add_method " + cls->qualname + ".__init__ to define one");
    return;
  }
  std::unique_ptr<PyModule> m = ParseCode(p.body.text, p.body.origin, ctx.st.out.errors);
  if (!m) return;
  uint32_t at = LineEndOf(up.source(), init->body.end);
  bool before_line = false;
  if (p.init_at != Patch::InitAt::kAfterSuperInit && !init->inline_body) {
    std::optional<InitEnd> end = InitEndInsertion(ctx, p, *init, what);
    if (!end) return;
    at = end->offset;
    before_line = end->before_line;
  } else if (p.init_at == Patch::InitAt::kAfterSuperInit) {
    std::optional<ByteRange> super_init = parser::SuperInitStatement(up, *init);
    if (!super_init) {
      ctx.Error(p.loc, "no super().__init__(...) call in " + init->qualname,
                "use `after: end` (the default) to append to __init__");
      return;
    }
    at = LineEndOf(up.source(), super_init->end);
  }
  Snippet s = WholeSnippet(*m, p.body.origin, {&patch_map, &ctx.spec_map}, init->body_indent);
  std::string indent(init->body_indent, ' ');
  std::string marker = Marker(p, indent) + "\n";
  if (init->inline_body) {
    // `def __init__(self): super().__init__()` -> the inline body moves to its own line.
    std::string moved = "\n" + indent + std::string(up.Text(init->body)) + "\n";
    ctx.st.out.edits.push_back(
        SnippetEdit({init->header.end, LineEndOf(up.source(), init->body.end)}, moved + marker, s,
                    "", p.loc, what));
    return;
  }
  ctx.st.out.edits.push_back(before_line
                                 ? SnippetEdit({at, at}, marker, s, "\n", p.loc, what)
                                 : SnippetEdit({at, at}, "\n" + marker, s, "", p.loc, what));
}

// ----- optional patches: is the target absent? ----------------------------------------------

std::optional<std::string> ReplaceAbsent(const PyModule& up, const Patch& p) {
  Definition::Kind want =
      p.kind == PatchKind::kReplaceClass ? Definition::Kind::kClass : Definition::Kind::kFunction;
  const Definition* top = up.FindTopLevel(p.target);
  if (!top || top->kind != want) return "optional: no top-level '" + p.target + "' upstream";
  return std::nullopt;
}

std::optional<std::string> OverrideAbsent(const PyModule& up, const Patch& p) {
  const Definition* def = up.Find(p.target);
  if (!def || def->kind != Definition::Kind::kFunction) {
    return "optional: no method '" + p.target + "' upstream";
  }
  return std::nullopt;
}

std::optional<std::string> AddMethodAbsent(const PyModule& up, const Patch& p) {
  if (!up.Find(Owner(p.target))) return "optional: no class '" + Owner(p.target) + "' upstream";
  if (up.Find(p.target)) return "optional: upstream already defines '" + p.target + "'";
  return std::nullopt;
}

std::optional<std::string> ModifyInitAbsent(const PyModule& up, const Patch& p) {
  const Definition* def = up.Find(p.target);
  if (!def || def->kind != Definition::Kind::kClass || !up.Find(p.target + ".__init__")) {
    return "optional: no class '" + p.target + "' with an __init__ upstream";
  }
  return std::nullopt;
}

// ----- contract pins -------------------------------------------------------------------------

/// Decorators through the header's colon: what callers of `def` rely on.
ByteRange SignatureOf(const Definition& def) { return {def.definition.start, def.header.end}; }

void PinSignature(PatchContext& ctx, const Patch& p, const std::string& key) {
  if (const Definition* def = ctx.up.Find(p.target)) {
    ctx.st.contract.push_back(MakePin(ctx.up, key, "signature", spec::PatchKindKey(p.kind),
                                      p.target, p.loc, {SignatureOf(*def)}, {}));
  }
}

void PinAbsent(PatchContext& ctx, const Patch& p, const std::string& key) {
  if (!ctx.up.Find(p.target)) {
    ctx.st.contract.push_back(
        MakePin(ctx.up, key, "absent", spec::PatchKindKey(p.kind), p.target, p.loc, {}, {}));
  }
}

void PinInit(PatchContext& ctx, const Patch& p, const std::string& key) {
  const Definition* def = ctx.up.Find(p.target);
  const Definition* init = ctx.up.Find(p.target + ".__init__");
  if (!def || !init) return;
  ctx.st.contract.push_back(MakePin(ctx.up, key, "signature", spec::PatchKindKey(p.kind), p.target,
                                    p.loc, {SignatureOf(*def), SignatureOf(*init)}, {}));
}

/// One row per patch kind (spec::kPatchKinds): how it is planned, when it is absent, what it pins.
constexpr PatchPlanner kPatchPlanners[] = {
    {PatchKind::kReplaceClass, PlanReplace, ReplaceAbsent, PinSignature},
    {PatchKind::kReplaceFunction, PlanReplace, ReplaceAbsent, PinSignature},
    {PatchKind::kOverrideMethod, PlanOverride, OverrideAbsent, PinSignature},
    {PatchKind::kAddMethod, PlanAddMethod, AddMethodAbsent, PinAbsent},
    {PatchKind::kModifyInit, PlanModifyInit, ModifyInitAbsent, PinInit},
    {PatchKind::kEditBody, PlanEditBody, EditBodyAbsent, nullptr},
    {PatchKind::kConfigSlot, PlanConfigSlot, ConfigSlotAbsent, PinConfigSlot},
};

/// A patch on a member of a class that another patch replaces wholesale (e.g. `add_method X.m`
/// with `replace_class X`) would edit text that is no longer there: the two overlap, even when
/// their text edits only touch at the class's last byte.
void CheckNestedInReplaced(const spec::PatchSpec& spec, std::vector<Diagnostic>& errors) {
  for (const Patch& outer : spec.patches) {
    if (outer.kind != PatchKind::kReplaceClass && outer.kind != PatchKind::kReplaceFunction) {
      continue;
    }
    for (const Patch& inner : spec.patches) {
      if (inner.target.size() <= outer.target.size() ||
          inner.target.compare(0, outer.target.size() + 1, outer.target + ".") != 0) {
        continue;
      }
      errors.push_back(OverlapError(inner.loc, What(inner), outer.loc, What(outer)));
    }
  }
}

}  // namespace

const PatchPlanner* PlannerOf(PatchKind kind) {
  for (const PatchPlanner& row : kPatchPlanners) {
    if (row.kind == kind) return &row;
  }
  return nullptr;
}

std::string What(const Patch& p) {
  return std::string(spec::PatchKindKey(p.kind)) + " " + p.target;
}

std::string Marker(const Patch& p, const std::string& indent) {
  std::string m = indent + "# patchgen: " + spec::PatchKindKey(p.kind) + " " + p.target;
  if (!p.description.empty()) m += " - " + OneLine(p.description);
  return m + " (" + p.loc.PathLine() + ")";
}

const Definition* FindClass(PatchContext& ctx, const std::string& qualname, const SourceLoc& loc) {
  const PyModule& up = ctx.up;
  const Definition* def = up.Find(qualname);
  if (def && def->kind == Definition::Kind::kClass) return def;
  std::vector<std::string> candidates;
  std::string owner = Owner(qualname);
  if (owner.empty()) {
    candidates = up.TopLevelNames(Definition::Kind::kClass);
  } else if (const Definition* o = up.Find(owner)) {
    candidates = up.ChildNames(*o, Definition::Kind::kClass);
    for (std::string& c : candidates) c = owner + "." + c;
  }
  std::string help = DidYouMeanOr(qualname, candidates, "classes: " + JoinNames(candidates));
  ctx.Error(loc, "no class '" + qualname + "' in " + up.path(), help);
  return nullptr;
}

PatchesStage PlanPatches(const spec::PatchSpec& spec, const PyModule& up) {
  PatchesStage st;
  NameMap spec_map(spec.name_map);
  PatchContext ctx{spec, up, spec_map, st};
  CheckNestedInReplaced(spec, st.out.errors);
  for (const Patch& p : spec.patches) {
    const PatchPlanner& planner = *PlannerOf(p.kind);
    if (p.when.optional) {
      if (std::optional<std::string> why = planner.absent(up, p)) {
        st.skipped.push_back({spec::PatchKindKey(p.kind), p.target,
                              *why + (p.when.reason.empty() ? "" : "; " + p.when.reason), p.loc});
        continue;
      }
    }
    NameMap patch_map(p.name_map);
    planner.plan(ctx, p, patch_map, What(p));
    patch_map.ReportUnused({}, st.out.errors);
    st.out.applied.push_back({spec::PatchKindKey(p.kind), p.target, OneLine(p.description)});
    if (planner.pin) {
      std::string key = What(p);
      if (p.when.upstream_version) key += " for upstream " + *p.when.upstream_version;
      planner.pin(ctx, p, key);
    }
  }
  st.out.used_keys = spec_map.UsedKeys();
  return st;
}

}  // namespace patchgen::rewriter
