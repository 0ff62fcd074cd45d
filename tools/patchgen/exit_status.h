// The exit status of patchgen (docs/cli.md, "Exit codes"), decided in one place (ExitStatus) from
// what the run produced (run_result.h).
#pragma once

#include <vector>

#include "base/diagnostic.h"
#include "run_result.h"

namespace patchgen::cli {

/// Exit codes. When specs fail differently the run exits with the largest.
enum ExitCode : int {
  kExitOk = 0,
  kExitDrift = 1,
  kExitUsage = 2,
  kExitSpec = 3,
  kExitUpstream = 4,
  kExitIo = 5,
  kExitInternal = 70,
};

/// The code of an error's kind: 3 spec, 4 upstream, 5 I/O, 70 internal.
int ExitCodeOf(ErrorKind kind);

/// The largest code of `errors` (0 when there are none).
int WorstExit(const std::vector<Diagnostic>& errors);

/// The exit status of a run: the code of why it stopped, else the largest code of what it found.
int ExitStatus(const RunResult& result);

}  // namespace patchgen::cli
