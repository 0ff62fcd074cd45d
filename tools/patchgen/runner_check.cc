// --check (runner.h): compare every generated job with the files on disk, print what drifted, write
// it with --fix; then the orphaned outputs under the output root.
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
  nlohmann::json orphans = nlohmann::json::array();
  size_t orphaned = 0;
  for (const fs::path& p : FindOrphans()) {
    ++orphaned;
    orphans.push_back(Show(p));
    code = std::max(code, HandleOrphan(p));
  }
  if (opts_.json) {
    std::cout << JsonText(
                     nlohmann::json{{"specs", report}, {"orphaned", orphans}, {"exit_code", code}})
              << "\n";
  } else {
    std::cout << "check: " << n.clean << " up to date, " << n.stale << " stale, ";
    if (opts_.fix) std::cout << n.fixed << " fixed, ";
    std::cout << n.skipped << " skipped, " << n.failed << " failed";
    if (orphaned) std::cout << ", " << orphaned << (opts_.fix ? " orphaned removed" : " orphaned");
    std::cout << "\n";
  }
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

// A .py or .diff that no spec produces and that carries patchgen's header.
bool IsOrphan(const fs::path& p, const std::set<fs::path>& produced) {
  std::string ext = p.extension().string();
  if ((ext != ".py" && ext != ".diff") || produced.count(p)) return false;
  auto text = ReadFile(p, nullptr, kMaxSpecFileBytes * 4);
  return text && rewriter::CarriesGeneratedHeader(*text);
}

}  // namespace

// Orphaned outputs: files under the output root that carry patchgen's header but that no spec
// produces (their spec was deleted, renamed or given another `output:`). Only when every spec
// was discovered and loaded: otherwise what the others produce is not known.
std::vector<fs::path> Runner::FindOrphans() const {
  std::vector<fs::path> found;
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
  std::set<fs::path> produced;
  for (const Job& job : jobs_) {
    produced.insert(job.out_py);
    produced.insert(job.out_diff);
  }
  std::error_code ec;
  for (fs::recursive_directory_iterator it(out_root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->is_directory(ec2) && !it->is_symlink(ec2)) {
      if (SkipFolder(it->path(), not_entered)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink(ec2) || !it->is_regular_file(ec2)) continue;
    fs::path p = it->path().lexically_normal();
    if (IsOrphan(p, produced)) found.push_back(p);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Reports an orphaned output, or removes it with --fix; returns the exit code.
int Runner::HandleOrphan(const fs::path& p) {
  if (!opts_.fix) {
    if (!opts_.json) {
      std::cout << "orphaned: " << Show(p)
                << " (carries patchgen's header, but no spec produces it; "
                << "`patchgen --check --fix` removes it)\n";
    }
    return kExitDrift;
  }
  std::error_code rm;
  if (fs::remove(p, rm); rm) {
    Diagnostic d = ErrorAt(SourceLoc::InFile(Show(p)),
                           "cannot remove orphaned output: " + rm.message(), {}, ErrorKind::kIo);
    PrintDiagnostics({d});
    return ExitCodeOf(ErrorKind::kIo);
  }
  if (!opts_.json) std::cout << "removed: " << Show(p) << " (orphaned: no spec produces it)\n";
  return kExitOk;
}

}  // namespace patchgen::cli
