// The source roots given to a run, checked (source_roots.h).
#include "source_roots.h"

#include <algorithm>

namespace patchgen::cli {
namespace {

/// What is wrong with a source root: it does not exist; it holds none of the specs' packages; it
/// holds none while a spec is skipped for its package.
enum class RootProblem { kMissing, kNoPackage, kSkip };

// Where a `source_roots` entry is written in the config file: its value when it is written there
// as given, else the file.
SourceLoc ConfigRootLoc(const RunContext& ctx, const fs::path& root) {
  const ProjectConfig& config = ctx.config;
  std::string config_shown = config.file ? ctx.Show(*config.file) : std::string("config");
  std::optional<std::string> text = config.file ? ReadFile(*config.file) : std::nullopt;
  if (!text) return SourceLoc::InFile(config_shown);
  std::string written = DisplayPath(root, config.root);
  size_t at = std::string::npos, key = text->find("source_roots");
  for (char q : {'"', '\''}) {
    if (key != std::string::npos)
      at = std::min(at, text->find(std::string(1, q) + written + q, key));
  }
  if (at == std::string::npos) return SourceLoc::InFile(config_shown);
  LineIndex lines(*text);
  return LocOf(
      config_shown, *text, lines,
      ByteRange{static_cast<uint32_t>(at), static_cast<uint32_t>(at + written.size() + 2)});
}

// The help of a source root's error under --check: what the run would do with it, and what to
// do. `skipped`: how many specs are skipped for their package.
std::string CheckRootHelp(const GivenRoot& root, RootProblem problem, size_t skipped) {
  const std::string example = " (e.g. the one that contains 'transformers/')";
  if (problem == RootProblem::kSkip) {
    return "--check would skip " + std::to_string(skipped) +
           (skipped == 1 ? " spec whose upstream package is"
                         : " specs whose upstream packages are") +
           " on no source root, and pass; fill the folder (e.g. `make upstream`, `git submodule "
           "update --init`) or remove it from the source roots";
  }
  if (problem == RootProblem::kNoPackage)
    return "--source-root names the folder that contains an upstream package" + example +
           "; --check would check the upstream found on the other source roots, or skip the spec";
  if (root.origin.empty())
    return "--check would skip every spec whose upstream package lives there; create it "
           "(e.g. `make upstream`) or remove it from `source_roots`";
  return "--check would skip every spec whose upstream package lives there; give the folder that "
         "contains the upstream package" +
         example;
}

// The help of a source root's error: what the run would do with it, and what to do.
std::string RootHelp(const RunContext& ctx, const GivenRoot& root, RootProblem problem,
                     size_t skipped = 0) {
  const std::string example = " (e.g. the one that contains 'transformers/')";
  if (ctx.opts.audit && root.origin == "--source-root-old")
    return "audit would compare with no old upstream; give the folder that contains the old "
           "upstream package" +
           example;
  if (ctx.opts.audit)
    return "audit would survey the upstream found on the other source roots (an older release) "
           "instead of the new one; give the folder that contains the new upstream package" +
           example;
  return CheckRootHelp(root, problem, skipped);
}

// An error about a source root: at its value in the config file, or naming where it was given.
Diagnostic RootError(const RunContext& ctx, const GivenRoot& root, const std::string& what,
                     const std::string& help) {
  if (root.origin.empty())
    return ErrorAt(ConfigRootLoc(ctx, root.path),
                   "source root '" + ctx.Show(root.path) + "' " + what, help);
  return ErrorAt(SourceLoc::InFile("patchgen"),
                 "source root '" + ctx.Show(root.path) + "' (" + root.origin + ") " + what, help);
}

// The top-level packages of the specs' upstream modules ("transformers").
std::set<std::string> SpecPackages(const std::vector<SpecRecord>& specs) {
  std::set<std::string> packages;
  for (const SpecRecord& rec : specs) {
    if (rec.load.spec) packages.insert(TopPackage(rec.load.spec->upstream));
    if (rec.load.partial) packages.insert(TopPackage(rec.load.partial->upstream));
  }
  return packages;
}

bool HoldsAPackage(const fs::path& root, const std::set<std::string>& packages) {
  std::error_code ec;
  for (const std::string& p : packages) {
    if (fs::is_directory(root / p, ec) || fs::is_regular_file(root / (p + ".py"), ec)) return true;
  }
  return false;
}

// "holds no upstream package of the specs (no 'a', 'b' under it)", saying when it is empty.
std::string NoPackageText(const fs::path& root, const std::set<std::string>& packages) {
  std::string names;
  for (const std::string& p : packages) names += (names.empty() ? "'" : ", '") + p + "'";
  std::error_code ec;
  bool empty = fs::is_empty(root, ec) && !ec;
  return "holds no upstream package of the specs (no " + names + " under it)" +
         (empty ? ": it is empty" : "");
}

// An error for each of the `which` roots that holds none of the specs' packages (an empty folder:
// an uninitialised submodule, a failed unpack; a folder one level off).
std::vector<Diagnostic> RootsWithoutPackages(const RunContext& ctx,
                                             const std::vector<SpecRecord>& specs, RootSet which,
                                             RootProblem problem) {
  const std::set<std::string> packages = SpecPackages(specs);
  std::vector<Diagnostic> errors;
  if (packages.empty()) return errors;
  size_t skipped =
      std::count_if(specs.begin(), specs.end(), [](const SpecRecord& r) { return r.skipped(); });
  for (const GivenRoot& root : GivenRoots(ctx, which)) {
    if (RootsHoldAPackage({root}, packages)) continue;
    errors.push_back(RootError(ctx, root, NoPackageText(root.path, packages),
                               RootHelp(ctx, root, problem, skipped)));
  }
  return errors;
}

}  // namespace

std::vector<GivenRoot> GivenRoots(const RunContext& ctx, RootSet which) {
  std::vector<GivenRoot> roots;
  for (const auto& r : ctx.opts.source_roots) roots.push_back({ctx.FromCwd(r), "--source-root"});
  if (which == RootSet::kAudit) {
    for (const auto& r : ctx.opts.old_roots) roots.push_back({ctx.FromCwd(r), "--source-root-old"});
  }
  if (which != RootSet::kAll) return roots;
  if (const char* env = std::getenv("PATCHGEN_SOURCE_PATH")) {
    for (auto& p : SourceLookup::SplitPathList(env, ctx.cwd))
      roots.push_back({p, "PATCHGEN_SOURCE_PATH"});
  }
  for (const fs::path& p : ctx.config.source_roots) roots.push_back({p, ""});
  return roots;
}

bool RootsHoldAPackage(const std::vector<GivenRoot>& roots, const std::set<std::string>& packages) {
  for (const GivenRoot& root : roots) {
    std::error_code ec;
    if (fs::is_directory(root.path, ec) && !HoldsAPackage(root.path, packages)) return false;
  }
  return true;
}

std::vector<Diagnostic> MissingRoots(const RunContext& ctx) {
  std::vector<Diagnostic> errors;
  RootSet which = ctx.opts.mode() == Mode::kAudit ? RootSet::kAudit : RootSet::kAll;
  for (const GivenRoot& root : GivenRoots(ctx, which)) {
    std::error_code ec;
    if (fs::is_directory(root.path, ec)) continue;
    errors.push_back(
        RootError(ctx, root, "does not exist", RootHelp(ctx, root, RootProblem::kMissing)));
  }
  return errors;
}

std::vector<Diagnostic> RootsWithoutTheSpecs(const RunContext& ctx,
                                             const std::vector<SpecRecord>& specs) {
  Mode mode = ctx.opts.mode();
  if (mode == Mode::kCheck)
    return RootsWithoutPackages(ctx, specs, RootSet::kFlags, RootProblem::kNoPackage);
  if (mode == Mode::kAudit)
    return RootsWithoutPackages(ctx, specs, RootSet::kAudit, RootProblem::kNoPackage);
  return {};
}

std::vector<Diagnostic> UnexplainedSkips(const RunContext& ctx,
                                         const std::vector<SpecRecord>& specs) {
  bool skipped =
      std::any_of(specs.begin(), specs.end(), [](const SpecRecord& r) { return r.skipped(); });
  if (!skipped) return {};
  return RootsWithoutPackages(ctx, specs, RootSet::kAll, RootProblem::kSkip);
}

}  // namespace patchgen::cli
