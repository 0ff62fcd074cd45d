// Records of the outputs patchgen wrote (docs/cli.md, "Orphaned outputs"): one small file per
// output under the project's cache (.patchgen_cache/written/), naming the output's real path and
// the sha256 of the bytes generation wrote there (or found there unchanged). `--check --fix`
// removes an orphaned output only when its record says that patchgen wrote exactly its bytes there
// in this project: never another project's output in a shared output root, never a file someone
// changed. Like the check stamps, a record is a cache: without it an orphan is only reported.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace patchgen::cli {

/// Records that the bytes with sha256 `sha` are at `output` (which exists). Silent on failure.
void RecordOutput(const std::filesystem::path& cache_dir, const std::filesystem::path& output,
                  const std::string& sha);

/// What the record of the file at real path `real` says about the bytes with sha256 `sha`:
/// nullopt when there is no record, else whether they are the bytes recorded.
std::optional<bool> RecordedAs(const std::filesystem::path& cache_dir,
                               const std::filesystem::path& real, const std::string& sha);

}  // namespace patchgen::cli
