// Generate: upstream PyModule + validated PatchSpec -> generated module text (the stages are in
// stages.h).
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
#include "rewriter/result_types.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

struct GenerateOptions {
  std::string upstream_path;               ///< Upstream file as shown in the header/diff, e.g.
                                           ///< "transformers/models/qwen3/modeling_qwen3.py".
  std::string upstream_version;            ///< e.g. "5.17.0"; "unknown" when not found.
  std::string default_runtime = "opslot";  ///< Used when the spec has no `runtime:`.
  /// Hex sha256 of `upstream.source()` when the caller has it (one upstream serves many specs);
  /// computed when empty.
  std::string upstream_sha256;
  /// Tests only (output_check_test.cc): also parse the output from scratch and fail with an
  /// internal error when that tree differs from the incremental one.
  bool verify_incremental_parse = false;
  /// The spec lost entries to load errors (spec::LoadSpecKeepingEntries): its other entries are
  /// planned and their errors returned, but the checks that need every entry are not made (unused
  /// name_map keys, the output check: a name the lost entries would define or remove), and the
  /// result, when there is no error, is not a generated file (its text is empty).
  bool entries_dropped = false;
};

struct GenerateResult {
  std::string text;  ///< The generated file (LF, UTF-8).
  std::vector<AppliedPatch>
      applied;  ///< In stage order (docs/rewriter.md, "The header"), as listed in the header.
  std::string upstream_sha256;        ///< Hex sha256 of the upstream bytes.
  std::vector<SkippedEntry> skipped;  ///< Conditional entries left out, in spec order.
  std::vector<ContractPin> contract;  ///< What the applied guards and patches rely on upstream.
};

/// Generates the patched module. Errors are located in the spec (or patch files) where possible.
Result<GenerateResult> Generate(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                                const GenerateOptions& options);

}  // namespace patchgen::rewriter
