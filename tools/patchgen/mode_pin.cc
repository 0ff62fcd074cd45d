// `pin` (modes.h): each generated spec's contract recorded in its pin file (pins.h), the only
// command that writes pins.
#include "modes.h"
#include "report.h"

namespace patchgen::cli {
namespace {

/// A generated spec's contract recorded in its pin file; its JSON entry names the pin file and the
/// count of new fingerprints.
SpecOutcome PinSpec(const RunContext& ctx, const SpecRecord& rec, Printout& printed,
                    nlohmann::json& j) {
  fs::path path = PinsPathFor(rec.file.abs);
  PinFile pins = rec.gen.pins.value_or(PinFile{});
  const std::string& version = rec.upstream.lookup.file.version;
  size_t added = UpdatePins(pins, rec.gen.contract, version);
  std::string error;
  auto written =
      WriteIfChanged(path, FormatPins(pins, DisplayPath(rec.file.abs, ctx.config.root)), &error);
  SpecOutcome o;
  if (!written) {
    o = OutcomeOf(rec, JobStatus::kError);
    o.errors.push_back(ErrorAt(SourceLoc::InFile(ctx.Show(path)), error, {}, ErrorKind::kIo));
    printed.Diagnostics(o.errors);
  } else {
    bool wrote = *written == WriteOutcome::kWritten;
    o = OutcomeOf(rec, wrote ? JobStatus::kPinned : JobStatus::kUnchanged);
    if (!ctx.opts.json) {
      printed.Out((wrote ? "pinned " : "unchanged ") + ctx.Show(path) + " (" +
                  std::to_string(rec.gen.contract.size()) + " entries, " + std::to_string(added) +
                  " new fingerprints, " + rec.spec()->upstream + " " + version + ")\n");
    }
  }
  j = SpecJson(ctx, rec, o);
  j["pins"] = ctx.Show(path);
  j["new_fingerprints"] = added;
  return o;
}

}  // namespace

RunResult PinMode(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  RunResult r;
  r.mode = Mode::kPin;
  nlohmann::json report = nlohmann::json::array();
  size_t pinned = 0, unchanged = 0, skipped = 0, failed = 0;
  for (const SpecRecord& rec : specs) {
    SpecOutcome o;
    nlohmann::json j;
    if (rec.skipped()) {
      o = Skipped(ctx, rec, "", r.printed);
    } else if (!rec.Errors().empty()) {
      o = Failed(rec, r.printed);
    } else {
      o = PinSpec(ctx, rec, r.printed, j);
    }
    if (j.is_null()) j = SpecJson(ctx, rec, o);
    pinned += o.status == JobStatus::kPinned;
    unchanged += o.status == JobStatus::kUnchanged;
    skipped += o.status == JobStatus::kUpstreamNotFound;
    failed += o.status == JobStatus::kError;
    report.push_back(std::move(j));
    r.specs.push_back(std::move(o));
  }
  if (ctx.opts.json) {
    r.report = SpecsReport(std::move(report));
  } else {
    r.printed.Out("pin: " + std::to_string(specs.size()) + " specs: " + std::to_string(pinned) +
                  " pinned, " + std::to_string(unchanged) + " unchanged, " +
                  std::to_string(skipped) + " skipped, " + std::to_string(failed) + " failed\n");
  }
  return r;
}

}  // namespace patchgen::cli
