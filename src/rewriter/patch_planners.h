// Internals of the patches stage (stage_patches.cc, stage_edit_body.cc, stage_config_slot.cc):
// what a kind's planning function works on, and the table that gives each patch kind its
// functions.
#pragma once

#include <optional>
#include <string>

#include "rewriter/stages.h"

namespace patchgen::rewriter {

/// What the planning functions of one PlanPatches call share: its inputs and the stage's result
/// being built (edits, errors, contract pins, replaced/added targets, statement edits).
struct PatchContext {
  const spec::PatchSpec& spec;
  const parser::PyModule& up;
  NameMap& spec_map;
  PatchesStage& st;

  void Error(const SourceLoc& loc, std::string message, std::string help = {},
             ErrorKind kind = ErrorKind::kSpec) {
    st.out.errors.push_back(ErrorAt(loc, std::move(message), std::move(help), kind));
  }
};

/// The functions of one patch kind:
/// - `plan` adds the patch's edits (or errors); `patch_map` is the patch-level name_map, `what`
///   the patch as named in errors ("override_method Qwen3MLP.forward");
/// - `absent` says why an `optional` patch cannot apply (its target is absent upstream), or
///   nullopt;
/// - `pin` adds the contract pin of what the patch relies on upstream (`key` is its identity);
///   nullptr when `plan` pins (edit_body pins each edit's statements).
struct PatchPlanner {
  spec::PatchKind kind;
  void (*plan)(PatchContext& ctx, const spec::Patch& p, NameMap& patch_map,
               const std::string& what);
  std::optional<std::string> (*absent)(const parser::PyModule& up, const spec::Patch& p);
  void (*pin)(PatchContext& ctx, const spec::Patch& p, const std::string& key);
};

/// The planner of `kind` (every row of spec::kPatchKinds has one; stage_patches_test.cc checks).
const PatchPlanner* PlannerOf(spec::PatchKind kind);

/// "override_method Qwen3MLP.forward": how edits of a patch are named in errors.
std::string What(const spec::Patch& p);

/// `# patchgen: <kind> <target> - <description> (<spec>:<line>)` at `indent`.
std::string Marker(const spec::Patch& p, const std::string& indent);

/// The class named `qualname` ("A" or "A.B"), or nullptr with an error at `loc`.
const parser::Definition* FindClass(PatchContext& ctx, const std::string& qualname,
                                    const SourceLoc& loc);

/// config_slot (stage_config_slot.cc).
void PlanConfigSlot(PatchContext& ctx, const spec::Patch& p, NameMap& patch_map,
                    const std::string& what);
std::optional<std::string> ConfigSlotAbsent(const parser::PyModule& up, const spec::Patch& p);
void PinConfigSlot(PatchContext& ctx, const spec::Patch& p, const std::string& key);

/// Where statements appended to `init` go: after its last statement, or at the start of the line
/// of a trailing `return` (`before_line`). nullopt, with an error at `p`, when `init` returns
/// earlier too (what is appended would not run on that path).
struct InitEnd {
  uint32_t offset = 0;
  bool before_line = false;
};
std::optional<InitEnd> InitEndInsertion(PatchContext& ctx, const spec::Patch& p,
                                        const parser::Definition& init, const std::string& what);

/// edit_body (stage_edit_body.cc).
void PlanEditBody(PatchContext& ctx, const spec::Patch& p, NameMap& patch_map,
                  const std::string& what);
std::optional<std::string> EditBodyAbsent(const parser::PyModule& up, const spec::Patch& p);

}  // namespace patchgen::rewriter
