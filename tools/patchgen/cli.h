// The patchgen command line: its options (options.h), the stages every run takes its specs
// through (pipeline.h), the modes that write, check, list, validate, pin, audit or index
// (modes.h), and the one decision of the exit status (exit_status.h). main.cc only calls Run().
#pragma once

namespace patchgen::cli {

/// Runs patchgen with `argv` in the current working directory and returns the exit code
/// (docs/cli.md): 0 ok, 1 drift, 2 usage, 3 invalid spec, 4 upstream, 5 I/O, 70 internal.
int Run(int argc, char** argv);

}  // namespace patchgen::cli
