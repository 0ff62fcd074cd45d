// PlanGuards: turns a spec's `slots:` into OpSlot declarations and TextEdits that inject guards
// into upstream bodies (docs/guards.md). Nothing is copied out of upstream: an entry guard is an
// insertion, a call-site guard replaces a run of upstream lines by an if/else whose else-branch is
// those same bytes shifted one level right.
//
// Statements are found with the upstream tree-sitter tree (blocks, clauses, string literals), so
// matching `at`/`through` never looks inside nested defs, and re-indentation never touches a line
// that starts inside a multi-line string literal. Every error is located in the spec and all of
// them are collected before returning.
#include "rewriter/guards.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "base/text_util.h"
#include "parser/tree_queries.h"
#include "rewriter/guard_planner.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::PyModule;
using spec::Guard;
using spec::Slot;

std::string Describe(const Slot& s) {
  return SlotExpr(s) + (s.scope == Slot::Scope::kInstance ? " (scope: instance)" : "");
}

}  // namespace

std::string SlotExpr(const Slot& slot) {
  return "OpSlot(\"" + slot.op + "\", \"" + slot.variant + "\")";
}

Result<GuardPlan> GuardPlanner::Run() {
  std::vector<const Slot*> slots = UniqueSlots();
  for (const Slot* slot : slots) {
    std::set<std::string> seen_guards;
    for (const Guard& g : slot->guards) {
      std::string key =
          g.in + '\0' + g.at.value_or("") + '\0' + g.through.value_or("") + '\0' + g.call;
      if (!seen_guards.insert(key).second) continue;  // Inherited twice: apply once.
      if (g.when.optional) {
        if (std::optional<std::string> why = Absent(g)) {
          plan_.skipped.push_back({g.in, *why + (g.when.reason.empty() ? "" : "; " + g.when.reason),
                                   g.loc.line > 0 ? g.loc : g.in_loc});
          continue;
        }
      }
      PlanGuard(*slot, g);
    }
  }
  EmitEdits();
  if (!errors_.empty()) {
    SortDiagnostics(errors_);
    return errors_;
  }
  return std::move(plan_);
}

/// Checks slot names (conflicts, clashes with upstream names) and builds `declarations`.
std::vector<const Slot*> GuardPlanner::UniqueSlots() {
  std::vector<const Slot*> unique;
  std::map<std::string, const Slot*> by_name;
  std::map<std::string, uint32_t> upstream_names;
  for (const auto& st : up_.top_level()) {
    for (const std::string& n : st.names) {
      upstream_names.emplace(n, up_.lines().LineOf(st.range.start) + 1);
    }
  }
  std::string decls;
  for (const Slot& slot : spec_.slots) {
    auto [it, inserted] = by_name.emplace(slot.name, &slot);
    if (!inserted) {
      const Slot& first = *it->second;
      if (first.op == slot.op && first.variant == slot.variant && first.scope == slot.scope) {
        unique.push_back(&slot);  // Its guards still apply; the declaration is emitted once.
        continue;
      }
      Diagnostic d = ErrorAt(
          slot.loc,
          "conflicting declarations of slot '" + slot.name + "': " + Describe(slot) + " here, " +
              Describe(first) + " before",
          "a slot name means one op/variant; rename one of the slots or make them identical");
      d.notes.push_back(Note::At(first.loc, "'" + slot.name + "' first declared here"));
      errors_.push_back(std::move(d));
      continue;
    }
    auto clash = upstream_names.find(slot.name);
    if (clash != upstream_names.end()) {
      errors_.push_back(ErrorAt(slot.loc,
                                "slot name '" + slot.name + "' is already defined in " +
                                    up_.path() + " (line " + std::to_string(clash->second) + ")",
                                "a slot is a module-level variable; choose a name upstream "
                                "does not bind"));
      continue;
    }
    unique.push_back(&slot);
    if (slot.scope == Slot::Scope::kModule) decls += slot.name + " = " + SlotExpr(slot) + "\n";
  }
  if (!spec_.slots.empty()) {
    plan_.declarations = "from " + runtime_ + " import OpSlot\n";
    if (!decls.empty()) plan_.declarations += "\n" + decls;
  }
  return unique;
}

/// Resolves `in` to a function or method, or reports why it cannot.
const Definition* GuardPlanner::ResolveTarget(const Guard& g) {
  std::vector<std::string> parts;
  for (std::string_view rest = g.in;;) {
    size_t dot = rest.find('.');
    parts.emplace_back(rest.substr(0, dot));
    if (dot == std::string_view::npos) break;
    rest.remove_prefix(dot + 1);
  }
  const Definition* def = up_.FindTopLevel(parts[0]);
  if (!def) {
    errors_.push_back(ErrorAt(g.in_loc, "no class or function '" + parts[0] + "' in " + up_.path(),
                              DidYouMeanOr(parts[0], up_.TopLevelNames(),
                                           "a guard goes in a function ('f') or a method "
                                           "('Class.method', 'Outer.Inner.method')")));
    return nullptr;
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    const Definition* child = up_.Find(def->qualname + "." + parts[i]);
    if (child) {
      def = child;
      continue;
    }
    bool is_class = def->kind == Definition::Kind::kClass;
    std::vector<std::string> methods = up_.ChildNames(*def, Definition::Kind::kFunction);
    std::vector<std::string> candidates = methods;
    for (const std::string& c : up_.ChildNames(*def, Definition::Kind::kClass))
      candidates.push_back(c);
    std::string help =
        WithDidYouMean(parts[i], candidates,
                       is_class ? "Methods of " + def->qualname + ": " +
                                      (methods.empty() ? std::string("none") : JoinNames(methods))
                                : std::string());
    errors_.push_back(ErrorAt(g.in_loc,
                              std::string(is_class ? "no method '" : "no nested function '") +
                                  parts[i] + "' in " + (is_class ? "class '" : "function '") +
                                  def->qualname + "'",
                              help));
    return nullptr;
  }
  if (def->kind == Definition::Kind::kClass) {
    errors_.push_back(ErrorAt(g.in_loc,
                              "guard target '" + g.in + "' is a class, not a function or method",
                              "Methods of " + def->qualname + ": " +
                                  JoinNames(up_.ChildNames(*def, Definition::Kind::kFunction))));
    return nullptr;
  }
  return def;
}

/// Why an optional guard cannot apply (its target, `at` or `through` is absent upstream), or
/// nullopt when everything it names is there (then it is planned, errors included).
std::optional<std::string> GuardPlanner::Absent(const Guard& g) const {
  const Definition* def = up_.Find(g.in);
  if (!def || def->kind != Definition::Kind::kFunction) {
    return "optional guard: no function '" + g.in + "' upstream";
  }
  if (!g.at) return std::nullopt;
  BodyStatements stmts(up_, *def);
  if (!stmts.ok()) return std::nullopt;
  AnchorQuery q;
  q.at = *g.at;
  if (g.through) q.through = *g.through;
  if (std::optional<std::string> why = stmts.Absent(q)) return "optional guard: " + *why;
  return std::nullopt;
}

void GuardPlanner::PlanGuard(const Slot& slot, const Guard& g) {
  if (g.through && !g.at) {  // The spec loader rejects this too; PatchSpecs may be built in code.
    errors_.push_back(ErrorAt(g.through_loc, "`through` without `at`",
                              "`through` ends the statement range that `at` starts"));
    return;
  }
  const Definition* def = ResolveTarget(g);
  if (!def) return;
  bool ok = true;
  if (slot.scope == Slot::Scope::kInstance) ok = PlanInstanceBinding(slot, g, *def);
  ok = ok && CheckSlotName(slot, g, *def);
  std::optional<PreparedCall> call = PrepareGuardCall(slot, g, !g.at, errors_);
  if (!call || !ok || (!g.at && !CheckEntry(slot, g, *def, *call))) return;
  bool planned = g.at ? PlanCallSite(slot, g, *def, *call) : PlanEntry(slot, g, *def, *call);
  if (!planned) return;
  plan_.applied.emplace_back(def->qualname, slot.name + " -> " + slot.op + "/" + slot.variant);
  GuardPlan::Region region{slot.name,
                           slot.op + "/" + slot.variant,
                           def->qualname,
                           g.at,
                           g.through,
                           g.loc.line > 0 ? g.loc : g.in_loc,
                           IndexOf(def),
                           std::nullopt,
                           g.when.upstream_version};
  if (g.at) region.statements = last_call_site_;
  plan_.regions.push_back(std::move(region));
  plan_.guarded_targets.emplace_back(def->qualname, g.in_loc);
}

/// Checks an instance-scoped guard's target and records the `__init__` binding of its owner.
bool GuardPlanner::PlanInstanceBinding(const Slot& slot, const Guard& g, const Definition& def) {
  const auto& defs = up_.definitions();
  if (def.parent < 0 || defs[def.parent].kind != Definition::Kind::kClass) {
    errors_.push_back(ErrorAt(
        g.in_loc,
        "slot '" + slot.name + "' has `scope: instance`, but '" + g.in + "' is " +
            (def.parent < 0 ? "a module-level function" : "a nested function") + ", not a method",
        "instance-scoped slots live on `self`; guard a method, or drop `scope: instance`"));
    return false;
  }
  const Definition& owner = defs[def.parent];
  const Definition* init = up_.Find(owner.qualname + ".__init__");
  if (!init) {
    errors_.push_back(ErrorAt(
        g.in_loc,
        "slot '" + slot.name + "' has `scope: instance`, but class '" + owner.qualname +
            "' has no __init__ to bind it in",
        "instance-scoped slots are bound in the owner's __init__; drop `scope: instance` or "
        "guard a method of a class that defines __init__"));
    return false;
  }
  std::vector<std::string> params = parser::ParameterNames(up_, *init);
  if (std::find(params.begin(), params.end(), "config") == params.end()) {
    errors_.push_back(ErrorAt(
        g.in_loc,
        "slot '" + slot.name + "' has `scope: instance`, but " + owner.qualname +
            ".__init__ has no `config` parameter to bind from",
        "the binding is `self." + slot.name + " = " + SlotExpr(slot) +
            ".bind_from(config, owner=self)`; drop `scope: instance` or guard a class whose "
            "__init__ takes the config"));
    return false;
  }
  InitEdit& e = init_[IndexOf(init)];
  if (e.slots.insert(slot.name).second) {
    if (e.lines.empty()) e.origin = slot.loc;
    // `owner=self`: the runtime checks a saved ops choice against the module-level slots of the
    // module of self's class, instead of reading the calling module from the stack.
    e.lines.push_back("self." + slot.name + " = " + SlotExpr(slot) +
                      ".bind_from(config, owner=self)");
  }
  return true;
}

Result<GuardPlan> PlanGuards(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                             const std::string& runtime) {
  return GuardPlanner(spec, upstream, runtime).Run();
}

}  // namespace patchgen::rewriter
