// Check stamps (modes.h; their format: stamp_file.h): written by generation for every spec it
// wrote, read by --check to answer "up to date" without loading a spec or parsing a module when no
// input, no output and nothing about the run changed (docs/cli.md, "--check without parsing").
#include <set>

#include "modes.h"
#include "parallel.h"
#include "rewriter/sha256.h"
#include "source_roots.h"
#include "stamp_file.h"

namespace patchgen::cli {

std::string StampKey(const RunContext& ctx, bool may_write) {
  std::string exe = ExecutableIdentity(ctx.CacheDir(), may_write);
  if (exe.empty()) return "";
  const ProjectConfig& config = ctx.config;
  std::string k = std::string("patchgen ") + PATCHGEN_VERSION + "\n" + exe + "\n";
  k += config.root.string() + "\n" + (config.file ? config.file->string() : "-") + "\n";
  k += config.specs.string() + "\n" + ctx.OutputRoot().string() + "\n";
  k += config.runtime + "\n" + config.python + "\n";
  for (const fs::path& r : config.source_roots) k += "root " + r.string() + "\n";
  for (const std::string& r : ctx.opts.source_roots) k += "flag " + r + "\n";
  const char* env = std::getenv("PATCHGEN_SOURCE_PATH");
  k += std::string("env ") + (env ? env : "") + "\n" + ctx.cwd.string() + "\n";
  return rewriter::Sha256Hex(k);
}

namespace {

fs::path StampDir(const RunContext& ctx) { return ctx.CacheDir() / "check"; }

// True when `p` was last modified before `start` by more than the file system's timestamp
// granularity: a file edited while the run read it gets no stamp.
bool UnchangedSince(const fs::path& p, fs::file_time_type start) {
  std::error_code ec;
  fs::file_time_type t = fs::last_write_time(p, ec);
  if (ec) return !fs::exists(p, ec);  // absent (a spec without a pin file) is a state too
  return t + std::chrono::seconds(1) < start;
}

// The files a spec's generation read besides the upstream module: the spec, its parents, patch
// files and the pin file.
std::vector<fs::path> SpecInputs(const RunContext& ctx, const SpecRecord& rec) {
  std::vector<fs::path> paths = {rec.file.abs, PinsPathFor(rec.file.abs)};
  for (const std::string& parent : rec.spec()->extends_chain) paths.push_back(ctx.Unshow(parent));
  auto add_body = [&](const spec::Body& b) {
    if (b.source == spec::Body::Source::kFile) paths.push_back(ctx.Unshow(b.origin.path));
  };
  for (const spec::Patch& p : rec.spec()->patches) add_body(p.body);
  for (const spec::Helper& h : rec.spec()->helpers) add_body(h.body);
  return paths;
}

// The stamp of a spec that was just written (or found unchanged), or nullopt when its generation
// failed or anything about it is not certain (warnings, a file changed during the run).
std::optional<std::string> StampText(const RunContext& ctx, const SpecRecord& rec,
                                     const SpecOutcome& o, const std::string& key) {
  if (key.empty() || !o.errors.empty() || !rec.gen.warnings.empty() || rec.parsed == nullptr ||
      (o.status != JobStatus::kWritten && o.status != JobStatus::kUnchanged)) {
    return std::nullopt;
  }
  const UpstreamFile& up = rec.upstream.lookup.file;
  CheckStamp s{key,
               rec.file.abs,
               rec.spec()->upstream,
               up.file,
               up.rel_path,
               up.version,
               rec.parsed->source_sha256,
               rec.out.py,
               rec.out.diff,
               rewriter::Sha256Hex(rec.gen.py_text),
               ctx.opts.diff ? rewriter::Sha256Hex(rec.gen.diff_text) : "-",
               {}};
  for (const fs::path& p : SpecInputs(ctx, rec)) {
    std::optional<std::string> sha = FileSha(p);
    if (!sha || !UnchangedSince(p, ctx.start)) return std::nullopt;
    s.inputs.emplace_back(*sha, p);
  }
  return FormatStamp(s);
}

// The stamp of a spec when it describes the run, the spec and the upstream file the lookup finds
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

// No two stamps write one file and no stamp writes a file another one reads (what OutputClashes
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

// The usable stamp of every spec, or nullopt when one has none.
std::optional<std::vector<CheckStamp>> UsableStamps(const RunContext& ctx,
                                                    const std::vector<SpecRecord>& specs) {
  const std::string key = StampKey(ctx, /*may_write=*/false);
  if (key.empty() || ctx.opts.json || specs.empty()) return std::nullopt;
  SourceLookup lookup = MakeSourceLookup(ctx);
  std::vector<CheckStamp> stamps;
  for (const SpecRecord& rec : specs) {
    fs::path path = StampPath(StampDir(ctx), rec.file.abs, ctx.opts.output_dir);
    std::optional<CheckStamp> s = UsableStamp(path, key, rec.file.abs, lookup);
    if (!s) return std::nullopt;
    stamps.push_back(std::move(*s));
  }
  return stamps;
}

}  // namespace

void WriteStamp(const RunContext& ctx, const SpecRecord& rec, const SpecOutcome& outcome,
                const std::string& key) {
  fs::path path = StampPath(StampDir(ctx), rec.file.abs, ctx.opts.output_dir);
  std::optional<std::string> text = StampText(ctx, rec, outcome, key);
  std::error_code ec;
  if (!text) {
    fs::remove(path, ec);  // an old stamp must not outlive a generation it does not describe
    return;
  }
  EnsureCacheFolder(ctx.CacheDir());
  std::string error;
  WriteIfChanged(path, *text, &error);
}

std::optional<std::vector<OutputPaths>> QuickCheck(const RunContext& ctx,
                                                   const std::vector<SpecRecord>& specs) {
  std::optional<std::vector<CheckStamp>> stamps = UsableStamps(ctx, specs);
  if (!stamps) return std::nullopt;
  std::vector<char> match(stamps->size(), 0);
  ParallelFor(stamps->size(), ctx.opts.jobs,
              [&](size_t i) { match[i] = FilesMatch((*stamps)[i], ctx.opts.diff); });
  if (std::count(match.begin(), match.end(), 0) || !OutputsDistinct(*stamps)) return std::nullopt;
  // A --source-root that holds none of the specs' packages fails the full path: take it.
  std::set<std::string> packages;
  for (const CheckStamp& s : *stamps) packages.insert(TopPackage(s.module));
  if (!RootsHoldAPackage(GivenRoots(ctx, RootSet::kFlags), packages)) return std::nullopt;
  std::vector<OutputPaths> outs;
  for (const CheckStamp& s : *stamps) outs.push_back({s.out_py, s.out_diff});
  return outs;
}

}  // namespace patchgen::cli
