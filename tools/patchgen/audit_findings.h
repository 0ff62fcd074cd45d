// What `patchgen audit` reports about one spec (docs/cli.md, "audit"): its findings, from what no
// longer generates, its contract against the pins and the old upstream, its entries, and the
// imports it adds. mode_audit.cc runs the audit over every spec.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/diagnostic.h"
#include "pipeline.h"
#include "rewriter/generate.h"

namespace patchgen::cli {

/// One thing `audit` reports about a spec.
struct Finding {
  std::string kind;      ///< "target missing", "body changed under a guard", ...
  std::string entry;     ///< The spec entry (contract key or kind + target), "" for the spec.
  SourceLoc spec_loc;    ///< Where in the spec.
  std::string upstream;  ///< Upstream place (path:line[-line] (version)), "" when none.
  std::string message;
  std::vector<std::string> details;  ///< Signature changes, diff lines, notes.
  bool attention = true;             ///< False for information (skipped entries).
};

/// One spec's view for the audit: its record and errors, what the old upstream gave for it (when
/// given), and the strings its findings name.
struct AuditView {
  const SpecRecord& rec;
  const std::vector<Diagnostic>& errors;          ///< What failed its generation: findings here.
  const rewriter::GenerateResult* old = nullptr;  ///< Generated against the old upstream.
  const std::pair<UpstreamFile, parser::PyModule*>* old_module =
      nullptr;             ///< The old upstream file.
  std::string up_shown;    ///< The new upstream file as shown, "" when not found.
  std::string version;     ///< The new upstream's version.
  std::string pins_shown;  ///< The spec's pin file as shown.

  /// "path:first-last (version)" of a contract entry in the new upstream.
  std::string Where(const rewriter::ContractPin& c) const;
  /// The old upstream's contract entry with `key`, if any.
  const rewriter::ContractPin* OldPin(const std::string& key) const;
  /// Signature and decorator changes of the entry's target (and its __init__ for modify_init)
  /// between the old and the new upstream.
  std::vector<std::string> SignatureDetails(const rewriter::ContractPin& c) const;
};

/// Every finding about the spec of `v`, by its place in the spec.
std::vector<Finding> FindingsOf(const AuditView& v);

/// The findings as the JSON report's list, and appended to the text report `text`.
nlohmann::json ReportFindings(const std::vector<Finding>& findings, std::string& text);

}  // namespace patchgen::cli
