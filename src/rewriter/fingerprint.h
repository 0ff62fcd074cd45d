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
// A contract pin (result_types.h) is made of one: MakePin for an entry the stages apply,
// RefingerprintContract for the same entry in another upstream release (`patchgen audit`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/byte_range.h"
#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "rewriter/result_types.h"

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

// ----- contract pins made of fingerprints ----------------------------------------------------

/// A contract pin on `ranges` of `up` (none: the "absent" fingerprint).
ContractPin MakePin(const parser::PyModule& up, std::string key, std::string region,
                    std::string expects, std::string qualname, const SourceLoc& loc,
                    const std::vector<ByteRange>& ranges, const std::vector<ByteRange>& skip);

/// The same contract entry fingerprinted in another version of the upstream module, found by
/// qualified name, for regions that do not depend on `at`/`through` ("function", "signature",
/// "absent"); nullopt for "statements" or when the definition is gone. Used by `patchgen audit`
/// when a spec no longer generates against the new upstream.
std::optional<ContractPin> RefingerprintContract(const ContractPin& pin,
                                                 const parser::PyModule& upstream);

}  // namespace patchgen::rewriter
