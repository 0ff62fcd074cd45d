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
/// same folder that is renamed over `path`, so readers never see a partial file. Returns the
/// outcome, or an error message.
std::optional<WriteOutcome> WriteIfChanged(const std::filesystem::path& path, const std::string& bytes,
                                           std::string* error);

/// `path` as printed: relative to `base` when it lies under it (or is reachable with `..` without
/// leaving the file system root), otherwise absolute. Uses '/' and no "./" prefix.
std::string DisplayPath(const std::filesystem::path& path, const std::filesystem::path& base);

}  // namespace patchgen::cli
