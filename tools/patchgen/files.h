// File helpers for the CLI: whole-file reads, atomic writes that skip identical bytes, and the
// paths printed to users (relative to the working directory).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "base/file_util.h"

namespace patchgen::cli {

using patchgen::ReadFile;

/// Outcome of WriteIfChanged.
enum class WriteOutcome { kUnchanged, kWritten };

/// Writes `bytes` to `path` unless it already holds exactly those bytes (then the file, its mtime
/// included, is not touched). Parent folders are created. The write goes to a temporary file in the
/// same folder that is renamed over `path`, so readers never see a partial file; that temporary
/// file is removed on every error path and, after InstallTempFileCleanup, when SIGINT, SIGTERM or
/// SIGHUP ends the process. An existing file keeps its permission bits. Refused (an error, nothing
/// written): an output that is a symbolic link or not a regular file, and, when `root` is given
/// and `path` lies under it, an output whose folder leads out of `root` through a symbolic link.
/// Returns the outcome, or an error message that does not repeat the path (callers locate it).
std::optional<WriteOutcome> WriteIfChanged(const std::filesystem::path& path,
                                           const std::string& bytes, std::string* error,
                                           const std::filesystem::path& root = {});

/// Signal handlers that remove WriteIfChanged's temporary files before SIGINT/SIGTERM/SIGHUP end
/// the process; SIGXFSZ ignored, so a file size limit is a write error (exit 5), not a kill.
void InstallTempFileCleanup();

/// `path` as printed: relative to `base` when it lies under it (or is reachable with `..` without
/// leaving the file system root), otherwise absolute. Uses '/' and no "./" prefix.
std::string DisplayPath(const std::filesystem::path& path, const std::filesystem::path& base);

}  // namespace patchgen::cli
