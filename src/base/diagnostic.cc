#include "base/diagnostic.h"

#include <algorithm>
#include <tuple>
#include <vector>

namespace patchgen {
namespace {

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence starting at s[i] (2 to 4), or 0 when there is none.
size_t Utf8Length(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  auto c1 = static_cast<unsigned char>(s[i + 1]);
  if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) ||
      (c == 0xF4 && c1 >= 0x90)) {
    return 0;
  }
  return n;
}

// Appends `s` so that what is printed is valid UTF-8 on one line: a byte that is not part of a
// UTF-8 sequence becomes U+FFFD; a control character becomes \xNN in messages (a newline or an
// escape sequence quoted from the input) and U+FFFD in excerpts (one column, so the caret stays
// aligned). Tabs are kept.
void AppendPrintable(std::string& out, std::string_view s, bool excerpt) {
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (IsControl(c) && c != '\t') {
        if (excerpt) {
          out += kReplacement;
        } else {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        }
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    size_t n = Utf8Length(s, i);
    if (n == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
}

// Appends `s` as one printable line of at most kMaxMessageBytes, cut at a UTF-8 boundary with
// "... (N more bytes)".
void AppendOneLine(std::string& out, std::string_view s) {
  size_t cut = s.size();
  if (cut > kMaxMessageBytes) {
    cut = kMaxMessageBytes;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  }
  AppendPrintable(out, s.substr(0, cut), false);
  if (cut < s.size()) out += "... (" + std::to_string(s.size() - cut) + " more bytes)";
}

std::string ExcerptText(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  AppendPrintable(out, s, true);
  return out;
}

const char* SeverityLabel(Severity severity) {
  switch (severity) {
    case Severity::kError:
      return "error: ";
    case Severity::kWarning:
      return "warning: ";
  }
  return "error: ";
}

// The code points of an excerpt line that are shown: all of them, or, for a line longer than
// kMaxExcerptColumns code points, a window around the caret with "..." where text was left out,
// so one huge line cannot flood the terminal.
struct ExcerptWindow {
  std::vector<size_t> starts;  // byte offset of each code point of the line
  size_t caret = 0;            // 0-based code point of the caret
  size_t first = 0;            // shown code points: [first, last)
  size_t last = 0;

  size_t total() const { return starts.size(); }
  size_t ByteAt(size_t cp, size_t line_size) const { return cp < total() ? starts[cp] : line_size; }
};

ExcerptWindow WindowOf(std::string_view line, uint32_t col) {
  ExcerptWindow w;
  for (size_t i = 0; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80) w.starts.push_back(i);
  }
  size_t total = w.total();
  w.caret = col > 0 ? col - 1 : 0;
  w.last = total;
  if (total > kMaxExcerptColumns) {
    w.first = w.caret > kMaxExcerptColumns / 4 ? w.caret - kMaxExcerptColumns / 4 : 0;
    if (w.first > total - kMaxExcerptColumns) w.first = total - kMaxExcerptColumns;
    w.last = w.first + kMaxExcerptColumns;
  }
  return w;
}

// The caret line under the shown text: tabs copied from the source so the caret lines up, then
// '^' and '~' over `length` code points (cut at the window's end when the line was shortened).
std::string CaretMarker(std::string_view line, const ExcerptWindow& w, size_t length) {
  std::string marker;
  if (w.first > 0) marker += "   ";
  size_t cp = w.first;
  for (; cp < w.caret && cp < w.last; ++cp) marker += line[w.starts[cp]] == '\t' ? '\t' : ' ';
  for (; cp < w.caret; ++cp) marker += ' ';
  marker += '^';
  if (w.total() > kMaxExcerptColumns && w.caret + length > w.last + 3)
    length = w.caret < w.last ? w.last + 3 - w.caret : 1;
  for (size_t i = 1; i < length; ++i) marker += '~';
  return marker;
}

// The window of `loc`'s line an excerpt shows, and its text (not yet made printable) with "..."
// where text was left out. A cropped line (SetSourceLine) holds at least 2 * kMaxExcerptColumns
// code points before a column that is not near its start, so the window starts after its first
// code point as the whole line's would, and "..." is written where it would be.
ExcerptWindow ShownWindow(const SourceLoc& loc, std::string* shown) {
  std::string_view line = loc.source_line;
  ExcerptWindow w = WindowOf(line, loc.col - std::min(loc.col, loc.line_first_col));
  if (w.first > 0) *shown += "...";
  size_t begin_byte = w.ByteAt(w.first, line.size());
  size_t end_byte = w.ByteAt(w.last, line.size());
  shown->append(line.substr(begin_byte, end_byte - begin_byte));
  if (w.last < w.total()) *shown += "...";
  return w;
}

// The excerpt: the source line with its number in a gutter of at least four columns, and the caret
// line under it.
void AppendExcerpt(std::string& out, const Diagnostic& d) {
  std::string num = std::to_string(d.loc.line);
  std::string gutter(num.size() < 4 ? 4 : num.size(), ' ');
  std::string lead = std::string(gutter.size() - num.size(), ' ') + num;
  std::string shown;
  ExcerptWindow w = ShownWindow(d.loc, &shown);
  out += ' ' + lead + " | " + ExcerptText(shown) + '\n';
  out += ' ' + gutter + " | " + CaretMarker(d.loc.source_line, w, d.loc.length) + '\n';
}

}  // namespace

SourceLoc LocOf(std::string path, std::string_view text, const LineIndex& lines, ByteRange range) {
  SourceLoc loc;
  loc.path = std::move(path);
  LineCol lc = lines.At(range.start);
  loc.line = lc.line;
  loc.col = lc.col;
  uint32_t line0 = lc.line - 1;
  std::string_view line_text = lines.LineText(line0);
  SetSourceLine(loc, line_text);
  uint32_t line_start = lines.LineStart(line0);
  uint32_t line_end = line_start + static_cast<uint32_t>(line_text.size());
  uint32_t end = std::min(range.end, line_end);
  if (end > range.start && range.start <= text.size()) {
    loc.length = std::max<uint32_t>(1, CodePointCount(text.substr(range.start, end - range.start)));
  }
  return loc;
}

void SetSourceLine(SourceLoc& loc, std::string_view line) {
  constexpr size_t kKeep = 2 * kMaxExcerptColumns;
  loc.line_first_col = 0;
  if (line.size() <= 2 * kKeep) {  // fewer code points than bytes
    loc.source_line = std::string(line);
    return;
  }
  auto starts_code_point = [&](size_t i) {
    return (static_cast<unsigned char>(line[i]) & 0xC0) != 0x80;
  };
  size_t total = 0;
  for (size_t i = 0; i < line.size(); ++i) total += starts_code_point(i) ? 1 : 0;
  size_t caret = std::min<size_t>(loc.col > 0 ? loc.col - 1 : 0, total);
  size_t first = caret > kKeep ? caret - kKeep : 0;
  size_t last = std::min(total, caret + kKeep);
  size_t begin = line.size(), end = line.size();
  for (size_t i = 0, cp = 0; i < line.size(); ++i) {
    if (!starts_code_point(i)) continue;
    if (cp == first) begin = i;
    if (cp == last) {
      end = i;
      break;
    }
    ++cp;
  }
  begin = std::min(begin, end);
  loc.source_line = std::string(line.substr(begin, end - begin));
  loc.line_first_col = static_cast<uint32_t>(first);
}

void CropSourceLine(SourceLoc& loc) {
  std::string line = std::move(loc.source_line);
  SetSourceLine(loc, line);
}

std::string ShownLine(const SourceLoc& loc) {
  std::string shown;
  ShownWindow(loc, &shown);
  return shown;
}

Note MoreOfAKind(size_t more, const std::string& what) {
  return Note::Text("... and " + std::to_string(more) + " more " + what);
}

void CapDiagnostics(std::vector<Diagnostic>& diags, size_t from, const std::string& what) {
  if (diags.size() - std::min(from, diags.size()) <= kMaxDiagnosticsOfAKind) return;
  auto key = [](const Diagnostic& d) {
    return std::tie(d.loc.path, d.loc.line, d.loc.col, d.message);
  };
  auto begin = diags.begin() + static_cast<std::ptrdiff_t>(from);
  std::stable_sort(begin, diags.end(),
                   [&](const Diagnostic& a, const Diagnostic& b) { return key(a) < key(b); });
  size_t more = static_cast<size_t>(diags.end() - begin) - kMaxDiagnosticsOfAKind;
  diags.erase(begin + kMaxDiagnosticsOfAKind, diags.end());
  diags.back().notes.push_back(MoreOfAKind(more, what));
}

Diagnostic MakeDiagnostic(std::string path, std::string_view text, const LineIndex& lines,
                          ByteRange range, std::string message, std::string help, ErrorKind kind) {
  return ErrorAt(LocOf(std::move(path), text, lines, range), std::move(message), std::move(help),
                 kind);
}

Diagnostic ErrorAt(const SourceLoc& loc, std::string message, std::string help, ErrorKind kind) {
  Diagnostic d;
  d.kind = kind;
  d.loc = loc;
  d.message = std::move(message);
  d.help = std::move(help);
  return d;
}

std::string SourceLoc::LocationPrefix() const {
  if (path.empty()) return "";
  return (line > 0 ? PathLineCol() : path) + ": ";
}

std::string FormatNote(const Note& note) {
  if (note.verbatim) return note.message;
  std::string out = note.loc ? note.loc->LocationPrefix() : "";
  out += "note: ";
  out += note.message;
  return out;
}

std::string FormatDiagnostic(const Diagnostic& d) {
  std::string out;
  AppendPrintable(out, d.loc.LocationPrefix(), false);
  out += SeverityLabel(d.severity);
  AppendOneLine(out, d.message);
  out += '\n';
  if (d.loc.line > 0 && !d.loc.source_line.empty()) AppendExcerpt(out, d);
  for (const Note& n : d.notes) {
    AppendOneLine(out, FormatNote(n));
    out += '\n';
  }
  if (!d.help.empty()) {
    out += "help: ";
    AppendOneLine(out, d.help);
    out += '\n';
  }
  return out;
}

void SortDiagnostics(std::vector<Diagnostic>& diags) {
  auto key = [](const Diagnostic& d) {
    return std::tie(d.loc.path, d.loc.line, d.loc.col, d.message);
  };
  std::stable_sort(diags.begin(), diags.end(),
                   [&](const Diagnostic& a, const Diagnostic& b) { return key(a) < key(b); });
  diags.erase(std::unique(diags.begin(), diags.end(),
                          [&](const Diagnostic& a, const Diagnostic& b) {
                            return key(a) == key(b) && a.help == b.help;
                          }),
              diags.end());
}

}  // namespace patchgen
