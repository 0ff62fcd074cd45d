// The per-spec pipeline behind the patchgen command line (cli.cc): the options, a spec's Job, the
// Runner that takes every job through the stages (runner_stages.cc) and one mode (runner_modes.cc,
// runner_audit.cc), and the helpers they share (runner_util.cc). Internal to tools/patchgen.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "audit.h"
#include "base/line_index.h"
#include "cli.h"
#include "diff/unified_diff.h"
#include "files.h"
#include "parser/index_printer.h"
#include "parser/py_module.h"
#include "pins.h"
#include "project_config.h"
#include "rewriter/generate.h"
#include "rewriter/header.h"
#include "source_lookup.h"
#include "spec/spec_loader.h"
#include "validate.h"

namespace patchgen::cli {

namespace fs = std::filesystem;

/// Exit codes (docs/cli.md, "Exit codes"). When specs fail differently the run exits with the
/// largest; ExitCodeOf maps a diagnostic's kind to 3, 4, 5 or 70.
enum ExitCode : int {
  kExitOk = 0,
  kExitDrift = 1,
  kExitUsage = 2,
  kExitSpec = 3,
  kExitUpstream = 4,
  kExitIo = 5,
  kExitInternal = 70,
};

/// What one run of patchgen does (Options::mode()).
enum class Mode { kGenerate, kCheck, kList, kValidate, kPin, kAudit };

/// A job's outcome as reports print it (StatusName): text lines, `--list`'s table, `--json`.
enum class JobStatus {
  kPending,  ///< not decided yet (prints "")
  kWritten,
  kUnchanged,
  kWouldWrite,
  kUpToDate,
  kStale,
  kFixed,
  kMissing,
  kUpstreamNotFound,
  kValid,
  kInvalid,
  kError,
  kPinned,
  kNeedsAttention,
  kOk,
};
const char* StatusName(JobStatus status);

int ExitCodeOf(ErrorKind kind);
const char* KindName(ErrorKind kind);

/// Runs fn(i) for i in [0, n) on up to `jobs` threads.
template <class F>
void ParallelFor(size_t n, unsigned jobs, F fn) {
  unsigned threads = std::max(1u, std::min<unsigned>(jobs, static_cast<unsigned>(n)));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

/// The indices [0, n) by decreasing `size(i)` (ties in index order): the order in which to hand
/// work of uneven sizes to ParallelFor, so that no worker starts a large item last.
template <class Size>
std::vector<size_t> LargestFirst(size_t n, Size size) {
  std::vector<uintmax_t> sizes(n);
  for (size_t i = 0; i < n; ++i) sizes[i] = size(i);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  return order;
}

struct Options {
  std::vector<std::string> specs;
  bool all = false;
  bool diff = false;
  bool dry_run = false;
  bool verbose = false;
  bool json = false;
  bool list = false;
  bool check = false;
  bool fix = false;
  bool validate = false;
  std::string output_dir;
  unsigned jobs = 0;
  std::vector<std::string> source_roots;
  // `patchgen pin` / `patchgen audit`
  bool pin = false;
  bool audit = false;
  std::vector<std::string> old_roots;  ///< audit --source-root-old
  // `patchgen index`
  std::vector<std::string> index_files;
  bool index_json = false;

  /// The mode the flags select (cli.cc has refused combinations that select two).
  Mode mode() const {
    if (pin) return Mode::kPin;
    if (audit) return Mode::kAudit;
    if (check) return Mode::kCheck;
    if (list) return Mode::kList;
    return validate ? Mode::kValidate : Mode::kGenerate;
  }
};

/// A parsed upstream file, shared by every spec that names it.
struct Upstream {
  std::string source;  ///< As read (a byte order mark included), for the .diff.
  bool crlf = false;   ///< Every line ends with CRLF: so does the generated file.
  std::unique_ptr<parser::PyModule> module;
  std::string source_sha256;  ///< Of `source` (check stamps).
  std::string
      module_sha256;  ///< Of module->source() (the bytes patched, a byte order mark left out).
  std::vector<Diagnostic> errors;
};

/// One spec's journey through the stages.
struct Job {
  fs::path spec_abs;
  std::string spec_shown;   // as printed and given to the spec loader (relative to shown_base_)
  bool discovered = false;  // found by --all / bare --check rather than named
  std::optional<spec::PatchSpec> spec;
  /// A spec that loaded with errors in some entries: the rest of it, generated only to report the
  /// errors of those entries too (all errors in one round); never written. `spec` is then empty.
  std::optional<spec::PatchSpec> partial_spec;
  bool entries_dropped = false;  // partial_spec lost entries to their errors
  std::vector<Diagnostic> errors;
  LookupResult lookup;
  bool skipped = false;  // upstream package absent on a discovered spec
  Upstream* upstream = nullptr;
  fs::path out_py, out_diff;
  std::string py_text, diff_text;
  size_t patches = 0;
  std::string upstream_sha;
  std::vector<rewriter::ContractPin> contract;          // what the applied entries rely on upstream
  std::vector<rewriter::SkippedEntry> skipped_entries;  // conditional entries left out
  std::optional<PinFile> pins;                          // the spec's pin file, when it has one
  std::vector<PinFinding> pin_findings;    // contract entries that differ from the pins
  std::vector<Diagnostic> warnings;        // entries without a pin
  JobStatus status = JobStatus::kPending;  // final, for reports
  bool fresh = false;  // --check: up to date by its stamp, nothing loaded (runner_stamps.cc)
};

int WorstExit(const std::vector<Diagnostic>& errors);
void PrintDiagnostics(const std::vector<Diagnostic>& errors);
/// JSON as printed by --json: valid UTF-8 whatever the bytes of paths, names and messages (a byte
/// that is not UTF-8 prints as U+FFFD, like Python's errors="replace").
std::string JsonText(const nlohmann::json& j);
nlohmann::json DiagnosticJson(const Diagnostic& d);
std::string Short(const std::string& sha);
/// "1.0.0 (sha256 0123456789ab)", leaving out what is unknown.
std::string Fingerprint(const std::string& version, const std::string& sha);

/// Spec files under `root`: *.yaml and *.yml, recursively, sorted by their '/'-separated relative
/// path. Nothing is skipped silently: a folder that cannot be read and a symbolic link to a folder
/// (not followed: it could lead out of the tree or into a loop) are errors in `errors`, and the
/// walk goes on with the rest. A link to a file is a spec like any other.
std::vector<fs::path> DiscoverSpecs(const fs::path& root, const fs::path& cwd,
                                    std::vector<Diagnostic>& errors);

/// The first thing in a generated module that CPython rejects in any source file whatever its
/// grammar: a byte sequence that is not UTF-8 (no coding cookie survives the generated header), a
/// NUL byte, or U+FEFF (a byte order mark inside the file, e.g. from a patch file saved with one).
/// Returns its byte offset and what it is.
std::optional<std::pair<uint32_t, std::string>> FirstSourceBlocker(std::string_view text);

/// What identifies a file on disk: its device and inode when it exists (so symlinks and hard links
/// to one file compare equal), otherwise its normalised absolute path.
std::string FileIdentity(const fs::path& p);

/// Errors for entries whose upstream target (or a class around it) is defined more than once in one
/// scope (PyModule::Redefinitions): Python keeps the last definition, the splice would patch the
/// first. Located at the spec entry, naming every definition.
std::vector<Diagnostic> AmbiguousTargets(const std::vector<rewriter::ContractPin>& contract,
                                         const parser::PyModule& upstream,
                                         const std::string& shown);

/// A job's output files with the bytes generated for them: the .py, and the .diff when it is made.
using OutputFiles = std::vector<std::pair<fs::path, const std::string*>>;

/// What generate and `--check` count for their summary lines.
struct WriteCounts {
  size_t written = 0, unchanged = 0, skipped = 0, failed = 0;
};
struct CheckCounts {
  size_t clean = 0, stale = 0, skipped = 0, failed = 0, fixed = 0;
};

/// An output under the output root that no spec of the run produces but that carries patchgen's
/// header (runner_check.cc), as --check found it.
struct Orphan {
  fs::path path;    ///< As walked: under the output root, no symbolic link below it.
  std::string sha;  ///< sha256 of its bytes when it was found.
  fs::path spec;    ///< The spec its header names (absolute), empty when none.
};

/// A source root given to the run and where it was given: "--source-root", "PATCHGEN_SOURCE_PATH",
/// "--source-root-old", or "" for `source_roots` of the project config.
struct GivenRoot {
  fs::path path;  ///< Absolute.
  std::string origin;
};
/// Which of the given source roots: the --source-root flags; flags, PATCHGEN_SOURCE_PATH and the
/// config's (--check); flags and --source-root-old (audit).
enum class RootSet { kFlags, kAll, kAudit };
/// What is wrong with a source root (Runner::RootHelp): it does not exist; it holds none of the
/// specs' packages; it holds none while a spec is skipped for its package.
enum class RootProblem { kMissing, kNoPackage, kSkip };
/// Whether every one of `roots` that is a folder holds at least one of `packages` (a folder
/// `<package>/` or a module `<package>.py`), as the upstream lookup would see it.
bool RootsHoldAPackage(const std::vector<GivenRoot>& roots, const std::set<std::string>& packages);

/// `audit --source-root-old`: each spec's old upstream file and what it generated there.
struct OldUpstreams {
  std::map<size_t, rewriter::GenerateResult> results;                    ///< By job index.
  std::map<size_t, std::pair<UpstreamFile, parser::PyModule*>> modules;  ///< By job index.
  std::map<fs::path, std::unique_ptr<parser::PyModule>> parsed;          ///< Owns the modules.
};
/// What `audit` gathers over its specs.
struct AuditTally {
  int code = kExitOk;
  size_t attention = 0, clean = 0, skipped = 0;
  nlohmann::json report = nlohmann::json::array();
  std::string text;
};

class Runner {
 public:
  Runner(Options opts, fs::path cwd, ProjectConfig config)
      : opts_(std::move(opts)),
        cwd_(std::move(cwd)),
        config_(std::move(config)),
        shown_base_(cwd_) {}

  int Main();

 private:
  /// A path as messages print it: relative to the project root (shown_base_).
  std::string Show(const fs::path& p) const { return DisplayPath(p, shown_base_); }
  /// The absolute path of a path as printed (a spec's `extends` parent or patch file).
  fs::path Unshow(const std::string& shown) const {
    fs::path p(shown);
    return (p.is_absolute() ? p : shown_base_ / p).lexically_normal();
  }
  bool WorkFromProjectRoot();
  /// Where generated files go: -o DIR, else the configured output root.
  fs::path OutputRoot() const {
    if (opts_.output_dir.empty()) return config_.output;
    fs::path dir(opts_.output_dir);
    return (dir.is_absolute() ? dir : cwd_ / dir).lexically_normal();
  }
  bool CollectSpecs();
  void LoadSpecs();
  SourceLookup MakeSourceLookup() const;
  void FindUpstreams();
  void ParseUpstreams();
  void GenerateAll();
  void PlaceOutputs();
  void GenerateJob(Job& job);
  void GeneratePartial(Job& job);
  bool AcceptGenerated(Job& job, const rewriter::GenerateResult& result);
  bool MatchPins(Job& job);
  void CheckOutputs();
  std::map<std::string, std::string> InputFiles() const;
  std::vector<GivenRoot> GivenRoots(RootSet which) const;
  SourceLoc ConfigRootLoc(const fs::path& root) const;
  std::string RootHelp(const GivenRoot& root, RootProblem problem) const;
  Diagnostic RootError(const GivenRoot& root, const std::string& what,
                       const std::string& help) const;
  bool RootsExist(RootSet which) const;
  std::set<std::string> SpecPackages() const;
  bool RootsHoldPackages(RootSet which, RootProblem problem) const;
  bool RootsHoldTheSpecs(Mode mode) const;
  bool SkipsExplained() const;
  int Validate();
  int Generate();
  int WriteJob(Job& job, WriteCounts& n);
  std::optional<bool> WriteOutput(Job& job, const fs::path& path, const std::string& bytes);
  int Check();
  std::optional<int> QuickCheck();
  std::string StampKey(bool may_write) const;
  fs::path CacheDir() const;
  fs::path StampDir() const;
  std::vector<fs::path> JobInputs(const Job& job) const;
  std::optional<std::string> StampText(const Job& job, const std::string& key) const;
  void WriteStamp(const Job& job, const std::string& key);
  int CheckJob(Job& job, CheckCounts& n);
  bool ShowDrift(const Job& job, const fs::path& path, const std::string& bytes,
                 bool& py_missing) const;
  int FixJob(Job& job, const OutputFiles& files, CheckCounts& n);
  void RecordWritten(const fs::path& path, const std::string& bytes) const;
  std::vector<Orphan> FindOrphans() const;
  bool RunChecks(const fs::path& spec) const;
  std::optional<std::string> KeepOrphan(const Orphan& o, bool reread) const;
  int CheckOrphans(nlohmann::json& found, nlohmann::json& kept);
  int HandleOrphan(const Orphan& o, nlohmann::json& kept);
  int List();
  JobStatus DiskStatus(const Job& job) const;
  int Pin();
  int PinJob(Job& job, WriteCounts& n, nlohmann::json& j);
  int Audit();
  OldUpstreams LoadOldUpstreams() const;
  void AuditJob(size_t i, const OldUpstreams& olds, AuditTally& t);
  nlohmann::json JobJson(const Job& job) const;
  void Fail(Job& job, std::vector<Diagnostic> errors) {
    for (auto& d : errors) job.errors.push_back(std::move(d));
  }
  int Failed(Job& job) const;
  void ReportSkipped(const Job& job, const char* why) const;
  bool NeedDiff(const Job& job) const;

  Options opts_;
  fs::path cwd_;  // where patchgen was started: command-line paths are relative to it
  ProjectConfig config_;
  fs::path shown_base_;  // the project root, or cwd_ when patchgen cannot work from there
  std::vector<Job> jobs_;
  bool discovery_failed_ = false;
  std::map<fs::path, std::unique_ptr<Upstream>> upstreams_;
  fs::file_time_type run_start_ = fs::file_time_type::clock::now();  // check stamps
};

}  // namespace patchgen::cli
