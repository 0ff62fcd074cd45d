// The Runner's modes that act on generated jobs (runner.h): --validate, generate (write or
// --dry-run), --list and `pin` (--check is runner_check.cc); each job's JSON report.
#include "runner.h"

namespace patchgen::cli {

nlohmann::json Runner::JobJson(const Job& job) const {
  nlohmann::json j;
  j["spec"] = job.spec_shown;
  j["upstream"] = job.spec ? nlohmann::json(job.spec->upstream) : nlohmann::json(nullptr);
  bool found = job.spec && job.lookup.status == LookupResult::Status::kFound;
  j["upstream_path"] = found ? nlohmann::json(Show(job.lookup.file.file)) : nlohmann::json(nullptr);
  j["upstream_version"] = found ? nlohmann::json(job.lookup.file.version) : nlohmann::json(nullptr);
  j["output"] = job.out_py.empty() ? nlohmann::json(nullptr) : nlohmann::json(Show(job.out_py));
  j["status"] = StatusName(job.status);
  j["patches"] = job.patches;
  j["bytes"] = job.py_text.size();
  nlohmann::json errors = nlohmann::json::array();
  for (const auto& d : job.errors) errors.push_back(DiagnosticJson(d));
  j["errors"] = errors;
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& sk : job.skipped_entries) {
    skipped.push_back({{"kind", sk.kind},
                       {"target", sk.target},
                       {"why", sk.why},
                       {"spec", sk.loc.path},
                       {"line", sk.loc.line}});
  }
  j["skipped_entries"] = skipped;
  nlohmann::json warnings = nlohmann::json::array();
  for (const auto& d : job.warnings) warnings.push_back(DiagnosticJson(d));
  j["warnings"] = warnings;
  return j;
}

int Runner::Validate() {
  int code = kExitOk;
  size_t ok = 0;
  nlohmann::json report = nlohmann::json::array();
  for (Job& job : jobs_) {
    if (job.spec) Fail(job, ValidateSpecWithoutUpstream(*job.spec));
    if (job.partial_spec) {  // the code of the entries that loaded is checked too
      Fail(job, ValidateSpecWithoutUpstream(*job.partial_spec));
      SortDiagnostics(job.errors);
    }
    job.status = job.errors.empty() ? JobStatus::kValid : JobStatus::kInvalid;
    if (job.errors.empty()) {
      ++ok;
      if (opts_.verbose && !opts_.json) std::cout << "valid: " << job.spec_shown << "\n";
    }
    PrintDiagnostics(job.errors);
    code = std::max(code, WorstExit(job.errors));
    report.push_back(JobJson(job));
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << "validate: " << ok << " of " << jobs_.size() << " specs valid\n";
  }
  return code;
}

int Runner::Generate() {
  int code = kExitOk;
  WriteCounts n;
  nlohmann::json report = nlohmann::json::array();
  const std::string stamp_key = opts_.dry_run ? "" : StampKey(/*may_write=*/true);
  for (Job& job : jobs_) {
    if (job.skipped) {
      ++n.skipped;
      job.status = JobStatus::kUpstreamNotFound;
      ReportSkipped(job, " (upstream not found)");
    } else if (!job.errors.empty()) {
      ++n.failed;
      code = std::max(code, Failed(job));
    } else {
      code = std::max(code, WriteJob(job, n));
    }
    if (!opts_.dry_run) WriteStamp(job, stamp_key);
    report.push_back(JobJson(job));
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << jobs_.size() << " specs: " << n.written
              << (opts_.dry_run ? " to write, " : " written, ") << n.unchanged << " unchanged, "
              << n.skipped << " skipped, " << n.failed << " failed\n";
  }
  return code;
}

// Writes (or, with --dry-run, compares) a generated job's files and counts the job; returns its
// exit code (5 when a file cannot be written).
int Runner::WriteJob(Job& job, WriteCounts& n) {
  PrintDiagnostics(job.warnings);
  OutputFiles files = {{job.out_py, &job.py_text}};
  if (opts_.diff) files.push_back({job.out_diff, &job.diff_text});
  bool any_written = false;
  int code = kExitOk;
  for (const auto& [path, bytes] : files) {
    std::optional<bool> changed = WriteOutput(job, path, *bytes);
    if (!changed) {
      code = kExitIo;
      break;
    }
    any_written |= *changed;
  }
  if (!job.errors.empty()) {
    ++n.failed;
    job.status = JobStatus::kError;
    return code;
  }
  any_written ? ++n.written : ++n.unchanged;
  job.status = !any_written    ? JobStatus::kUnchanged
               : opts_.dry_run ? JobStatus::kWouldWrite
                               : JobStatus::kWritten;
  if (opts_.verbose && !opts_.json) {
    std::cout << "  " << job.spec_shown << ": " << job.spec->upstream << " "
              << job.lookup.file.version << " from " << Show(job.lookup.file.file) << "\n";
    for (const rewriter::SkippedEntry& sk : job.skipped_entries) {
      std::cout << "  skipped " << sk.kind << " " << sk.target << " (" << sk.loc.PathLine()
                << "): " << sk.why << "\n";
    }
  }
  return code;
}

// One output file of a job: written when it differs (with --dry-run only compared) and reported.
// Returns whether it differs, or nullopt after an I/O error (added to the job and printed).
std::optional<bool> Runner::WriteOutput(Job& job, const fs::path& path, const std::string& bytes) {
  std::string verb;
  bool changed = false;
  if (opts_.dry_run) {
    auto existing = ReadFile(path);
    changed = !(existing && *existing == bytes);
    verb = changed ? "would write" : "unchanged";
  } else {
    std::string error;
    auto outcome = WriteIfChanged(path, bytes, &error, OutputRoot());
    if (!outcome) {
      SourceLoc loc = SourceLoc::InFile(Show(path));
      job.errors.push_back(ErrorAt(loc, error, {}, ErrorKind::kIo));
      PrintDiagnostics({job.errors.back()});
      return std::nullopt;
    }
    changed = *outcome == WriteOutcome::kWritten;
    verb = changed ? "wrote" : "unchanged";
    RecordWritten(path, bytes);
  }
  if (opts_.json || (verb == "unchanged" && !opts_.verbose)) return changed;
  std::cout << verb << " " << Show(path) << " (" << bytes.size() << " bytes";
  if (path == job.out_py)
    std::cout << ", " << job.patches << (job.patches == 1 ? " patch" : " patches");
  std::cout << ")\n";
  return changed;
}

namespace {

// The rows of --list as columns two spaces apart (the last column not padded).
void PrintTable(const std::vector<std::array<std::string, 4>>& rows) {
  std::array<size_t, 3> width{};
  for (const auto& r : rows) {
    for (size_t c = 0; c < 3; ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < 3; ++c) line += r[c] + std::string(width[c] - r[c].size() + 2, ' ');
    std::cout << line << r[3] << "\n";
  }
}

}  // namespace

// --list: a generated job's .py (and .diff when there is one) against the files on disk.
JobStatus Runner::DiskStatus(const Job& job) const {
  auto py = ReadFile(job.out_py);
  std::error_code ec;
  bool diff_stale =
      fs::is_regular_file(job.out_diff, ec) && ReadFile(job.out_diff) != job.diff_text;
  if (!py) return JobStatus::kMissing;
  return *py == job.py_text && !diff_stale ? JobStatus::kUpToDate : JobStatus::kStale;
}

int Runner::List() {
  int code = kExitOk;
  nlohmann::json report = nlohmann::json::array();
  std::vector<std::array<std::string, 4>> rows = {{"SPEC", "UPSTREAM", "OUTPUT", "STATUS"}};
  for (Job& job : jobs_) {
    if (!job.spec || (!job.errors.empty() && job.lookup.status == LookupResult::Status::kFound)) {
      code = std::max(code, Failed(job));
    } else if (job.lookup.status != LookupResult::Status::kFound) {
      job.status = JobStatus::kUpstreamNotFound;
    } else {
      job.status = DiskStatus(job);
    }
    // `--list` never fails because an upstream is absent; it only reports it.
    if (job.status == JobStatus::kUpstreamNotFound) job.errors.clear();
    report.push_back(JobJson(job));
    rows.push_back({job.spec_shown, job.spec ? job.spec->upstream : "-",
                    job.out_py.empty() ? "-" : Show(job.out_py), StatusName(job.status)});
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
    return code;
  }
  PrintTable(rows);
  return code;
}

int Runner::Pin() {
  int code = kExitOk;
  WriteCounts n;
  nlohmann::json report = nlohmann::json::array();
  for (Job& job : jobs_) {
    nlohmann::json j = JobJson(job);
    if (job.skipped) {
      ++n.skipped;
      job.status = JobStatus::kUpstreamNotFound;
      ReportSkipped(job, "");
    } else if (!job.errors.empty()) {
      ++n.failed;
      code = std::max(code, Failed(job));
    } else {
      code = std::max(code, PinJob(job, n, j));
    }
    j["status"] = StatusName(job.status);
    report.push_back(j);
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << "pin: " << jobs_.size() << " specs: " << n.written << " pinned, " << n.unchanged
              << " unchanged, " << n.skipped << " skipped, " << n.failed << " failed\n";
  }
  return code;
}

// `pin` for a generated job: records its contract in its pin file; the JSON entry gets the pin
// file and the count of new fingerprints. Returns the exit code (5 when it cannot be written).
int Runner::PinJob(Job& job, WriteCounts& n, nlohmann::json& j) {
  int code = kExitOk;
  fs::path path = PinsPathFor(job.spec_abs);
  PinFile pins = job.pins.value_or(PinFile{});
  size_t added = UpdatePins(pins, job.contract, job.lookup.file.version);
  std::string error;
  auto outcome =
      WriteIfChanged(path, FormatPins(pins, DisplayPath(job.spec_abs, config_.root)), &error);
  if (!outcome) {
    job.errors.push_back(ErrorAt(SourceLoc::InFile(Show(path)), error, {}, ErrorKind::kIo));
    code = Failed(job);
    ++n.failed;
  } else {
    bool wrote = *outcome == WriteOutcome::kWritten;
    wrote ? ++n.written : ++n.unchanged;
    job.status = wrote ? JobStatus::kPinned : JobStatus::kUnchanged;
    if (!opts_.json) {
      std::cout << (wrote ? "pinned " : "unchanged ") << Show(path) << " (" << job.contract.size()
                << " entries, " << added << " new fingerprints, " << job.spec->upstream << " "
                << job.lookup.file.version << ")\n";
    }
  }
  j = JobJson(job);
  j["pins"] = Show(path);
  j["new_fingerprints"] = added;
  return code;
}

}  // namespace patchgen::cli
