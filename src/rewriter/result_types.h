// What generation reports about a spec's entries besides the generated text: the entries applied
// (the header's `applied:` list), the entries left out (`skipped:`), and the contract pins of what
// the applied entries rely on upstream. Shared by the stages (stages.h), the header writer
// (header.h), the orchestrator (generate.h) and the CLI; below all of them, so no header includes
// the orchestrator's.
#pragma once

#include <cstdint>
#include <string>

#include "base/diagnostic.h"

namespace patchgen::rewriter {

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

}  // namespace patchgen::rewriter
