// PlanGuards: turns a spec's `slots:` into OpSlot declarations and TextEdits that inject guards
// into upstream bodies (docs/guards.md). Nothing is copied out of upstream: an entry guard is an
// insertion, a call-site guard replaces a run of upstream lines by an if/else whose else-branch is
// those same bytes shifted one level right.
//
// Statements are found with the upstream tree-sitter tree (blocks, clauses, string literals), so
// matching `at`/`through` never looks inside nested defs, and re-indentation never touches a line
// that starts inside a multi-line string literal. Every error is located in the spec and all of
// them are collected before returning.
#include "rewriter/guards.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "base/text_util.h"
#include "parser/ts_node.h"
#include "rewriter/statements.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::Field;
using parser::PyModule;
using parser::RangeOf;
using parser::TypeOf;
using spec::Guard;
using spec::Slot;

constexpr std::string_view kStep = "    ";  // One indentation level added by a guard.

/// `path:line:col: note: msg`, the form used for notes that point at another spec location.
std::string NoteAt(const SourceLoc& loc, const std::string& msg) {
  std::string out;
  if (!loc.path.empty()) {
    out += loc.path;
    if (loc.line > 0) out += ':' + std::to_string(loc.line) + ':' + std::to_string(loc.col);
    out += ": ";
  }
  return out + "note: " + msg;
}

std::string SlotExpr(const Slot& slot) {
  return "OpSlot(\"" + slot.op + "\", \"" + slot.variant + "\")";
}

/// Removes the common leading whitespace of non-blank lines and any trailing blank lines.
/// (Spec `call:` text is short code written by hand; multi-line strings in it are not protected.)
std::vector<std::string> DedentLines(std::string_view code) {
  std::vector<std::string> lines;
  for (std::string_view l : SplitLines(code)) lines.emplace_back(l);
  while (!lines.empty() && IsBlank(lines.back())) lines.pop_back();
  while (!lines.empty() && IsBlank(lines.front())) lines.erase(lines.begin());
  size_t common = std::string::npos;
  for (const std::string& l : lines) {
    if (IsBlank(l)) continue;
    common = std::min(common, l.find_first_not_of(" \t"));
  }
  for (std::string& l : lines) l = IsBlank(l) ? std::string() : l.substr(common);
  return lines;
}

/// Names of the parameters of a function definition.
std::vector<std::string> ParameterNames(const PyModule& m, const Definition& def) {
  std::vector<std::string> names;
  TSNode n = ts_node_descendant_for_byte_range(m.root(), def.parameters.start, def.parameters.end);
  while (!ts_node_is_null(n) && TypeOf(n) != "parameters") n = ts_node_parent(n);
  if (ts_node_is_null(n)) return names;
  uint32_t count = ts_node_named_child_count(n);
  for (uint32_t i = 0; i < count; ++i) {
    TSNode p = ts_node_named_child(n, i);
    TSNode id = p;
    if (TypeOf(p) == "default_parameter" || TypeOf(p) == "typed_default_parameter") {
      id = Field(p, "name");
    } else if (TypeOf(p) == "typed_parameter") {
      id = ts_node_named_child(p, 0);
    }
    if (!ts_node_is_null(id) && TypeOf(id) == "identifier") {
      names.emplace_back(m.Text(RangeOf(id)));
    }
  }
  return names;
}

/// Every identifier in `code` equal to `name` that refers to the bare name (not `x.name`, not a
/// keyword argument's name), as byte ranges of `code`.
void FindNameRefs(TSNode node, std::string_view code, std::string_view name,
                  std::vector<ByteRange>& out) {
  uint32_t n = ts_node_child_count(node);
  for (uint32_t i = 0; i < n; ++i) {
    TSNode c = ts_node_child(node, i);
    ByteRange r = RangeOf(c);
    if (TypeOf(c) == "identifier" && r.In(code) == name) {
      bool attribute = TypeOf(node) == "attribute" && ts_node_eq(c, Field(node, "attribute"));
      bool keyword = TypeOf(node) == "keyword_argument" && ts_node_eq(c, Field(node, "name"));
      if (!attribute && !keyword) out.push_back(r);
    }
    FindNameRefs(c, code, name, out);
  }
}

struct TreeDeleter {
  void operator()(TSTree* t) const { ts_tree_delete(t); }
};
using TreePtr = std::unique_ptr<TSTree, TreeDeleter>;

/// What a planned call-site guard replaces (for overlap errors).
struct PlannedRange {
  ByteRange range;
  uint32_t first_line = 0;
  uint32_t last_line = 0;
  SourceLoc at_loc;
};

class Planner {
 public:
  Planner(const spec::PatchSpec& spec, const PyModule& up, const std::string& runtime)
      : spec_(spec), up_(up), runtime_(runtime) {}

  Result<GuardPlan> Run() {
    std::vector<const Slot*> slots = UniqueSlots();
    for (const Slot* slot : slots) {
      std::set<std::string> seen_guards;
      for (const Guard& g : slot->guards) {
        std::string key =
            g.in + '\0' + g.at.value_or("") + '\0' + g.through.value_or("") + '\0' + g.call;
        if (!seen_guards.insert(key).second) continue;  // Inherited twice: apply once.
        if (g.when.optional) {
          if (std::optional<std::string> why = Absent(g)) {
            plan_.skipped.push_back({g.in,
                                     *why + (g.when.reason.empty() ? "" : "; " + g.when.reason),
                                     g.loc.line > 0 ? g.loc : g.in_loc});
            continue;
          }
        }
        PlanGuard(*slot, g);
      }
    }
    EmitEdits();
    if (!errors_.empty()) {
      SortDiagnostics(errors_);
      return errors_;
    }
    return std::move(plan_);
  }

 private:
  // ---- declarations -------------------------------------------------------------------------

  /// Checks slot names (conflicts, clashes with upstream names) and builds `declarations`.
  std::vector<const Slot*> UniqueSlots() {
    std::vector<const Slot*> unique;
    std::map<std::string, const Slot*> by_name;
    std::map<std::string, uint32_t> upstream_names;
    for (const auto& st : up_.top_level()) {
      for (const std::string& n : st.names) {
        upstream_names.emplace(n, up_.lines().LineOf(st.range.start) + 1);
      }
    }
    std::string decls;
    for (const Slot& slot : spec_.slots) {
      auto [it, inserted] = by_name.emplace(slot.name, &slot);
      if (!inserted) {
        const Slot& first = *it->second;
        if (first.op == slot.op && first.variant == slot.variant && first.scope == slot.scope) {
          unique.push_back(&slot);  // Its guards still apply; the declaration is emitted once.
          continue;
        }
        Diagnostic d = ErrorAt(
            slot.loc,
            "conflicting declarations of slot '" + slot.name + "': " + Describe(slot) + " here, " +
                Describe(first) + " before",
            "a slot name means one op/variant; rename one of the slots or make them identical");
        d.notes.push_back(NoteAt(first.loc, "'" + slot.name + "' first declared here"));
        errors_.push_back(std::move(d));
        continue;
      }
      auto clash = upstream_names.find(slot.name);
      if (clash != upstream_names.end()) {
        errors_.push_back(ErrorAt(slot.loc,
                                  "slot name '" + slot.name + "' is already defined in " +
                                      up_.path() + " (line " + std::to_string(clash->second) + ")",
                                  "a slot is a module-level variable; choose a name upstream "
                                  "does not bind"));
        continue;
      }
      unique.push_back(&slot);
      if (slot.scope == Slot::Scope::kModule) decls += slot.name + " = " + SlotExpr(slot) + "\n";
    }
    if (!spec_.slots.empty()) {
      plan_.declarations = "from " + runtime_ + " import OpSlot\n";
      if (!decls.empty()) plan_.declarations += "\n" + decls;
    }
    return unique;
  }

  static std::string Describe(const Slot& s) {
    return SlotExpr(s) + (s.scope == Slot::Scope::kInstance ? " (scope: instance)" : "");
  }

  // ---- targets --------------------------------------------------------------------------------

  /// Resolves `in` to a function or method, or reports why it cannot.
  const Definition* ResolveTarget(const Guard& g) {
    std::vector<std::string> parts;
    for (std::string_view rest = g.in;;) {
      size_t dot = rest.find('.');
      parts.emplace_back(rest.substr(0, dot));
      if (dot == std::string_view::npos) break;
      rest.remove_prefix(dot + 1);
    }
    const Definition* def = up_.FindTopLevel(parts[0]);
    if (!def) {
      std::optional<std::string> near = DidYouMean(parts[0], up_.TopLevelNames());
      errors_.push_back(ErrorAt(g.in_loc,
                                "no class or function '" + parts[0] + "' in " + up_.path(),
                                near ? "did you mean '" + *near + "'?"
                                     : "a guard goes in a function ('f') or a method "
                                       "('Class.method', 'Outer.Inner.method')"));
      return nullptr;
    }
    for (size_t i = 1; i < parts.size(); ++i) {
      const Definition* child = up_.Find(def->qualname + "." + parts[i]);
      if (child) {
        def = child;
        continue;
      }
      bool is_class = def->kind == Definition::Kind::kClass;
      std::vector<std::string> methods = up_.ChildNames(*def, Definition::Kind::kFunction);
      std::vector<std::string> candidates = methods;
      for (const std::string& c : up_.ChildNames(*def, Definition::Kind::kClass))
        candidates.push_back(c);
      std::optional<std::string> near = DidYouMean(parts[i], candidates);
      std::string help = near ? "did you mean '" + *near + "'? " : "";
      if (is_class) {
        help +=
            "Methods of " + def->qualname + ": " + (methods.empty() ? "none" : JoinNames(methods));
      }
      errors_.push_back(ErrorAt(g.in_loc,
                                std::string(is_class ? "no method '" : "no nested function '") +
                                    parts[i] + "' in " + (is_class ? "class '" : "function '") +
                                    def->qualname + "'",
                                help));
      return nullptr;
    }
    if (def->kind == Definition::Kind::kClass) {
      errors_.push_back(ErrorAt(g.in_loc,
                                "guard target '" + g.in + "' is a class, not a function or method",
                                "Methods of " + def->qualname + ": " +
                                    JoinNames(up_.ChildNames(*def, Definition::Kind::kFunction))));
      return nullptr;
    }
    return def;
  }

  int IndexOf(const Definition* def) const {
    return static_cast<int>(def - up_.definitions().data());
  }

  // ---- text helpers -----------------------------------------------------------------------------

  uint32_t LineStartOf(uint32_t offset) const {
    return up_.lines().LineStart(up_.lines().LineOf(offset));
  }
  uint32_t LineEndOf(uint32_t offset) const { return patchgen::LineEndOf(up_.source(), offset); }
  /// Leading whitespace of the line containing `offset`.
  std::string IndentAt(uint32_t offset) const { return rewriter::IndentAt(up_, offset); }
  std::string Marker(const Slot& slot, const Guard& g) const {
    const SourceLoc& at = g.loc.line > 0 ? g.loc : g.in_loc;
    return "# patchgen: guard " + slot.name + " -> " + slot.op + "/" + slot.variant + " (" +
           at.path + ":" + std::to_string(at.line) + ")";
  }

  /// Location of byte range [col_start, col_end) of 0-based line `line` of a guard's `call` text.
  SourceLoc CallLoc(const Guard& g, const std::vector<std::string_view>& call_lines, uint32_t line,
                    uint32_t col_start, uint32_t col_end) const {
    const spec::TextOrigin& o = g.call_origin;
    if (!o.file_text || line >= call_lines.size()) return g.loc;
    std::string_view text = call_lines[line];
    col_start = std::min<uint32_t>(col_start, static_cast<uint32_t>(text.size()));
    SourceLoc loc;
    loc.path = o.path;
    loc.line = o.first_line + line;
    loc.col = CodePointCount(text.substr(0, col_start)) + 1 + o.col_offset;
    col_end = std::clamp<uint32_t>(col_end, col_start, static_cast<uint32_t>(text.size()));
    loc.length = std::max<uint32_t>(1, CodePointCount(text.substr(col_start, col_end - col_start)));
    LineIndex file_lines(*o.file_text);
    if (loc.line >= 1 && loc.line <= file_lines.line_count()) {
      loc.source_line = std::string(file_lines.LineText(loc.line - 1));
    }
    return loc;
  }

  /// A guard's `call`, dedented, and where its lines are in the spec (for TextEdit::code).
  struct PreparedCall {
    std::vector<std::string> lines;
    uint32_t first_line = 1;  ///< Spec line of lines[0].
    int32_t col_shift = 0;    ///< -(removed indentation + YAML column offset); see CallSpan.
  };

  /// The CodeSpan of call text placed at `column` starting at byte `begin` of an edit's text.
  std::optional<CodeSpan> CallSpan(const Guard& g, const PreparedCall& call, size_t begin,
                                   size_t end, size_t column) const {
    if (!g.call_origin.file_text) return std::nullopt;
    return CodeSpan{static_cast<uint32_t>(begin), static_cast<uint32_t>(end), g.call_origin,
                    call.first_line, static_cast<int32_t>(column) + call.col_shift};
  }

  /// Nullopt when the parsed code `root` is one expression statement (no assignment, no yield);
  /// otherwise the offset to point at: the second statement, or the one that is not an expression.
  static std::optional<uint32_t> NotOneExpression(TSNode root) {
    std::vector<TSNode> stmts;
    for (uint32_t i = 0; i < ts_node_named_child_count(root); ++i) {
      TSNode c = ts_node_named_child(root, i);
      if (TypeOf(c) != "comment") stmts.push_back(c);
    }
    bool single = stmts.size() == 1 && TypeOf(stmts[0]) == "expression_statement";
    for (uint32_t i = 0; single && i < ts_node_named_child_count(stmts[0]); ++i) {
      std::string_view t = TypeOf(ts_node_named_child(stmts[0], i));
      if (t == "assignment" || t == "augmented_assignment" || t == "yield") single = false;
    }
    if (single) return std::nullopt;
    return stmts.empty() ? 0 : ts_node_start_byte(stmts[stmts.size() > 1 ? 1 : 0]);
  }

  /// Parses a guard's `call`, checks its shape and returns its lines dedented, with an instance
  /// slot's bare name rewritten to `self.<name>`. Empty on error (reported).
  std::optional<PreparedCall> PrepareCall(const Slot& slot, const Guard& g, bool entry) {
    std::vector<std::string> lines = DedentLines(g.call);
    std::string code;
    for (const std::string& l : lines) code += l + "\n";
    // Where line i of `code` is in the YAML text, for error locations.
    std::vector<std::string_view> raw = SplitLines(g.call);
    uint32_t skipped = 0;
    while (skipped < raw.size() && IsBlank(raw[skipped])) ++skipped;
    size_t common = skipped < raw.size() ? raw[skipped].size() - lines.front().size() : 0;
    auto error_at_line = [&](uint32_t i, uint32_t col, std::string msg, std::string help) {
      uint32_t raw_line = skipped + i;
      uint32_t start = static_cast<uint32_t>(common + col);
      uint32_t end =
          raw_line < raw.size() ? static_cast<uint32_t>(raw[raw_line].size()) : start + 1;
      errors_.push_back(
          ErrorAt(CallLoc(g, raw, raw_line, start, end), std::move(msg), std::move(help)));
    };
    if (lines.empty()) {
      errors_.push_back(ErrorAt(g.loc, "guard in '" + g.in + "' has an empty `call`",
                                "write the statement(s) that call the slot"));
      return std::nullopt;
    }
    TreePtr tree(parser::ParseTree(code));
    if (!tree) {
      errors_.push_back(
          ErrorAt(g.loc, "could not parse the guard's `call`", {}, ErrorKind::kInternal));
      return std::nullopt;
    }
    TSNode root = ts_tree_root_node(tree.get());
    LineIndex code_lines(code);
    if (std::optional<TSNode> bad = parser::FirstErrorNode(root)) {
      uint32_t off = ts_node_start_byte(*bad);
      uint32_t line =
          code_lines.LineOf(std::min<uint32_t>(off, code.empty() ? 0 : code.size() - 1));
      uint32_t col = off - code_lines.LineStart(line);
      error_at_line(line, col, "`call` is not valid Python",
                    entry ? "an entry guard's `call` is one expression; it becomes `return <call>`"
                          : "a call-site guard's `call` is one or more statements");
      return std::nullopt;
    }
    if (std::optional<uint32_t> off = entry ? NotOneExpression(root) : std::nullopt) {
      uint32_t line = code_lines.LineOf(*off);
      uint32_t col = *off - code_lines.LineStart(line);
      error_at_line(line, col, "an entry guard's `call` must be a single expression",
                    "it becomes `return <call>`; to run statements instead, add `at:` to make a "
                    "call-site guard");
      return std::nullopt;
    }
    if (slot.scope == Slot::Scope::kInstance) {
      std::vector<ByteRange> refs;
      FindNameRefs(root, code, slot.name, refs);
      for (auto it = refs.rbegin(); it != refs.rend(); ++it) code.insert(it->start, "self.");
      lines.clear();
      for (std::string_view l : SplitLines(code)) lines.emplace_back(l);
    }
    return PreparedCall{std::move(lines), g.call_origin.first_line + skipped,
                        -static_cast<int32_t>(common + g.call_origin.col_offset)};
  }

  // ---- guards ---------------------------------------------------------------------------------

  /// Why an optional guard cannot apply (its target, `at` or `through` is absent upstream), or
  /// nullopt when everything it names is there (then it is planned, errors included).
  std::optional<std::string> Absent(const Guard& g) const {
    const Definition* def = up_.Find(g.in);
    if (!def || def->kind != Definition::Kind::kFunction) {
      return "optional guard: no function '" + g.in + "' upstream";
    }
    if (!g.at) return std::nullopt;
    BodyStatements stmts(up_, *def);
    if (!stmts.ok()) return std::nullopt;
    AnchorQuery q;
    q.at = *g.at;
    if (g.through) q.through = *g.through;
    if (std::optional<std::string> why = stmts.Absent(q)) return "optional guard: " + *why;
    return std::nullopt;
  }

  void PlanGuard(const Slot& slot, const Guard& g) {
    if (g.through && !g.at) {  // The spec loader rejects this too; PatchSpecs may be built in code.
      errors_.push_back(ErrorAt(g.through_loc, "`through` without `at`",
                                "`through` ends the statement range that `at` starts"));
      return;
    }
    const Definition* def = ResolveTarget(g);
    if (!def) return;
    bool ok = true;
    if (slot.scope == Slot::Scope::kInstance) ok = PlanInstanceBinding(slot, g, *def);
    std::optional<PreparedCall> call = PrepareCall(slot, g, !g.at);
    if (!call || !ok) return;
    bool planned = g.at ? PlanCallSite(slot, g, *def, *call) : PlanEntry(slot, g, *def, *call);
    if (!planned) return;
    plan_.applied.emplace_back(def->qualname, slot.name + " -> " + slot.op + "/" + slot.variant);
    GuardPlan::Region region{slot.name,
                             slot.op + "/" + slot.variant,
                             def->qualname,
                             g.at,
                             g.through,
                             g.loc.line > 0 ? g.loc : g.in_loc,
                             IndexOf(def),
                             std::nullopt,
                             g.when.upstream_version};
    if (g.at) region.statements = last_call_site_;
    plan_.regions.push_back(std::move(region));
    plan_.guarded_targets.emplace_back(def->qualname, g.in_loc);
  }

  std::string Cond(const Slot& slot) const {
    return (slot.scope == Slot::Scope::kInstance ? "self." : "") + slot.name +
           ".use_non_eager_impl";
  }

  /// Entry guard: `if <slot>.use_non_eager_impl: return <call>` before the body's first
  /// statement (after the docstring; before leading comments).
  bool PlanEntry(const Slot& slot, const Guard& g, const Definition& def,
                 const PreparedCall& call) {
    std::string ind = def.inline_body ? IndentAt(def.definition.start) + std::string(kStep)
                      : def.docstring ? IndentAt(def.docstring->start)
                                      : IndentAt(FirstStatementStart(def));
    std::string text = ind + Marker(slot, g) + "\n" + ind + "if " + Cond(slot) + ":\n";
    std::string head = ind + std::string(kStep) + "return ";
    size_t begin = text.size() + head.size();
    for (size_t i = 0; i < call.lines.size(); ++i) {
      if (call.lines[i].empty()) {
        text += "\n";
        continue;
      }
      text += (i == 0 ? head : ind + std::string(kStep)) + call.lines[i] + "\n";
    }
    EntryEdit& e = entry_[IndexOf(&def)];
    if (e.text.empty()) {
      e.origin = g.in_loc;
      // A one-line call maps back to the spec exactly (later lines lack the `return ` prefix).
      if (call.lines.size() == 1) e.code = CallSpan(g, call, begin, text.size() - 1, head.size());
    } else {
      e.code.reset();  // Several guards share the edit; a span can describe only one.
    }
    e.what = "guard " + def.qualname;
    e.text += text;
    return true;
  }

  uint32_t FirstStatementStart(const Definition& def) const {
    TSNode block = BodyBlock(up_, def);
    if (!ts_node_is_null(block)) {
      for (uint32_t i = 0; i < ts_node_named_child_count(block); ++i) {
        TSNode c = ts_node_named_child(block, i);
        if (TypeOf(c) != "comment") return ts_node_start_byte(c);
      }
    }
    return def.body.start;
  }

  /// Start of the body's first line: its first statement, or the first comment line above it
  /// (a comment on the header's own line stays there).
  uint32_t BodyStart(const Definition& def) const {
    uint32_t first = FirstStatementStart(def);
    const LineIndex& lines = up_.lines();
    for (uint32_t l = lines.LineOf(def.header.end) + 1; l < lines.LineOf(first); ++l) {
      if (!IsBlank(lines.LineText(l))) return lines.LineStart(l);
    }
    return first;
  }

  /// Call-site guard: the lines of statements `at`..`through` become the else-branch.
  bool PlanCallSite(const Slot& slot, const Guard& g, const Definition& def,
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
          "call-site guard on lines " + std::to_string(first.line) + "-" +
              std::to_string(last_line) + " of " + where + " overlaps another guard's lines " +
              std::to_string(other.first_line) + "-" + std::to_string(other.last_line),
          "guards in one body must wrap disjoint statement ranges");
      d.notes.push_back(NoteAt(other.at_loc, "the other guard"));
      errors_.push_back(std::move(d));
      return false;
    }
    call_sites_.push_back(PlannedRange{moved, first.line, last_line, g.at_loc});

    std::string ind = IndentAt(first.range.start);
    std::string text = ind + Marker(slot, g) + "\n" + ind + "if " + Cond(slot) + ":\n";
    size_t begin = text.size();
    for (const std::string& l : call.lines)
      text += l.empty() ? "\n" : ind + std::string(kStep) + l + "\n";
    std::optional<CodeSpan> span =
        CallSpan(g, call, begin, text.size() - 1, ind.size() + kStep.size());
    text += ind + "else:\n" + ShiftLines(up_, moved, kStep);
    call_site_edits_.push_back(
        TextEdit{moved, std::move(text), g.at_loc, "guard " + def.qualname, span});
    return true;
  }

  // ---- instance scope -------------------------------------------------------------------------

  /// Checks an instance-scoped guard's target and records the `__init__` binding of its owner.
  bool PlanInstanceBinding(const Slot& slot, const Guard& g, const Definition& def) {
    const auto& defs = up_.definitions();
    if (def.parent < 0 || defs[def.parent].kind != Definition::Kind::kClass) {
      errors_.push_back(ErrorAt(
          g.in_loc,
          "slot '" + slot.name + "' has `scope: instance`, but '" + g.in + "' is " +
              (def.parent < 0 ? "a module-level function" : "a nested function") + ", not a method",
          "instance-scoped slots live on `self`; guard a method, or drop `scope: instance`"));
      return false;
    }
    const Definition& owner = defs[def.parent];
    const Definition* init = up_.Find(owner.qualname + ".__init__");
    if (!init) {
      errors_.push_back(ErrorAt(
          g.in_loc,
          "slot '" + slot.name + "' has `scope: instance`, but class '" + owner.qualname +
              "' has no __init__ to bind it in",
          "instance-scoped slots are bound in the owner's __init__; drop `scope: instance` or "
          "guard a method of a class that defines __init__"));
      return false;
    }
    std::vector<std::string> params = ParameterNames(up_, *init);
    if (std::find(params.begin(), params.end(), "config") == params.end()) {
      errors_.push_back(ErrorAt(
          g.in_loc,
          "slot '" + slot.name + "' has `scope: instance`, but " + owner.qualname +
              ".__init__ has no `config` parameter to bind from",
          "the binding is `self." + slot.name + " = " + SlotExpr(slot) +
              ".bind_from(config)`; drop `scope: instance` or guard a class whose __init__ takes "
              "the config"));
      return false;
    }
    InitEdit& e = init_[IndexOf(init)];
    if (e.slots.insert(slot.name).second) {
      if (e.lines.empty()) e.origin = slot.loc;
      e.lines.push_back("self." + slot.name + " = " + SlotExpr(slot) + ".bind_from(config)");
    }
    return true;
  }

  // ---- edits ----------------------------------------------------------------------------------

  static void ShiftSpan(std::optional<CodeSpan>& span, uint32_t by) {
    if (!span) return;
    span->begin += by;
    span->end += by;
  }

  struct EntryEdit {
    std::string text;
    SourceLoc origin;
    std::string what;
    std::optional<CodeSpan> code;
  };
  struct InitEdit {
    std::set<std::string> slots;
    std::vector<std::string> lines;
    SourceLoc origin;
  };

  /// Turns the collected guards into edits: entry guards first (so that a call-site guard on a
  /// body's first statement follows its entry guard), then call sites, then `__init__` bindings.
  void EmitEdits() {
    const auto& defs = up_.definitions();
    for (auto& [index, e] : entry_) {
      const Definition& def = defs[index];
      if (def.inline_body) {
        // `def f(x): return x` becomes a block: guard lines, then the old body on its own line.
        ByteRange gap{def.header.end, def.body.start};
        std::string ind = IndentAt(def.definition.start) + std::string(kStep);
        ShiftSpan(e.code, 1);  // After the "\n".
        plan_.edits.push_back(TextEdit{gap, "\n" + e.text + ind, e.origin, e.what, e.code});
      } else {
        uint32_t at =
            def.docstring ? LineEndOf(def.docstring->end) + 1 : LineStartOf(BodyStart(def));
        std::string text = e.text;
        if (at > up_.source().size()) {  // Docstring on the file's last line, no newline.
          at = static_cast<uint32_t>(up_.source().size());
          text = "\n" + text;
          ShiftSpan(e.code, 1);
        }
        plan_.edits.push_back(TextEdit{{at, at}, std::move(text), e.origin, e.what, e.code});
      }
    }
    for (TextEdit& e : call_site_edits_) plan_.edits.push_back(std::move(e));
    for (auto& [index, e] : init_) {
      const Definition& init = defs[index];
      std::string ind = init.inline_body ? IndentAt(init.definition.start) + std::string(kStep)
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
      std::string text = "\n" + ind + "# patchgen: instance slots " + names + " (" + e.origin.path +
                         ":" + std::to_string(e.origin.line) + ")";
      for (const std::string& l : e.lines) text += "\n" + ind + l;
      uint32_t at = LineEndOf(init.body.end);
      plan_.edits.push_back(TextEdit{
          {at, at}, std::move(text), e.origin, "instance slots " + init.qualname, std::nullopt});
    }
  }

  const spec::PatchSpec& spec_;
  const PyModule& up_;
  const std::string& runtime_;
  GuardPlan plan_;
  std::vector<Diagnostic> errors_;
  std::map<int, EntryEdit> entry_;
  std::vector<TextEdit> call_site_edits_;
  std::vector<PlannedRange> call_sites_;
  ByteRange last_call_site_;  ///< Statements of the last planned call-site guard.
  std::map<int, InitEdit> init_;
};

}  // namespace

Result<GuardPlan> PlanGuards(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                             const std::string& runtime) {
  return Planner(spec, upstream, runtime).Run();
}

}  // namespace patchgen::rewriter
