// NFKC (unicode_nfkc.h) over tables generated from Python's unicodedata at build time
// (scripts/gen_unicode_tables.py -> <build>/generated/unicode_nfkc_tables.inc).
#include "base/unicode_nfkc.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace patchgen {
namespace {

struct DecompositionEntry {
  char32_t cp;
  uint32_t offset;  ///< Into kDecompositionPool.
  uint32_t length;
};

struct CombiningClassRange {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};

struct CompositionEntry {
  char32_t first;
  char32_t second;
  char32_t composite;
};

#include "unicode_nfkc_tables.inc"

// Hangul syllables decompose and compose by formula (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

/// Length of the UTF-8 sequence that lead byte `c` starts (2 to 4), or 0 when it starts none.
size_t SequenceLength(unsigned char c) {
  if (c >= 0xF0 && c <= 0xF4) return 4;
  if (c >= 0xE0 && c < 0xF0) return 3;
  return c >= 0xC2 && c < 0xE0 ? 2 : 0;
}

/// The code point of the well-formed UTF-8 sequence at `s[i]` (ASCII included) and its length;
/// length 0 when there is none.
std::pair<char32_t, size_t> DecodeOne(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return {c, 1};
  size_t n = SequenceLength(c);
  if (n == 0 || i + n > s.size()) return {0, 0};
  char32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) {
    auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return {0, 0};
  return {cp, n};
}

/// Decodes well-formed UTF-8; nullopt when `s` is not.
std::optional<std::u32string> Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto [cp, n] = DecodeOne(s, i);
    if (n == 0) return std::nullopt;
    out.push_back(cp);
    i += n;
  }
  return out;
}

void Encode(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint8_t CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::upper_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), cp,
                             [](char32_t c, const CombiningClassRange& r) { return c < r.first; });
  if (it == std::begin(kCombiningClasses)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

/// Appends the full compatibility decomposition of `cp`.
void Decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                             [](const DecompositionEntry& e, char32_t c) { return e.cp < c; });
  if (it == std::end(kDecompositions) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  out.append(kDecompositionPool + it->offset, it->length);
}

/// Stable sort of every run of non-starters by combining class (canonical ordering).
void CanonicalOrder(std::u32string& s, std::vector<uint8_t>& ccc) {
  ccc.resize(s.size());
  for (size_t i = 0; i < s.size(); ++i) ccc[i] = CombiningClass(s[i]);
  for (size_t i = 1; i < s.size(); ++i) {  // insertion sort: runs are short
    for (size_t j = i; j > 0 && ccc[j] != 0 && ccc[j - 1] > ccc[j]; --j) {
      std::swap(s[j], s[j - 1]);
      std::swap(ccc[j], ccc[j - 1]);
    }
  }
}

/// The primary composite of `a` followed by `b`, or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const CompositionEntry key{a, b, 0};
  auto less = [](const CompositionEntry& x, const CompositionEntry& y) {
    return x.first != y.first ? x.first < y.first : x.second < y.second;
  };
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), key, less);
  if (it == std::end(kCompositions) || it->first != a || it->second != b) return 0;
  return it->composite;
}

/// Canonical composition of a decomposed, canonically ordered string (`ccc`: its classes).
void ComposeAll(std::u32string& s, const std::vector<uint8_t>& ccc) {
  if (s.empty()) return;
  size_t starter = 0;
  // The class of the last character kept after the starter; 256 when the text starts with a
  // non-starter, which nothing composes with.
  int last = ccc[0] == 0 ? 0 : 256;
  size_t kept = 1;
  for (size_t i = 1; i < s.size(); ++i) {
    char32_t c = s[i];
    int cls = ccc[i];
    // Not blocked from the starter: nothing kept in between (last == 0: the starter is the last
    // character kept), or everything in between has a lower class.
    if (last < cls || last == 0) {
      if (char32_t composite = Compose(s[starter], c)) {
        s[starter] = composite;
        continue;
      }
    }
    if (cls == 0) starter = kept;
    last = cls;
    s[kept++] = c;
  }
  s.resize(kept);
}

}  // namespace

const char* UnicodeVersion() { return PATCHGEN_UNICODE_VERSION; }

size_t FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = DecodeOne(s, i).second;
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

bool SameIdentifierSlow(std::string_view a, std::string_view b) {
  return IdentifierKey(a) == IdentifierKey(b);
}

std::string Nfkc(std::string_view utf8) {
  if (IsAscii(utf8)) return std::string(utf8);
  std::optional<std::u32string> decoded = Decode(utf8);
  if (!decoded) return std::string(utf8);
  std::u32string d;
  d.reserve(decoded->size() * 2);
  for (char32_t cp : *decoded) Decompose(cp, d);
  std::vector<uint8_t> ccc;
  CanonicalOrder(d, ccc);
  ComposeAll(d, ccc);
  std::string out;
  out.reserve(utf8.size());
  for (char32_t cp : d) Encode(cp, out);
  return out;
}

}  // namespace patchgen
