// Slots and guards (docs/spec-format.md, "Guards"): OpSlot declarations after the imports and
// guards injected into upstream bodies as TextEdits, so bodies keep tracking upstream.
#pragma once

#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "rewriter/edit_plan.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

struct GuardPlan {
  /// Text inserted once after the last top-level import: `from <runtime> import OpSlot` and one
  /// `name = OpSlot("op", "variant")` per module-scoped slot (identical duplicates once). Empty
  /// when the spec has no module-scoped slots.
  std::string declarations;
  /// Entry and call-site guards, and `self.<name> = OpSlot(...).bind_from(config)` lines appended to
  /// `__init__` of owners of instance-scoped slots.
  std::vector<TextEdit> edits;
  /// For the header: one entry per guard ("guard", "Qwen3RMSNorm.forward", "rms_norm_slot -> rms_norm/standard").
  std::vector<std::pair<std::string, std::string>> applied;
  /// Qualified names of definitions that guards edit (for "guard inside an overridden method" errors).
  std::vector<std::pair<std::string, SourceLoc>> guarded_targets;
};

/// Plans every slot and guard of `spec` against `upstream`. `runtime` is the module providing OpSlot.
Result<GuardPlan> PlanGuards(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                             const std::string& runtime);

}  // namespace patchgen::rewriter
