// Check stamps (check_stamp.h): written by generation for every spec it wrote, read by --check to
// answer "up to date" without loading a spec or parsing a module when no input, no output and
// nothing about the run changed (docs/cli.md, "--check without parsing").
#include <sys/stat.h>

#include "check_stamp.h"
#include "rewriter/sha256.h"
#include "runner.h"

namespace patchgen::cli {

// Everything about the run, besides the spec's own files, that generation depends on: the
// version and the very binary, the project config (roots, runtime, interpreter), -o and the
// source roots named on the command line or in PATCHGEN_SOURCE_PATH. "" when the binary cannot
// be identified: no stamp is then written or trusted. `may_write`: the binary's hash may be cached
// (generation; --check stays read-only).
std::string Runner::StampKey(bool may_write) const {
  std::string exe = ExecutableIdentity(CacheDir(), may_write);
  if (exe.empty()) return "";
  std::string k = std::string("patchgen ") + PATCHGEN_VERSION + "\n" + exe + "\n";
  k += config_.root.string() + "\n" + (config_.file ? config_.file->string() : "-") + "\n";
  k += config_.specs.string() + "\n" + OutputRoot().string() + "\n";
  k += config_.runtime + "\n" + config_.python + "\n";
  for (const fs::path& r : config_.source_roots) k += "root " + r.string() + "\n";
  for (const std::string& r : opts_.source_roots) k += "flag " + r + "\n";
  const char* env = std::getenv("PATCHGEN_SOURCE_PATH");
  k += std::string("env ") + (env ? env : "") + "\n" + cwd_.string() + "\n";
  return rewriter::Sha256Hex(k);
}

fs::path Runner::CacheDir() const { return config_.root / ".patchgen_cache"; }

fs::path Runner::StampDir() const { return CacheDir() / "check"; }

namespace {

// True when `p` was last modified before `start` by more than the file system's timestamp
// granularity: a file edited while the run read it gets no stamp.
bool UnchangedSince(const fs::path& p, fs::file_time_type start) {
  std::error_code ec;
  fs::file_time_type t = fs::last_write_time(p, ec);
  if (ec) return !fs::exists(p, ec);  // absent (a spec without a pin file) is a state too
  return t + std::chrono::seconds(1) < start;
}

}  // namespace

// The files a job's generation read besides the upstream module: the spec, its parents, patch
// files and the pin file.
std::vector<fs::path> Runner::JobInputs(const Job& job) const {
  std::vector<fs::path> paths = {job.spec_abs, PinsPathFor(job.spec_abs)};
  auto abs = [&](const std::string& shown) { return Unshow(shown); };
  for (const std::string& parent : job.spec->extends_chain) paths.push_back(abs(parent));
  auto add_body = [&](const spec::Body& b) {
    if (b.source == spec::Body::Source::kFile) paths.push_back(abs(b.origin.path));
  };
  for (const spec::Patch& p : job.spec->patches) add_body(p.body);
  for (const spec::Helper& h : job.spec->helpers) add_body(h.body);
  return paths;
}

// After generation wrote a job (or found its files unchanged): its stamp; after a failure, or when
// anything about it is not certain (warnings, a file changed during the run, a path that does not
// fit the format), no stamp. A stamp that cannot be written is left out silently: it is a cache.
void Runner::WriteStamp(const Job& job, const std::string& key) {
  fs::path path = StampPath(StampDir(), job.spec_abs, opts_.output_dir);
  std::optional<std::string> text = StampText(job, key);
  std::error_code ec;
  if (!text) {
    fs::remove(path, ec);  // an old stamp must not outlive a generation it does not describe
    return;
  }
  EnsureCacheFolder(CacheDir());
  std::string error;
  WriteIfChanged(path, *text, &error);
}

// The stamp of a job that was just written, or nullopt when its generation failed or anything
// about it is not certain.
std::optional<std::string> Runner::StampText(const Job& job, const std::string& key) const {
  if (key.empty() || !job.errors.empty() || !job.warnings.empty() || job.upstream == nullptr ||
      (job.status != JobStatus::kWritten && job.status != JobStatus::kUnchanged)) {
    return std::nullopt;
  }
  CheckStamp s{key,
               job.spec_abs,
               job.spec->upstream,
               job.lookup.file.file,
               job.lookup.file.rel_path,
               job.lookup.file.version,
               job.upstream->source_sha256,
               job.out_py,
               job.out_diff,
               rewriter::Sha256Hex(job.py_text),
               opts_.diff ? rewriter::Sha256Hex(job.diff_text) : "-",
               {}};
  for (const fs::path& p : JobInputs(job)) {
    std::optional<std::string> sha = FileSha(p);
    if (!sha || !UnchangedSince(p, run_start_)) return std::nullopt;
    s.inputs.emplace_back(*sha, p);
  }
  return FormatStamp(s);
}

namespace {

// The stamp of a job when it describes the run, the spec and the upstream file the lookup finds
// now; nullopt otherwise. (Serial: the lookup is not thread-safe.)
std::optional<CheckStamp> UsableStamp(const fs::path& path, const std::string& key,
                                      const fs::path& spec, SourceLookup& lookup) {
  std::optional<std::string> text = ReadFile(path);
  if (!text) return std::nullopt;
  std::optional<CheckStamp> s = ParseStamp(*text);
  if (!s || s->key != key || s->spec != spec) return std::nullopt;
  LookupResult found = lookup.Find(s->module);
  bool same = found.status == LookupResult::Status::kFound && found.file.file == s->upstream &&
              found.file.rel_path == s->upstream_rel && found.file.version == s->upstream_version;
  return same ? s : std::nullopt;
}

// Whether the files on disk still hash as the stamp recorded: inputs, upstream, the .py, and the
// .diff when --check would compare one.
bool FilesMatch(const CheckStamp& s, bool want_diff) {
  for (const auto& [sha, path] : s.inputs) {
    if (FileSha(path) != sha) return false;
  }
  if (FileSha(s.upstream) != s.upstream_sha || FileSha(s.out_py) != s.py_sha) return false;
  std::error_code ec;
  if (!want_diff && !fs::is_regular_file(s.out_diff, ec)) return true;
  return s.diff_sha != "-" && FileSha(s.out_diff) == s.diff_sha;
}

// No two stamps write one file and no stamp writes a file another one reads (what CheckOutputs
// would refuse), by file identity.
bool OutputsDistinct(const std::vector<CheckStamp>& stamps) {
  std::set<std::string> outs, ins;
  for (const CheckStamp& s : stamps) {
    for (const fs::path& o : {s.out_py, s.out_diff}) {
      if (!outs.insert(FileIdentity(o)).second) return false;
    }
    ins.insert(FileIdentity(s.upstream));
    for (const auto& [sha, path] : s.inputs) ins.insert(FileIdentity(path));
  }
  for (const std::string& o : outs) {
    if (ins.count(o)) return false;
  }
  return true;
}

}  // namespace

// --check without parsing: when every spec of the run has a stamp that still matches, each is up
// to date and the usual report (orphans included) is printed from the stamps. nullopt when any
// one does not: the caller then takes the full path for every spec.
std::optional<int> Runner::QuickCheck() {
  const std::string key = StampKey(/*may_write=*/false);
  if (key.empty() || opts_.json || jobs_.empty()) return std::nullopt;
  SourceLookup lookup = MakeSourceLookup();
  std::vector<CheckStamp> stamps;
  for (const Job& job : jobs_) {
    fs::path path = StampPath(StampDir(), job.spec_abs, opts_.output_dir);
    std::optional<CheckStamp> s = UsableStamp(path, key, job.spec_abs, lookup);
    if (!s) return std::nullopt;
    stamps.push_back(std::move(*s));
  }
  std::vector<char> match(stamps.size(), 0);
  ParallelFor(stamps.size(), opts_.jobs,
              [&](size_t i) { match[i] = FilesMatch(stamps[i], opts_.diff); });
  if (std::count(match.begin(), match.end(), 0) || !OutputsDistinct(stamps)) return std::nullopt;
  // A --source-root that holds none of the specs' packages fails the full path: take it.
  std::set<std::string> packages;
  for (const CheckStamp& s : stamps) packages.insert(TopPackage(s.module));
  if (!RootsHoldAPackage(GivenRoots(RootSet::kFlags), packages)) return std::nullopt;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    jobs_[i].fresh = true;
    jobs_[i].out_py = stamps[i].out_py;
    jobs_[i].out_diff = stamps[i].out_diff;
  }
  if (opts_.verbose) {
    std::cout << "up to date by their check stamps (nothing parsed): " << jobs_.size()
              << (jobs_.size() == 1 ? " spec" : " specs") << "\n";
  }
  return Check();
}

}  // namespace patchgen::cli
