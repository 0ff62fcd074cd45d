// Checks the Runner makes before anything is written (runner.h): no output overwrites an input or
// another spec's output, and the source roots given to --check and audit exist and hold packages.
#include <sys/stat.h>

#include "runner.h"

namespace patchgen::cli {

std::string FileIdentity(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0)
    return "#" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return (ec ? p.lexically_normal() : c).generic_string();
}

// What the run reads, by file identity: the specs, their parents, patch files, pin files and
// upstream files ("the upstream file 'x'").
std::map<std::string, std::string> Runner::InputFiles() const {
  std::map<std::string, std::string> inputs;
  auto add_input = [&](const fs::path& p, std::string what) {
    std::error_code ec;
    if (fs::exists(p, ec)) inputs.emplace(FileIdentity(p), std::move(what));
  };
  auto abs = [&](const std::string& shown) { return Unshow(shown); };
  auto add_body = [&](const spec::Body& b) {
    if (b.source == spec::Body::Source::kFile) {
      add_input(abs(b.origin.path), "the patch file '" + Show(abs(b.origin.path)) + "'");
    }
  };
  for (const Job& job : jobs_) {
    add_input(job.spec_abs, "the spec '" + job.spec_shown + "'");
    add_input(PinsPathFor(job.spec_abs), "the pin file '" + Show(PinsPathFor(job.spec_abs)) + "'");
    if (!job.spec) continue;
    for (const std::string& parent : job.spec->extends_chain) {
      add_input(abs(parent), "the spec '" + Show(abs(parent)) + "'");
    }
    for (const spec::Patch& p : job.spec->patches) add_body(p.body);
    for (const spec::Helper& h : job.spec->helpers) add_body(h.body);
    if (job.lookup.status == LookupResult::Status::kFound) {
      add_input(job.lookup.file.file, "the upstream file '" + Show(job.lookup.file.file) + "'");
    }
  }
  return inputs;
}

namespace {

// The error on `at` for an output `shown` that the spec of `with` writes too.
Diagnostic ClashError(const Job& at, const Job& with, const std::string& shown) {
  Diagnostic d =
      ErrorAt(at.spec->output_loc,
              "output '" + shown + "' is also written by the spec '" + with.spec_shown + "'",
              "two specs cannot write one file; give one of them another `output:` name");
  d.notes.push_back(Note::At(with.spec->output_loc, "its output is set here"));
  return d;
}

}  // namespace

// Never lose a file: an output that is one of the run's inputs (a spec, a parent spec, a patch
// file, a pin file, an upstream file) or that two specs would both write fails those specs
// before anything is written.
void Runner::CheckOutputs() {
  const std::map<std::string, std::string> inputs = InputFiles();
  std::map<std::string, size_t> writer;  // output identity -> index of the first job writing it
  std::vector<std::vector<Diagnostic>> errors(jobs_.size());
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const Job& job = jobs_[i];
    if (!job.spec || job.skipped || !job.errors.empty() || job.out_py.empty()) continue;
    std::vector<fs::path> outs = {job.out_py};
    std::error_code ec;
    if (opts_.diff || (opts_.check && fs::is_regular_file(job.out_diff, ec)))
      outs.push_back(job.out_diff);
    for (const fs::path& out : outs) {
      std::string id = FileIdentity(out);
      if (auto in = inputs.find(id); in != inputs.end()) {
        errors[i].push_back(ErrorAt(
            job.spec->output_loc, "output '" + Show(out) + "' would overwrite " + in->second,
            "patchgen never writes over its inputs; choose another `output:` "
            "name or output folder"));
        continue;
      }
      auto [it, inserted] = writer.emplace(id, i);
      if (inserted) continue;
      const Job& other = jobs_[it->second];
      if (FileIdentity(other.spec_abs) == FileIdentity(job.spec_abs))
        continue;  // one spec named twice
      errors[i].push_back(ClashError(job, other, Show(out)));
      errors[it->second].push_back(ClashError(other, job, Show(out)));
    }
  }
  for (size_t i = 0; i < jobs_.size(); ++i) Fail(jobs_[i], std::move(errors[i]));
}

// The source roots given to the run (absolute), in lookup order.
std::vector<GivenRoot> Runner::GivenRoots(RootSet which) const {
  std::vector<GivenRoot> roots;
  auto abs = [&](const std::string& r) {
    fs::path p(r);
    return (p.is_absolute() ? p : cwd_ / p).lexically_normal();
  };
  for (const auto& r : opts_.source_roots) roots.push_back({abs(r), "--source-root"});
  if (which == RootSet::kAudit) {
    for (const auto& r : opts_.old_roots) roots.push_back({abs(r), "--source-root-old"});
  }
  if (which != RootSet::kAll) return roots;
  if (const char* env = std::getenv("PATCHGEN_SOURCE_PATH")) {
    for (auto& p : SourceLookup::SplitPathList(env, cwd_))
      roots.push_back({p, "PATCHGEN_SOURCE_PATH"});
  }
  for (const fs::path& p : config_.source_roots) roots.push_back({p, ""});
  return roots;
}

// Where a `source_roots` entry is written in the config file: its value when it is written there
// as given, else the file.
SourceLoc Runner::ConfigRootLoc(const fs::path& root) const {
  std::string config_shown = config_.file ? Show(*config_.file) : std::string("config");
  std::optional<std::string> text = config_.file ? ReadFile(*config_.file) : std::nullopt;
  if (!text) return SourceLoc::InFile(config_shown);
  std::string written = DisplayPath(root, config_.root);
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

// The help of a source root's error: what the run would do with it, and what to do.
std::string Runner::RootHelp(const GivenRoot& root, RootProblem problem) const {
  const std::string example = " (e.g. the one that contains 'transformers/')";
  if (opts_.audit && root.origin == "--source-root-old")
    return "audit would compare with no old upstream; give the folder that contains the old "
           "upstream package" +
           example;
  if (opts_.audit)
    return "audit would survey the upstream found on the other source roots (an older release) "
           "instead of the new one; give the folder that contains the new upstream package" +
           example;
  if (problem == RootProblem::kSkip) {
    size_t n = std::count_if(jobs_.begin(), jobs_.end(), [](const Job& j) { return j.skipped; });
    return "--check would skip " + std::to_string(n) +
           (n == 1 ? " spec whose upstream package is" : " specs whose upstream packages are") +
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

// An error about a source root: at its value in the config file, or naming where it was given.
Diagnostic Runner::RootError(const GivenRoot& root, const std::string& what,
                             const std::string& help) const {
  if (root.origin.empty())
    return ErrorAt(ConfigRootLoc(root.path), "source root '" + Show(root.path) + "' " + what, help);
  return ErrorAt(SourceLoc::InFile("patchgen"),
                 "source root '" + Show(root.path) + "' (" + root.origin + ") " + what, help);
}

// --check and audit: a source root that does not exist would skip every spec whose package
// lives there (an empty gate that passes), or audit another release; it is an error instead.
bool Runner::RootsExist(RootSet which) const {
  bool ok = true;
  for (const GivenRoot& root : GivenRoots(which)) {
    std::error_code ec;
    if (fs::is_directory(root.path, ec)) continue;
    PrintDiagnostics({RootError(root, "does not exist", RootHelp(root, RootProblem::kMissing))});
    ok = false;
  }
  return ok;
}

// The top-level packages of the specs' upstream modules ("transformers").
std::set<std::string> Runner::SpecPackages() const {
  std::set<std::string> packages;
  for (const Job& job : jobs_) {
    if (job.spec) packages.insert(TopPackage(job.spec->upstream));
    if (job.partial_spec) packages.insert(TopPackage(job.partial_spec->upstream));
  }
  return packages;
}

namespace {

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

}  // namespace

bool RootsHoldAPackage(const std::vector<GivenRoot>& roots, const std::set<std::string>& packages) {
  for (const GivenRoot& root : roots) {
    std::error_code ec;
    if (fs::is_directory(root.path, ec) && !HoldsAPackage(root.path, packages)) return false;
  }
  return true;
}

// A source root that holds none of the specs' packages (an empty folder: an uninitialised
// submodule, a failed unpack; a folder one level off) is an error, printed for each such root.
bool Runner::RootsHoldPackages(RootSet which, RootProblem problem) const {
  const std::set<std::string> packages = SpecPackages();
  if (packages.empty()) return true;
  bool ok = true;
  for (const GivenRoot& root : GivenRoots(which)) {
    if (RootsHoldAPackage({root}, packages)) continue;
    PrintDiagnostics(
        {RootError(root, NoPackageText(root.path, packages), RootHelp(root, problem))});
    ok = false;
  }
  return ok;
}

// Once the specs are loaded: --check's --source-root flags, audit's new and old roots, each hold
// a package of the specs (a root named for this run that holds none is a mistake).
bool Runner::RootsHoldTheSpecs(Mode mode) const {
  if (mode == Mode::kCheck) return RootsHoldPackages(RootSet::kFlags, RootProblem::kNoPackage);
  if (mode == Mode::kAudit) return RootsHoldPackages(RootSet::kAudit, RootProblem::kNoPackage);
  return true;
}

// --check: a spec skipped because its package is on no source root passes the gate; that is what
// a project without that package wants, not what an empty root should cause. When a spec is
// skipped, every given root must hold a package of the specs.
bool Runner::SkipsExplained() const {
  bool skipped = std::any_of(jobs_.begin(), jobs_.end(), [](const Job& j) { return j.skipped; });
  return !skipped || RootsHoldPackages(RootSet::kAll, RootProblem::kSkip);
}

}  // namespace patchgen::cli
