// `extends`: one spec file as loaded, and the merge of a child into its parent
// (docs/spec-format.md, "Composition"). Internal to the loader (spec_loader.cc); spec_merge.cc.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "spec/patch_spec.h"

namespace patchgen::spec {

/// One spec file as loaded, before its `extends` chain is merged.
struct OneSpec {
  PatchSpec spec;
  std::optional<LocatedName> extends;
  std::vector<LocatedName> removes;
  bool parsed = false;  ///< The YAML was a mapping (otherwise missing keys are not reported).
  bool has_version = false, has_upstream = false, has_output = false, has_description = false;
  /// Errors outside the entries (the scalars, name_map, remove, extends, the merge): with one of
  /// them in the chain, what was loaded is not the spec minus some entries.
  size_t fatal_errors = 0;
};

/// Merges `child` into `parent` (loaded from `parent_path`), in place: `remove` entries drop
/// inherited entries first; scalars the child gives override; lists concatenate; entries with the
/// same target/name replace the parent's; a partial entry (no body, no op/variant) changes the
/// fields it gives of the inherited entry. Errors go to `diags`.
void Merge(OneSpec& parent, OneSpec&& child, const std::string& parent_path,
           std::vector<Diagnostic>& diags);

}  // namespace patchgen::spec
