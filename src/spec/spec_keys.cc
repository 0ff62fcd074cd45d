#include "spec/spec_keys.h"

#include "spec/patch_kinds.h"
#include "spec/patch_spec.h"

namespace patchgen::spec {

const std::vector<KeyLevel>& AllKeyLevels() {
  static const std::vector<KeyLevel> levels = {
      KeyLevel::kSpec,  KeyLevel::kImports, KeyLevel::kSlot, KeyLevel::kGuard,
      KeyLevel::kPatch, KeyLevel::kHelper,  KeyLevel::kEdit};
  return levels;
}

const char* KeyLevelName(KeyLevel level) {
  switch (level) {
    case KeyLevel::kSpec:
      return "spec";
    case KeyLevel::kImports:
      return "imports";
    case KeyLevel::kSlot:
      return "slot";
    case KeyLevel::kGuard:
      return "guard";
    case KeyLevel::kPatch:
      return "patch";
    case KeyLevel::kHelper:
      return "helper";
    case KeyLevel::kEdit:
      return "edit";
  }
  return "?";
}

const std::vector<std::string>& KnownKeys(KeyLevel level) {
  static const std::vector<std::string> spec = {
      "version", "upstream", "output",  "description", "runtime", "extends", "name_map",
      "imports", "slots",    "patches", "helpers",     "blocks",  "exclude", "remove"};
  static const std::vector<std::string> imports = {"add", "drop"};
  static const std::vector<std::string> slot = {"name", "op", "variant", "scope", "guards"};
  static const std::vector<std::string> guard = {
      "in", "at", "through", "call", "upstream_version", "optional", "reason"};
  // The kind keys (from the kind table) first, then the keys shared by the kinds.
  static const std::vector<std::string> patch = [] {
    std::vector<std::string> keys = PatchKindKeys();
    for (const char* k :
         {"description", "code", "file", "symbol", "from", "after", "edits", "attribute", "values",
          "default", "name_map", "upstream_version", "optional", "reason"}) {
      keys.push_back(k);
    }
    return keys;
  }();
  static const std::vector<std::string> helper = {
      "after", "name", "code", "file", "symbol", "upstream_version", "reason"};
  static const std::vector<std::string> edit = {
      "insert_before", "insert_after", "replace", "delete", "wrap", "through", "code"};
  switch (level) {
    case KeyLevel::kSpec:
      return spec;
    case KeyLevel::kImports:
      return imports;
    case KeyLevel::kSlot:
      return slot;
    case KeyLevel::kGuard:
      return guard;
    case KeyLevel::kPatch:
      return patch;
    case KeyLevel::kHelper:
      return helper;
    case KeyLevel::kEdit:
      return edit;
  }
  return spec;
}

const std::vector<std::string>& RequiredKeys(KeyLevel level) {
  static const std::vector<std::string> spec = {"upstream", "output"};
  // A slot's `op` and `variant` are required too, except in a spec with `extends`, where a slot
  // without them changes the inherited slot of that name (NewSlotKeys).
  static const std::vector<std::string> slot = {"name"};
  static const std::vector<std::string> guard = {"in", "call"};
  static const std::vector<std::string> none;
  switch (level) {
    case KeyLevel::kSpec:
      return spec;
    case KeyLevel::kSlot:
      return slot;
    case KeyLevel::kGuard:
      return guard;
    default:
      return none;
  }
}

const std::vector<std::string>& NewSlotKeys() {
  static const std::vector<std::string> keys = {"name", "op", "variant"};
  return keys;
}

const std::vector<std::string>& PatchKindKeys() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> keys;
    for (const PatchKindInfo& info : kPatchKinds) keys.emplace_back(info.key);
    return keys;
  }();
  return kinds;
}

const std::vector<std::string>& EditOpKeys() {
  static const std::vector<std::string> ops = {"insert_before", "insert_after", "replace", "delete",
                                               "wrap"};
  return ops;
}

const std::vector<std::string>& ScopeValues() {
  static const std::vector<std::string> v = {"module", "instance"};
  return v;
}

const std::vector<std::string>& InitAfterValues() {
  static const std::vector<std::string> v = {"end", "super_init"};
  return v;
}

const char* EditOpKey(StatementEdit::Op op) {
  switch (op) {
    case StatementEdit::Op::kInsertBefore:
      return "insert_before";
    case StatementEdit::Op::kInsertAfter:
      return "insert_after";
    case StatementEdit::Op::kReplace:
      return "replace";
    case StatementEdit::Op::kDelete:
      return "delete";
    case StatementEdit::Op::kWrap:
      return "wrap";
  }
  return "?";
}

}  // namespace patchgen::spec
