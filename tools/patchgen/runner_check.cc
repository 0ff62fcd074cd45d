// --check (runner.h): compare every generated job with the files on disk, print what drifted, write
// it with --fix; then the orphaned outputs under the output root.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "check_stamp.h"
#include "output_record.h"
#include "rewriter/sha256.h"
#include "runner.h"

namespace patchgen::cli {

int Runner::Check() {
  int code = kExitOk;
  CheckCounts n;
  nlohmann::json report = nlohmann::json::array();
  for (Job& job : jobs_) {
    if (job.skipped) {
      ++n.skipped;
      job.status = JobStatus::kUpstreamNotFound;
      ReportSkipped(job, " on any source root");
    } else if (!job.errors.empty()) {
      ++n.failed;
      code = std::max(code, Failed(job));
    } else {
      code = std::max(code, CheckJob(job, n));
    }
    report.push_back(JobJson(job));
  }
  nlohmann::json orphans = nlohmann::json::array(), kept = nlohmann::json::array();
  code = std::max(code, CheckOrphans(orphans, kept));
  if (opts_.json) {
    nlohmann::json j{{"specs", report}, {"orphaned", orphans}, {"exit_code", code}};
    if (!kept.empty()) j["orphaned_kept"] = kept;
    std::cout << JsonText(j) << "\n";
    return code;
  }
  std::cout << "check: " << n.clean << " up to date, " << n.stale << " stale, ";
  if (opts_.fix) std::cout << n.fixed << " fixed, ";
  std::cout << n.skipped << " skipped, " << n.failed << " failed";
  if (!orphans.empty() && !opts_.fix) std::cout << ", " << orphans.size() << " orphaned";
  if (!orphans.empty() && opts_.fix) {
    std::cout << ", " << orphans.size() - kept.size() << " orphaned removed";
    if (!kept.empty()) std::cout << ", " << kept.size() << " orphaned kept";
  }
  std::cout << "\n";
  return code;
}

// A generated job against its files on disk: up to date, stale/missing, or fixed with --fix.
// Counts the job and returns its exit code.
int Runner::CheckJob(Job& job, CheckCounts& n) {
  if (job.fresh) {  // its stamp matched (runner_stamps.cc)
    ++n.clean;
    job.status = JobStatus::kUpToDate;
    return kExitOk;
  }
  PrintDiagnostics(job.warnings);
  std::error_code ec;
  OutputFiles files = {{job.out_py, &job.py_text}};
  if (opts_.diff || fs::is_regular_file(job.out_diff, ec))
    files.push_back({job.out_diff, &job.diff_text});
  bool drift = false;
  bool py_missing = false;
  for (const auto& [path, bytes] : files) drift |= ShowDrift(job, path, *bytes, py_missing);
  if (!drift) {
    ++n.clean;
    job.status = JobStatus::kUpToDate;
    return kExitOk;
  }
  if (!opts_.fix) {
    ++n.stale;
    job.status = py_missing ? JobStatus::kMissing : JobStatus::kStale;
    return kExitDrift;
  }
  return FixJob(job, files, n);
}

// Whether `path` differs from what the job generates; if so (and not --json) prints it as stale or
// missing, the upstream change since generation, and the diff. Sets py_missing for an absent .py.
bool Runner::ShowDrift(const Job& job, const fs::path& path, const std::string& bytes,
                       bool& py_missing) const {
  auto on_disk = ReadFile(path);
  if (on_disk && *on_disk == bytes) return false;
  py_missing |= !on_disk && path == job.out_py;
  if (opts_.json) return true;
  std::string shown = Show(path);
  std::cout << (on_disk ? "stale: " : "missing: ") << shown << " (from " << job.spec_shown << ")\n";
  if (on_disk && path == job.out_py) {
    rewriter::HeaderUpstream old = rewriter::ReadHeaderUpstream(*on_disk);
    if (!old.sha256.empty() && old.sha256 != job.upstream_sha) {
      std::cout << "upstream changed since generation: " << Fingerprint(old.version, old.sha256)
                << " -> " << Fingerprint(job.lookup.file.version, job.upstream_sha) << "\n";
    }
  }
  std::cout << diff::UnifiedDiff(on_disk.value_or(""), bytes, "a/" + shown, "b/" + shown);
  return true;
}

// --check --fix of a drifted job: writes its files; returns the exit code.
int Runner::FixJob(Job& job, const OutputFiles& files, CheckCounts& n) {
  job.status = JobStatus::kFixed;
  for (const auto& [path, bytes] : files) {
    std::string error;
    if (!WriteIfChanged(path, *bytes, &error, OutputRoot())) {
      job.errors.push_back(ErrorAt(SourceLoc::InFile(Show(path)), error, {}, ErrorKind::kIo));
    } else {
      RecordWritten(path, *bytes);
    }
  }
  if (job.errors.empty()) {
    ++n.fixed;
    if (!opts_.json) std::cout << "fixed: " << Show(job.out_py) << "\n";
    return kExitOk;
  }
  ++n.failed;
  return Failed(job);
}

// Records that generation or --fix wrote `bytes` at `path` (or found them there): what lets
// --fix remove it once it is orphaned (output_record.h).
void Runner::RecordWritten(const fs::path& path, const std::string& bytes) const {
  RecordOutput(CacheDir(), path, rewriter::Sha256Hex(bytes));
}

namespace {

bool Under(const fs::path& p, const fs::path& dir) {
  fs::path rel = p.lexically_normal().lexically_relative(dir.lexically_normal());
  return !rel.empty() && *rel.begin() != "..";
}

// A folder the orphan search does not enter: a dot-folder, or one of `not_entered`.
bool SkipFolder(const fs::path& dir, const std::vector<fs::path>& not_entered) {
  bool skip = dir.filename().string().starts_with(".");
  for (const fs::path& d : not_entered) skip |= dir.lexically_normal() == d.lexically_normal();
  return skip;
}

// The orphan at `p`: a .py or .diff that no spec produces (`produced`: file identities, so that an
// output written through a folder link, or a link to an output, is the file it leads to) and that
// carries patchgen's header. The spec its header names is resolved against `root`.
std::optional<Orphan> OrphanAt(const fs::path& p, const std::set<std::string>& produced,
                               const fs::path& root) {
  std::string ext = p.extension().string();
  if ((ext != ".py" && ext != ".diff") || produced.count(FileIdentity(p))) return std::nullopt;
  auto text = ReadFile(p, nullptr, kMaxSpecFileBytes * 4);
  if (!text || !rewriter::CarriesGeneratedHeader(*text)) return std::nullopt;
  fs::path spec = rewriter::ReadHeaderSpec(*text);
  if (!spec.empty()) spec = (spec.is_absolute() ? spec : root / spec).lexically_normal();
  return Orphan{p, rewriter::Sha256Hex(*text), spec};
}

// Why `p` (found under `root`) must not be removed through its path: it is no regular file any
// more, a link, or reached through one; nullopt when it may be.
std::optional<std::string> LinkOnTheWay(const fs::path& p, const fs::path& root) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return "it no longer exists";
  if (S_ISLNK(st.st_mode)) return "it is a symbolic link";
  if (!S_ISREG(st.st_mode)) return "it is no regular file";
  std::error_code ec, ec2;
  fs::path real = fs::canonical(p, ec), real_root = fs::canonical(root, ec2);
  if (ec || ec2) return "its real path cannot be told";
  if (!Under(real, real_root))
    return "its real path is outside the output root (through a symbolic link)";
  fs::path rel = p.lexically_normal().lexically_relative(root.lexically_normal());
  if (real != (real_root / rel).lexically_normal()) return "its path leads through a symbolic link";
  return std::nullopt;
}

}  // namespace

// Orphaned outputs: files under the output root that carry patchgen's header but that no spec
// produces (their spec was deleted, renamed or given another `output:`). Only when every spec
// was discovered and loaded: otherwise what the others produce is not known.
std::vector<Orphan> Runner::FindOrphans() const {
  std::vector<Orphan> found;
  bool all_known = opts_.specs.empty();
  for (const Job& job : jobs_) all_known &= (job.spec || job.fresh) && !job.out_py.empty();
  // An output root that holds the whole project (`output = "."`) would take test expectations and
  // files of other tools for orphans: it is not searched. Below the output root, the specs root,
  // the source roots and dot-folders are not entered.
  const fs::path out_root = OutputRoot();
  if (!all_known || Under(config_.root, out_root)) return found;
  std::vector<fs::path> not_entered = {config_.specs};
  for (const auto& r : config_.source_roots) not_entered.push_back(r);
  for (const auto& r : opts_.source_roots) not_entered.push_back(cwd_ / r);
  std::set<std::string> produced;
  for (const Job& job : jobs_) {
    produced.insert(FileIdentity(job.out_py));
    produced.insert(FileIdentity(job.out_diff));
  }
  std::error_code ec;
  for (fs::recursive_directory_iterator it(out_root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->is_directory(ec2) && !it->is_symlink(ec2)) {
      if (SkipFolder(it->path(), not_entered)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink(ec2) || !it->is_regular_file(ec2)) continue;
    if (auto o = OrphanAt(it->path().lexically_normal(), produced, config_.root))
      found.push_back(std::move(*o));
  }
  std::sort(found.begin(), found.end(),
            [](const Orphan& a, const Orphan& b) { return a.path < b.path; });
  return found;
}

// Whether `spec` is one of the specs this run checked.
bool Runner::RunChecks(const fs::path& spec) const {
  const std::string id = FileIdentity(spec);
  return std::any_of(jobs_.begin(), jobs_.end(),
                     [&](const Job& job) { return FileIdentity(job.spec_abs) == id; });
}

// Why an orphan must stay, or nullopt when --fix may remove it: only a file patchgen wrote in this
// project (its record), still holding those bytes (`reread`: read again right before removal),
// reached from the output root without a symbolic link, whose spec did not appear during the run.
std::optional<std::string> Runner::KeepOrphan(const Orphan& o, bool reread) const {
  if (auto why = LinkOnTheWay(o.path, OutputRoot())) return why;
  std::error_code ec;
  if (!o.spec.empty() && !RunChecks(o.spec) && fs::exists(o.spec, ec)) {
    return "its spec '" + Show(o.spec) +
           "' exists but was not checked in this run (added during the run?); run `patchgen "
           "--check` again";
  }
  if (reread && FileSha(o.path) != o.sha) return std::string("it changed while --check ran");
  std::optional<bool> recorded = RecordedAs(CacheDir(), fs::canonical(o.path, ec), o.sha);
  if (!recorded) {
    return std::string(
        "patchgen has no record of writing it in this project; remove it by hand if no other "
        "project writes it");
  }
  if (!*recorded) {
    return std::string(
        "its bytes are not the ones patchgen wrote there; remove it by hand if the change is not "
        "needed");
  }
  return std::nullopt;
}

// Reports (or with --fix removes) every orphaned output; `found` lists them, `kept` those --fix
// left. Returns the exit code.
int Runner::CheckOrphans(nlohmann::json& found, nlohmann::json& kept) {
  int code = kExitOk;
  for (const Orphan& o : FindOrphans()) {
    found.push_back(Show(o.path));
    code = std::max(code, HandleOrphan(o, kept));
  }
  return code;
}

// Reports an orphaned output, or removes it with --fix when nothing says it must stay (then it is
// reported as kept); returns the exit code.
int Runner::HandleOrphan(const Orphan& o, nlohmann::json& kept) {
  if (!opts_.fix) {
    if (!opts_.json) {
      std::optional<std::string> why = KeepOrphan(o, /*reread=*/false);
      std::cout << "orphaned: " << Show(o.path)
                << " (carries patchgen's header, but no spec produces it; `patchgen --check --fix` "
                << (why ? "leaves it: " + *why : std::string("removes it")) << ")\n";
    }
    return kExitDrift;
  }
  if (std::optional<std::string> why = KeepOrphan(o, /*reread=*/true)) {
    kept.push_back(Show(o.path));
    if (!opts_.json)
      std::cout << "kept: " << Show(o.path) << " (orphaned, not removed: " << *why << ")\n";
    return kExitDrift;
  }
  if (::unlink(o.path.c_str()) != 0) {
    Diagnostic d = ErrorAt(SourceLoc::InFile(Show(o.path)),
                           "cannot remove orphaned output: " +
                               std::error_code(errno, std::generic_category()).message(),
                           {}, ErrorKind::kIo);
    PrintDiagnostics({d});
    return ExitCodeOf(ErrorKind::kIo);
  }
  if (!opts_.json) std::cout << "removed: " << Show(o.path) << " (orphaned: no spec produces it)\n";
  return kExitOk;
}

}  // namespace patchgen::cli
