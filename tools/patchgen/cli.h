// The patchgen command line: argument parsing, the per-spec pipeline (load, find upstream, parse
// once, generate), and the modes that write, check, list or validate. main.cc only calls Run().
#pragma once

#include <string>

namespace patchgen::cli {

/// Runs patchgen with `argv` in the current working directory and returns the exit code
/// (docs/cli.md): 0 ok, 1 drift, 2 usage, 3 invalid spec, 4 upstream, 5 I/O, 70 internal.
int Run(int argc, char** argv);

/// "<name>.diff" for "<name>.py" (otherwise ".diff" is appended).
std::string DiffNameFor(const std::string& output_name);

}  // namespace patchgen::cli
