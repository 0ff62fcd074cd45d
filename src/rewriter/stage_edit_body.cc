// edit_body: statement edits anchored like call-site guards (statements.h). Planned with the
// other patches; placed after the guards (PlaceStatementEdits) so that at a body's first statement
// an entry guard stays first and an edit touching a call-site guard's statements is an error.
#include <tree_sitter/api.h>

#include "base/line_index.h"
#include "base/text_util.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"
#include "rewriter/fingerprint.h"
#include "rewriter/patch_planners.h"
#include "rewriter/reindent.h"
#include "rewriter/statements.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::PyModule;
using spec::Patch;
using spec::StatementEdit;

/// An edit's anchor lookup, with the edit's keys in messages.
AnchorQuery QueryOf(const StatementEdit& e) {
  AnchorQuery q;
  q.at = e.at;
  q.at_loc = e.at_loc;
  q.at_key = spec::EditOpKey(e.op);
  if (e.through) q.through = *e.through;
  q.through_loc = e.through_loc;
  q.noun = "edited";
  q.why = "an edit works on whole lines";
  return q;
}

bool LinesOverlap(ByteRange a, ByteRange b) { return a.start < b.end && b.start < a.end; }

std::string LineSpan(uint32_t first, uint32_t last) {
  return first == last ? "line " + std::to_string(first)
                       : "lines " + std::to_string(first) + "-" + std::to_string(last);
}

/// The function named by an edit_body target, or nullptr with an error.
const Definition* EditTarget(PatchContext& ctx, const Patch& p) {
  const PyModule& up = ctx.up;
  const Definition* def = up.Find(p.target);
  if (def && def->kind == Definition::Kind::kFunction) return def;
  if (def) {
    ctx.Error(p.target_loc,
              "edit_body target '" + p.target + "' is a class, not a function or method",
              "methods of " + def->qualname + ": " +
                  JoinNames(up.ChildNames(*def, Definition::Kind::kFunction)) +
                  "; to edit its constructor, write `edit_body: " + p.target + ".__init__`");
    return nullptr;
  }
  std::string owner = Owner(p.target);
  if (owner.empty()) {
    std::vector<std::string> names = up.TopLevelNames(Definition::Kind::kFunction);
    std::string help = WithDidYouMean(p.target, names, "top-level functions: " + JoinNames(names));
    ctx.Error(p.target_loc, "no function '" + p.target + "' in " + up.path(), help);
    return nullptr;
  }
  const Definition* o = up.Find(owner);
  if (!o) {
    FindClass(ctx, owner, p.target_loc);
    return nullptr;
  }
  std::vector<std::string> methods = up.ChildNames(*o, Definition::Kind::kFunction);
  std::string help = WithDidYouMean(LastComponent(p.target), methods,
                                    "methods of " + o->qualname + ": " + JoinNames(methods));
  bool in_class = o->kind == Definition::Kind::kClass;
  ctx.Error(p.target_loc,
            std::string("no ") + (in_class ? "method '" : "nested function '") +
                LastComponent(p.target) + "' in " + (in_class ? "class '" : "function '") +
                o->qualname + "'",
            help);
  return nullptr;
}

/// `code` of an edit, parsed and checked: its first statement must start at the code's
/// smallest indentation (a deeper first line cannot be re-indented to one block).
std::unique_ptr<PyModule> EditCode(PatchContext& ctx, const StatementEdit& e) {
  std::vector<std::string_view> lines = SplitLines(e.code);
  size_t common = CommonIndent(e.code);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    size_t first = l.find_first_not_of(" \t");
    if (first == std::string_view::npos || l[first] == '#') continue;
    if (first > common) {
      ctx.Error(OriginLoc(e.code_origin, static_cast<uint32_t>(i), static_cast<uint32_t>(first + 1),
                          static_cast<uint32_t>(CodePointCount(l.substr(first)))),
                "the first statement of `code` is indented deeper than a later line",
                "write the statements of an edit at one column; patchgen indents them to the "
                "anchor statement's block");
      return nullptr;
    }
    break;
  }
  return ParseCode(e.code, e.code_origin, ctx.st.out.errors);
}

/// The single `...` line of a wrap's code (parser::EllipsisLines), or nullopt with an error.
std::optional<TSNode> WrapPlaceholder(PatchContext& ctx, const PyModule& m,
                                      const StatementEdit& e) {
  std::vector<TSNode> found = parser::EllipsisLines(m);
  if (found.size() == 1) return found[0];
  ctx.Error(e.code_loc,
            "the code of `wrap` must have exactly one `...` line, where the wrapped statements go; "
            "found " +
                std::to_string(found.size()),
            "e.g. `with torch.no_grad():` and, indented below it, a line holding only `...`");
  return std::nullopt;
}

std::string EditMarker(const Patch& p, const StatementEdit& e, const std::string& indent) {
  std::string m = indent + "# patchgen: edit_body " + p.target + ": " + spec::EditOpKey(e.op);
  if (!p.description.empty()) m += " - " + OneLine(p.description);
  return m + " (" + e.loc.PathLine() + ")";
}

/// A wrap's text: the snippet's lines before the placeholder, the anchor statements' upstream
/// lines shifted to the placeholder's column, then the snippet's lines after it.
TextEdit WrapEdit(const PyModule& up, const PyModule& m, TSNode placeholder, const Snippet& s,
                  const std::string& marker, const std::string& ind, const PendingEdit& pe,
                  SourceLoc loc, std::string what) {
  uint32_t hole = m.lines().LineOf(ts_node_start_byte(placeholder));
  std::vector<std::string_view> lines = SplitLines(s.text);
  std::string before, after;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i < hole) before += std::string(lines[i]) + "\n";
    if (i > hole) after += (after.empty() ? "" : "\n") + std::string(lines[i]);
  }
  std::string_view hole_line = hole < lines.size() ? lines[hole] : std::string_view();
  size_t hole_col = hole_line.find_first_not_of(' ');
  if (hole_col == std::string_view::npos) hole_col = ind.size();
  std::string shift(hole_col > ind.size() ? hole_col - ind.size() : 0, ' ');
  std::string text = marker + "\n";
  std::optional<CodeSpan> head, tail;
  if (!before.empty()) {
    head = CodeSpan{static_cast<uint32_t>(text.size()),
                    static_cast<uint32_t>(text.size() + before.size() - 1), s.origin, s.first_line,
                    s.col_shift};
  }
  text += before + ShiftLines(up, pe.lines, shift);
  if (!after.empty()) {
    text += "\n";
    tail = CodeSpan{static_cast<uint32_t>(text.size()),
                    static_cast<uint32_t>(text.size() + after.size()), s.origin,
                    s.first_line + hole + 1, s.col_shift};
    text += after;
  }
  TextEdit edit{pe.lines, std::move(text), std::move(loc), std::move(what), head ? head : tail};
  if (head && tail) edit.tail_code = tail;
  return edit;
}

/// Builds the TextEdit of one statement edit into `pe.edit`; false on error (reported).
bool PlanOneEdit(PatchContext& ctx, const Patch& p, const StatementEdit& e,
                 const BodyStatements& stmts, const AnchorRange& r, NameMap& patch_map,
                 const std::string& what, PendingEdit& pe) {
  std::string ind = IndentAt(ctx.up, r.first->range.start);
  std::string marker = EditMarker(p, e, ind);
  std::string edit_what = what + " " + spec::EditOpKey(e.op);
  if (e.op == StatementEdit::Op::kDelete) {
    std::string text = marker;
    if (stmts.WholeBlock(r)) text += "\n" + ind + "pass";  // The block must keep a statement.
    pe.edit = TextEdit{pe.lines, std::move(text), e.loc, edit_what, std::nullopt};
    return true;
  }
  std::unique_ptr<PyModule> m = EditCode(ctx, e);
  if (!m) return false;
  std::optional<TSNode> placeholder;
  if (e.op == StatementEdit::Op::kWrap) {
    placeholder = WrapPlaceholder(ctx, *m, e);
    if (!placeholder) return false;
  }
  Snippet s = WholeSnippet(*m, e.code_origin, {&patch_map, &ctx.spec_map}, ind.size());
  switch (e.op) {
    case StatementEdit::Op::kInsertBefore:
      pe.edit =
          SnippetEdit({pe.lines.start, pe.lines.start}, marker + "\n", s, "\n", e.loc, edit_what);
      return true;
    case StatementEdit::Op::kInsertAfter:
      pe.edit =
          SnippetEdit({pe.lines.end, pe.lines.end}, "\n" + marker + "\n", s, "", e.loc, edit_what);
      return true;
    case StatementEdit::Op::kReplace:
      pe.edit = SnippetEdit(pe.lines, marker + "\n", s, "", e.loc, edit_what);
      return true;
    case StatementEdit::Op::kDelete:
    case StatementEdit::Op::kWrap:
      break;
  }
  pe.edit = WrapEdit(ctx.up, *m, *placeholder, s, marker, ind, pe, e.loc, edit_what);
  return true;
}

/// Two edits of one body must not touch the same statements (insertions next to each other are
/// fine: they keep spec order). True when `pe` clashes with an earlier edit (reported).
bool ClashesWithEarlier(PatchContext& ctx, const PendingEdit& pe, size_t first_pending) {
  bool clash = false;
  const StatementEdit& e = *pe.op;
  const std::vector<PendingEdit>& pending = ctx.st.statement_edits;
  for (size_t i = first_pending; i < pending.size(); ++i) {
    const PendingEdit& o = pending[i];
    if (!(pe.modifies || o.modifies) || !LinesOverlap(pe.lines, o.lines)) continue;
    Diagnostic d =
        ErrorAt(e.loc,
                "edits overlap: `" + std::string(spec::EditOpKey(e.op)) + "` of " +
                    LineSpan(pe.first_line, pe.last_line) + " and `" + spec::EditOpKey(o.op->op) +
                    "` of " + LineSpan(o.first_line, o.last_line) + " in " + pe.qualname,
                "edits of one body must touch disjoint statements; merge them into "
                "one `replace`, or anchor the insertion elsewhere");
    d.notes.push_back(Note::Text("the `" + std::string(spec::EditOpKey(o.op->op)) +
                                 "` edit is at " + o.op->loc.PathLineCol()));
    ctx.st.out.errors.push_back(std::move(d));
    clash = true;
  }
  return clash;
}

}  // namespace

void PlanEditBody(PatchContext& ctx, const Patch& p, NameMap& patch_map, const std::string& what) {
  const PyModule& up = ctx.up;
  const Definition* def = EditTarget(ctx, p);
  if (!def) return;
  BodyStatements stmts(up, *def);
  if (!stmts.ok()) {
    ctx.Error(p.target_loc, "cannot find the body of '" + def->qualname + "'", {},
              ErrorKind::kInternal);
    return;
  }
  size_t first_pending = ctx.st.statement_edits.size();
  for (const StatementEdit& e : p.edits) {
    std::optional<AnchorRange> r = stmts.Locate(QueryOf(e), ctx.st.out.errors);
    if (!r) continue;
    PendingEdit pe;
    pe.op = &e;
    pe.qualname = def->qualname;
    pe.first_line = r->first->line;
    pe.last_line = up.lines().LineOf(r->last->range.end) + 1;
    pe.lines = {LineStartOf(up.source(), r->first->range.start),
                LineEndOf(up.source(), r->last->range.end)};
    pe.modifies =
        e.op != StatementEdit::Op::kInsertBefore && e.op != StatementEdit::Op::kInsertAfter;
    std::string key = what + " " + spec::EditOpKey(e.op) + " '" + e.at + "'";
    if (e.through) key += " through '" + *e.through + "'";
    if (p.when.upstream_version) key += " for upstream " + *p.when.upstream_version;
    ctx.st.contract.push_back(MakePin(up, key, "statements", spec::PatchKindKey(p.kind),
                                      def->qualname, e.loc,
                                      {ByteRange{r->first->range.start, r->last->range.end}}, {}));
    if (ClashesWithEarlier(ctx, pe, first_pending)) continue;
    if (!PlanOneEdit(ctx, p, e, stmts, *r, patch_map, what, pe)) continue;
    ctx.st.statement_edits.push_back(std::move(pe));
  }
}

std::optional<std::string> EditBodyAbsent(const PyModule& up, const Patch& p) {
  const Definition* def = up.Find(p.target);
  if (!def || def->kind != Definition::Kind::kFunction) {
    return "optional: no function '" + p.target + "' upstream";
  }
  BodyStatements stmts(up, *def);
  if (!stmts.ok()) return std::nullopt;
  for (const StatementEdit& e : p.edits) {
    if (std::optional<std::string> why = stmts.Absent(QueryOf(e))) return "optional: " + *why;
  }
  return std::nullopt;
}

StageOutput PlaceStatementEdits(const PyModule& up, std::vector<PendingEdit> edits,
                                const std::vector<GuardPlan::Region>& regions) {
  StageOutput out;
  const std::string& src = up.source();
  for (PendingEdit& pe : edits) {
    bool clash = false;
    for (const GuardPlan::Region& g : regions) {
      if (!g.statements) continue;
      ByteRange guarded{LineStartOf(src, g.statements->start), LineEndOf(src, g.statements->end)};
      if (!LinesOverlap(pe.lines, guarded)) continue;
      uint32_t first = up.lines().LineOf(g.statements->start) + 1;
      uint32_t last = up.lines().LineOf(g.statements->end) + 1;
      Diagnostic d = ErrorAt(
          pe.op->loc,
          "`" + std::string(spec::EditOpKey(pe.op->op)) + "` edit of " +
              LineSpan(pe.first_line, pe.last_line) + " in " + pe.qualname +
              " overlaps the call-site guard of slot '" + g.slot + "' on " + LineSpan(first, last),
          "the guard moves those statements into an `else:` branch; anchor the edit on "
          "statements outside the guarded lines, or guard other statements");
      d.notes.push_back(Note::Text("the guard is at " + g.loc.PathLineCol()));
      out.errors.push_back(std::move(d));
      clash = true;
    }
    if (!clash) out.edits.push_back(std::move(pe.edit));
  }
  return out;
}

}  // namespace patchgen::rewriter
