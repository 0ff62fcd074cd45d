// GuardPlanner: the worker behind PlanGuards (guards.h). Internal to src/rewriter; one class over
// two files: guards.cc (slot declarations, guard targets, instance scope, the plan) and
// guard_edits.cc (the text of entry guards, call-site guards and `__init__` bindings).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/diagnostic.h"
#include "base/text_util.h"
#include "parser/py_module.h"
#include "rewriter/edit_plan.h"
#include "rewriter/guard_call.h"
#include "rewriter/guards.h"
#include "rewriter/statements.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// What a planned call-site guard replaces (for overlap errors).
struct PlannedRange {
  ByteRange range;
  uint32_t first_line = 0;
  uint32_t last_line = 0;
  SourceLoc at_loc;
};

class GuardPlanner {
 public:
  GuardPlanner(const spec::PatchSpec& spec, const parser::PyModule& up, const std::string& runtime)
      : spec_(spec), up_(up), runtime_(runtime) {}

  Result<GuardPlan> Run();

 private:
  // ---- declarations (guards.cc) -------------------------------------------------------------

  /// Checks slot names (conflicts, clashes with upstream names) and builds `declarations`.
  std::vector<const spec::Slot*> UniqueSlots();

  // ---- targets (guards.cc) ------------------------------------------------------------------

  /// Resolves `in` to a function or method, or reports why it cannot.
  const parser::Definition* ResolveTarget(const spec::Guard& g);

  int IndexOf(const parser::Definition* def) const {
    return static_cast<int>(def - up_.definitions().data());
  }

  // ---- text helpers -----------------------------------------------------------------------------

  uint32_t LineStartOf(uint32_t offset) const {
    return up_.lines().LineStart(up_.lines().LineOf(offset));
  }
  uint32_t LineEndOf(uint32_t offset) const { return patchgen::LineEndOf(up_.source(), offset); }
  /// Leading whitespace of the line containing `offset`.
  std::string IndentAt(uint32_t offset) const { return rewriter::IndentAt(up_, offset); }
  std::string Marker(const spec::Slot& slot, const spec::Guard& g) const {
    const SourceLoc& at = g.loc.line > 0 ? g.loc : g.in_loc;
    return "# patchgen: guard " + slot.name + " -> " + slot.op + "/" + slot.variant + " (" +
           at.PathLine() + ")";
  }

  // ---- guards: Absent, PlanGuard in guards.cc; the entry and call-site text in guard_edits.cc -

  /// Why an optional guard cannot apply (its target, `at` or `through` is absent upstream), or
  /// nullopt when everything it names is there (then it is planned, errors included).
  std::optional<std::string> Absent(const spec::Guard& g) const;

  void PlanGuard(const spec::Slot& slot, const spec::Guard& g);

  std::string Cond(const spec::Slot& slot) const {
    return (slot.scope == spec::Slot::Scope::kInstance ? "self." : "") + slot.name +
           ".use_non_eager_impl";
  }

  /// Entry guard: `if <slot>.use_non_eager_impl: return <call>` before the body's first
  /// statement (after the docstring; before leading comments).
  bool PlanEntry(const spec::Slot& slot, const spec::Guard& g, const parser::Definition& def,
                 const PreparedCall& call);

  uint32_t FirstStatementStart(const parser::Definition& def) const;

  /// Start of the body's first line: its first statement, or the first comment line above it
  /// (a comment on the header's own line stays there).
  uint32_t BodyStart(const parser::Definition& def) const;

  /// Call-site guard: the lines of statements `at`..`through` become the else-branch.
  bool PlanCallSite(const spec::Slot& slot, const spec::Guard& g, const parser::Definition& def,
                    const PreparedCall& call);

  // ---- refusals (guard_checks.cc) ------------------------------------------------------------

  /// Why an entry guard cannot go into `def` (a generator, an async generator, `__init__`), or "".
  std::string EntryRefusal(const parser::Definition& def) const;

  /// Refuses an entry guard that cannot go into `def` (EntryRefusal) or whose names a later
  /// `global`/`nonlocal` declaration of `def` declares (CPython: "name used prior to global
  /// declaration"). The guard goes after the leading declarations (LeadingDeclarationsEnd).
  bool CheckEntry(const spec::Slot& slot, const spec::Guard& g, const parser::Definition& def,
                  const PreparedCall& call);

  /// End of the leading `global`/`nonlocal` statements of `def`'s body (after its docstring);
  /// 0 when the body does not start with one.
  uint32_t LeadingDeclarationsEnd(const parser::Definition& def) const;

  /// Refuses a slot whose name the guarded function already uses (module scope: a parameter or a
  /// local would shadow the module-level slot) or whose `self.<name>` the owner class already
  /// uses (instance scope: the binding would clobber it, or be clobbered).
  bool CheckSlotName(const spec::Slot& slot, const spec::Guard& g, const parser::Definition& def);

  // ---- instance scope (guards.cc) -----------------------------------------------------------

  /// Checks an instance-scoped guard's target and records the `__init__` binding of its owner.
  bool PlanInstanceBinding(const spec::Slot& slot, const spec::Guard& g,
                           const parser::Definition& def);

  // ---- edits (guard_edits.cc) ---------------------------------------------------------------

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
  void EmitEdits();
  /// The edit of one entry guard (after leading `global`/`nonlocal` declarations or the docstring).
  void EmitEntryGuard(const parser::Definition& def, EntryEdit& e);

  const spec::PatchSpec& spec_;
  const parser::PyModule& up_;
  const std::string& runtime_;
  GuardPlan plan_;
  std::vector<Diagnostic> errors_;
  std::map<int, EntryEdit> entry_;
  std::vector<TextEdit> call_site_edits_;
  std::vector<PlannedRange> call_sites_;
  ByteRange last_call_site_;  ///< Statements of the last planned call-site guard.
  std::map<int, InitEdit> init_;
};

/// `OpSlot("op", "variant")`: the expression that makes `slot`'s handle.
std::string SlotExpr(const spec::Slot& slot);

/// One indentation level added by a guard.
inline constexpr std::string_view kGuardStep = "    ";

}  // namespace patchgen::rewriter
