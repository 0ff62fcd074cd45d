// SpecReader's part for `config_slot` entries: the attribute, the implementation names and the
// default (issue #18; the kind's row in patch_kinds.cc has has_choice).
#include <algorithm>

#include "base/text_util.h"
#include "spec/python_names.h"
#include "spec/spec_reader.h"

namespace patchgen::spec {

// An implementation name of a config slot: letters, digits and `_` (it becomes a string literal of
// the generated `ConfigSlot(...)`, and is compared with the config's value as written).
std::optional<LocatedName> SpecReader::ImplName(const RawNode& n, std::string_view what) {
  auto s = String(n, what);
  if (!s) return std::nullopt;
  bool ok = !s->empty();
  for (char c : *s) {
    ok = ok &&
         (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'));
  }
  if (!ok) {
    Error(n, "'" + *s + "' is not a valid implementation name",
          "`" + std::string(what) +
              "` takes names of letters, digits and `_`, like `eager` or `flash_attention_2`");
    return std::nullopt;
  }
  return LocatedName{*s, Loc(n)};
}

bool SpecReader::LoadChoiceValues(const RawNode& n, ConfigChoice& c) {
  const auto* items = Sequence(n, "values");
  if (!items) return false;
  if (items->empty()) {
    Error(n, "'values' is empty",
          "list the implementations the config may choose, like `[eager, sdpa]`");
    return false;
  }
  bool ok = true;
  for (const RawNode& item : *items) {
    std::optional<LocatedName> v = ImplName(item, "values");
    if (!v) {
      ok = false;
      continue;
    }
    auto first = std::find_if(c.values.begin(), c.values.end(),
                              [&](const LocatedName& x) { return x.name == v->name; });
    if (first != c.values.end()) {
      ErrorWithNote(item, "'" + v->name + "' is listed twice in 'values'", first->loc,
                    "first listed here");
      ok = false;
      continue;
    }
    c.values.push_back(std::move(*v));
  }
  return ok;
}

bool SpecReader::LoadChoiceDefault(const RawNode& def, bool values_ok, ConfigChoice& c) {
  std::optional<LocatedName> d = ImplName(def, "default");
  if (!d) return false;
  bool listed = std::any_of(c.values.begin(), c.values.end(),
                            [&](const LocatedName& x) { return x.name == d->name; });
  if (!listed && values_ok) {
    std::vector<std::string> names;
    for (const LocatedName& v : c.values) names.push_back(v.name);
    std::string help = "the default must be one of 'values': " + JoinNames(names, 100);
    if (auto near = DidYouMean(d->name, names)) help = "did you mean '" + *near + "'? " + help;
    Error(def, "default '" + d->name + "' is not one of the values", help);
    return false;
  }
  c.default_value = std::move(*d);
  return true;
}

bool SpecReader::LoadChoice(const KeyMap& keys, const PatchKindInfo& info, const RawNode& kind_node,
                            bool partial_allowed, Patch& p) {
  bool ok = true;
  for (const char* k : {"code", "file", "symbol", "from", "edits"}) {
    if (const RawNode* key = KeyNodeOf(keys, k)) {
      Error(*key, std::string("'") + k + "' is not allowed on " + std::string(info.key),
            "a config slot's code is generated (`self.<name> = ConfigSlot(...)` in __init__); "
            "the code that reads it goes in an edit_body or override_method patch");
      ok = false;
    }
  }
  const RawNode* attribute = ValueOf(keys, "attribute");
  const RawNode* values = ValueOf(keys, "values");
  const RawNode* def = ValueOf(keys, "default");
  if (partial_allowed && !attribute && !values) {
    // Changes the inherited config_slot of this target (resolved by the merge); a `default` is
    // checked against the inherited values there.
    p.partial = true;
    if (def && !LoadChoiceDefault(*def, false, p.choice)) ok = false;
    return ok;
  }
  for (const char* k : {"attribute", "values"}) {
    if (ValueOf(keys, k)) continue;
    Error(kind_node, std::string(info.key) + " needs '" + k + "'",
          "a config slot names the config attribute it reads (`attribute:`) and the "
          "implementations it may hold (`values:`)");
    ok = false;
  }
  ConfigChoice& c = p.choice;
  if (attribute) {
    // As written: it becomes a string literal (`ConfigSlot(..., "<attribute>", ...)`), which the
    // runtime reads with getattr, and Python does not normalise strings.
    std::optional<std::string> a = Identifier(*attribute, "attribute", /*as_python=*/false);
    ok = ok && a.has_value();
    c.attribute = a.value_or("");
    c.attribute_loc = Loc(*attribute);
  }
  bool values_ok = values && LoadChoiceValues(*values, c);
  ok = ok && values_ok;
  if (def && !LoadChoiceDefault(*def, values_ok, c)) ok = false;
  return ok;
}

bool SpecReader::RefuseChoiceKeys(const KeyMap& keys, const PatchKindInfo& info) {
  bool ok = true;
  for (const char* k : {"attribute", "values", "default"}) {
    if (const RawNode* key = KeyNodeOf(keys, k)) {
      Error(*key, std::string("'") + k + "' is only for config_slot",
            "`" + std::string(info.key) +
                "` takes a body; a config slot (`config_slot: Class.name` with `attribute` and "
                "`values`) declares an implementation chosen from the model config");
      ok = false;
    }
  }
  return ok;
}

}  // namespace patchgen::spec
