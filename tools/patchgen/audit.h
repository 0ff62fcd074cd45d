// `patchgen audit` helpers (docs/cli.md, "audit"): what changed in a definition's signature
// between two upstream versions, and whether the names a spec imports still exist upstream.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "parser/py_module.h"

namespace patchgen::cli {

/// One parameter of a def as written: name with its `*`/`**` prefix, or "*" / "/" separators.
struct Param {
  std::string name;           ///< "x", "*args", "**kwargs", "*", "/"
  std::string annotation;     ///< Text after ':' ("" when none)
  std::string default_value;  ///< Text after '=' ("" when none)
};

std::vector<Param> ParametersOf(const parser::PyModule& m, const parser::Definition& def);

/// Decorator lines of a definition, whitespace-trimmed, in order.
std::vector<std::string> DecoratorsOf(const parser::PyModule& m, const parser::Definition& def);

/// Human lines describing how `now` differs from `old`: "parameter 'device' removed",
/// "parameter 'cache' added (default None)", "parameters reordered: a, b -> b, a", "default of
/// 'eps' changed: 1e-6 -> 1e-5", "annotation of 'x' changed: ...", "decorator added: @x".
std::vector<std::string> SignatureChanges(const std::vector<Param>& old_params,
                                          const std::vector<Param>& new_params,
                                          const std::vector<std::string>& old_decorators,
                                          const std::vector<std::string>& new_decorators);

/// For an `imports.add` statement of a spec whose upstream module is `upstream_module` (dotted),
/// the names it imports from the upstream's own package that `root` no longer provides:
/// "module transformers.x.y not found" or "'name' not defined in transformers.x.y". Imports from
/// other packages are not checked. Empty when all is well or the statement cannot be read.
std::vector<std::string> MissingImportedNames(const std::string& statement,
                                              const std::string& upstream_module,
                                              const std::filesystem::path& root);

}  // namespace patchgen::cli
