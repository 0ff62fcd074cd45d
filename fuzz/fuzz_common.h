// Shared checks of the fuzz targets (docs/fuzzing.md). The property every target asserts: patchgen
// answers any input with either a result or located error diagnostics; never a crash, a hang, an
// internal error, an unlocated or multi-line message, or an unbounded one. A violation prints what
// was wrong and aborts, which libFuzzer reports as a crash and saves the input.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/diagnostic.h"

namespace patchgen::fuzz {

/// The most bytes one formatted diagnostic may take (message, excerpt, notes, help). Messages quote
/// names from the input, so this bounds how much of the input a message may repeat.
inline constexpr size_t kMaxDiagnosticBytes = 8192;

/// Aborts with `why` and the offending text.
[[noreturn]] void Fail(std::string_view why, std::string_view detail = {});

/// Checks every diagnostic: an error (or warning) with a message on one line, a path, a line > 0
/// unless `allow_unlocated` (errors about a whole file), never ErrorKind::kInternal, and formatted
/// within kMaxDiagnosticBytes.
void CheckDiagnostics(const std::vector<Diagnostic>& diags, bool allow_unlocated = false);

/// Splits a generation input into sections: the text before the first line starting with "#@@ " is
/// the spec; "#@@ upstream" starts the upstream module; "#@@ file NAME" a file NAME next to the
/// spec (a patch file or a parent spec).
struct Sections {
  std::string spec;
  std::string upstream;
  std::vector<std::pair<std::string, std::string>> files;
};
Sections SplitSections(std::string_view data);

/// A per-process scratch folder (removed at exit; PATCHGEN_FUZZ_SCRATCH if set, else a new
/// temporary folder), emptied by each call.
std::string FreshScratchDir();

/// When PATCHGEN_FUZZ_DUMP names a folder, writes `text` there as NAME (for the CPython check of
/// fuzz/check_outputs.py); otherwise does nothing.
void Dump(const std::string& name, std::string_view text);
bool Dumping();

}  // namespace patchgen::fuzz
