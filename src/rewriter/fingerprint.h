// Contract fingerprints (docs/cli.md, "Contract pins"): what a spec entry relies on in upstream,
// reduced to what can change behaviour.
//
// A fingerprint is the stream of the tree-sitter leaf tokens of one or more byte ranges of a
// parsed module, with comments and the ranges in `skip` (the docstring) left out, so that
// formatting, comments and docstrings never change it and any other token change does. A string
// literal is one token (its exact text). Marks of structure join the tokens: the start of each
// statement and the start and end of each block inside the region (a `;` between statements is
// left out: the marks say it), so block nesting and statement boundaries count; the walk is
// iterative (any depth). The sha256 is over the tokens and marks joined by U+001F; `text`
// is the same tokens joined by single spaces, one line per source line, indented two spaces per
// indentation step relative to the first line, for people (diffs in error messages, pin files).
#pragma once

#include <string>
#include <vector>

#include "base/byte_range.h"
#include "parser/py_module.h"

namespace patchgen::rewriter {

struct Fingerprint {
  std::string sha256;  ///< Hex sha256 of the token stream.
  std::string text;    ///< Normalised, line-structured text (no trailing newline).
  size_t tokens = 0;
};

/// Fingerprint of `ranges` of `module` (in order), leaving out comments and every token that lies
/// inside one of `skip`.
Fingerprint FingerprintOf(const parser::PyModule& module, const std::vector<ByteRange>& ranges,
                          const std::vector<ByteRange>& skip = {});

/// The fingerprint of something absent ("absent"), for contracts like "upstream has no
/// Class.method" (add_method).
Fingerprint AbsentFingerprint();

}  // namespace patchgen::rewriter
