// Small helpers over tree-sitter nodes, shared by the parser and the rewriter.
#pragma once

#include <tree_sitter/api.h>

#include <cstring>
#include <string_view>

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

}  // namespace patchgen::parser
