// LoadSpec: YAML file -> validated PatchSpec, with `extends` merged. All errors of a spec (and of
// the specs it extends) are collected, sorted and returned together.
#pragma once

#include <string>

#include "base/diagnostic.h"
#include "spec/patch_spec.h"

namespace patchgen::spec {

/// Loads the spec at `path` (relative to the working directory or absolute; printed as given).
/// Reads patch files named by `file:` (relative to the spec's folder). No Python parsing here.
Result<PatchSpec> LoadSpec(const std::string& path);

/// Same, from text already in memory (tests); `path` is used for diagnostics and for resolving
/// relative `file:` / `extends:` paths.
Result<PatchSpec> LoadSpecFromString(const std::string& path, std::string text);

}  // namespace patchgen::spec
