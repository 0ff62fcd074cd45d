// GuardPlanner (guard_planner.h): the text of the guards. An entry guard is an insertion before
// the body's first statement; a call-site guard replaces the lines of statements `at`..`through`
// by an if/else whose else-branch is those same bytes shifted one level right; instance-scoped
// slots are bound at the end of the owner's `__init__`.
#include <string>

#include "base/text_util.h"
#include "parser/tree_queries.h"
#include "rewriter/guard_planner.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using spec::Guard;
using spec::Slot;

void ShiftSpan(std::optional<CodeSpan>& span, uint32_t by) {
  if (!span) return;
  span->begin += by;
  span->end += by;
}

}  // namespace

/// Entry guard: `if <slot>.use_non_eager_impl: return <call>` before the body's first
/// statement (after the docstring; before leading comments).
bool GuardPlanner::PlanEntry(const Slot& slot, const Guard& g, const Definition& def,
                             const PreparedCall& call) {
  std::string ind = def.inline_body ? IndentAt(def.definition.start) + std::string(kGuardStep)
                    : def.docstring ? IndentAt(def.docstring->start)
                                    : IndentAt(FirstStatementStart(def));
  std::string text = ind + Marker(slot, g) + "\n" + ind + "if " + Cond(slot) + ":\n";
  std::string head = ind + std::string(kGuardStep) + "return ";
  size_t begin = text.size() + head.size();
  for (size_t i = 0; i < call.lines.size(); ++i) {
    if (call.lines[i].empty()) {
      text += "\n";
      continue;
    }
    text += (i == 0 ? head : ind + std::string(kGuardStep)) + call.lines[i] + "\n";
  }
  EntryEdit& e = entry_[IndexOf(&def)];
  if (e.text.empty()) {
    e.origin = g.in_loc;
    // A one-line call maps back to the spec exactly (later lines lack the `return ` prefix).
    if (call.lines.size() == 1)
      e.code = GuardCallSpan(g, call, begin, text.size() - 1, head.size());
  } else {
    e.code.reset();  // Several guards share the edit; a span can describe only one.
  }
  e.what = "guard " + def.qualname;
  e.text += text;
  return true;
}

uint32_t GuardPlanner::FirstStatementStart(const Definition& def) const {
  std::vector<TSNode> stmts = parser::BlockStatements(BodyBlock(up_, def));
  return stmts.empty() ? def.body.start : ts_node_start_byte(stmts.front());
}

/// Start of the body's first line: its first statement, or the first comment line above it
/// (a comment on the header's own line stays there).
uint32_t GuardPlanner::BodyStart(const Definition& def) const {
  uint32_t first = FirstStatementStart(def);
  const LineIndex& lines = up_.lines();
  for (uint32_t l = lines.LineOf(def.header.end) + 1; l < lines.LineOf(first); ++l) {
    if (!IsBlank(lines.LineText(l))) return lines.LineStart(l);
  }
  return first;
}

/// Call-site guard: the lines of statements `at`..`through` become the else-branch.
bool GuardPlanner::PlanCallSite(const Slot& slot, const Guard& g, const Definition& def,
                                const PreparedCall& call) {
  BodyStatements stmts(up_, def);
  if (!stmts.ok()) {
    errors_.push_back(ErrorAt(g.in_loc, "cannot find the body of '" + def.qualname + "'", {},
                              ErrorKind::kInternal));
    return false;
  }
  std::string where = def.qualname;
  AnchorQuery q;
  q.at = *g.at;
  q.at_loc = g.at_loc;
  if (g.through) q.through = *g.through;
  q.through_loc = g.through_loc;
  std::optional<AnchorRange> located = stmts.Locate(q, errors_);
  if (!located) return false;
  const Stmt& first = *located->first;
  const Stmt* last = located->last;
  ByteRange moved{LineStartOf(first.range.start), LineEndOf(last->range.end)};
  last_call_site_ = ByteRange{first.range.start, last->range.end};
  uint32_t last_line = up_.lines().LineOf(last->range.end) + 1;
  for (const PlannedRange& other : call_sites_) {
    if (!other.range.Overlaps(moved)) continue;
    Diagnostic d = ErrorAt(
        g.at_loc,
        "call-site guard on lines " + std::to_string(first.line) + "-" + std::to_string(last_line) +
            " of " + where + " overlaps another guard's lines " + std::to_string(other.first_line) +
            "-" + std::to_string(other.last_line),
        "guards in one body must wrap disjoint statement ranges");
    d.notes.push_back(Note::At(other.at_loc, "the other guard"));
    errors_.push_back(std::move(d));
    return false;
  }
  call_sites_.push_back(PlannedRange{moved, first.line, last_line, g.at_loc});

  std::string ind = IndentAt(first.range.start);
  std::string text = ind + Marker(slot, g) + "\n" + ind + "if " + Cond(slot) + ":\n";
  size_t begin = text.size();
  for (const std::string& l : call.lines)
    text += l.empty() ? "\n" : ind + std::string(kGuardStep) + l + "\n";
  std::optional<CodeSpan> span =
      GuardCallSpan(g, call, begin, text.size() - 1, ind.size() + kGuardStep.size());
  text += ind + "else:\n" + ShiftLines(up_, moved, kGuardStep);
  call_site_edits_.push_back(
      TextEdit{moved, std::move(text), g.at_loc, "guard " + def.qualname, span});
  return true;
}

/// Turns the collected guards into edits: entry guards first (so that a call-site guard on a
/// body's first statement follows its entry guard), then call sites, then `__init__` bindings.
void GuardPlanner::EmitEntryGuard(const Definition& def, EntryEdit& e) {
  if (def.inline_body) {
    // `def f(x): return x` becomes a block: guard lines, then the old body on its own line.
    ByteRange gap{def.header.end, def.body.start};
    std::string ind = IndentAt(def.definition.start) + std::string(kGuardStep);
    ShiftSpan(e.code, 1);  // After the "\n".
    plan_.edits.push_back(TextEdit{gap, "\n" + e.text + ind, e.origin, e.what, e.code});
    return;
  }
  uint32_t declarations = LeadingDeclarationsEnd(def);  // After `global x` (CPython).
  uint32_t at = declarations > 0 ? LineEndOf(declarations) + 1
                : def.docstring  ? LineEndOf(def.docstring->end) + 1
                                 : LineStartOf(BodyStart(def));
  std::string text = e.text;
  if (at > up_.source().size()) {  // Docstring on the file's last line, no newline.
    at = static_cast<uint32_t>(up_.source().size());
    text = "\n" + text;
    ShiftSpan(e.code, 1);
  }
  plan_.edits.push_back(TextEdit{{at, at}, std::move(text), e.origin, e.what, e.code});
}

void GuardPlanner::EmitEdits() {
  const auto& defs = up_.definitions();
  for (auto& [index, e] : entry_) EmitEntryGuard(defs[index], e);
  for (TextEdit& e : call_site_edits_) plan_.edits.push_back(std::move(e));
  for (auto& [index, e] : init_) {
    const Definition& init = defs[index];
    std::string ind = init.inline_body ? IndentAt(init.definition.start) + std::string(kGuardStep)
                                       : IndentAt(FirstStatementStart(init));
    if (init.inline_body && !entry_.count(index)) {
      plan_.edits.push_back(TextEdit{{init.header.end, init.body.start},
                                     "\n" + ind,
                                     e.origin,
                                     "instance slots " + init.qualname,
                                     std::nullopt});
    }
    std::string names;
    for (const std::string& n : e.slots) names += (names.empty() ? "" : ", ") + n;
    std::string text =
        "\n" + ind + "# patchgen: instance slots " + names + " (" + e.origin.PathLine() + ")";
    for (const std::string& l : e.lines) text += "\n" + ind + l;
    uint32_t at = LineEndOf(init.body.end);
    plan_.edits.push_back(TextEdit{
        {at, at}, std::move(text), e.origin, "instance slots " + init.qualname, std::nullopt});
  }
}

}  // namespace patchgen::rewriter
