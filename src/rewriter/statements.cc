// BodyStatements: statement lookup by leading text, shared by call-site guards and statement
// edits (statements.h). Statements come from the upstream tree-sitter tree (parser::
// NestedStatements), so matching never looks inside nested defs, and the line shift of moved code
// never touches a line that starts inside a multi-line string literal.
#include "rewriter/statements.h"

#include <algorithm>
#include <set>

#include "base/text_util.h"
#include "base/unicode_nfkc.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::PyModule;

constexpr size_t kMaxCandidates = 8;  // Candidate statements listed in "no match" errors.

uint32_t LineStartOf(const PyModule& m, uint32_t offset) {
  return m.lines().LineStart(m.lines().LineOf(offset));
}

/// True when statement text `text` starts with the anchor `prefix`, as written or as Python reads
/// names (NFKC, PEP 3131: `x = ﬁnd(` anchors `x = find(`). Only the head of the statement is
/// normalised: NFKC turns at most 4 bytes into one, so 4 bytes a byte of the prefix (and a margin
/// for combining marks) are enough.
bool StartsWithAnchor(std::string_view text, std::string_view prefix) {
  if (text.substr(0, prefix.size()) == prefix) return true;
  std::string_view head = text.substr(0, std::min(text.size(), 4 * prefix.size() + 64));
  while (head.size() < text.size() && !head.empty() &&
         (static_cast<unsigned char>(text[head.size()]) & 0xC0) == 0x80) {
    head.remove_suffix(1);  // a code point boundary
  }
  if (IsAscii(prefix) && IsAscii(head)) return false;
  return Nfkc(head).starts_with(Nfkc(prefix));
}

}  // namespace

std::string_view TrimSpace(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool StartsLine(const PyModule& m, uint32_t offset) {
  uint32_t start = LineStartOf(m, offset);
  return IsBlank(std::string_view(m.source()).substr(start, offset - start));
}

bool EndsLine(const PyModule& m, uint32_t offset) {
  std::string_view rest = TrimSpace(
      std::string_view(m.source()).substr(offset, LineEndOf(m.source(), offset) - offset));
  return rest.empty() || rest[0] == '#';
}

std::string IndentAt(const PyModule& m, uint32_t offset) {
  std::string_view line = m.lines().LineText(m.lines().LineOf(offset));
  return std::string(line.substr(0, line.find_first_not_of(" \t")));
}

std::string ShiftLines(const PyModule& m, ByteRange range, std::string_view shift) {
  std::set<uint32_t> in_string;
  parser::MarkLinesInsideStrings(m.root(), range, m.lines(), in_string);
  std::string out;
  uint32_t first = m.lines().LineOf(range.start);
  uint32_t last = m.lines().LineOf(range.end);
  for (uint32_t l = first; l <= last; ++l) {
    uint32_t start = m.lines().LineStart(l);
    uint32_t end = std::min(range.end, LineEndOf(m.source(), start));
    std::string_view line = std::string_view(m.source()).substr(start, end - start);
    if (!IsBlank(line) && !in_string.count(l)) out += shift;
    out += line;
    if (l < last) out += '\n';
  }
  return out;
}

BodyStatements::BodyStatements(const PyModule& m, const Definition& def)
    : m_(m), where_(def.qualname) {
  TSNode block = BodyBlock(m, def);
  if (ts_node_is_null(block)) return;
  stmts_ = parser::NestedStatements(block, m.lines());
  ok_ = true;
}

std::vector<const Stmt*> BodyStatements::Matching(std::string_view prefix) const {
  std::vector<const Stmt*> out;
  for (const Stmt& s : stmts_) {
    if (StartsWithAnchor(s.range.In(m_.source()), prefix)) out.push_back(&s);
  }
  return out;
}

std::string BodyStatements::FirstLineOf(const Stmt& s) const {
  return std::string(
      TrimSpace(std::string_view(m_.source())
                    .substr(s.range.start, LineEndOf(m_.source(), s.range.start) - s.range.start)));
}

bool BodyStatements::WholeBlock(const AnchorRange& r) const {
  if (r.first->index != 0) return false;
  for (const Stmt& s : stmts_) {
    if (ts_node_eq(s.block, r.last->block) && s.index > r.last->index) return false;
  }
  return true;
}

std::vector<Note> BodyStatements::StatementNotes(const std::vector<const Stmt*>& stmts) const {
  std::vector<Note> notes;
  for (size_t i = 0; i < stmts.size() && i < kMaxCandidates; ++i) {
    notes.push_back(
        Note::Text("line " + std::to_string(stmts[i]->line) + ": " + FirstLineOf(*stmts[i])));
  }
  if (stmts.size() > kMaxCandidates) {
    notes.push_back(Note::Text("... (" + std::to_string(stmts.size() - kMaxCandidates) + " more)"));
  }
  return notes;
}

std::vector<const Stmt*> BodyStatements::Closest(const std::vector<const Stmt*>& stmts,
                                                 std::string_view prefix) const {
  std::vector<std::pair<size_t, const Stmt*>> scored;
  for (const Stmt* s : stmts) {
    std::string first = FirstLineOf(*s);
    scored.emplace_back(EditDistance(prefix, std::string_view(first).substr(0, prefix.size())), s);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<const Stmt*> out;
  for (const auto& [d, s] : scored) out.push_back(s);
  return out;
}

void BodyStatements::NoMatch(const SourceLoc& loc, std::string_view key, std::string_view prefix,
                             const std::string& where, const std::vector<const Stmt*>& candidates,
                             std::vector<Diagnostic>& errors) const {
  Diagnostic d =
      ErrorAt(loc, "no statement in " + where + " starts with '" + std::string(prefix) + "'",
              "`" + std::string(key) +
                  "` is the leading text of one statement, after its indentation; "
                  "copy it from the upstream line");
  if (!candidates.empty()) {
    d.notes.push_back(Note::Text("closest statements in " + where + " (" + m_.path() + "):"));
    for (Note& n : StatementNotes(Closest(candidates, prefix))) d.notes.push_back(std::move(n));
  }
  errors.push_back(std::move(d));
}

bool BodyStatements::AllIdentical(const std::vector<const Stmt*>& stmts) const {
  for (const Stmt* s : stmts) {
    if (s->range.In(m_.source()) != stmts.front()->range.In(m_.source())) return false;
  }
  return !stmts.empty();
}

void BodyStatements::Ambiguous(const SourceLoc& loc, std::string_view key, std::string_view prefix,
                               const std::string& where, const std::vector<const Stmt*>& matches,
                               std::vector<Diagnostic>& errors) const {
  std::string help =
      "make `" + std::string(key) + "` longer so that it matches exactly one statement";
  if (AllIdentical(matches)) {
    // No longer text can tell identical statements apart, and anchors have no occurrence index.
    help = "the " + std::to_string(matches.size()) + " statements are identical, so no longer `" +
           std::string(key) +
           "` can tell them apart; anchor on a unique statement next to the one you mean "
           "(`insert_after`/`insert_before` it, or start the range there and end it with "
           "`through`), or replace the whole function with override_method";
  }
  Diagnostic d = ErrorAt(loc,
                         "'" + std::string(prefix) + "' matches " + std::to_string(matches.size()) +
                             " statements in " + where,
                         help);
  d.notes = StatementNotes(matches);
  errors.push_back(std::move(d));
}

const Stmt* BodyStatements::LocateThrough(const AnchorQuery& q, const Stmt& first,
                                          std::vector<Diagnostic>& errors) const {
  std::string_view through = TrimSpace(*q.through);
  std::vector<const Stmt*> later;  // Statements of the same block from `at` on.
  for (const Stmt& s : stmts_) {
    if (ts_node_eq(s.block, first.block) && s.index >= first.index) later.push_back(&s);
  }
  std::vector<const Stmt*> sibling_matches;
  for (const Stmt* s : later) {
    if (StartsWithAnchor(s->range.In(m_.source()), through)) sibling_matches.push_back(s);
  }
  if (sibling_matches.size() == 1) return sibling_matches[0];
  if (sibling_matches.size() > 1) {
    Ambiguous(q.through_loc, "through", through, where_, sibling_matches, errors);
    return nullptr;
  }
  std::vector<const Stmt*> anywhere = Matching(through);
  if (anywhere.empty()) {
    NoMatch(q.through_loc, "through", through, where_ + " after line " + std::to_string(first.line),
            later, errors);
    return nullptr;
  }
  std::string lines;
  for (const Stmt* s : anywhere) lines += (lines.empty() ? "" : ", ") + std::to_string(s->line);
  Diagnostic d =
      ErrorAt(q.through_loc,
              "`through` statement (line " + lines + ") is not a later sibling of the `" +
                  q.at_key + "` statement (line " + std::to_string(first.line) + ") in " + where_,
              "`" + q.at_key +
                  "` and `through` must be statements of the same block, `through` at or "
                  "after `" +
                  q.at_key + "`");
  d.notes = StatementNotes(anywhere);
  d.notes.insert(d.notes.begin(),
                 Note::Text("`" + q.at_key + "` is line " + std::to_string(first.line) + ": " +
                            FirstLineOf(first)));
  errors.push_back(std::move(d));
  return nullptr;
}

std::optional<AnchorRange> BodyStatements::Locate(const AnchorQuery& q,
                                                  std::vector<Diagnostic>& errors) const {
  std::vector<const Stmt*> all;
  for (const Stmt& s : stmts_) all.push_back(&s);
  std::string_view at = TrimSpace(q.at);
  std::vector<const Stmt*> at_matches = Matching(at);
  if (at_matches.empty()) {
    NoMatch(q.at_loc, q.at_key, at, where_, all, errors);
    return std::nullopt;
  }
  if (at_matches.size() > 1) {
    Ambiguous(q.at_loc, q.at_key, at, where_, at_matches, errors);
    return std::nullopt;
  }
  const Stmt& first = *at_matches[0];
  const Stmt* last = &first;
  if (q.through) {
    last = LocateThrough(q, first, errors);
    if (!last) return std::nullopt;
  }
  if (!StartsLine(m_, first.range.start)) {
    errors.push_back(ErrorAt(q.at_loc,
                             "the `" + q.at_key + "` statement (line " +
                                 std::to_string(first.line) + ") does not start its line; " + q.why,
                             {}));
    return std::nullopt;
  }
  if (!EndsLine(m_, last->range.end)) {
    errors.push_back(ErrorAt(q.through ? q.through_loc : q.at_loc,
                             "the last " + q.noun + " statement (line " +
                                 std::to_string(last->line) + ") does not end its line; " + q.why,
                             {}));
    return std::nullopt;
  }
  return AnchorRange{&first, last};
}

std::optional<std::string> BodyStatements::Absent(const AnchorQuery& q) const {
  if (Matching(TrimSpace(q.at)).empty()) {
    return "no statement starting with '" + std::string(TrimSpace(q.at)) + "' in " + where_;
  }
  if (q.through && Matching(TrimSpace(*q.through)).empty()) {
    return "no statement starting with '" + std::string(TrimSpace(*q.through)) + "' in " + where_;
  }
  return std::nullopt;
}

}  // namespace patchgen::rewriter
