#include "base/diagnostic.h"

#include <catch2/catch.hpp>

#include "base/text_util.h"

namespace patchgen {
namespace {

TEST_CASE("FormatDiagnostic prints location, excerpt, caret and help") {
  std::string text = "version: 1\npatches:\n  - override_method: Qwen3MLP.fowrard\n";
  LineIndex lines(text);
  uint32_t start = static_cast<uint32_t>(text.find("Qwen3MLP.fowrard"));
  Diagnostic d = MakeDiagnostic("specs/q.yaml", text, lines, {start, start + 16},
                                "no method 'fowrard' in class 'Qwen3MLP'",
                                "did you mean 'forward'? Methods of Qwen3MLP: __init__, forward");
  CHECK(FormatDiagnostic(d) ==
        "specs/q.yaml:3:22: error: no method 'fowrard' in class 'Qwen3MLP'\n"
        "    3 |   - override_method: Qwen3MLP.fowrard\n"
        "      |                      ^~~~~~~~~~~~~~~~\n"
        "help: did you mean 'forward'? Methods of Qwen3MLP: __init__, forward\n");
}

TEST_CASE("Columns count code points and carets copy tabs") {
  std::string text = "\tx = 'é' + y\n";
  LineIndex lines(text);
  uint32_t start = static_cast<uint32_t>(text.find('y'));
  Diagnostic d = MakeDiagnostic("a.py", text, lines, {start, start + 1}, "undefined name 'y'");
  CHECK(d.loc.col == 12);
  CHECK(FormatDiagnostic(d) ==
        "a.py:1:12: error: undefined name 'y'\n"
        "    1 | \tx = 'é' + y\n"
        "      | \t          ^\n");
}

TEST_CASE("Long excerpt lines are cut to a window around the caret") {
  // 300 code points of 'é' (2 bytes each), the culprit at code point 250, then 100 more.
  std::string pad;
  for (int i = 0; i < 250; ++i) pad += "\xc3\xa9";
  std::string tail;
  for (int i = 0; i < 100; ++i) tail += "\xc3\xa9";
  std::string text = pad + "bad" + tail + "\n";
  LineIndex lines(text);
  uint32_t start = static_cast<uint32_t>(pad.size());
  Diagnostic d = MakeDiagnostic("a.yaml", text, lines, {start, start + 3}, "bad value");
  CHECK(d.loc.col == 251);
  // The window would start 50 code points before the caret but stays 200 wide, so it is the last
  // 200 code points of the 353: [153, 353).
  std::string shown;
  for (int i = 0; i < 97; ++i) shown += "\xc3\xa9";
  std::string expected = "a.yaml:1:251: error: bad value\n    1 | ..." + shown + "bad" + tail +
                         "\n" + "      | " + std::string(100, ' ') + "^~~\n";
  CHECK(FormatDiagnostic(d) == expected);

  // Caret near the start: the line is cut at 200 code points, "..." after; a long underline stops
  // at the cut.
  std::string word(500, 'x');
  std::string text2 = word + "\n";
  LineIndex lines2(text2);
  Diagnostic d2 = MakeDiagnostic("b.yaml", text2, lines2, {0, 500}, "unknown key");
  CHECK(FormatDiagnostic(d2) == "b.yaml:1:1: error: unknown key\n    1 | " + std::string(200, 'x') +
                                    "...\n      | ^" + std::string(202, '~') + "\n");

  // A line of exactly 200 code points is printed whole.
  std::string text3 = std::string(200, 'y') + "\n";
  LineIndex lines3(text3);
  Diagnostic d3 = MakeDiagnostic("c.yaml", text3, lines3, {199, 200}, "last");
  CHECK(FormatDiagnostic(d3) == "c.yaml:1:200: error: last\n    1 | " + std::string(200, 'y') +
                                    "\n      | " + std::string(199, ' ') + "^\n");
}

TEST_CASE("Messages, notes and help print on one line; control characters are escaped") {
  // yaml-cpp quotes the offending character ("unknown escape character: \v"); an upstream name
  // may hold an escape sequence. Found by fuzz_spec.
  std::string text = "key: \"a\\\vb\x1b[2J\"\n";
  LineIndex lines(text);
  Diagnostic d = MakeDiagnostic("s.yaml", text, lines, {5, 6}, "unknown escape character: \v\n");
  d.notes.push_back(Note::Text("\x1b[31mred\r"));
  d.help = "a\tb\x7f";
  CHECK(FormatDiagnostic(d) ==
        "s.yaml:1:6: error: unknown escape character: \\x0b\\x0a\n"
        "    1 | key: \"a\\\xEF\xBF\xBD"
        "b\xEF\xBF\xBD[2J\"\n"
        "      |      ^\n"
        "note: \\x1b[31mred\\x0d\n"
        "help: a\tb\\x7f\n");
}

TEST_CASE("Printed diagnostics are valid UTF-8: stray bytes print as U+FFFD") {
  // A latin-1 upstream line: 'caf\xe9' is one invalid byte, one column.
  std::string text = "NAME = 'caf\xe9' + x\n";
  LineIndex lines(text);
  uint32_t start = static_cast<uint32_t>(text.find('x'));
  Diagnostic d =
      MakeDiagnostic("m\xff.py", text, lines, {start, start + 1}, "undefined name 'x\xc3'");
  CHECK(FormatDiagnostic(d) ==
        "m\xEF\xBF\xBD.py:1:17: error: undefined name 'x\xEF\xBF\xBD'\n"
        "    1 | NAME = 'caf\xEF\xBF\xBD' + x\n"
        "      |                 ^\n");
  // Overlong forms and surrogates are not UTF-8 either; valid sequences are kept.
  d = Diagnostic{};
  d.loc.path = "p";
  d.message = "\xc0\xaf \xed\xa0\x80 \xf0\x9f\x98\x80 \xc3\xa9";
  CHECK(FormatDiagnostic(d) ==
        "p: error: \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD "
        "\xf0\x9f\x98\x80 \xc3\xa9\n");
}

TEST_CASE("Long messages are cut at a UTF-8 boundary") {
  std::string name = "x" + std::string(2000, 'y');
  Diagnostic d;
  d.loc.path = "s.yaml";
  d.message = "no class '" + name + "'";
  std::string out = FormatDiagnostic(d);
  CHECK(out == "s.yaml: error: no class 'x" + std::string(kMaxMessageBytes - 11, 'y') +
                   "... (1012 more bytes)\n");
  // A cut inside a two-byte code point moves back to its first byte.
  d.message = std::string(kMaxMessageBytes - 1, 'a') + "\xc3\xa9";
  CHECK(FormatDiagnostic(d) ==
        "s.yaml: error: " + std::string(kMaxMessageBytes - 1, 'a') + "... (2 more bytes)\n");
}

TEST_CASE("SortDiagnostics orders by location and drops duplicates") {
  std::vector<Diagnostic> ds(3);
  ds[0].loc.path = "b";
  ds[0].loc.line = 1;
  ds[0].message = "x";
  ds[1].loc.path = "a";
  ds[1].loc.line = 9;
  ds[1].message = "y";
  ds[2] = ds[0];
  SortDiagnostics(ds);
  REQUIRE(ds.size() == 2);
  CHECK(ds[0].loc.path == "a");
}

TEST_CASE("DidYouMean finds close names only") {
  CHECK(DidYouMean("fowrard", {"__init__", "forward"}) == std::optional<std::string>("forward"));
  CHECK(!DidYouMean("zzz", {"__init__", "forward"}).has_value());
  CHECK(EditDistance("kitten", "sitting") == 3);
  CHECK(JoinNames({"a", "b", "c"}, 2) == "a, b, ... (1 more)");
}

TEST_CASE("WithDidYouMean and DidYouMeanOr: the one shape of a suggested name") {
  std::vector<std::string> names = {"__init__", "forward"};
  CHECK(WithDidYouMean("fowrard", names, "methods: __init__, forward") ==
        "did you mean 'forward'? methods: __init__, forward");
  CHECK(WithDidYouMean("zzz", names, "methods: __init__, forward") == "methods: __init__, forward");
  // An empty help keeps the space after the question mark (help lines that add nothing after it).
  CHECK(WithDidYouMean("fowrard", names, "") == "did you mean 'forward'? ");
  CHECK(DidYouMeanOr("fowrard", names, "methods: __init__, forward") == "did you mean 'forward'?");
  CHECK(DidYouMeanOr("zzz", names, "methods: __init__, forward") == "methods: __init__, forward");
  CHECK(DidYouMeanOr("x", {}, "") == "");
}

TEST_CASE("SourceLoc's location text") {
  SourceLoc loc{"specs/q.yaml", 12, 5, 3, "  - name: x"};
  CHECK(loc.PathLine() == "specs/q.yaml:12");
  CHECK(loc.PathLineCol() == "specs/q.yaml:12:5");
  CHECK(loc.LocationPrefix() == "specs/q.yaml:12:5: ");
  CHECK(SourceLoc::InFile("pyproject.toml").LocationPrefix() == "pyproject.toml: ");
  CHECK(SourceLoc{}.LocationPrefix() == "");
  // A line without a path names nothing: no prefix (as for the diagnostic itself).
  CHECK(SourceLoc{"", 3, 1, 1, {}}.LocationPrefix() == "");
  // A line span (how a pin names its upstream statements), a line, or the file alone.
  SourceLoc up = SourceLoc::AtLine("up/modeling_q.py", 40);
  CHECK(up.PathLine() == "up/modeling_q.py:40");
  CHECK(up.PathLineSpan(44) == "up/modeling_q.py:40-44");
  CHECK(up.PathLineSpan(40) == "up/modeling_q.py:40");
  CHECK(up.PathLineSpan(0) == "up/modeling_q.py:40");
  CHECK(SourceLoc::AtLine("up/modeling_q.py", 0).PathLineSpan(44) == "up/modeling_q.py");
  // An empty file's location is its line 1, column 1, with an empty excerpt line (an empty spec).
  LineIndex empty("");
  SourceLoc start = LocOf("e.yaml", "", empty, {0, 0});
  CHECK(start.PathLineCol() == "e.yaml:1:1");
  CHECK(start.length == 1);
  CHECK(start.source_line.empty());
  Diagnostic d = ErrorAt(SourceLoc::InFile("a.yaml"), "cannot read spec: gone", {}, ErrorKind::kIo);
  CHECK(d.kind == ErrorKind::kIo);
  CHECK(FormatDiagnostic(d) == "a.yaml: error: cannot read spec: gone\n");
}

TEST_CASE("Notes print one way: location prefix, 'note: ', message") {
  SourceLoc loc{"specs/q.yaml", 12, 5, 3, "  - name: x"};
  // With a location: the excerpt text and caret length of `loc` are not printed.
  CHECK(FormatNote(Note::At(loc, "first declared here")) ==
        "specs/q.yaml:12:5: note: first declared here");
  // Line unknown: the path alone.
  CHECK(FormatNote(Note::At(SourceLoc::InFile("pyproject.toml"), "here")) ==
        "pyproject.toml: note: here");
  // Path unknown: no prefix, whatever the line.
  CHECK(FormatNote(Note::At(SourceLoc{}, "somewhere")) == "note: somewhere");
  CHECK(FormatNote(Note::At(SourceLoc{"", 7, 2, 1, {}}, "somewhere")) == "note: somewhere");
  // Without a location.
  CHECK(FormatNote(Note::Text("line 14: return x")) == "note: line 14: return x");
  // Verbatim: as is, even with a location set.
  CHECK(FormatNote(Note::Verbatim("  /usr/lib/python3")) == "  /usr/lib/python3");
  Note v = Note::Verbatim("looked in:");
  v.loc = loc;
  CHECK(FormatNote(v) == "looked in:");
}

TEST_CASE("FormatDiagnostic prints the notes after the excerpt, in order, before help") {
  std::string text = "a: 1\nb: 2\n";
  LineIndex lines(text);
  Diagnostic d = MakeDiagnostic("s.yaml", text, lines, {5, 6}, "duplicate key 'b'", "rename it");
  d.notes.push_back(Note::At(SourceLoc{"s.yaml", 1, 1, 1, "a: 1"}, "first defined here"));
  d.notes.push_back(Note::Text("keys: a, b"));
  d.notes.push_back(Note::Verbatim("  a"));
  d.notes.push_back(Note::At(SourceLoc::InFile("p\x1b.yaml"), "\x01"));
  CHECK(FormatDiagnostic(d) ==
        "s.yaml:2:1: error: duplicate key 'b'\n"
        "    2 | b: 2\n"
        "      | ^\n"
        "s.yaml:1:1: note: first defined here\n"
        "note: keys: a, b\n"
        "  a\n"
        "p\\x1b.yaml: note: \\x01\n"
        "help: rename it\n");
  // A note is cut like a message, its location prefix included.
  d.notes = {Note::At(SourceLoc{"s.yaml", 1, 1, 1, {}}, std::string(2000, 'n'))};
  d.help.clear();
  std::string out = FormatDiagnostic(d);
  std::string prefix = "s.yaml:1:1: note: ";
  CHECK(out.substr(out.find(prefix)) ==
        prefix + std::string(kMaxMessageBytes - prefix.size(), 'n') + "... (" +
            std::to_string(prefix.size() + 2000 - kMaxMessageBytes) + " more bytes)\n");
}

TEST_CASE("A location keeps only what its excerpt shows of a long line; notes quote the window") {
  // 2,000 names on one line: each location holds at most 4 * kMaxExcerptColumns code points of
  // it, and prints the excerpt the whole line would.
  std::string text;
  for (int i = 0; i < 2000; ++i) text += (i ? ", n" : "x = [n") + std::to_string(1000 + i);
  text += "]\n";
  LineIndex lines(text);
  for (uint32_t at : {4u, 300u, 9000u, static_cast<uint32_t>(text.size() - 6)}) {
    Diagnostic d = MakeDiagnostic("a.py", text, lines, {at, at + 5}, "m");
    CHECK(d.loc.source_line.size() <= 4 * kMaxExcerptColumns);
    SourceLoc whole = d.loc;
    whole.source_line = std::string(lines.LineText(0));
    whole.line_first_col = 0;
    Diagnostic w = d;
    w.loc = whole;
    CHECK(FormatDiagnostic(d) == FormatDiagnostic(w));
    // The note text of the line is the excerpt's window, "..." where text was left out.
    std::string shown = ShownLine(d.loc);
    CHECK(FormatDiagnostic(d).find(" | " + shown + "\n") != std::string::npos);
    CHECK(shown.size() <= kMaxExcerptColumns + 6);
  }
  SourceLoc short_line = LocOf("b.py", "y = 1\n", LineIndex("y = 1\n"), {4, 5});
  CHECK(ShownLine(short_line) == "y = 1");
}

TEST_CASE("LineColCursor counts columns on from the previous offset") {
  std::string text = "ab\xC3\xA9 cd\nxyz\n";
  LineIndex lines(text);
  LineColCursor cursor(text, lines);
  for (uint32_t offset : {0u, 2u, 4u, 5u, 8u, 10u}) {
    LineCol want = lines.At(offset);
    LineCol got = cursor.At(offset);
    CHECK(got.line == want.line);
    CHECK(got.col == want.col);
  }
  CHECK(cursor.At(1).col == 2);  // backwards: counted again from the line's start
}

TEST_CASE("CapDiagnostics keeps the first of a kind by location and counts the rest") {
  std::vector<Diagnostic> ds;
  ds.push_back(ErrorAt(SourceLoc{"s.yaml", 1, 1, 1, {}}, "other kind"));
  for (uint32_t i = 30; i > 0; --i) {
    ds.push_back(ErrorAt(SourceLoc{"s.yaml", 5, i, 1, {}}, "undefined " + std::to_string(i)));
  }
  CapDiagnostics(ds, 1, "undefined names");
  REQUIRE(ds.size() == 1 + kMaxDiagnosticsOfAKind);
  CHECK(ds[0].message == "other kind");
  CHECK(ds[1].loc.col == 1);
  CHECK(ds.back().loc.col == kMaxDiagnosticsOfAKind);
  REQUIRE(ds.back().notes.size() == 1);
  CHECK(FormatNote(ds.back().notes[0]) == "note: ... and 10 more undefined names");
  std::vector<Diagnostic> few(3, ErrorAt(SourceLoc{"s.yaml", 5, 1, 1, {}}, "x"));
  CapDiagnostics(few, 0, "x");
  CHECK(few.size() == 3);
  CHECK(few.back().notes.empty());
}

}  // namespace
}  // namespace patchgen
