// The keys and enumerated values the spec loader accepts at each level of a spec. The JSON Schema
// (schemas/patch-spec.schema.json) must describe exactly these; spec_loader_test.cc checks it.
#pragma once

#include <string>
#include <vector>

namespace patchgen::spec {

/// A mapping level of the spec format.
enum class KeyLevel {
  kSpec,     ///< The top-level mapping.
  kImports,  ///< `imports:`
  kSlot,     ///< An entry of `slots:`
  kGuard,    ///< An entry of a slot's `guards:`
  kPatch,    ///< An entry of `patches:` (kind keys included)
  kHelper,   ///< An entry of `helpers:`
  kEdit,     ///< An entry of an edit_body patch's `edits:` (operation keys included)
};

/// Every level, for tests that walk them all.
const std::vector<KeyLevel>& AllKeyLevels();

/// Name of a level as used in messages and as the schema's `$defs` name ("spec", "patch", ...).
const char* KeyLevelName(KeyLevel level);

/// Keys accepted at `level`, in documentation order.
const std::vector<std::string>& KnownKeys(KeyLevel level);

/// Keys that must be present at `level` (for kSpec: after `extends` is merged).
const std::vector<std::string>& RequiredKeys(KeyLevel level);

/// Keys a new slot needs (RequiredKeys(kSlot) plus op and variant; in a spec with `extends`, a slot
/// with only `name` changes the inherited one).
const std::vector<std::string>& NewSlotKeys();

/// The patch kind keys, in the order of the kind table (patch_kinds.h): replace_class,
/// replace_function, override_method, add_method, modify_init, edit_body, config_slot.
const std::vector<std::string>& PatchKindKeys();

/// The operation keys of an edit: insert_before, insert_after, replace, delete, wrap.
const std::vector<std::string>& EditOpKeys();

/// Values of a slot's `scope`: module, instance.
const std::vector<std::string>& ScopeValues();

/// Values of modify_init's `after`: end, super_init.
const std::vector<std::string>& InitAfterValues();

}  // namespace patchgen::spec
