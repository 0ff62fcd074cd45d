// Unicode Normalization Form KC, as Python applies it to identifiers (PEP 3131): `ﬁnd`
// (U+FB01 LATIN SMALL LIGATURE FI) and `find` are one name, so are `ｆｏｏ` and `foo`.
//
// patchgen compares identifiers in their NFKC form wherever it compares them (the upstream
// index, spec names, name resolution, name_map; docs/parser.md, "Identifiers are compared as
// Python compares them") and never writes the normalised form over upstream's bytes. The tables
// are generated at build time from the build's Python `unicodedata` (scripts/gen_unicode_tables.py,
// never committed); an ASCII name takes a fast path without a lookup.
#pragma once

#include <string>
#include <string_view>

namespace patchgen {

/// The Unicode version of the tables (that of the Python the build ran), e.g. "14.0.0".
const char* UnicodeVersion();

/// True when every byte of `s` is ASCII (below 0x80).
inline bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

/// The offset of the first byte of `s` that does not start a well-formed UTF-8 sequence (a stray
/// continuation byte, a sequence cut short, an overlong form, a surrogate, a code point above
/// U+10FFFF), or std::string_view::npos when `s` is well-formed.
size_t FirstInvalidUtf8(std::string_view s);

/// True when `s` is well-formed UTF-8.
inline bool IsWellFormedUtf8(std::string_view s) {
  return FirstInvalidUtf8(s) == std::string_view::npos;
}

/// NFKC of UTF-8 text (full compatibility decomposition, canonical ordering by combining class,
/// canonical composition). Text that is not well-formed UTF-8 is returned unchanged.
std::string Nfkc(std::string_view utf8);

/// The identifier `name` as Python compares it: unchanged when ASCII, else its NFKC form.
inline std::string IdentifierKey(std::string_view name) {
  return IsAscii(name) ? std::string(name) : Nfkc(name);
}

/// IdentifierKey without a copy for ASCII: `name` itself, else its NFKC form kept in `storage`
/// (the view lives as long as `name` and `storage`).
inline std::string_view IdentifierKeyView(std::string_view name, std::string& storage) {
  if (IsAscii(name)) return name;
  storage = Nfkc(name);
  return storage;
}

/// Makes `name` its IdentifierKey in place; an ASCII name is left alone without a copy.
inline void NormalizeIdentifier(std::string& name) {
  if (!IsAscii(name)) name = Nfkc(name);
}

/// SameIdentifier when `a` or `b` is not ASCII (out of line: recursive walks that compare names
/// keep small stack frames).
bool SameIdentifierSlow(std::string_view a, std::string_view b);

/// True when identifiers (or dotted names) `a` and `b` are one name for Python. Both ASCII: a
/// plain comparison.
inline bool SameIdentifier(std::string_view a, std::string_view b) {
  if (IsAscii(a) && IsAscii(b)) return a == b;
  return SameIdentifierSlow(a, b);
}

}  // namespace patchgen
