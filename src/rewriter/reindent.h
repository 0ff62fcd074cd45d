// Re-indentation of Python code moved between columns (bodies from specs/patch files spliced at
// a target's column; upstream statements moved into a guard's `else:` branch).
//
// Python re-indentation is not a text operation: a line that starts inside a multi-line string
// literal (a docstring, a triple-quoted template) is part of the string's value and must not be
// touched. These functions parse the code with tree-sitter to find such lines. Continuation
// lines of brackets are shifted like any other line (their indentation is not significant).
// Tabs in leading whitespace count as one column each; code mixing tabs and spaces is shifted
// without re-expanding tabs (limitation: patchgen never converts between tabs and spaces).
// Whitespace-only lines outside strings come out empty (no trailing whitespace is produced).
// An indented fragment (a block's statements) is parsed under a synthetic `if 1:` header so that
// tree-sitter sees a well-formed block; code that does not parse at all is still re-indented,
// with strings found on a best-effort basis (callers validate bodies by parsing them first).
#pragma once

#include <string>
#include <string_view>

namespace patchgen::rewriter {

/// Smallest leading-whitespace width over non-blank lines that do not start inside a string.
size_t CommonIndent(std::string_view code);

/// Removes `CommonIndent(code)` columns from every line that does not start inside a string.
std::string Dedent(std::string_view code);

/// Prefixes every non-blank line that does not start inside a string with `indent`.
std::string Indent(std::string_view code, std::string_view indent);

/// Dedent then Indent: the code's first-level statements end up at `column` spaces.
std::string ReindentTo(std::string_view code, size_t column);

}  // namespace patchgen::rewriter
