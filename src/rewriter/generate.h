// Generate: upstream PyModule + validated PatchSpec -> generated module text.
//
// Pipeline: each spec operation becomes provenance-tagged TextEdits (edit_plan.h); the plan is
// validated (overlaps are errors naming both spec locations), applied in one forward splice,
// the header is prepended, and the output is re-parsed and checked (no ERROR nodes, names used by
// inserted code resolve). No I/O: callers read files and write results.
#pragma once

#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

struct GenerateOptions {
  std::string upstream_path;     ///< Upstream file as shown in the header/diff, e.g. "transformers/models/qwen3/modeling_qwen3.py".
  std::string upstream_version;  ///< e.g. "5.17.0"; "unknown" when not found.
  std::string default_runtime = "opslot";  ///< Used when the spec has no `runtime:`.
};

struct AppliedPatch {
  std::string kind;         ///< "replace_class", "override_method", "guard", "exclude", ...
  std::string target;
  std::string description;
};

struct GenerateResult {
  std::string text;                   ///< The generated file (LF, UTF-8).
  std::vector<AppliedPatch> applied;  ///< In spec order, as listed in the header.
  std::string upstream_sha256;        ///< Hex sha256 of the upstream bytes.
};

/// Generates the patched module. Errors are located in the spec (or patch files) where possible.
Result<GenerateResult> Generate(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                                const GenerateOptions& options);

}  // namespace patchgen::rewriter
