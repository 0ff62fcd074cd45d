// Generate: upstream PyModule + validated PatchSpec -> generated module text (the stages are in
// stages.h).
//
// Pipeline: each spec operation becomes provenance-tagged TextEdits (edit_plan.h); the plan is
// validated (overlaps are errors naming both spec locations), applied in one forward splice,
// the header is prepended, and the output is re-parsed and checked (no ERROR nodes, names used by
// inserted code resolve). No I/O: callers read files and write results.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
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

struct AppliedPatch {
  std::string kind;  ///< "replace_class", "override_method", "guard", "exclude", ...
  std::string target;
  std::string description;
};

/// An entry left out because of its `upstream_version` or, being `optional`, because what it
/// names is absent upstream. Listed in the header's `skipped:` section.
struct SkippedEntry {
  std::string kind;  ///< "guard", "override_method", "helper", ...
  std::string target;
  std::string why;  ///< "upstream_version \">=5.23\" does not match 5.17.0; <reason>"
  SourceLoc loc;    ///< The spec entry.
};

/// What one applied entry relies on upstream (docs/cli.md, "Contract pins").
struct ContractPin {
  /// Stable identity of the entry, independent of spec lines: "guard rms_norm_slot in
  /// Qwen3RMSNorm.forward", "guard s in F.forward at 'logits = self.lm_head(' through 'if
  /// labels is not None:'", "override_method Qwen3Attention.forward"; an entry with an
  /// `upstream_version` condition ends with " for upstream <condition>".
  std::string key;
  /// "function" (entry guard: decorators, signature and body, docstring left out), "statements"
  /// (call-site guard: `at` through `through`), "signature" (decorators and header of a patched
  /// target; modify_init: the class's and its __init__'s), "absent" (add_method).
  std::string region;
  std::string expects;  ///< For messages: "rms_norm/standard" or the patch kind.
  std::string
      qualname;   ///< The upstream definition ("Qwen3RMSNorm.forward"; modify_init: the class).
  SourceLoc loc;  ///< The spec entry.
  uint32_t first_line = 0, last_line = 0;  ///< Upstream lines (1-based, inclusive); 0 when absent.
  std::string sha256;                      ///< Fingerprint (fingerprint.h).
  std::string text;                        ///< Normalised text of the region.
};

struct GenerateResult {
  std::string text;  ///< The generated file (LF, UTF-8).
  std::vector<AppliedPatch>
      applied;  ///< In stage order (docs/rewriter.md, "The header"), as listed in the header.
  std::string upstream_sha256;        ///< Hex sha256 of the upstream bytes.
  std::vector<SkippedEntry> skipped;  ///< Conditional entries left out, in spec order.
  std::vector<ContractPin> contract;  ///< What the applied guards and patches rely on upstream.
};

/// The same contract entry fingerprinted in another version of the upstream module, found by
/// qualified name, for regions that do not depend on `at`/`through` ("function", "signature",
/// "absent"); nullopt for "statements" or when the definition is gone. Used by `patchgen audit`
/// when a spec no longer generates against the new upstream.
std::optional<ContractPin> RefingerprintContract(const ContractPin& pin,
                                                 const parser::PyModule& upstream);

/// Generates the patched module. Errors are located in the spec (or patch files) where possible.
Result<GenerateResult> Generate(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                                const GenerateOptions& options);

}  // namespace patchgen::rewriter
