// The header of a generated module (docs/rewriter.md, "The header"): written by WriteHeader and
// read back by ReadHeaderUpstream, in this one file, so that the two cannot drift apart.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "parser/py_module.h"
#include "rewriter/result_types.h"
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
  /// Write the version stamp (`StampLines`): the caller sets it from `StampFits(upstream)`.
  bool stamp = false;
  std::string runtime = "opslot";  ///< The spec's runtime; the stamp's check call is opslot's.
};

/// The name of the module-level constant the stamp defines: ("<package>", "<version>").
inline constexpr std::string_view kStampName = "__patchgen_upstream__";

/// Whether code may precede upstream's first statement without changing what it means: false when
/// upstream starts with a module docstring (it would stop being `__doc__`) or a `from __future__`
/// import (which must come first).
bool StampFits(const parser::PyModule& upstream);

/// The version stamp, the header's last lines before its closing rule, or "" (no stamp: `stamp`
/// unset, or the version is "" or "unknown"):
///   __patchgen_upstream__ = ("transformers", "5.17.0")
///   __import__("opslot.checks").checks.check_generated_upstream(__name__, __patchgen_upstream__)
/// The package is the first component of `upstream`, the version `upstream_version` (the package's
/// `__version__`, as `upstream_version` conditions read it). The second line, written only when
/// the runtime is opslot, refuses the import under another release of the package before
/// upstream's own imports run (docs/runtime.md, "Generated for another release").
std::string StampLines(const HeaderFacts& facts);

/// The header: a rule, the banner, the fields, the skipped entries, the slots without a guard,
/// the applied entries, the stamp (when there is one), a rule. Every line ends in '\n'.
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
