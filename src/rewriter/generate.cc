// Generate: the orchestrator. It filters the spec's entries by the upstream version, maps patch
// targets through the spec-level name_map, runs the stages of stages.h in order (each one a
// function of the spec, the upstream module and what earlier stages returned), puts their edits
// into one EditPlan, applies it, prepends the header and checks the output. docs/rewriter.md
// describes the output layout and the stages.
#include "rewriter/generate.h"

#include <algorithm>
#include <map>
#include <set>

#include "rewriter/header.h"
#include "rewriter/sha256.h"
#include "rewriter/stages.h"
#include "spec/version_condition.h"

namespace patchgen::rewriter {
namespace {

using parser::PyModule;
using spec::Patch;

/// Keeps the entries whose `upstream_version` matches `version`; the others go to `skipped`.
/// A condition that cannot be evaluated (upstream version unknown) is an error.
template <class T, class Describe>
void FilterByVersion(std::vector<T>& entries, const std::string& version, Describe describe,
                     std::vector<SkippedEntry>& skipped, std::vector<Diagnostic>& errors) {
  std::vector<T> kept;
  for (T& e : entries) {
    if (!e.when.upstream_version) {
      kept.push_back(std::move(e));
      continue;
    }
    std::optional<bool> match = spec::VersionMatches(*e.when.upstream_version, version);
    if (!match) {
      errors.push_back(ErrorAt(e.when.version_loc,
                               "cannot evaluate upstream_version '" + *e.when.upstream_version +
                                   "': the upstream version is '" + version + "'",
                               "the version comes from __version__ in the package's "
                               "__init__.py or its dist-info METADATA"));
      continue;
    }
    if (*match) {
      kept.push_back(std::move(e));
      continue;
    }
    auto [kind, target, loc] = describe(e);
    skipped.push_back({kind, target,
                       "upstream_version \"" + *e.when.upstream_version + "\" does not match " +
                           version + (e.when.reason.empty() ? "" : "; " + e.when.reason),
                       loc});
  }
  entries = std::move(kept);
}

/// Everything the stages returned, in stage order.
struct Collected {
  std::vector<TextEdit> edits;
  std::vector<AppliedPatch> applied;
  std::vector<Diagnostic> errors;
  std::set<std::string> used_keys;

  void Add(StageOutput&& out) {
    for (TextEdit& e : out.edits) edits.push_back(std::move(e));
    for (AppliedPatch& a : out.applied) applied.push_back(std::move(a));
    for (Diagnostic& d : out.errors) errors.push_back(std::move(d));
    used_keys.insert(out.used_keys.begin(), out.used_keys.end());
  }
};

/// Runs the stages on `spec` (filtered and with mapped targets). `skipped`: entries left out by
/// their upstream_version; `used_keys`: name_map keys that mapping patch targets (and the targets
/// of version-skipped guards) used.
Result<GenerateResult> RunStages(const spec::PatchSpec& spec, const PyModule& up,
                                 const GenerateOptions& options, std::vector<SkippedEntry> skipped,
                                 std::set<std::string> used_keys) {
  ImportsStage imports = PlanImports(spec, up, options.upstream_path);
  PatchesStage patches = PlanPatches(spec, up);
  const std::string runtime = spec.runtime.value_or(options.default_runtime);
  GuardsStage guards = PlanGuardStage(spec, up, runtime, patches.replaced, patches.added_methods);
  StageOutput statement_edits =
      PlaceStatementEdits(up, std::move(patches.statement_edits), guards.regions);
  StageOutput module_code =
      PlanModuleCode(spec, up, imports.removed_imports,
                     WithConfigSlotImport(guards.declarations, runtime, patches.config_slots));
  ExcludeStage excludes = PlanExcludes(spec, up);

  Collected all;
  all.used_keys = std::move(used_keys);
  all.Add(std::move(imports.out));
  all.Add(std::move(patches.out));
  all.Add(std::move(guards.out));
  all.Add(std::move(statement_edits));
  all.Add(std::move(module_code));
  all.Add(std::move(excludes.out));
  if (!options.entries_dropped) NameMap(spec.name_map).ReportUnused(all.used_keys, all.errors);
  if (!all.errors.empty()) {
    SortDiagnostics(all.errors);
    return all.errors;
  }
  EditPlan plan;
  for (TextEdit& e : all.edits) plan.Add(std::move(e));
  std::vector<Diagnostic> overlaps = plan.Validate();
  if (!overlaps.empty()) {
    SortDiagnostics(overlaps);
    return overlaps;
  }
  if (options.entries_dropped) return GenerateResult{};

  for (SkippedEntry& sk : patches.skipped) skipped.push_back(std::move(sk));
  for (SkippedEntry& sk : guards.skipped) skipped.push_back(std::move(sk));
  std::stable_sort(skipped.begin(), skipped.end(),
                   [](const SkippedEntry& a, const SkippedEntry& b) {
                     return std::tie(a.loc.path, a.loc.line) < std::tie(b.loc.path, b.loc.line);
                   });
  GenerateResult result;
  result.upstream_sha256 =
      options.upstream_sha256.empty() ? Sha256Hex(up.source()) : options.upstream_sha256;
  result.applied = all.applied;
  result.skipped = skipped;
  result.contract = std::move(patches.contract);
  for (ContractPin& pin : guards.contract) result.contract.push_back(std::move(pin));
  std::string header =
      WriteHeader({spec.path, spec.upstream, options.upstream_path, options.upstream_version,
                   result.upstream_sha256, spec.description, std::move(skipped),
                   guards.unguarded_slots, std::move(all.applied), StampFits(up), runtime});
  result.text = header + plan.Apply(up.source());
  std::vector<Diagnostic> errors =
      CheckOutput(spec, up, plan, result.text, static_cast<uint32_t>(header.size()),
                  excludes.excluded, options.verify_incremental_parse);
  if (!errors.empty()) {
    SortDiagnostics(errors);
    return errors;
  }
  return result;
}

}  // namespace

Result<GenerateResult> Generate(const spec::PatchSpec& spec, const parser::PyModule& upstream,
                                const GenerateOptions& options) {
  spec::PatchSpec active = spec;
  // The spec-level name_map maps patch targets as it maps guard targets, so that a sibling
  // family inherits its parent's patches (`Qwen3_5*: Qwen3_5Moe*`).
  NameMap target_map(active.name_map);
  for (Patch& p : active.patches) p.target = target_map.MapDotted(p.target);
  std::set<std::string> used_keys = target_map.UsedKeys();
  std::vector<SkippedEntry> skipped;
  std::vector<Diagnostic> errors;
  const std::string& v = options.upstream_version;
  for (spec::Slot& slot : active.slots) {
    FilterByVersion(
        slot.guards, v,
        [](const spec::Guard& g) {
          return std::make_tuple(std::string("guard"), g.in, g.loc.line > 0 ? g.loc : g.in_loc);
        },
        skipped, errors);
  }
  FilterByVersion(
      active.patches, v,
      [](const Patch& p) {
        return std::make_tuple(std::string(PatchKindKey(p.kind)), p.target, p.loc);
      },
      skipped, errors);
  FilterByVersion(
      active.helpers, v,
      [](const spec::Helper& h) { return std::make_tuple(std::string("helper"), h.name, h.loc); },
      skipped, errors);
  // Two entries for one target must not both apply (their conditions overlap).
  std::map<std::string, const Patch*> targets;
  for (const Patch& p : active.patches) {
    auto [it, inserted] = targets.emplace(p.target, &p);
    if (inserted) continue;
    Diagnostic d =
        ErrorAt(p.target_loc, "duplicate target '" + p.target + "' for upstream version " + v,
                "entries of one target need upstream_version conditions that do not "
                "overlap");
    d.notes.push_back(Note::At(it->second->target_loc, "also applies"));
    errors.push_back(std::move(d));
  }
  if (!errors.empty()) {
    SortDiagnostics(errors);
    return errors;
  }
  // A name_map key that only a version-skipped guard's target uses is not unused.
  NameMap skipped_map(active.name_map);
  for (const SkippedEntry& sk : skipped) {
    if (sk.kind == "guard") skipped_map.MapDotted(sk.target);
  }
  std::set<std::string> skipped_keys = skipped_map.UsedKeys();
  used_keys.insert(skipped_keys.begin(), skipped_keys.end());
  return RunStages(active, upstream, options, std::move(skipped), std::move(used_keys));
}

}  // namespace patchgen::rewriter
