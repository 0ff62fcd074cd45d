// Printers for `patchgen index`: what patchgen sees in a Python module, as text for people and as
// JSON for tools and tests. Byte ranges are printed 1-based `line:col` (text) or as both
// 0-based half-open byte offsets and `line:col` (JSON); an end position is exclusive.
#pragma once

#include <string>

#include "parser/py_module.h"

namespace patchgen::parser {

/// Human-readable index: a header line, then `imports:`, `top-level:` and `definitions:` sections,
/// one line per item; nested definitions are indented two spaces per level. Ends with '\n'.
std::string FormatIndexText(const PyModule& m);

/// One JSON object (keys in a fixed order) with "path", "imports", "top_level" and
/// "definitions". Each range is {"bytes": [start, end], "from": "L:C", "to": "L:C"}; absent or
/// empty optional ranges are null. Pretty-printed with 2 spaces, ends with '\n'.
std::string FormatIndexJson(const PyModule& m);

}  // namespace patchgen::parser
