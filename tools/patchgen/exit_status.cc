// The exit status of a run (exit_status.h): every rule of docs/cli.md's "Exit codes" table is here.
#include "exit_status.h"

#include <algorithm>

namespace patchgen::cli {
namespace {

int StopCode(Stop why) {
  switch (why) {
    case Stop::kDone:
      return kExitOk;
    case Stop::kUsage:
      return kExitUsage;
    case Stop::kSpecsUnreadable:
      return kExitIo;
    case Stop::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

/// A spec's code: a failed or invalid spec, the worst of its errors; drift (a stale or missing
/// file) 1 under --check and 0 under --list, which only reports; needing attention (audit) 1; and
/// in every mode a spec that does not load, the worst of its errors.
int SpecCode(Mode mode, const SpecOutcome& s) {
  int not_loaded = s.loaded ? kExitOk : WorstExit(s.errors);
  switch (s.status) {
    case JobStatus::kError:
    case JobStatus::kInvalid:
      return WorstExit(s.errors);
    case JobStatus::kStale:
    case JobStatus::kMissing:
      return std::max<int>(not_loaded, mode == Mode::kCheck ? kExitDrift : kExitOk);
    case JobStatus::kNeedsAttention:
      return std::max<int>(not_loaded, kExitDrift);
    default:
      return not_loaded;
  }
}

}  // namespace

int ExitCodeOf(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSpec:
      return kExitSpec;
    case ErrorKind::kUpstream:
      return kExitUpstream;
    case ErrorKind::kIo:
      return kExitIo;
    case ErrorKind::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

int WorstExit(const std::vector<Diagnostic>& errors) {
  int code = 0;
  for (const auto& d : errors) code = std::max(code, ExitCodeOf(d.kind));
  return code;
}

int ExitStatus(const RunResult& result) {
  if (result.stop) return StopCode(*result.stop);
  // Orphaned outputs left on disk are drift; one that could not be removed, its I/O error.
  int code = result.orphans_left > 0 ? kExitDrift : kExitOk;
  code = std::max<int>(code, WorstExit(result.errors));
  for (const SpecOutcome& s : result.specs) code = std::max(code, SpecCode(result.mode, s));
  return code;
}

}  // namespace patchgen::cli
