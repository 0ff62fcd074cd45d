// What reports print (report.h).
#include "report.h"

#include <algorithm>
#include <iostream>

namespace patchgen::cli {

const char* KindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSpec:
      return "spec";
    case ErrorKind::kUpstream:
      return "upstream";
    case ErrorKind::kIo:
      return "io";
    case ErrorKind::kInternal:
      return "internal";
  }
  return "internal";
}

std::string JsonText(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json DiagnosticJson(const Diagnostic& d) {
  return {{"path", d.loc.path},       {"line", d.loc.line},   {"col", d.loc.col},
          {"kind", KindName(d.kind)}, {"message", d.message}, {"help", d.help}};
}

std::string Short(const std::string& sha) { return sha.substr(0, 12); }

std::string Fingerprint(const std::string& version, const std::string& sha) {
  std::string s = version.empty() ? "" : version;
  if (!sha.empty())
    s += (s.empty() ? "sha256 " : " (sha256 ") + Short(sha) + (s.empty() ? "" : ")");
  return s.empty() ? "unknown" : s;
}

namespace {

nlohmann::json DiagnosticsJson(const std::vector<Diagnostic>& ds) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& d : ds) out.push_back(DiagnosticJson(d));
  return out;
}

}  // namespace

nlohmann::json SpecJson(const RunContext& ctx, const SpecRecord& rec, const SpecOutcome& outcome) {
  using nlohmann::json;
  const spec::PatchSpec* spec = rec.spec();
  const UpstreamFile& up = rec.upstream.lookup.file;
  bool found = spec && rec.found();
  json j;
  j["spec"] = rec.file.shown;
  j["upstream"] = spec ? json(spec->upstream) : json(nullptr);
  j["upstream_path"] = found ? json(ctx.Show(up.file)) : json(nullptr);
  j["upstream_version"] = found ? json(up.version) : json(nullptr);
  j["output"] = rec.out.py.empty() ? json(nullptr) : json(ctx.Show(rec.out.py));
  j["status"] = StatusName(outcome.status);
  j["patches"] = rec.gen.patches;
  j["bytes"] = rec.gen.py_text.size();
  j["errors"] = DiagnosticsJson(outcome.errors);
  json skipped = json::array();
  for (const auto& sk : rec.gen.skipped_entries) {
    skipped.push_back({{"kind", sk.kind},
                       {"target", sk.target},
                       {"why", sk.why},
                       {"spec", sk.loc.path},
                       {"line", sk.loc.line}});
  }
  j["skipped_entries"] = skipped;
  j["warnings"] = DiagnosticsJson(rec.gen.warnings);
  return j;
}

SpecOutcome OutcomeOf(const SpecRecord& rec, JobStatus status) {
  return {status, rec.Errors(), rec.load.errors.empty()};
}

SpecOutcome Failed(const SpecRecord& rec, Printout& printed) {
  SpecOutcome o = OutcomeOf(rec, JobStatus::kError);
  printed.Diagnostics(o.errors);
  return o;
}

SpecOutcome Skipped(const RunContext& ctx, const SpecRecord& rec, const char* why,
                    Printout& printed) {
  if (!ctx.opts.json) {
    printed.Out("skipped " + rec.file.shown + ": upstream package '" +
                TopPackage(rec.spec()->upstream) + "' not found" + why + "\n");
  }
  return OutcomeOf(rec, JobStatus::kUpstreamNotFound);
}

size_t CountOf(const std::vector<SpecOutcome>& specs, std::initializer_list<JobStatus> statuses) {
  return std::count_if(specs.begin(), specs.end(), [&](const SpecOutcome& o) {
    return std::find(statuses.begin(), statuses.end(), o.status) != statuses.end();
  });
}

nlohmann::json SpecsReport(nlohmann::json specs) { return nlohmann::json{{"specs", specs}}; }

void PrintResult(const RunResult& result, int exit_code) {
  result.printed.WriteTo(std::cout, std::cerr);
  if (!result.report) return;
  nlohmann::json report = *result.report;
  report["exit_code"] = exit_code;
  std::cout << JsonText(report) << "\n";
}

}  // namespace patchgen::cli
