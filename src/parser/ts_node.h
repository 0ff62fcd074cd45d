// Small helpers over tree-sitter nodes, shared by the parser and the rewriter.
#pragma once

#include <tree_sitter/api.h>

#include <cstring>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "base/byte_range.h"

namespace patchgen::parser {

/// The node's grammar type, e.g. "function_definition".
inline std::string_view TypeOf(TSNode n) { return ts_node_type(n); }

/// True when the node's type is `type`.
inline bool Is(TSNode n, const char* type) { return std::strcmp(ts_node_type(n), type) == 0; }

/// The node's bytes: [start, end).
inline ByteRange RangeOf(TSNode n) { return {ts_node_start_byte(n), ts_node_end_byte(n)}; }

/// The child in field `field` (a null node when absent).
inline TSNode Field(TSNode n, const char* field) {
  return ts_node_child_by_field_name(n, field, static_cast<uint32_t>(std::strlen(field)));
}

/// A table indexed by grammar symbol of `language` (every symbol and alias) saying whether its
/// name is one of `types`: one lookup per node of a walk instead of string comparisons.
inline std::vector<bool> SymbolTable(const TSLanguage* language,
                                     std::initializer_list<std::string_view> types) {
  std::vector<bool> table(ts_language_symbol_count(language));
  for (TSSymbol s = 0; s < table.size(); ++s) {
    const char* name = ts_language_symbol_name(language, s);
    for (std::string_view t : types) table[s] = table[s] || (name && t == name);
  }
  return table;
}

/// Whether the node's symbol is marked in `table` (SymbolTable).
inline bool InTable(const std::vector<bool>& table, TSNode n) {
  TSSymbol s = ts_node_symbol(n);
  return s < table.size() && table[s];  // ERROR's symbol is past the table
}

}  // namespace patchgen::parser
