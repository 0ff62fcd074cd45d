// FileLoader (file_loader.h): slots and their guards, and the conditions (`upstream_version`,
// `optional`, `reason`) of guards, patches and helpers.
#include <map>

#include "base/text_util.h"
#include "spec/file_loader.h"
#include "spec/version_condition.h"

namespace patchgen::spec {

void FileLoader::LoadSlots(const RawNode& n, PatchSpec& spec) {
  const auto* items = Sequence(n, "slots");
  if (!items) return;
  std::map<std::string, size_t> by_name;
  for (const RawNode& item : *items) {
    if (!Mapping(item, "slots")) continue;
    KeyMap keys = Keys(item, KeyLevel::kSlot);
    if (std::optional<Slot> slot = LoadSlot(item, keys)) {
      AddSlot(std::move(*slot), *keys.at("name").second, spec, by_name);
    }
  }
}

// One slot entry; nullopt when any part is invalid (reported). With `extends`, `name` and no
// op/variant changes the inherited slot of that name (a partial slot).
std::optional<Slot> FileLoader::LoadSlot(const RawNode& item, const KeyMap& keys) {
  Slot slot;
  slot.partial = has_extends_ && keys.count("name") && !keys.count("op") && !keys.count("variant");
  if (!slot.partial && !RequireNewSlotKeys(item, keys)) return std::nullopt;
  for (const auto& [k, kv] : keys) slot.given.push_back(k);
  auto name = Identifier(*keys.at("name").second, "name");
  std::optional<std::string> op = slot.partial ? std::optional<std::string>("")
                                               : OpName(*keys.at("op").second, "op", "rms_norm");
  std::optional<std::string> variant =
      slot.partial ? std::optional<std::string>("")
                   : OpName(*keys.at("variant").second, "variant", "standard");
  bool ok = name && op && variant;
  if (auto it = keys.find("scope"); it != keys.end()) {
    auto scope = EnumValue(*it->second.second, "scope", ScopeValues());
    ok = ok && scope;
    if (scope) slot.scope = *scope == "instance" ? Slot::Scope::kInstance : Slot::Scope::kModule;
  }
  if (auto it = keys.find("guards"); it != keys.end()) LoadSlotGuards(*it->second.second, slot);
  if (!ok) return std::nullopt;
  slot.name = *name;
  slot.op = *op;
  slot.variant = *variant;
  slot.loc = Loc(*keys.at("name").second);
  return slot;
}

void FileLoader::LoadSlotGuards(const RawNode& n, Slot& slot) {
  const auto* guards = Sequence(n, "guards");
  if (!guards) return;
  for (const RawNode& g : *guards) {
    if (auto guard = LoadGuard(g)) slot.guards.push_back(std::move(*guard));
  }
}

// Adds `slot` to the spec. The same declaration again (name, op, variant, scope) joins its
// guards to the first one's; the same name with another op/variant/scope is an error.
void FileLoader::AddSlot(Slot slot, const RawNode& name_node, PatchSpec& spec,
                         std::map<std::string, size_t>& by_name) {
  if (slot.partial) {
    spec.slots.push_back(std::move(slot));
    return;
  }
  auto [it, inserted] = by_name.emplace(slot.name, spec.slots.size());
  if (inserted) {
    spec.slots.push_back(std::move(slot));
    return;
  }
  Slot& first = spec.slots[it->second];
  if (first.op != slot.op || first.variant != slot.variant || first.scope != slot.scope) {
    ErrorWithNote(name_node,
                  "slot '" + slot.name + "' is declared again with a different op/variant/scope",
                  first.loc, "first declared here as " + first.op + "/" + first.variant,
                  "use another slot name, or the same op, variant and scope");
    return;
  }
  for (Guard& g : slot.guards) first.guards.push_back(std::move(g));
}

// `name`, `op` and `variant` of a new slot, with the messages of RequireKeys.
bool FileLoader::RequireNewSlotKeys(const RawNode& entry, const KeyMap& keys) {
  bool ok = true;
  for (const std::string& k : NewSlotKeys()) {
    if (keys.count(k)) continue;
    Error(entry.entries.empty() ? entry : entry.entries.front().first,
          "missing key '" + k + "' in a slot", "a slot needs: " + JoinNames(NewSlotKeys(), 100));
    ok = false;
  }
  return ok;
}

std::optional<Guard> FileLoader::LoadGuard(const RawNode& n) {
  if (!Mapping(n, "guards")) return std::nullopt;
  auto keys = Keys(n, KeyLevel::kGuard);
  if (!RequireKeys(n, keys, KeyLevel::kGuard)) return std::nullopt;
  Guard g;
  g.loc = Loc(n.entries.front().first);
  auto in = Dotted(*keys["in"].second, "in", "Qwen3RMSNorm.forward");
  auto call = Code(*keys["call"].second, "call");
  bool ok = in && call;
  if (auto it = keys.find("at"); it != keys.end()) {
    if (auto at = String(*it->second.second, "at")) {
      g.at = *at;
      g.at_loc = Loc(*it->second.second);
    } else {
      ok = false;
    }
  }
  if (auto it = keys.find("through"); it != keys.end()) {
    if (!g.at && keys.find("at") == keys.end()) {
      Error(*it->second.first, "'through' needs 'at'",
            "`at` names the first statement of the range, `through` the last");
      ok = false;
    } else if (auto through = String(*it->second.second, "through")) {
      g.through = *through;
      g.through_loc = Loc(*it->second.second);
    } else {
      ok = false;
    }
  }
  if (!LoadCondition(keys, g.when)) ok = false;
  if (!ok) return std::nullopt;
  g.in = *in;
  g.in_loc = Loc(*keys["in"].second);
  g.call = std::move(call->first);
  g.call_origin = std::move(call->second);
  return g;
}

// `upstream_version`, `optional` and `reason` of a guard, patch or helper (the level's known
// keys decide which are accepted). False when one is invalid (reported).
bool FileLoader::LoadCondition(const KeyMap& keys, Condition& c) {
  bool ok = true;
  if (auto it = keys.find("upstream_version"); it != keys.end()) {
    if (auto v = String(*it->second.second, "upstream_version")) {
      if (auto why = CheckVersionCondition(*v)) {
        Error(*it->second.second, "invalid upstream_version '" + *v + "': " + *why,
              "write clauses like \">=5.23\" or \">=5.17,<5.23\"");
        ok = false;
      } else {
        c.upstream_version = *v;
        c.version_loc = Loc(*it->second.second);
      }
    } else {
      ok = false;
    }
  }
  if (auto it = keys.find("optional"); it != keys.end()) {
    const RawNode& v = *it->second.second;
    if (v.kind == Kind::kScalar && v.style == RawNode::Style::kPlain &&
        (v.scalar == "true" || v.scalar == "false")) {
      c.optional = v.scalar == "true";
      c.optional_loc = Loc(*it->second.first);
    } else {
      Error(v, "'optional' takes true or false", "write `optional: true` and a `reason:`");
      ok = false;
    }
  }
  if (auto it = keys.find("reason"); it != keys.end()) {
    if (auto r = OneLine(*it->second.second, "reason"))
      c.reason = *r;
    else
      ok = false;
  }
  if (c.optional && c.reason.empty() && keys.find("reason") == keys.end()) {
    Error(*keys.find("optional")->second.first, "'optional: true' needs a 'reason'",
          "say why the entry may be absent upstream, e.g. `reason: slice_logits_to_keep "
          "appeared in 5.23`; it is shown when the entry is skipped");
    ok = false;
  }
  return ok;
}

}  // namespace patchgen::spec
