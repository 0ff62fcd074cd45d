// FileLoader: one spec file (YAML text) -> OneSpec, as written, before `extends` is merged
// (spec_loader.cc merges the chain). It adds the levels of a spec (the spec itself, imports, slots
// and guards, patches and their edits, helpers) to SpecReader's typed access. Every check records a
// diagnostic and moves on, so one run reports all of a file's errors.
//
// One class over three files, by level: file_loader.cc (the spec level, imports, helpers),
// file_loader_slots.cc (slots, guards, conditions), file_loader_patches.cc (patches, edits).
// Internal to src/spec: the public entry point is LoadSpec (spec_loader.h).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spec/patch_kinds.h"
#include "spec/patch_spec.h"
#include "spec/raw_node.h"
#include "spec/spec_keys.h"
#include "spec/spec_merge.h"
#include "spec/spec_reader.h"

namespace patchgen::spec {

class FileLoader : public SpecReader {
 public:
  using SpecReader::SpecReader;

  /// The file's spec; errors are in diags().
  OneSpec Load();

 private:
  using Kind = RawNode::Kind;

  // --- file_loader.cc: the spec level, imports, helpers ------------------------------------
  void LoadTop(const RawNode& root, OneSpec& out);
  // The scalars: version, upstream, output, description, runtime, extends.
  void LoadHead(const KeyMap& keys, OneSpec& out);
  void LoadVersion(const RawNode& v, OneSpec& out);
  void LoadOutput(const RawNode& v, OneSpec& out);
  // The lists and mappings: name_map, imports, slots, patches, helpers, blocks, exclude, remove.
  void LoadEntries(const KeyMap& keys, OneSpec& out);
  void LoadImports(const RawNode& v, PatchSpec& spec);
  std::optional<std::string> EnumValue(const RawNode& n, std::string_view what,
                                       const std::vector<std::string>& values);
  bool RequireKeys(const RawNode& entry, const KeyMap& keys, KeyLevel level);
  // A helper's name: `name:`, else the `symbol` of its file, else the first def/class of its
  // code (extends replaces and removes helpers by name). Nullopt when none (reported).
  std::optional<std::string> HelperName(const KeyMap& keys, const Body& body);
  void LoadHelpers(const RawNode& n, PatchSpec& spec);

  // --- file_loader_slots.cc: slots, guards, conditions -------------------------------------
  void LoadSlots(const RawNode& n, PatchSpec& spec);
  // One slot entry; nullopt when any part is invalid (reported). With `extends`, `name` and no
  // op/variant changes the inherited slot of that name (a partial slot).
  std::optional<Slot> LoadSlot(const RawNode& item, const KeyMap& keys);
  void LoadSlotGuards(const RawNode& n, Slot& slot);
  // Adds `slot` to the spec. The same declaration again (name, op, variant, scope) joins its
  // guards to the first one's; the same name with another op/variant/scope is an error.
  void AddSlot(Slot slot, const RawNode& name_node, PatchSpec& spec,
               std::map<std::string, size_t>& by_name);
  // `name`, `op` and `variant` of a new slot, with the messages of RequireKeys.
  bool RequireNewSlotKeys(const RawNode& entry, const KeyMap& keys);
  std::optional<Guard> LoadGuard(const RawNode& n);
  // `upstream_version`, `optional` and `reason` of a guard, patch or helper (the level's known
  // keys decide which are accepted). False when one is invalid (reported).
  bool LoadCondition(const KeyMap& keys, Condition& c);

  // --- file_loader_patches.cc: patches and their statement edits ---------------------------
  void LoadPatches(const RawNode& n, PatchSpec& spec);
  // The kind key of a patch entry (key node, target node): the one key that names a row of the
  // kind table. None or several are errors.
  std::optional<KeyValue> KindKey(const RawNode& item);
  // One patch entry whose kind key is `kind_key`; nullopt when any part is invalid (reported:
  // every error of the entry, not only the first).
  std::optional<Patch> LoadPatch(const RawNode& item, const KeyMap& keys, KeyValue kind_key);
  // `description`, `after` (where the kind's row allows it) and `name_map` of a patch.
  void LoadPatchOptions(const KeyMap& keys, const PatchKindInfo& info, Patch& p);
  // The `edits:` of a kind whose row has them. The edits carry their own code; a body key here
  // would be ignored, so it is an error. Without `edits` in a spec with `extends`, the patch
  // changes the inherited one (resolved by the merge). False on error (reported).
  bool LoadPatchEdits(const KeyMap& keys, const PatchKindInfo& info, const RawNode& kind_node,
                      Patch& p);
  // The body of a kind without `edits`: `code`, `file` + `symbol`, or `from` where the row allows
  // it. Without a body in a spec with `extends`, the patch changes the inherited one. False when
  // `edits` is given (reported); body errors are reported by BodyOf.
  bool LoadPatchBody(const RawNode& item, const KeyMap& keys, const PatchKindInfo& info,
                     const std::optional<std::string>& target, Patch& p);
  // Whether `target` has the shape the kind's row asks for; reports the error when not.
  bool TargetHasShape(const RawNode& target_node, const PatchKindInfo& info,
                      const std::string& target);
  // The `edits:` of an edit_body patch. False when any entry is invalid (reported).
  bool LoadEdits(const RawNode& n, std::vector<StatementEdit>& out);
  // The operation key of an edit entry (key node, anchor node): exactly one of EditOpKeys().
  std::optional<KeyValue> OpKey(const RawNode& item);
  // One edit whose operation key is `op_key`; nullopt when any part is invalid (reported).
  std::optional<StatementEdit> LoadEdit(const KeyMap& keys, KeyValue op_key);
  // The operation key's value: the leading text of the anchor statement.
  bool LoadEditAnchor(const RawNode& value, const std::string& op, StatementEdit& e);
  // `through`: the last statement of a replace/delete/wrap range (not of an insertion).
  bool LoadEditThrough(const KeyMap& keys, const std::string& op, StatementEdit& e);
  // `code`: refused on delete, required on the other operations.
  bool LoadEditCode(const KeyMap& keys, const RawNode& op_node, const std::string& op,
                    StatementEdit& e);

  bool has_extends_ = false;  ///< Entries without a body/op then change inherited entries.
};

}  // namespace patchgen::spec
