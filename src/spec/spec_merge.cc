#include "spec/spec_merge.h"

#include <algorithm>

#include "base/text_util.h"
#include "spec/patch_kinds.h"

namespace patchgen::spec {
namespace {

// Replaces the entry of `list` whose key equals `item`'s in place, or appends it.
template <class T, class KeyFn>
void Upsert(std::vector<T>& list, T item, KeyFn key) {
  for (T& existing : list) {
    if (key(existing) == key(item)) {
      existing = std::move(item);
      return;
    }
  }
  list.push_back(std::move(item));
}

bool Given(const std::vector<std::string>& keys, const char* k) {
  return std::find(keys.begin(), keys.end(), k) != keys.end();
}

// `remove` first: it names inherited entries only. Suggestions list every inherited entry,
// including those an earlier `remove` entry already dropped.
void ApplyRemoves(PatchSpec& parent, const std::vector<LocatedName>& removes,
                  const std::string& parent_path, std::vector<Diagnostic>& diags) {
  std::vector<std::string> names;
  for (const Patch& p : parent.patches) names.push_back(p.target);
  for (const Slot& s : parent.slots) names.push_back(s.name);
  for (const Helper& h : parent.helpers) names.push_back(h.name);
  for (const LocatedName& r : removes) {
    size_t before = parent.patches.size() + parent.slots.size() + parent.helpers.size();
    std::erase_if(parent.patches, [&](const Patch& p) { return p.target == r.name; });
    std::erase_if(parent.slots, [&](const Slot& s) { return s.name == r.name; });
    std::erase_if(parent.helpers, [&](const Helper& h) { return h.name == r.name; });
    if (parent.patches.size() + parent.slots.size() + parent.helpers.size() != before) continue;
    std::string help = WithDidYouMean(
        r.name, names,
        names.empty() ? std::string("the parent has no patches, slots or helpers")
                      : "inherited patch targets, slots and helpers: " + JoinNames(names));
    diags.push_back(
        ErrorAt(r.loc, "nothing named '" + r.name + "' to remove in '" + parent_path + "'", help));
  }
}

// The scalars the child gives override the parent's; the merged spec is the child's file.
void MergeScalars(OneSpec& parent_one, const OneSpec& child_one, const std::string& parent_path) {
  PatchSpec& parent = parent_one.spec;
  const PatchSpec& child = child_one.spec;
  parent.extends_chain.insert(parent.extends_chain.begin(), parent_path);
  parent.path = child.path;
  parent.text = child.text;
  if (child_one.has_version) parent.version = child.version;
  if (child_one.has_upstream) {
    parent.upstream = child.upstream;
    parent.upstream_loc = child.upstream_loc;
  }
  if (child_one.has_output) {
    parent.output = child.output;
    parent.output_loc = child.output_loc;
  }
  if (child_one.has_description) parent.description = child.description;
  if (child.runtime) parent.runtime = child.runtime;
}

// A slot without op/variant changes the inherited slot of its name (scope, guards).
void MergeSlots(PatchSpec& parent, std::vector<Slot>&& slots, const std::string& parent_path,
                std::vector<Diagnostic>& diags) {
  for (Slot& s : slots) {
    if (!s.partial) {
      Upsert(parent.slots, std::move(s), [](const Slot& x) { return x.name; });
      continue;
    }
    auto it = std::find_if(parent.slots.begin(), parent.slots.end(),
                           [&](const Slot& x) { return x.name == s.name; });
    if (it == parent.slots.end()) {
      std::vector<std::string> inherited;
      for (const Slot& x : parent.slots) inherited.push_back(x.name);
      std::string help = WithDidYouMean(s.name, inherited,
                                        "a slot without `op` and `variant` changes an inherited "
                                        "slot; a new slot needs both");
      diags.push_back(ErrorAt(
          s.loc, "no inherited slot '" + s.name + "' to change in '" + parent_path + "'", help));
      continue;
    }
    if (Given(s.given, "scope")) it->scope = s.scope;
    if (Given(s.given, "guards")) it->guards = std::move(s.guards);
  }
}

// The inherited patch a partial patch changes, or nullptr with an error.
Patch* InheritedPatch(PatchSpec& parent, const Patch& p, const std::string& parent_path,
                      std::vector<Diagnostic>& diags) {
  auto key = [](const Patch& x) { return x.target + '\0' + x.when.upstream_version.value_or(""); };
  auto it = std::find_if(parent.patches.begin(), parent.patches.end(),
                         [&](const Patch& x) { return key(x) == key(p); });
  if (it == parent.patches.end()) {
    std::vector<std::string> inherited;
    for (const Patch& x : parent.patches) inherited.push_back(x.target);
    std::string help =
        std::string("an entry without a body changes the inherited patch of its target; a new ") +
        PatchKindKey(p.kind) + " needs " +
        (InfoOf(p.kind).has_edits    ? "`edits`"
         : InfoOf(p.kind).has_choice ? "`attribute` and `values`"
                                     : "`code` or `file` + `symbol`");
    help = WithDidYouMean(p.target, inherited, std::move(help));
    diags.push_back(ErrorAt(
        p.target_loc, "no inherited patch of '" + p.target + "' to change in '" + parent_path + "'",
        help));
    return nullptr;
  }
  if (it->kind != p.kind) {
    diags.push_back(ErrorAt(p.loc,
                            std::string("the inherited patch of '") + p.target + "' is " +
                                PatchKindKey(it->kind) + ", not " + PatchKindKey(p.kind),
                            std::string("write `") + PatchKindKey(it->kind) + ": " + p.target +
                                "` to change it, or give a body to replace it"));
    return nullptr;
  }
  return &*it;
}

// A child's `default` of an inherited config_slot: one of the inherited values.
void MergeDefault(Patch& inherited, const LocatedName& def, std::vector<Diagnostic>& diags) {
  std::vector<std::string> names;
  for (const LocatedName& v : inherited.choice.values) names.push_back(v.name);
  if (std::find(names.begin(), names.end(), def.name) != names.end()) {
    inherited.choice.default_value = def;
    return;
  }
  std::string help = "the default must be one of the inherited values: " + JoinNames(names, 100);
  if (auto near = DidYouMean(def.name, names)) help = "did you mean '" + *near + "'? " + help;
  diags.push_back(ErrorAt(
      def.loc, "default '" + def.name + "' is not one of the values of " + inherited.target, help));
}

// A patch without a body changes the fields it gives of the inherited patch of its target
// (description, after, name_map, optional, reason); one with a body replaces it.
void MergePatches(PatchSpec& parent, std::vector<Patch>&& patches, const std::string& parent_path,
                  std::vector<Diagnostic>& diags) {
  for (Patch& p : patches) {
    if (!p.partial) {
      Upsert(parent.patches, std::move(p),
             [](const Patch& x) { return x.target + '\0' + x.when.upstream_version.value_or(""); });
      continue;
    }
    Patch* it = InheritedPatch(parent, p, parent_path, diags);
    if (!it) continue;
    if (Given(p.given, "description")) it->description = p.description;
    if (Given(p.given, "after")) it->init_at = p.init_at;
    for (NameMapEntry& e : p.name_map) {
      Upsert(it->name_map, std::move(e), [](const NameMapEntry& x) { return x.Key(); });
    }
    if (Given(p.given, "optional")) {
      it->when.optional = p.when.optional;
      it->when.optional_loc = p.when.optional_loc;
    }
    if (Given(p.given, "reason")) it->when.reason = p.when.reason;
    if (p.choice.default_value) MergeDefault(*it, *p.choice.default_value, diags);
  }
}

}  // namespace

void Merge(OneSpec& parent_one, OneSpec&& child_one, const std::string& parent_path,
           std::vector<Diagnostic>& diags) {
  PatchSpec& parent = parent_one.spec;
  PatchSpec& child = child_one.spec;
  // Required keys are only checked when every spec of the chain parsed: a parent that is not valid
  // YAML reports its own error, not a false "missing key" in its child.
  parent_one.parsed = parent_one.parsed && child_one.parsed;
  parent_one.has_upstream |= child_one.has_upstream;
  parent_one.has_output |= child_one.has_output;
  ApplyRemoves(parent, child_one.removes, parent_path, diags);
  MergeScalars(parent_one, child_one, parent_path);
  for (NameMapEntry& e : child.name_map) {
    Upsert(parent.name_map, std::move(e), [](const NameMapEntry& x) { return x.Key(); });
  }
  for (Block& b : child.import_adds) parent.import_adds.push_back(std::move(b));
  for (LocatedName& n : child.import_drops) {
    Upsert(parent.import_drops, std::move(n), [](const LocatedName& x) { return x.name; });
  }
  MergeSlots(parent, std::move(child.slots), parent_path, diags);
  MergePatches(parent, std::move(child.patches), parent_path, diags);
  for (Helper& h : child.helpers)
    Upsert(parent.helpers, std::move(h), [](const Helper& x) { return x.name; });
  for (Block& b : child.blocks) parent.blocks.push_back(std::move(b));
  for (LocatedName& n : child.excludes) {
    Upsert(parent.excludes, std::move(n), [](const LocatedName& x) { return x.name; });
  }
}

}  // namespace patchgen::spec
