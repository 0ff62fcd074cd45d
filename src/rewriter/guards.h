// Slots and guards (docs/spec-format.md, "Slots and guards"): OpSlot declarations after the
// imports and guards injected into upstream bodies as TextEdits, so bodies keep tracking upstream.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "rewriter/edit_plan.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

struct GuardPlan {
  /// Text inserted once after the last top-level import: `from <runtime> import OpSlot\n`, then
  /// (when there are module-scoped slots) a blank line and one `name = OpSlot("op", "variant")\n`
  /// per module-scoped slot (identical duplicates once). No blank lines around the block: the
  /// caller separates it from the imports. Empty when the spec has no slots; only the import
  /// when every slot is instance-scoped.
  std::string declarations;
  /// Entry and call-site guards, and `self.<name> = OpSlot(...).bind_from(config, owner=self)`
  /// lines appended to `__init__` of owners of instance-scoped slots. Entry guards come first, so a
  /// call-site guard on a body's first statement follows the entry guard at the same offset.
  /// `TextEdit::code` maps a guard's `call` text back to the spec (one-line entry calls and
  /// every call-site call).
  std::vector<TextEdit> edits;
  /// For the header: one (target, description) per guard, e.g. ("Qwen3RMSNorm.forward",
  /// "rms_norm_slot -> rms_norm/standard"); the kind is always "guard".
  std::vector<std::pair<std::string, std::string>> applied;
  /// Qualified names of definitions that guards edit, with the guard's `in` location (for
  /// "guard inside an overridden method" errors).
  std::vector<std::pair<std::string, SourceLoc>> guarded_targets;
  /// What each planned guard relies on upstream (for contract pins): the guarded definition
  /// (entry guard) or the statements `at`..`through` (call-site guard).
  struct Region {
    std::string slot;        ///< Slot name.
    std::string op_variant;  ///< "rms_norm/standard".
    std::string in;          ///< Qualified name of the guarded function.
    std::optional<std::string> at, through;
    SourceLoc loc;                        ///< The guard entry.
    int definition = -1;                  ///< Index into the upstream's definitions().
    std::optional<ByteRange> statements;  ///< Call-site guards: first statement start .. last end.
    std::optional<std::string> upstream_version;  ///< The guard's version condition.
  };
  std::vector<Region> regions;
  /// Optional guards whose target or anchors are absent upstream: (target, why, guard entry).
  struct Skipped {
    std::string target;
    std::string why;
    SourceLoc loc;
  };
  std::vector<Skipped> skipped;
};

/// Plans every slot and guard of `spec` against `upstream` (docs/guards.md). `runtime` is the
/// module providing OpSlot. All errors are collected, located in the spec, and sorted.
Result<GuardPlan> PlanGuards(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                             const std::string& runtime);

}  // namespace patchgen::rewriter
