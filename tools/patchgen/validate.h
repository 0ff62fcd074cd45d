// Validate-only checks of a loaded spec that need no upstream module: every piece of Python the
// spec brings (code bodies, patch files and their symbols, guard calls, blocks, added imports)
// parses, and slot declarations are consistent. Targets in the upstream are not resolved here.
#pragma once

#include <vector>

#include "base/diagnostic.h"
#include "spec/patch_spec.h"

namespace patchgen::cli {

/// All problems found, sorted; empty when the spec is valid.
std::vector<Diagnostic> ValidateSpecWithoutUpstream(const spec::PatchSpec& spec);

}  // namespace patchgen::cli
