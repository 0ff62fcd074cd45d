// Code taken from a spec or a patch file, ready to splice: parsed (a syntax error located in the
// spec), renamed through the name_maps, re-indented to its target column, and made into a
// TextEdit whose CodeSpan maps its lines back to where they were written.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "rewriter/edit_plan.h"
#include "rewriter/name_map.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// Code taken from a body, ready to splice: re-indented lines (no final newline) and where they
/// came from.
struct Snippet {
  std::string text;
  spec::TextOrigin origin;
  uint32_t first_line = 1;
  int32_t col_shift = 0;
};

/// Text with `prefix` in front of a snippet, as a TextEdit whose CodeSpan covers the snippet.
TextEdit SnippetEdit(ByteRange range, const std::string& prefix, const Snippet& s,
                     const std::string& suffix, SourceLoc origin, std::string what);

/// A location inside code text: line `line0` (0-based, of the text), 1-based column `col`.
SourceLoc OriginLoc(const spec::TextOrigin& o, uint32_t line0, uint32_t col, uint32_t length = 1);

/// Parses code from a spec or patch file; a syntax error is reported at its place there.
std::unique_ptr<parser::PyModule> ParseCode(const std::string& text, const spec::TextOrigin& origin,
                                            std::vector<Diagnostic>& errors);

/// The renames a snippet gets: patch-level entries win over spec-level ones.
struct Renames {
  NameMap* patch = nullptr;
  NameMap* spec = nullptr;
};

/// Renames identifiers in `region` of `m` (`renames`; `rename` for one node) and re-indents the
/// region's lines to `column`.
Snippet MakeSnippet(const parser::PyModule& m, ByteRange region, const spec::TextOrigin& origin,
                    Renames renames, std::optional<std::pair<ByteRange, std::string>> rename,
                    size_t column);

/// The whole of `m` as a snippet at `column` (statements, added imports, blocks).
Snippet WholeSnippet(const parser::PyModule& m, const spec::TextOrigin& origin, Renames renames,
                     size_t column);

/// The one def/class a body provides, or nullptr (with an error).
const parser::Definition* BodyDefinition(const parser::PyModule& m, const spec::Body& body,
                                         const std::string& what, std::vector<Diagnostic>& errors);

}  // namespace patchgen::rewriter
