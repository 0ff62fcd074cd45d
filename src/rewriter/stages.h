// The generator's stages. Each one is a function of the spec, the upstream module and the facts
// earlier stages returned, and returns data: its edits, `applied` entries and errors
// (StageOutput) and the facts later stages need. generate.cc runs them in this order and adds
// their edits to one EditPlan in this order (at one offset, plan order decides):
//
//   PlanImports        -> removed imports
//   PlanPatches        -> replaced and added targets, statement edits, skipped optional patches
//   PlanGuardStage     (replaced and added targets) -> slot declarations, guarded regions
//   PlaceStatementEdits(statement edits, guarded regions)
//   PlanModuleCode     (removed imports, slot declarations)
//   PlanExcludes       -> excluded names
//   WriteHeader, CheckOutput (excluded names)
//
// What the stages share is in headers named for it: name_map.h (renaming with use tracking),
// snippet.h (code from the spec, ready to splice), text_splice.h, fingerprint.h (MakePin) and
// result_types.h (AppliedPatch, SkippedEntry, ContractPin).
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"
#include "rewriter/edit_plan.h"
#include "rewriter/guards.h"
#include "rewriter/name_map.h"
#include "rewriter/result_types.h"
#include "rewriter/snippet.h"
#include "rewriter/text_splice.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// What every stage returns: its edits, in the order they enter the plan (at one offset, plan
/// order decides); the header's `applied:` entries; its errors; the spec-level name_map keys it
/// used (a key no stage used is an error, reported by the orchestrator).
struct StageOutput {
  std::vector<TextEdit> edits;
  std::vector<AppliedPatch> applied;
  std::vector<Diagnostic> errors;
  std::set<std::string> used_keys;  ///< NameMapEntry::Key() of the spec-level entries used.
};

// Tree queries of the parser (tree_queries.h), used unqualified by the stages.
using parser::DefNode;
using parser::NodeAt;

// ----- imports (stage_imports.cc) ------------------------------------------------------------

struct ImportsStage {
  StageOutput out;
  std::set<size_t> removed_imports;  ///< Indices into upstream.imports() removed whole.
};

/// Relative imports made absolute (the package comes from `upstream_path`: an `__init__.py` is
/// its own package) and the names of `imports.drop` removed.
ImportsStage PlanImports(const spec::PatchSpec& spec, const parser::PyModule& up,
                         const std::string& upstream_path);

/// Where an added `from __future__` import goes: after upstream's last top-level one, else after
/// the module docstring, else in front of the first statement (`before_statement`).
struct FutureAnchor {
  uint32_t offset = 0;
  bool before_statement = false;
};
FutureAnchor AfterFutureImports(const parser::PyModule& up);

/// For the code of an imports.add entry: true when it is only `from __future__` imports, false
/// when it has none, nullopt when it mixes them with other statements.
std::optional<bool> OnlyFutureImports(const parser::PyModule& m);

// ----- patches (stage_patches.cc, stage_edit_body.cc) -----------------------------------------

/// A planned statement edit of edit_body, kept until the guards are planned (overlaps with
/// call-site guards are errors; at one offset a guard's text comes first).
struct PendingEdit {
  TextEdit edit;
  ByteRange lines;          ///< The anchor statements' whole lines.
  uint32_t first_line = 0;  ///< 1-based upstream lines of the anchor statements.
  uint32_t last_line = 0;
  bool modifies = false;  ///< replace / delete / wrap (insertions leave the anchor alone).
  const spec::StatementEdit* op = nullptr;
  std::string qualname;
};

/// A patch target and its patch.
using PatchedTarget = std::pair<std::string, const spec::Patch*>;

struct PatchesStage {
  StageOutput out;
  std::vector<SkippedEntry> skipped;  ///< Optional patches whose target is absent.
  std::vector<ContractPin> contract;
  std::vector<PatchedTarget> replaced;  ///< Upstream bodies replaced (replace_*, override).
  std::vector<PatchedTarget> added_methods;
  std::vector<PendingEdit> statement_edits;  ///< edit_body, placed by PlaceStatementEdits.
  bool config_slots = false;  ///< A config_slot patch applied: the output imports ConfigSlot.
};

/// Every patch of `spec` (patch targets already mapped by the spec-level name_map), in spec
/// order, each by the planning function of its kind.
PatchesStage PlanPatches(const spec::PatchSpec& spec, const parser::PyModule& up);

/// `declarations` (the guards stage's slot declarations) with `ConfigSlot` imported from
/// `runtime` when `config_slots` (stage_config_slot.cc).
std::string WithConfigSlotImport(const std::string& declarations, const std::string& runtime,
                                 bool config_slots);

// ----- guards (stage_guards.cc) --------------------------------------------------------------

struct GuardsStage {
  StageOutput out;
  std::string declarations;                ///< Slot declarations (GuardPlan::declarations).
  std::vector<GuardPlan::Region> regions;  ///< What the planned guards wrap.
  std::vector<SkippedEntry> skipped;       ///< Optional guards whose target is absent.
  std::vector<ContractPin> contract;
  std::vector<const spec::Slot*> unguarded_slots;  ///< Declared slots no guard dispatches.
};

/// The slots and guards (guard targets mapped by the spec-level name_map), and their conflicts
/// with patches that replace or add the guarded definition.
GuardsStage PlanGuardStage(const spec::PatchSpec& spec, const parser::PyModule& up,
                           const std::string& runtime, const std::vector<PatchedTarget>& replaced,
                           const std::vector<PatchedTarget>& added_methods);

/// The statement edits of edit_body, after the guards' edits; an edit touching the statements
/// of a call-site guard is an error naming both.
StageOutput PlaceStatementEdits(const parser::PyModule& up, std::vector<PendingEdit> edits,
                                const std::vector<GuardPlan::Region>& regions);

// ----- module-level code (stage_module_code.cc) -----------------------------------------------

/// imports.add, slot declarations, blocks and helpers without `after` after the imports that stay
/// (`removed_imports` left out), then helpers with `after`.
StageOutput PlanModuleCode(const spec::PatchSpec& spec, const parser::PyModule& up,
                           const std::set<size_t>& removed_imports,
                           const std::string& declarations);

// ----- top-level bindings (stage_module_code.cc; the exclude stage uses them too) ----------

/// The top-level statement of `up` binding `name` (class, def or assignment), or nullptr.
const parser::TopLevelStatement* TopLevelBinding(const parser::PyModule& up,
                                                 const std::string& name);
/// "<context>: no top-level definition or assignment '<name>' in <upstream>" with "did you mean".
Diagnostic MissingTopLevel(const parser::PyModule& up, const SourceLoc& loc,
                           const std::string& context, const std::string& name);

// ----- exclude (stage_exclude.cc) -------------------------------------------------------------

struct ExcludeStage {
  StageOutput out;
  std::vector<const spec::LocatedName*> excluded;  ///< Entries of spec.excludes that applied.
};

ExcludeStage PlanExcludes(const spec::PatchSpec& spec, const parser::PyModule& up);

// ----- output check (output_check.cc) ---------------------------------------------------------

/// The tree of the generated text `out` (a header of `header_size` bytes, then `plan` applied to
/// `upstream.source()`), parsed incrementally: a copy of the upstream tree gets a ts_tree_edit for
/// the header and every splice, each grown to token boundaries where reuse can resume
/// (reparse_edits.h), and tree-sitter reparses it reusing every subtree the edits did not touch.
/// The same tree as a parse of `out` from scratch (output_check_test.cc compares them). Empty when
/// tree-sitter returns none.
parser::TreePtr ParseOutputTree(const parser::PyModule& upstream, const EditPlan& plan,
                                const std::string& out, uint32_t header_size);

/// The generated text `out` (header of `header_size` bytes, then `plan` applied to
/// `upstream.source()`) re-parsed (ParseOutputTree): parse errors and undefined names in
/// inserted code, located in the spec through the edits' CodeSpans; excluded names and dropped
/// imports still used. A parse error is located on a parse of `out` from scratch, as before the
/// incremental parse. `verify_incremental` (tests): an incremental tree that differs from a parse
/// from scratch (TreeSignature) is an internal error.
std::vector<Diagnostic> CheckOutput(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                                    const EditPlan& plan, const std::string& out,
                                    uint32_t header_size,
                                    const std::vector<const spec::LocatedName*>& excluded,
                                    bool verify_incremental = false);

/// Every node of `tree`, anonymous ones included: type, byte range, points, named and missing
/// flags, as one string (trees from two parses compare equal exactly when these do).
std::string TreeSignature(TSTree* tree);

}  // namespace patchgen::rewriter
