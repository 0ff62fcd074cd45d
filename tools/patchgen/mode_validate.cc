// --validate (modes.h): every loaded spec (and what loaded of a spec with errors) checked without
// its upstream module (validate.h).
#include <absl/strings/str_cat.h>

#include "modes.h"
#include "report.h"
#include "validate.h"

namespace patchgen::cli {
namespace {

SpecOutcome ValidateOne(const RunContext& ctx, const SpecRecord& rec, Printout& printed) {
  SpecOutcome o = OutcomeOf(rec, JobStatus::kValid);
  auto add = [&](std::vector<Diagnostic> errors) {
    for (Diagnostic& d : errors) o.errors.push_back(std::move(d));
  };
  if (rec.load.spec) add(ValidateSpecWithoutUpstream(*rec.load.spec));
  if (rec.load.partial) {  // the code of the entries that loaded is checked too
    add(ValidateSpecWithoutUpstream(*rec.load.partial));
    SortDiagnostics(o.errors);
  }
  if (!o.errors.empty()) o.status = JobStatus::kInvalid;
  if (o.errors.empty() && ctx.opts.verbose && !ctx.opts.json)
    printed.Out("valid: " + rec.file.shown + "\n");
  printed.Diagnostics(o.errors);
  return o;
}

}  // namespace

RunResult ValidateMode(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  RunResult r;
  r.mode = Mode::kValidate;
  nlohmann::json report = nlohmann::json::array();
  for (const SpecRecord& rec : specs) {
    SpecOutcome o = ValidateOne(ctx, rec, r.printed);
    report.push_back(SpecJson(ctx, rec, o));
    r.specs.push_back(std::move(o));
  }
  if (ctx.opts.json) {
    r.report = SpecsReport(std::move(report));
  } else {
    r.printed.Out(absl::StrCat("validate: ", CountOf(r.specs, {JobStatus::kValid}), " of ",
                               specs.size(), " specs valid\n"));
  }
  return r;
}

}  // namespace patchgen::cli
