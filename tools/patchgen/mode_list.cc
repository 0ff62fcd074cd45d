// --list (modes.h): every spec, its upstream, output and status against the files on disk, as a
// table (or --json). It never fails because an upstream is absent; it only reports it.
#include <array>

#include "modes.h"
#include "report.h"

namespace patchgen::cli {
namespace {

/// The rows of --list as columns two spaces apart (the last column not padded).
std::string Table(const std::vector<std::array<std::string, 4>>& rows) {
  std::array<size_t, 3> width{};
  for (const auto& r : rows) {
    for (size_t c = 0; c < 3; ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string text;
  for (const auto& r : rows) {
    for (size_t c = 0; c < 3; ++c) text += r[c] + std::string(width[c] - r[c].size() + 2, ' ');
    text += r[3] + "\n";
  }
  return text;
}

/// A generated spec's .py (and .diff when there is one) against the files on disk.
JobStatus DiskStatus(const SpecRecord& rec) {
  auto py = ReadFile(rec.out.py);
  std::error_code ec;
  bool diff_stale =
      fs::is_regular_file(rec.out.diff, ec) && ReadFile(rec.out.diff) != rec.gen.diff_text;
  if (!py) return JobStatus::kMissing;
  return *py == rec.gen.py_text && !diff_stale ? JobStatus::kUpToDate : JobStatus::kStale;
}

SpecOutcome ListOutcome(const SpecRecord& rec, Printout& printed) {
  if (!rec.spec() || (!rec.Errors().empty() && rec.found())) return Failed(rec, printed);
  if (!rec.found()) return {JobStatus::kUpstreamNotFound, {}, true};  // reported, not failed
  return OutcomeOf(rec, DiskStatus(rec));
}

}  // namespace

RunResult ListMode(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  RunResult r;
  r.mode = Mode::kList;
  nlohmann::json report = nlohmann::json::array();
  std::vector<std::array<std::string, 4>> rows = {{"SPEC", "UPSTREAM", "OUTPUT", "STATUS"}};
  for (const SpecRecord& rec : specs) {
    SpecOutcome o = ListOutcome(rec, r.printed);
    report.push_back(SpecJson(ctx, rec, o));
    rows.push_back({rec.file.shown, rec.spec() ? rec.spec()->upstream : "-",
                    rec.out.py.empty() ? "-" : ctx.Show(rec.out.py), StatusName(o.status)});
    r.specs.push_back(std::move(o));
  }
  if (ctx.opts.json) {
    r.report = SpecsReport(std::move(report));
  } else {
    r.printed.Out(Table(rows));
  }
  return r;
}

}  // namespace patchgen::cli
