// The header of a generated module (docs/rewriter.md, "The header"): written by WriteHeader and
// read back by ReadHeaderUpstream, in this one file, so that the two cannot drift apart.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "rewriter/generate.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// What the header says.
struct HeaderFacts {
  std::string spec_path;      ///< As the caller gave it.
  std::string upstream;       ///< Dotted module.
  std::string upstream_path;  ///< "transformers/models/qwen3/modeling_qwen3.py".
  std::string upstream_version;
  std::string upstream_sha256;
  std::string description;  ///< The spec's; may be empty.
  std::vector<SkippedEntry> skipped;
  std::vector<const spec::Slot*> unguarded_slots;
  std::vector<AppliedPatch> applied;
};

/// The header: a rule, the banner, the fields, the skipped entries, the slots without a guard,
/// the applied entries, a rule. Every line ends in '\n'.
std::string WriteHeader(const HeaderFacts& facts);

/// The upstream fingerprint a generated file's header records.
struct HeaderUpstream {
  std::string sha256;   ///< 64 hex characters, or "" when the header names none.
  std::string version;  ///< "" when the header names none.
};

/// Reads the upstream sha256 and version from the leading comment block of a generated file.
/// patchgen's own `#   version:` / `#   sha256:` fields win when both are present; other headers
/// are read loosely: the first 64-hex-digit word on a comment line that mentions "sha256", and
/// the word after the first "version".
HeaderUpstream ReadHeaderUpstream(const std::string& text);

/// True when `text` starts like a file patchgen generated: the header's first two lines (a .py),
/// or those lines added by a .diff of one.
bool CarriesGeneratedHeader(std::string_view text);

/// The spec the header of a generated file names (`#   spec:`, or `+#   spec:` in a .diff of
/// one), as written there: relative to the project root of the run that generated it. "" when
/// `text` carries no generated header or the header names no spec.
std::string ReadHeaderSpec(std::string_view text);

}  // namespace patchgen::rewriter
