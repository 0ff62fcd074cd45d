// RawNode: a YAML document as a tree that keeps, for every key and value, its byte range in the
// spec text. yaml-cpp gives only a start mark per node; the ends and the scalar styles are read
// back from the text here, so errors can underline exactly the key or value at fault.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/byte_range.h"
#include "base/diagnostic.h"

namespace patchgen::spec {

struct RawNode {
  enum class Kind { kNull, kScalar, kSequence, kMapping };
  enum class Style { kPlain, kQuoted, kLiteral, kFolded };
  Kind kind = Kind::kNull;
  Style style = Style::kPlain;  ///< Scalars only.
  std::string scalar;           ///< Scalars only: the value after YAML processing.
  ByteRange range;              ///< Scalars: the token on its first line; others: the first byte.
  bool explicit_null = false;   ///< `~`/`null` written out (an empty value is implicit).
  std::vector<std::pair<RawNode, RawNode>> entries;  ///< Mappings, in document order.
  std::vector<RawNode> items;                        ///< Sequences.

  // Declared, and defaulted below where RawNode is complete: with an implicit constructor clang
  // (with libstdc++ 12, C++20) instantiates the constexpr destructor of `entries` while
  // std::pair<RawNode, RawNode> is still incomplete and rejects the header (GCC accepts it).
  RawNode();
};

inline RawNode::RawNode() = default;

/// Parses `text` (the spec at `path`) into a RawNode tree. A YAML syntax error becomes
/// `path:line:col: error: invalid YAML: <msg>`.
Result<RawNode> ParseRawYaml(const std::string& path, const std::string& text);

/// "a string", "a sequence", "a mapping", "nothing" — for "expected X, found Y" messages.
const char* DescribeKind(const RawNode& node);

}  // namespace patchgen::spec
