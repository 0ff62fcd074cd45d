// LoadSpec: YAML file -> validated PatchSpec, with `extends` merged. All errors of a spec (and of
// the specs it extends) are collected, sorted and returned together.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "spec/patch_spec.h"

namespace patchgen::spec {

/// Loads the spec at `path` (relative to the working directory or absolute; printed as given).
/// Reads patch files named by `file:` (relative to the spec's folder). No Python parsing here.
Result<PatchSpec> LoadSpec(const std::string& path);

/// Same, from text already in memory (tests); `path` is used for diagnostics and for resolving
/// relative `file:` / `extends:` paths.
Result<PatchSpec> LoadSpecFromString(const std::string& path, std::string text);

/// What LoadSpecKeepingEntries returns.
struct PartialLoad {
  /// The spec when there are no errors; with errors, the spec without the entries that had them,
  /// when every error lies in an entry (of slots, patches, helpers, imports, blocks, exclude) or
  /// is an unknown or duplicate key, and every file of the chain parsed with `upstream` and
  /// `output`. Otherwise none: an error in the scalars, `name_map`, `remove` or `extends` changes
  /// what every entry means.
  std::optional<PatchSpec> spec;
  std::vector<Diagnostic> errors;  ///< Sorted, as LoadSpec returns them.
  bool entries_dropped = false;    ///< Some entry of `spec` was left out because of its errors.
};

/// LoadSpecFromString that keeps what loaded, so that a caller can also report the errors the
/// generator finds in the valid entries (all errors of a run in one round, issue #18).
PartialLoad LoadSpecKeepingEntries(const std::string& path, std::string text);

}  // namespace patchgen::spec
