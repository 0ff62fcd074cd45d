// What a generated module must not be (pipeline.h): a patch of an upstream definition that
// upstream defines twice or rebinds (AmbiguousTargets), or bytes CPython rejects in any source
// file (FirstSourceBlocker).
#include <cstdio>

#include "pipeline.h"

namespace patchgen::cli {

namespace {

// The length of the UTF-8 sequence starting with the byte at `i` (not ASCII), or 0 when it is not
// valid UTF-8: a bad lead or continuation byte, truncated, an overlong form or a surrogate.
size_t Utf8SequenceLength(std::string_view text, size_t i) {
  auto c = static_cast<unsigned char>(text[i]);
  size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  bool ok = n > 0 && i + n <= text.size();
  for (size_t k = 1; ok && k < n; ++k)
    ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
  if (ok && n == 3) {  // no overlong forms, no surrogates
    auto c1 = static_cast<unsigned char>(text[i + 1]);
    ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
  }
  if (ok && n == 4) {
    auto c1 = static_cast<unsigned char>(text[i + 1]);
    ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
  }
  return ok ? n : 0;
}

}  // namespace

std::optional<std::pair<uint32_t, std::string>> FirstSourceBlocker(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) return std::pair{static_cast<uint32_t>(i), std::string("a NUL byte")};
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", c);
      return std::pair{static_cast<uint32_t>(i),
                       "the byte " + std::string(hex) + ", which is not UTF-8"};
    }
    if (text.substr(i, 3) == "\xEF\xBB\xBF") {
      return std::pair{static_cast<uint32_t>(i), std::string("U+FEFF (a byte order mark)")};
    }
    i += n;
  }
  return std::nullopt;
}

namespace {

/// The error for an entry whose target `d` (or a class around it) upstream rebinds after its
/// definition (PyModule::Rebindings, `f = other`): the patched definition would be dead code.
std::optional<Diagnostic> RebindingError(const rewriter::ContractPin& pin,
                                         const parser::PyModule& upstream,
                                         const parser::Definition& d, const std::string& shown) {
  std::vector<ByteRange> again = upstream.Rebindings(d);
  if (again.empty()) return std::nullopt;
  LineCol lc = upstream.lines().At(again.front().start);
  std::string text(upstream.Text(again.front()).substr(0, 60));
  Diagnostic e =
      ErrorAt(pin.loc,
              "'" + d.qualname + "' (line " + std::to_string(d.line) + ") is rebound at line " +
                  std::to_string(lc.line) + " of the upstream module " + shown + " (`" +
                  text.substr(0, text.find('\n')) +
                  "`): Python uses that value, the patched definition " + "would be dead code",
              "patchgen does not patch a definition that upstream replaces; patch what line " +
                  std::to_string(lc.line) +
                  " binds, or generate against an upstream that does not "
                  "rebind '" +
                  d.qualname + "'",
              ErrorKind::kUpstream);
  e.notes.push_back(Note::At(SourceLoc{shown, lc.line, lc.col, 1, {}}, "rebound here"));
  return e;
}

}  // namespace

std::vector<Diagnostic> AmbiguousTargets(const std::vector<rewriter::ContractPin>& contract,
                                         const parser::PyModule& upstream,
                                         const std::string& shown) {
  std::vector<Diagnostic> out;
  auto where = [&](const parser::Definition& d) {
    LineCol lc = upstream.lines().At(d.definition.start);
    return SourceLoc{shown, lc.line, lc.col, 1, {}};
  };
  for (const rewriter::ContractPin& pin : contract) {
    if (pin.qualname.empty()) continue;
    for (const parser::Definition* d = upstream.Find(pin.qualname); d != nullptr;
         d = d->parent >= 0 ? &upstream.definitions()[d->parent] : nullptr) {
      if (auto rebound = RebindingError(pin, upstream, *d, shown)) {
        out.push_back(std::move(*rebound));
        break;
      }
      std::vector<const parser::Definition*> again = upstream.Redefinitions(*d);
      if (again.empty()) continue;
      const char* what = d->kind == parser::Definition::Kind::kClass ? "class"
                         : d->parent >= 0 && upstream.definitions()[d->parent].kind ==
                                                 parser::Definition::Kind::kClass
                             ? "method"
                             : "function";
      Diagnostic e = ErrorAt(
          pin.loc,
          std::string(what) + " '" + d->qualname + "' is defined " +
              std::to_string(again.size() + 1) + " times in the upstream module " + shown +
              ": Python keeps the last (line " + std::to_string(again.back()->line) +
              "), patchgen would patch the first (line " + std::to_string(d->line) + ")",
          "patchgen does not guess which definition is meant; remove the dead definition upstream "
          "or generate against an upstream that defines '" +
              d->qualname + "' once",
          ErrorKind::kUpstream);
      e.notes.push_back(Note::At(where(*d), "first definition"));
      for (const parser::Definition* r : again)
        e.notes.push_back(Note::At(where(*r), "defined again here"));
      out.push_back(std::move(e));
      break;
    }
  }
  SortDiagnostics(out);
  return out;
}

}  // namespace patchgen::cli
