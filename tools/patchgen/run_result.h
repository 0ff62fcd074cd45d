// What a run produced, as data: each spec's status and the errors that failed it, what the run
// found beyond its specs (orphaned outputs), why it stopped early, what it prints, and its --json
// report. Made by the stages and modes; read by ExitStatus (exit_status.h), the one place that
// decides the exit status, and by PrintResult (report.h).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/diagnostic.h"
#include "options.h"

namespace patchgen::cli {

/// A spec's outcome as reports print it (StatusName): text lines, `--list`'s table, `--json`.
enum class JobStatus {
  kPending,  ///< not decided yet (prints "")
  kWritten,
  kUnchanged,
  kWouldWrite,
  kUpToDate,
  kStale,
  kFixed,
  kMissing,
  kUpstreamNotFound,
  kValid,
  kInvalid,
  kError,
  kPinned,
  kNeedsAttention,
  kOk,
};
const char* StatusName(JobStatus status);

/// What a mode made of one spec (of an `index` file).
struct SpecOutcome {
  JobStatus status = JobStatus::kPending;
  /// What failed it, as reported: the errors of the stage that failed it, or the mode's own (a
  /// file it could not write). `audit` reports a failed generation as findings.
  std::vector<Diagnostic> errors;
  bool loaded = true;  ///< Its spec loaded (a spec that does not fails the run in every mode).
};

/// Why a run stopped before its mode ran (what it printed says why).
enum class Stop {
  kDone,             ///< --help, --version
  kUsage,            ///< flags, the project config, a specs folder or a source root
  kSpecsUnreadable,  ///< a folder under the specs root cannot be walked
  kInternal,         ///< an exception
};

/// What a run prints, in order: text for stdout, and for stderr (diagnostics).
class Printout {
 public:
  void Out(std::string text) { Add(false, std::move(text)); }
  void Err(std::string text) { Add(true, std::move(text)); }
  /// Each diagnostic in patchgen's format (FormatDiagnostic), on stderr.
  void Diagnostics(const std::vector<Diagnostic>& errors);
  /// `later` after what this holds.
  void Append(Printout later);
  void WriteTo(std::ostream& out, std::ostream& err) const;

 private:
  void Add(bool err, std::string text);
  std::vector<std::pair<bool, std::string>> pieces_;  ///< (on stderr, text)
};

/// Everything a run produced.
struct RunResult {
  Mode mode = Mode::kGenerate;
  std::optional<Stop> stop;        ///< Set when it stopped before its mode.
  std::vector<SpecOutcome> specs;  ///< One per spec (per file for `index`), in spec order.
  size_t orphans_left = 0;  ///< --check: orphaned outputs reported, or kept by --fix (drift).
  std::vector<Diagnostic> errors;  ///< Beyond the specs: an orphan that could not be removed.
  Printout printed;
  /// --json: the report, printed after `printed` with the exit status added (`exit_code`).
  std::optional<nlohmann::json> report;
};

/// A run that stopped, after printing `printed`.
RunResult Stopped(Mode mode, Stop why, Printout printed);

}  // namespace patchgen::cli
