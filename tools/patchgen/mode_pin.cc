// `pin` (modes.h): each generated spec's contract recorded in its pin file (pins.h), the only
// command that writes pins.
#include <absl/strings/str_cat.h>

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
      printed.Out(absl::StrCat(wrote ? "pinned " : "unchanged ", ctx.Show(path), " (",
                               rec.gen.contract.size(), " entries, ", added, " new fingerprints, ",
                               rec.spec()->upstream, " ", version, ")\n"));
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
    report.push_back(std::move(j));
    r.specs.push_back(std::move(o));
  }
  if (ctx.opts.json) {
    r.report = SpecsReport(std::move(report));
  } else {
    r.printed.Out(absl::StrCat("pin: ", specs.size(),
                               " specs: ", CountOf(r.specs, {JobStatus::kPinned}), " pinned, ",
                               CountOf(r.specs, {JobStatus::kUnchanged}), " unchanged, ",
                               CountOf(r.specs, {JobStatus::kUpstreamNotFound}), " skipped, ",
                               CountOf(r.specs, {JobStatus::kError}), " failed\n"));
  }
  return r;
}

}  // namespace patchgen::cli
