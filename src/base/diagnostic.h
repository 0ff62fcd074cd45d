// Diagnostic: the one error format of patchgen, shared by every layer.
//
//   specs/qwen3/qwen3_gpu.yaml:14:22: error: no method 'fowrard' in class 'Qwen3MLP'
//      14 |   - override_method: Qwen3MLP.fowrard
//         |                      ^~~~~~~~~~~~~~~~
//   help: did you mean 'forward'? Methods of Qwen3MLP: __init__, forward
//
// Libraries return diagnostics (never print, never exit); only tools/patchgen maps them to
// stderr and exit codes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/byte_range.h"
#include "base/line_index.h"

namespace patchgen {

/// What a diagnostic's line calls it ("error: ", "warning: "). A note is a Note of a diagnostic,
/// never a diagnostic of its own.
enum class Severity { kError, kWarning };

/// What kind of failure a diagnostic reports; the CLI maps it to an exit code.
enum class ErrorKind {
  kSpec,  ///< invalid spec: YAML, schema, unresolved target, overlap, output does not parse (exit
          ///< 3)
  kUpstream,  ///< upstream module not found or does not parse (exit 4)
  kIo,        ///< file system error (exit 5)
  kInternal,  ///< a bug in patchgen (exit 70)
};

/// A position in a text file (a spec, a patch file, an upstream module), resolved for printing.
/// Its text forms are written here only: PathLine, PathLineCol, PathLineSpan, and the location
/// prefix of diagnostics and notes (LocationPrefix).
struct SourceLoc {
  std::string path;         ///< As printed; empty = unknown.
  uint32_t line = 0;        ///< 1-based; 0 = unknown.
  uint32_t col = 0;         ///< 1-based, code points.
  uint32_t length = 1;      ///< Caret length in code points.
  std::string source_line;  ///< The text of that line, for the excerpt.
  /// Code points of the line before `source_line` (CropSourceLine: a long line is kept only
  /// around the column; `col` still counts from the line's start).
  uint32_t line_first_col = 0;

  /// The file as a whole (no line): "path: error: ..." without an excerpt.
  static SourceLoc InFile(std::string path) { return SourceLoc{std::move(path), 0, 0, 1, {}}; }
  /// A line of a file, no column: for PathLine and PathLineSpan.
  static SourceLoc AtLine(std::string path, uint32_t line) {
    return SourceLoc{std::move(path), line, 0, 1, {}};
  }

  /// "path:line": how a generated file's header and markers name a spec entry.
  std::string PathLine() const { return path + ":" + std::to_string(line); }
  /// "path:line:col": how a message or note names another position.
  std::string PathLineCol() const { return PathLine() + ":" + std::to_string(col); }
  /// "path:line-last_line": how a pin names an upstream span; "path:line" when last_line <= line,
  /// "path" when the line is unknown.
  std::string PathLineSpan(uint32_t last_line) const {
    if (line == 0) return path;
    return last_line > line ? PathLine() + "-" + std::to_string(last_line) : PathLine();
  }
  /// What a diagnostic or note line starts with: "path:line:col: ", "path: " when the line is
  /// unknown, "" when the path is.
  std::string LocationPrefix() const;
};

/// One line printed after a diagnostic's excerpt. Three shapes, one formatter (FormatNote):
///
///   specs/q.yaml:12:5: note: 'x' first declared here   a note at another location (`loc`)
///   note: line 14: return self.down_proj(x)            a note without one
///     /usr/lib/python3/dist-packages                   a verbatim line (a list or a diff that
///                                                      the message or a note introduces)
///
/// A location the message names mid-sentence ("note: the guard is at s.yaml:9:7") is written with
/// SourceLoc::PathLineCol; a note *at* a location carries it in `loc`.
struct Note {
  std::optional<SourceLoc> loc;  ///< Printed before "note: " (LocationPrefix); none = no prefix.
  std::string message;           ///< One line, no trailing period.
  bool verbatim = false;         ///< Print `message` alone: no location, no "note: ".

  /// "path:line:col: note: message" (or "path: note: ..." / "note: ..." as far as `loc` is known).
  static Note At(SourceLoc loc, std::string message) {
    return Note{std::move(loc), std::move(message), false};
  }
  /// "note: message".
  static Note Text(std::string message) { return Note{std::nullopt, std::move(message), false}; }
  /// `line` as is, e.g. "looked in:", "  path", a diff line.
  static Note Verbatim(std::string line) { return Note{std::nullopt, std::move(line), true}; }
};

struct Diagnostic {
  Severity severity = Severity::kError;
  ErrorKind kind = ErrorKind::kSpec;
  /// Where: its path as printed (relative to the working directory; may be empty), line (0 when
  /// the diagnostic has no location), column and caret length, and the text of that line (empty
  /// prints no excerpt).
  SourceLoc loc;
  std::string message;      ///< One line, no trailing period.
  std::vector<Note> notes;  ///< Printed after the excerpt, one line each (e.g. candidates).
  std::string help;         ///< Printed as "help: ..."; empty prints nothing.
};

/// An error diagnostic at `loc`.
Diagnostic ErrorAt(const SourceLoc& loc, std::string message, std::string help = {},
                   ErrorKind kind = ErrorKind::kSpec);

/// The line of `note` as FormatDiagnostic prints it, before control characters are escaped and
/// the line is cut (Note shows the shapes); also the text of a note in `--audit` findings.
std::string FormatNote(const Note& note);

/// A SourceLoc for `range` of `text`; line 1, column 1, an empty excerpt line when `text` is empty.
SourceLoc LocOf(std::string path, std::string_view text, const LineIndex& lines, ByteRange range);

/// Sets `loc.source_line` to what an excerpt of `line` (the whole text of line `loc.line`) can
/// show: the line, or for a long one the code points within 2 * kMaxExcerptColumns of `loc.col`
/// (`line_first_col` counts those left out before). Thousands of locations on one long line then
/// hold a short copy each rather than the whole line (issue #28); the line is not copied first.
void SetSourceLine(SourceLoc& loc, std::string_view line);

/// SetSourceLine of the line `loc.source_line` holds now.
void CropSourceLine(SourceLoc& loc);

/// The text of `loc`'s line as its excerpt shows it: the whole line, or for a long one (longer
/// than kMaxExcerptColumns code points) the window around the column, with "..." where text was
/// left out. For a note that quotes a line ("generated line 42: ...").
std::string ShownLine(const SourceLoc& loc);

/// At most this many diagnostics of one kind are reported for one spec (undefined names in
/// inserted code, ...): the first ones by location, the last of them with a note
/// "... and K more <what>" (CapDiagnostics), so that output stays bounded (issue #28).
inline constexpr size_t kMaxDiagnosticsOfAKind = 20;

/// The note on the last reported diagnostic when `more` of its kind were left out.
Note MoreOfAKind(size_t more, const std::string& what);

/// Keeps of `diags[from..]` (diagnostics of one kind) the kMaxDiagnosticsOfAKind first by
/// location (SortDiagnostics' order), the last one noting how many more `what` there were.
void CapDiagnostics(std::vector<Diagnostic>& diags, size_t from, const std::string& what);

/// Builds a located diagnostic from a byte range of `text` (the caret spans the range's part on
/// its first line).
Diagnostic MakeDiagnostic(std::string path, std::string_view text, const LineIndex& lines,
                          ByteRange range, std::string message, std::string help = {},
                          ErrorKind kind = ErrorKind::kSpec);

/// Excerpt lines longer than this many code points are shortened around the caret, with "...".
inline constexpr size_t kMaxExcerptColumns = 200;

/// A message, note or help line longer than this many bytes is cut, with "... (N more bytes)".
inline constexpr size_t kMaxMessageBytes = 1000;

/// Formats one diagnostic in the format shown at the top of this file (ends with '\n'). The text is
/// valid UTF-8 whatever the input holds (a byte that is not UTF-8 prints as U+FFFD). Each of path,
/// message, notes and help prints on one line: control characters in them (a newline quoted from
/// the input, a terminal escape) print as \xNN, and each message, note and help is cut to
/// kMaxMessageBytes. In the excerpt a control character other than a tab prints as U+FFFD, one
/// column, so the caret stays aligned.
std::string FormatDiagnostic(const Diagnostic& d);

/// Sorts by (path, line, col, message) and removes exact duplicates.
void SortDiagnostics(std::vector<Diagnostic>& diags);

/// Either a value or at least one error diagnostic.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}                            // NOLINT: implicit by design
  Result(Diagnostic d) : v_(std::vector<Diagnostic>{std::move(d)}) {}  // NOLINT
  Result(std::vector<Diagnostic> ds) : v_(std::move(ds)) {}            // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const std::vector<Diagnostic>& errors() const { return std::get<1>(v_); }
  std::vector<Diagnostic>& errors() { return std::get<1>(v_); }

 private:
  std::variant<T, std::vector<Diagnostic>> v_;
};

}  // namespace patchgen
