// Generate (modes.h): each generated spec's .py (and with --diff its .diff) written when its bytes
// change, or with --dry-run only compared; its check stamp written after.
#include <absl/strings/str_cat.h>

#include "modes.h"
#include "report.h"

namespace patchgen::cli {
namespace {

/// What writing one output did: whether its bytes changed, or the error that stopped it.
struct Written {
  bool changed = false;
  std::optional<Diagnostic> error;
};

/// Writes `bytes` to `path` when they differ (with --dry-run only compares).
Written WriteOutput(const RunContext& ctx, const fs::path& path, const std::string& bytes) {
  if (ctx.opts.dry_run) {
    auto existing = ReadFile(path);
    return {!(existing && *existing == bytes), std::nullopt};
  }
  std::string error;
  auto outcome = WriteIfChanged(path, bytes, &error, ctx.OutputRoot());
  if (!outcome)
    return {false, ErrorAt(SourceLoc::InFile(ctx.Show(path)), error, {}, ErrorKind::kIo)};
  RecordWritten(ctx, path, bytes);
  return {*outcome == WriteOutcome::kWritten, std::nullopt};
}

/// `wrote PATH (N bytes, P patches)` (`would write` with --dry-run; `unchanged` with -v only).
std::string OutputLine(const RunContext& ctx, const SpecRecord& rec, const fs::path& path,
                       const std::string& bytes, bool changed) {
  if (ctx.opts.json || (!changed && !ctx.opts.verbose)) return "";
  std::string verb = !changed ? "unchanged" : ctx.opts.dry_run ? "would write" : "wrote";
  std::string line = absl::StrCat(verb, " ", ctx.Show(path), " (", bytes.size(), " bytes");
  if (path == rec.out.py) {
    size_t n = rec.gen.patches;
    absl::StrAppend(&line, ", ", n, n == 1 ? " patch" : " patches");
  }
  return line + ")\n";
}

/// -v: where the spec's upstream came from and each conditional entry left out.
std::string VerboseLines(const RunContext& ctx, const SpecRecord& rec) {
  const UpstreamFile& up = rec.upstream.lookup.file;
  std::string text = "  " + rec.file.shown + ": " + rec.spec()->upstream + " " + up.version +
                     " from " + ctx.Show(up.file) + "\n";
  for (const rewriter::SkippedEntry& sk : rec.gen.skipped_entries) {
    text +=
        "  skipped " + sk.kind + " " + sk.target + " (" + sk.loc.PathLine() + "): " + sk.why + "\n";
  }
  return text;
}

/// Writes (or, with --dry-run, compares) a generated spec's files.
SpecOutcome WriteSpec(const RunContext& ctx, const SpecRecord& rec, Printout& printed) {
  printed.Diagnostics(rec.gen.warnings);
  std::vector<std::pair<fs::path, const std::string*>> files = {{rec.out.py, &rec.gen.py_text}};
  if (ctx.opts.diff) files.push_back({rec.out.diff, &rec.gen.diff_text});
  bool any_written = false;
  for (const auto& [path, bytes] : files) {
    Written w = WriteOutput(ctx, path, *bytes);
    if (w.error) {
      printed.Diagnostics({*w.error});
      return {JobStatus::kError, {*w.error}, true};
    }
    any_written |= w.changed;
    printed.Out(OutputLine(ctx, rec, path, *bytes, w.changed));
  }
  JobStatus status = !any_written       ? JobStatus::kUnchanged
                     : ctx.opts.dry_run ? JobStatus::kWouldWrite
                                        : JobStatus::kWritten;
  if (ctx.opts.verbose && !ctx.opts.json) printed.Out(VerboseLines(ctx, rec));
  return OutcomeOf(rec, status);
}

SpecOutcome GenerateOutcome(const RunContext& ctx, const SpecRecord& rec, Printout& printed) {
  if (rec.skipped()) return Skipped(ctx, rec, " (upstream not found)", printed);
  if (!rec.Errors().empty()) return Failed(rec, printed);
  return WriteSpec(ctx, rec, printed);
}

/// `N specs: W written, U unchanged, S skipped, F failed` (`to write` with --dry-run).
std::string Summary(const RunContext& ctx, const std::vector<SpecOutcome>& specs) {
  return absl::StrCat(
      specs.size(), " specs: ", CountOf(specs, {JobStatus::kWritten, JobStatus::kWouldWrite}),
      ctx.opts.dry_run ? " to write, " : " written, ", CountOf(specs, {JobStatus::kUnchanged}),
      " unchanged, ", CountOf(specs, {JobStatus::kUpstreamNotFound}), " skipped, ",
      CountOf(specs, {JobStatus::kError}), " failed\n");
}

}  // namespace

RunResult GenerateMode(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  RunResult r;
  r.mode = Mode::kGenerate;
  nlohmann::json report = nlohmann::json::array();
  const std::string stamp_key = ctx.opts.dry_run ? "" : StampKey(ctx, /*may_write=*/true);
  for (const SpecRecord& rec : specs) {
    SpecOutcome o = GenerateOutcome(ctx, rec, r.printed);
    if (!ctx.opts.dry_run) WriteStamp(ctx, rec, o, stamp_key);
    report.push_back(SpecJson(ctx, rec, o));
    r.specs.push_back(std::move(o));
  }
  if (ctx.opts.json) {
    r.report = SpecsReport(std::move(report));
  } else {
    r.printed.Out(Summary(ctx, r.specs));
  }
  return r;
}

}  // namespace patchgen::cli
