// The guards stage: PlanGuards (guards.cc) on the spec with mapped guard targets, and the
// conflicts between guards and patches that replace or add the guarded definition.
#include <cctype>

#include "rewriter/fingerprint.h"
#include "rewriter/stages.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::PyModule;

/// The spec's slots with the spec-level name_map applied to guard targets, component by
/// component (`Qwen3_5MLP.forward` -> `Qwen3_5MoeMLP.forward` with `{Qwen3_5MLP: Qwen3_5MoeMLP}`),
/// so that a sibling model can inherit another model's guards through `extends`.
spec::PatchSpec SpecWithMappedGuardTargets(const spec::PatchSpec& spec, NameMap& spec_map) {
  spec::PatchSpec mapped = spec;
  for (spec::Slot& slot : mapped.slots) {
    for (spec::Guard& g : slot.guards) g.in = spec_map.MapDotted(g.in);
  }
  return mapped;
}

/// A guard inside a method that add_method creates has no upstream body to edit.
void CheckGuardsInAddedMethods(const spec::PatchSpec& mapped,
                               const std::vector<PatchedTarget>& added_methods,
                               std::vector<Diagnostic>& errors) {
  for (const spec::Slot& slot : mapped.slots) {
    for (const spec::Guard& g : slot.guards) {
      for (const auto& [target, p] : added_methods) {
        if (g.in != target) continue;
        errors.push_back(ErrorAt(
            g.in_loc,
            "guard on " + g.in + " is inside add_method " + target + " at " + p->loc.PathLine(),
            "guards edit upstream bodies; put the dispatch into the added method's code"));
      }
    }
  }
}

/// A guard on a definition that a patch replaces edits a body that is no longer there.
void CheckGuardsInReplaced(const GuardPlan& guards, const std::vector<PatchedTarget>& replaced,
                           std::vector<Diagnostic>& errors) {
  for (const auto& [qualname, loc] : guards.guarded_targets) {
    for (const auto& [target, p] : replaced) {
      if (qualname != target && !qualname.starts_with(target + ".")) continue;
      errors.push_back(
          ErrorAt(loc,
                  "guard on " + qualname + " conflicts with " + spec::PatchKindKey(p->kind) + " " +
                      target + " at " + p->loc.PathLine(),
                  "the patch replaces the upstream body the guard would edit; dispatch "
                  "inside the patch body instead, or drop one of them"));
    }
  }
}

/// What each planned guard relies on upstream: the guarded function (entry guard, docstring
/// left out) or the statements `at`..`through` (call-site guard).
ContractPin GuardPin(const PyModule& up, const GuardPlan::Region& r) {
  std::string key = "guard " + r.slot + " in " + r.in;
  if (r.at) key += " at '" + *r.at + "'";
  if (r.through) key += " through '" + *r.through + "'";
  if (r.upstream_version) key += " for upstream " + *r.upstream_version;
  if (r.statements)
    return MakePin(up, key, "statements", r.op_variant, r.in, r.loc, {*r.statements}, {});
  const Definition& def = up.definitions()[static_cast<size_t>(r.definition)];
  std::vector<ByteRange> skip;
  if (def.docstring) skip.push_back(*def.docstring);
  return MakePin(up, key, "function", r.op_variant, r.in, r.loc, {def.definition}, skip);
}

/// Slots whose every guard was skipped (or that have none): declared, but nothing in this
/// module dispatches through them; the header says so.
/// True when `name` occurs in `text` as a whole identifier (ASCII word boundaries).
bool NamesWord(const std::string& text, const std::string& name) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const size_t end = at + name.size();
    if ((at == 0 || !word(text[at - 1])) && (end == text.size() || !word(text[end]))) return true;
  }
  return false;
}

/// True when a patch's own code (an added or replaced body, a statement edit) names the slot: it
/// dispatches through it itself (e.g. a `loss_function` property that returns the bound slot).
bool NamedByPatchCode(const spec::PatchSpec& spec, const std::string& slot) {
  for (const spec::Patch& p : spec.patches) {
    if (p.body.source == spec::Body::Source::kCode && NamesWord(p.body.text, slot)) return true;
    for (const spec::StatementEdit& e : p.edits) {
      if (NamesWord(e.code, slot)) return true;
    }
  }
  return false;
}

std::vector<const spec::Slot*> SlotsWithoutGuards(const spec::PatchSpec& spec,
                                                  const std::vector<GuardPlan::Region>& regions) {
  std::vector<const spec::Slot*> out;
  std::set<std::string> seen;
  for (const spec::Slot& slot : spec.slots) {
    if (!seen.insert(slot.name).second) continue;
    bool guarded = NamedByPatchCode(spec, slot.name);
    for (const GuardPlan::Region& r : regions) guarded |= r.slot == slot.name;
    if (!guarded) out.push_back(&slot);
  }
  return out;
}

}  // namespace

GuardsStage PlanGuardStage(const spec::PatchSpec& spec, const PyModule& up,
                           const std::string& runtime, const std::vector<PatchedTarget>& replaced,
                           const std::vector<PatchedTarget>& added_methods) {
  GuardsStage st;
  NameMap spec_map(spec.name_map);
  const spec::PatchSpec mapped = SpecWithMappedGuardTargets(spec, spec_map);
  st.out.used_keys = spec_map.UsedKeys();
  CheckGuardsInAddedMethods(mapped, added_methods, st.out.errors);
  // PlanGuards would only add "no method" for a guard inside an added method.
  if (!mapped.slots.empty() && st.out.errors.empty()) {
    auto guards = PlanGuards(mapped, up, runtime);
    if (!guards) {
      for (Diagnostic& d : guards.errors()) st.out.errors.push_back(std::move(d));
    } else {
      CheckGuardsInReplaced(*guards, replaced, st.out.errors);
      st.out.edits = std::move(guards->edits);
      st.regions = guards->regions;
      st.declarations = guards->declarations;
      for (const GuardPlan::Skipped& sk : guards->skipped) {
        st.skipped.push_back({"guard", sk.target, sk.why, sk.loc});
      }
      for (const GuardPlan::Region& r : guards->regions) st.contract.push_back(GuardPin(up, r));
      for (const auto& [target, description] : guards->applied) {
        st.out.applied.push_back({"guard", target, OneLine(description)});
      }
    }
  }
  st.unguarded_slots = SlotsWithoutGuards(spec, st.regions);
  return st;
}

}  // namespace patchgen::rewriter
