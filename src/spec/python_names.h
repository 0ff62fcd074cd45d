// Python names as the spec loader checks them, without parsing Python: identifiers (keywords
// refused, non-ASCII letters allowed), dotted names, and the name of a code block's first
// top-level def/class.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace patchgen::spec {

/// A Python identifier that is not a keyword: `_`, ASCII letters, any non-ASCII byte, and digits
/// after the first character.
bool IsIdentifier(std::string_view s);

/// A Python keyword (`class`, `None`, ...): never a name.
bool IsPythonKeyword(std::string_view s);

/// Identifiers joined by single dots: "transformers.models.qwen3".
bool IsDotted(std::string_view s);

/// The number of '.' in `s`.
size_t CountDots(std::string_view s);

/// The identifier-like word `rest` starts with after spaces (as Python compares names: NFKC when
/// not ASCII), or nullopt.
std::optional<std::string> LeadingName(std::string_view rest);

/// The name of the first top-level def/class in `code` (`async def` too; decorators, comments and
/// indented lines skipped), or nullopt when the first top-level statement is something else.
std::optional<std::string> FirstDefName(std::string_view code);

}  // namespace patchgen::spec
