// The patch kinds as one table. Each row says what the loader accepts for one kind: its YAML key,
// the shape of its target, which kind-specific keys it allows, and whether it takes a body or
// `edits:`. The loader's key lists (spec_keys.h), its target-shape and key checks
// (spec_loader.cc) and the JSON Schema test (spec_schema_test.cc) all derive from this table; a
// kind is found by its key (FindPatchKind), never by its position. The rewriter plans each kind
// with the functions of its row in kPatchPlanners (rewriter/stage_patches.cc; this layer cannot
// name them).
//
// Adding a kind (docs/rewriter.md, "Adding a patch kind"): a value of PatchKind, a row here, a
// planning function and its kPatchPlanners row, the schema's `$defs/patch`, the docs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "spec/patch_spec.h"

namespace patchgen::spec {

/// What a kind's target names.
enum class TargetShape {
  kTopLevel,  ///< A top-level name: "Qwen3MLP", "rotate_half". Schema: `$defs/identifier`.
  kMember,    ///< `Class.method` (nested: `Outer.Inner.method`). Schema: dotted, with a dot.
  kAny,       ///< A top-level name or a dotted path. Schema: `$defs/dotted_name`.
};

struct PatchKindInfo {
  PatchKind kind;
  std::string_view key;  ///< The YAML key: "replace_class".
  TargetShape target;
  bool allows_from;   ///< The body may be `from: module.Name` (an import instead of code).
  bool allows_after;  ///< `after: end | super_init` (where the statements go).
  bool has_edits;     ///< `edits:` instead of a body (`code`, `file`, `symbol`, `from` refused).
  /// `attribute:`, `values:` and `default:` (an implementation chosen from the model config)
  /// instead of a body (`code`, `file`, `symbol`, `from`, `edits` refused).
  bool has_choice;
  /// The help for a target of the wrong shape: help_before + target + help_after.
  std::string_view shape_help_before;
  std::string_view shape_help_after;
  /// What the member of a kMember target names, in "'<key>' takes `Class.<member>`".
  std::string_view member = "method";
};

/// In the order of the documentation and of the schema's `oneOf`.
inline constexpr PatchKindInfo kPatchKinds[] = {
    {PatchKind::kReplaceClass, "replace_class", TargetShape::kTopLevel, /*allows_from=*/true,
     /*allows_after=*/false, /*has_edits=*/false, /*has_choice=*/false,
     "to change a method, use `override_method: ", "`"},
    {PatchKind::kReplaceFunction, "replace_function", TargetShape::kTopLevel, true, false, false,
     false, "to change a method, use `override_method: ", "`"},
    {PatchKind::kOverrideMethod, "override_method", TargetShape::kMember, false, false, false,
     false, "to replace a top-level function, use `replace_function: ", "`"},
    {PatchKind::kAddMethod, "add_method", TargetShape::kMember, false, false, false, false,
     "name the class and the new method, like `", ".forward`"},
    {PatchKind::kModifyInit, "modify_init", TargetShape::kAny, false, /*allows_after=*/true, false,
     false, "", ""},
    {PatchKind::kEditBody, "edit_body", TargetShape::kAny, false, false, /*has_edits=*/true, false,
     "", ""},
    {PatchKind::kConfigSlot, "config_slot", TargetShape::kMember, false, false, false,
     /*has_choice=*/true, "name the class and the attribute its __init__ sets, like `",
     ".attention_kernel`", /*member=*/"name"},
};

/// The row of `key`, or nullptr when `key` is not a kind key.
const PatchKindInfo* FindPatchKind(std::string_view key);

/// The row of `kind` (every PatchKind has one; patch_kinds_test.cc checks it).
const PatchKindInfo& InfoOf(PatchKind kind);

/// The keys that only some kinds allow, each with the rule that decides it: a patch of a kind
/// whose rule says no gets "'<key>' is not allowed on <kind>" (or the message of its kind).
/// `from`, `after`, `edits`, the body keys `code`, `file`, `symbol` for an edits or choice kind,
/// and the choice keys `attribute`, `values`, `default` for the other kinds.
std::vector<std::string> KeysRefusedBy(const PatchKindInfo& kind);

}  // namespace patchgen::spec
