// Version conditions of spec entries (`upstream_version: ">=5.23"`, docs/spec-format.md).
// A condition is one or more comma-separated clauses `OP VERSION`, OP one of >= > <= < == !=,
// VERSION dotted integers ("5.23", "5.23.0"); all clauses must hold. Versions compare numerically
// component by component, missing components being 0 ("5.23" == "5.23.0"). A pre-release or local
// suffix of the upstream version ("5.24.0.dev0", "5.24.0rc1") is ignored: only its leading
// integers count.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace patchgen::spec {

/// Why `condition` is not a valid condition, or nullopt when it is.
std::optional<std::string> CheckVersionCondition(std::string_view condition);

/// Leading dotted integers of a version ("5.23.0" -> {5, 23, 0}); empty when it has none
/// ("unknown").
std::vector<int> ParseVersion(std::string_view version);

/// Whether `version` satisfies `condition`; nullopt when the condition is invalid or the version
/// has no leading integers.
std::optional<bool> VersionMatches(std::string_view condition, std::string_view version);

}  // namespace patchgen::spec
