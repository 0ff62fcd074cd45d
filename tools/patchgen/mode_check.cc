// --check (modes.h): every generated spec against its files on disk; what drifted printed as
// stale or missing with a diff (written with --fix); then the orphaned outputs (orphans.cc).
#include <absl/strings/str_cat.h>

#include <algorithm>

#include "diff/unified_diff.h"
#include "modes.h"
#include "report.h"
#include "rewriter/header.h"

namespace patchgen::cli {
namespace {

using OutputFiles = std::vector<std::pair<fs::path, const std::string*>>;

/// What `path` holds on disk against the bytes generated for it.
struct Drift {
  bool differs = false;
  bool missing = false;  ///< It does not exist.
};

/// `path` against `bytes`; when it differs (and not --json) prints it as stale or missing, the
/// upstream change since generation, and the diff.
Drift ShowDrift(const RunContext& ctx, const SpecRecord& rec, const fs::path& path,
                const std::string& bytes, Printout& printed) {
  auto on_disk = ReadFile(path);
  if (on_disk && *on_disk == bytes) return {};
  Drift drift{true, !on_disk};
  if (ctx.opts.json) return drift;
  std::string shown = ctx.Show(path);
  printed.Out((on_disk ? "stale: " : "missing: ") + shown + " (from " + rec.file.shown + ")\n");
  if (on_disk && path == rec.out.py) {
    rewriter::HeaderUpstream old = rewriter::ReadHeaderUpstream(*on_disk);
    if (!old.sha256.empty() && old.sha256 != rec.gen.upstream_sha) {
      printed.Out("upstream changed since generation: " + Fingerprint(old.version, old.sha256) +
                  " -> " + Fingerprint(rec.upstream.lookup.file.version, rec.gen.upstream_sha) +
                  "\n");
    }
  }
  printed.Out(diff::UnifiedDiff(on_disk.value_or(""), bytes, "a/" + shown, "b/" + shown));
  return drift;
}

/// --check --fix of a drifted spec: writes its files.
SpecOutcome FixSpec(const RunContext& ctx, const SpecRecord& rec, const OutputFiles& files,
                    Printout& printed) {
  SpecOutcome o = OutcomeOf(rec, JobStatus::kFixed);
  for (const auto& [path, bytes] : files) {
    std::string error;
    if (!WriteIfChanged(path, *bytes, &error, ctx.OutputRoot())) {
      o.errors.push_back(ErrorAt(SourceLoc::InFile(ctx.Show(path)), error, {}, ErrorKind::kIo));
    } else {
      RecordWritten(ctx, path, *bytes);
    }
  }
  if (!o.errors.empty()) {
    o.status = JobStatus::kError;
    printed.Diagnostics(o.errors);
    return o;
  }
  if (!ctx.opts.json) printed.Out("fixed: " + ctx.Show(rec.out.py) + "\n");
  return o;
}

/// A generated spec against its files on disk: up to date, stale or missing, or fixed (--fix).
SpecOutcome CheckSpec(const RunContext& ctx, const SpecRecord& rec, Printout& printed) {
  printed.Diagnostics(rec.gen.warnings);
  std::error_code ec;
  OutputFiles files = {{rec.out.py, &rec.gen.py_text}};
  if (ctx.opts.diff || fs::is_regular_file(rec.out.diff, ec))
    files.push_back({rec.out.diff, &rec.gen.diff_text});
  bool drift = false;
  bool py_missing = false;
  for (const auto& [path, bytes] : files) {
    Drift d = ShowDrift(ctx, rec, path, *bytes, printed);
    drift |= d.differs;
    py_missing |= d.missing && path == rec.out.py;
  }
  if (!drift) return OutcomeOf(rec, JobStatus::kUpToDate);
  if (ctx.opts.fix) return FixSpec(ctx, rec, files, printed);
  return OutcomeOf(rec, py_missing ? JobStatus::kMissing : JobStatus::kStale);
}

SpecOutcome CheckOutcome(const RunContext& ctx, const SpecRecord& rec, bool fresh,
                         Printout& printed) {
  if (fresh) return OutcomeOf(rec, JobStatus::kUpToDate);  // its stamp matched (check_stamps.cc)
  if (rec.skipped()) return Skipped(ctx, rec, " on any source root", printed);
  if (!rec.Errors().empty()) return Failed(rec, printed);
  return CheckSpec(ctx, rec, printed);
}

/// `check: C up to date, S stale, [X fixed, ]K skipped, F failed[, orphans]`.
std::string Summary(const RunContext& ctx, const std::vector<SpecOutcome>& specs,
                    const OrphansFound& orphans) {
  std::string s =
      absl::StrCat("check: ", CountOf(specs, {JobStatus::kUpToDate}), " up to date, ",
                   CountOf(specs, {JobStatus::kStale, JobStatus::kMissing}), " stale, ");
  if (ctx.opts.fix) absl::StrAppend(&s, CountOf(specs, {JobStatus::kFixed}), " fixed, ");
  absl::StrAppend(&s, CountOf(specs, {JobStatus::kUpstreamNotFound}), " skipped, ",
                  CountOf(specs, {JobStatus::kError}), " failed");
  const size_t found = orphans.found.size(), kept = orphans.kept.size();
  if (found && !ctx.opts.fix) absl::StrAppend(&s, ", ", found, " orphaned");
  if (found && ctx.opts.fix) {
    absl::StrAppend(&s, ", ", found - kept, " orphaned removed");
    if (kept) absl::StrAppend(&s, ", ", kept, " orphaned kept");
  }
  return s + "\n";
}

}  // namespace

RunResult CheckMode(const RunContext& ctx, const std::vector<SpecRecord>& specs, bool fresh) {
  RunResult r;
  r.mode = Mode::kCheck;
  if (fresh && ctx.opts.verbose) {
    r.printed.Out(absl::StrCat("up to date by their check stamps (nothing parsed): ", specs.size(),
                               specs.size() == 1 ? " spec\n" : " specs\n"));
  }
  nlohmann::json report = nlohmann::json::array();
  for (const SpecRecord& rec : specs) {
    SpecOutcome o = CheckOutcome(ctx, rec, fresh, r.printed);
    report.push_back(SpecJson(ctx, rec, o));
    r.specs.push_back(std::move(o));
  }
  OrphansFound orphans = CheckOrphans(ctx, specs, fresh);
  r.orphans_left = orphans.left;
  r.errors = orphans.errors;
  r.printed.Append(std::move(orphans.printed));
  if (!ctx.opts.json) {
    r.printed.Out(Summary(ctx, r.specs, orphans));
    return r;
  }
  r.report = SpecsReport(std::move(report));
  (*r.report)["orphaned"] = orphans.found;
  if (!orphans.kept.empty()) (*r.report)["orphaned_kept"] = orphans.kept;
  return r;
}

}  // namespace patchgen::cli
