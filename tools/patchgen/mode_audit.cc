// `patchgen audit` (modes.h): what a new upstream changes for every spec, against the pins and an
// optional old upstream (--source-root-old); writes nothing. What it finds about a spec:
// audit_findings.h.
#include <absl/strings/str_cat.h>

#include <algorithm>

#include "audit_findings.h"
#include "modes.h"
#include "report.h"
#include "rewriter/generate.h"

namespace patchgen::cli {
namespace {

/// `audit --source-root-old`: each spec's old upstream file and what it generated there.
struct OldUpstreams {
  std::map<size_t, rewriter::GenerateResult> results;                    ///< By spec index.
  std::map<size_t, std::pair<UpstreamFile, parser::PyModule*>> modules;  ///< By spec index.
  std::map<fs::path, std::unique_ptr<parser::PyModule>> parsed;          ///< Owns the modules.
};

/// The old upstream file of `rec`, parsed once into `olds.parsed`; nullptr when it cannot be read
/// or parsed.
parser::PyModule* ParsedOld(const RunContext& ctx, const UpstreamFile& file, OldUpstreams& olds) {
  auto& slot = olds.parsed[file.file];
  if (slot) return slot.get();
  auto text = ReadFile(file.file);
  if (!text) return nullptr;
  auto parsed = parser::PyModule::Parse(ctx.Show(file.file), std::move(*text));
  if (!parsed.ok()) return nullptr;
  slot = std::move(parsed.value());
  return slot.get();
}

/// The old upstream (optional): every spec generated against it too, for the contract and the
/// definitions to compare with.
OldUpstreams LoadOldUpstreams(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  OldUpstreams olds;
  if (ctx.opts.old_roots.empty()) return olds;
  std::vector<SourceRoot> roots;
  for (const auto& r : ctx.opts.old_roots) roots.push_back({ctx.FromCwd(r), "--source-root-old"});
  SourceLookup lookup(std::move(roots), ctx.config.python, ctx.cwd, ctx.shown_base);
  for (size_t i = 0; i < specs.size(); ++i) {
    const spec::PatchSpec* spec = specs[i].spec();
    if (!spec) continue;
    LookupResult found = lookup.Find(spec->upstream);
    if (found.status != LookupResult::Status::kFound) continue;
    parser::PyModule* module = ParsedOld(ctx, found.file, olds);
    if (!module) continue;
    olds.modules[i] = {found.file, module};
    rewriter::GenerateOptions options;
    options.upstream_path = found.file.rel_path;
    options.upstream_version = found.file.version;
    options.default_runtime = ctx.config.runtime;
    auto result = rewriter::Generate(*spec, *module, options);
    if (result.ok()) olds.results[i] = std::move(result.value());
  }
  return olds;
}

/// One spec of the audit: its outcome, its JSON entry and its lines of the text report.
struct Audited {
  SpecOutcome outcome;
  nlohmann::json json;
  std::string text;
};

Audited AuditSkipped(const RunContext& ctx, const SpecRecord& rec) {
  Audited a;
  a.outcome = OutcomeOf(rec, JobStatus::kUpstreamNotFound);
  a.json = SpecJson(ctx, rec, a.outcome);
  a.text = rec.file.shown + ": skipped (upstream package '" + TopPackage(rec.spec()->upstream) +
           "' not found)\n";
  return a;
}

Audited AuditSpec(const RunContext& ctx, const SpecRecord& rec, size_t i,
                  const OldUpstreams& olds) {
  Audited a;
  a.outcome = OutcomeOf(rec, JobStatus::kOk);
  auto old = olds.results.find(i);
  auto old_module = olds.modules.find(i);
  AuditView v{rec,
              a.outcome.errors,
              old != olds.results.end() ? &old->second : nullptr,
              old_module != olds.modules.end() ? &old_module->second : nullptr,
              rec.spec() && rec.found() ? ctx.Show(rec.upstream.lookup.file.file) : std::string(),
              rec.upstream.lookup.file.version,
              ctx.Show(PinsPathFor(rec.file.abs))};
  std::vector<Finding> findings = FindingsOf(v);
  bool need =
      std::any_of(findings.begin(), findings.end(), [](const Finding& f) { return f.attention; });
  if (need) a.outcome.status = JobStatus::kNeedsAttention;
  a.json = SpecJson(ctx, rec, a.outcome);
  a.json["upstream_old_version"] =
      v.old_module ? nlohmann::json(v.old_module->first.version) : nlohmann::json(nullptr);
  a.text = rec.file.shown + " (" + (rec.spec() ? rec.spec()->upstream : std::string("?")) + " " +
           (v.old_module ? v.old_module->first.version + " -> " : std::string()) + v.version +
           "): " + StatusName(a.outcome.status) + "\n";
  a.json["findings"] = ReportFindings(findings, a.text);
  return a;
}

}  // namespace

RunResult AuditMode(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  RunResult r;
  r.mode = Mode::kAudit;
  OldUpstreams olds = LoadOldUpstreams(ctx, specs);
  nlohmann::json report = nlohmann::json::array();
  std::string text;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SpecRecord& rec = specs[i];
    if (!rec.skipped() && !rec.load.errors.empty()) r.printed.Diagnostics(rec.Errors());
    Audited a = rec.skipped() ? AuditSkipped(ctx, rec) : AuditSpec(ctx, rec, i, olds);
    text += a.text;
    report.push_back(std::move(a.json));
    r.specs.push_back(std::move(a.outcome));
  }
  if (ctx.opts.json) {
    r.report = SpecsReport(std::move(report));
  } else {
    r.printed.Out(absl::StrCat(text, "audit: ", specs.size(),
                               " specs: ", CountOf(r.specs, {JobStatus::kNeedsAttention}),
                               " need attention, ", CountOf(r.specs, {JobStatus::kOk}), " ok, ",
                               CountOf(r.specs, {JobStatus::kUpstreamNotFound}), " skipped\n"));
  }
  return r;
}

}  // namespace patchgen::cli
