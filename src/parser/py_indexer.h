// The index of a PyModule (imports, top-level statements, definitions), built by one walk over its
// tree (py_indexer.cc), and the tree queries it builds on (py_queries.cc). Internal to src/parser:
// PyModule::Parse calls IndexModule.
#pragma once

#include <tree_sitter/api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "parser/py_module.h"

namespace patchgen::parser {

/// True for a comment node.
bool IsComment(TSNode n);

/// Python's whitespace characters (space, tab, newline, carriage return, form feed, vertical tab).
bool IsSpace(char c);

/// The node's end without trailing comments, blank lines or whitespace folded into it.
uint32_t TrimmedEnd(TSNode n, std::string_view src);

/// Python statements that can hold other statements (where imports and definitions can nest).
bool IsContainer(TSNode n);

/// Names bound by an assignment target (identifiers in patterns; attributes/subscripts bind none),
/// as Python compares them (IdentifierKey: NFKC when not ASCII).
void CollectTargetNames(TSNode n, std::string_view src, std::vector<std::string>& out);

/// A type_alias_statement is genuine only when `type` is followed by a (possibly generic) name;
/// `type(x).attr = v` is an assignment the grammar misreads. Sets `*name` (IdentifierKey) when it
/// is.
bool IsGenuineTypeAlias(TSNode n, std::string_view src, std::string* name);

/// Fills `m`'s index from its parsed tree (which has no ERROR or MISSING node).
void IndexModule(PyModule& m);

}  // namespace patchgen::parser
