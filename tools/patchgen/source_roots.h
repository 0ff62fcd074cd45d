// The source roots given to a run, checked before anything is compared (docs/cli.md, "Which specs
// `--check` checks"): under --check and audit a root that does not exist, or that holds none of
// the specs' upstream packages, would skip specs or survey another release; it is an error (exit
// 2) instead.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "pipeline.h"
#include "run_context.h"

namespace patchgen::cli {

/// A source root given to the run and where it was given: "--source-root", "PATCHGEN_SOURCE_PATH",
/// "--source-root-old", or "" for `source_roots` of the project config.
struct GivenRoot {
  std::filesystem::path path;  ///< Absolute.
  std::string origin;
};

/// Which of the given source roots: the --source-root flags; flags, PATCHGEN_SOURCE_PATH and the
/// config's (--check); flags and --source-root-old (audit).
enum class RootSet { kFlags, kAll, kAudit };

/// The source roots given to the run (absolute), in lookup order.
std::vector<GivenRoot> GivenRoots(const RunContext& ctx, RootSet which);

/// Whether every one of `roots` that is a folder holds at least one of `packages` (a folder
/// `<package>/` or a module `<package>.py`), as the upstream lookup would see it.
bool RootsHoldAPackage(const std::vector<GivenRoot>& roots, const std::set<std::string>& packages);

/// --check and audit, before the specs are loaded: an error for each given root that does not
/// exist.
std::vector<Diagnostic> MissingRoots(const RunContext& ctx);

/// Once the specs are loaded: --check's --source-root flags and audit's new and old roots each
/// hold a package of the specs (a root named for this run that holds none is a mistake). An error
/// for each that does not.
std::vector<Diagnostic> RootsWithoutTheSpecs(const RunContext& ctx,
                                             const std::vector<SpecRecord>& specs);

/// --check, once the upstreams are looked up: a spec skipped because its package is on no source
/// root passes the gate; that is what a project without that package wants, not what an empty
/// root should cause. When a spec is skipped, an error for each given root that holds no package
/// of the specs.
std::vector<Diagnostic> UnexplainedSkips(const RunContext& ctx,
                                         const std::vector<SpecRecord>& specs);

}  // namespace patchgen::cli
