// What a run produced (run_result.h): status names and the printout.
#include "run_result.h"

namespace patchgen::cli {

const char* StatusName(JobStatus status) {
  switch (status) {
    case JobStatus::kPending:
      return "";
    case JobStatus::kWritten:
      return "written";
    case JobStatus::kUnchanged:
      return "unchanged";
    case JobStatus::kWouldWrite:
      return "would write";
    case JobStatus::kUpToDate:
      return "up to date";
    case JobStatus::kStale:
      return "stale";
    case JobStatus::kFixed:
      return "fixed";
    case JobStatus::kMissing:
      return "missing";
    case JobStatus::kUpstreamNotFound:
      return "upstream not found";
    case JobStatus::kValid:
      return "valid";
    case JobStatus::kInvalid:
      return "invalid";
    case JobStatus::kError:
      return "error";
    case JobStatus::kPinned:
      return "pinned";
    case JobStatus::kNeedsAttention:
      return "needs attention";
    case JobStatus::kOk:
      return "ok";
  }
  return "";
}

void Printout::Add(bool err, std::string text) {
  if (!text.empty()) pieces_.emplace_back(err, std::move(text));
}

void Printout::Diagnostics(const std::vector<Diagnostic>& errors) {
  for (const auto& d : errors) Err(FormatDiagnostic(d));
}

void Printout::Append(Printout later) {
  for (auto& [err, text] : later.pieces_) Add(err, std::move(text));
}

void Printout::WriteTo(std::ostream& out, std::ostream& err) const {
  for (const auto& [on_err, text] : pieces_) (on_err ? err : out) << text;
}

RunResult Stopped(Mode mode, Stop why, Printout printed) {
  RunResult r;
  r.mode = mode;
  r.stop = why;
  r.printed = std::move(printed);
  return r;
}

}  // namespace patchgen::cli
