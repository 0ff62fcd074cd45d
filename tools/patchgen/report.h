// What reports print: a spec's --json entry, diagnostics as JSON, short hashes, and the printing
// of a run's result (its text and diagnostics, then its --json report with the exit status).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/diagnostic.h"
#include "pipeline.h"
#include "run_result.h"

namespace patchgen::cli {

const char* KindName(ErrorKind kind);

/// JSON as printed by --json: valid UTF-8 whatever the bytes of paths, names and messages (a byte
/// that is not UTF-8 prints as U+FFFD, like Python's errors="replace").
std::string JsonText(const nlohmann::json& j);
nlohmann::json DiagnosticJson(const Diagnostic& d);

std::string Short(const std::string& sha);
/// "1.0.0 (sha256 0123456789ab)", leaving out what is unknown.
std::string Fingerprint(const std::string& version, const std::string& sha);

/// A spec's entry of the --json report (docs/cli.md, "--json"): what the stages found for it and
/// what the mode made of it.
nlohmann::json SpecJson(const RunContext& ctx, const SpecRecord& rec, const SpecOutcome& outcome);

/// A spec's outcome with `status` and the errors that failed it so far; `loaded` when its spec
/// loaded without an error.
SpecOutcome OutcomeOf(const SpecRecord& rec, JobStatus status);

/// The one failure path of a spec in every mode: status "error", its errors printed.
SpecOutcome Failed(const SpecRecord& rec, Printout& printed);

/// A spec skipped because its upstream package is on no source root: status "upstream not
/// found" and (text) the line `skipped SPEC: upstream package 'P' not found<why>`.
SpecOutcome Skipped(const RunContext& ctx, const SpecRecord& rec, const char* why,
                    Printout& printed);

/// How many of `specs` have one of `statuses` (a summary line's counts).
size_t CountOf(const std::vector<SpecOutcome>& specs, std::initializer_list<JobStatus> statuses);

/// The --json report of a mode: `specs` (and what else the mode adds).
nlohmann::json SpecsReport(nlohmann::json specs);

/// Prints what the run printed, then (--json) its report with `exit_code`.
void PrintResult(const RunResult& result, int exit_code);

}  // namespace patchgen::cli
