// Project configuration: `[tool.patchgen]` in the nearest pyproject.toml, or a patchgen.toml.
//
// Search: from the working directory up to the file system root; in each folder a pyproject.toml
// that has a [tool.patchgen] table wins, then a patchgen.toml (top-level keys). A pyproject.toml
// without the table is skipped and the walk continues. Without any config the working directory
// is the project root and every key has its default. Paths are relative to the config's folder.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"

namespace patchgen::cli {

struct ProjectConfig {
  std::filesystem::path root;                 ///< Folder of the config file (absolute), or the cwd.
  std::optional<std::filesystem::path> file;  ///< The config file, when one was found.
  std::filesystem::path specs;   ///< Specs root (absolute); key `specs`, default "specs".
  std::filesystem::path output;  ///< Output root (absolute); key `output`, default "generated".
  std::vector<std::filesystem::path>
      source_roots;  ///< Key `source_roots` (absolute), default none.
  /// Interpreter asked for sys.path; key `python`, default "python3" (looked up on PATH). A value
  /// containing '/' is a path relative to the config's folder.
  std::string python = "python3";
  std::string runtime = "opslot";  ///< Default module providing OpSlot; key `runtime`.
};

/// Finds and loads the project config for `cwd` (absolute). Errors (TOML syntax, unknown key,
/// wrong type) are located in the config file; ErrorKind::kSpec.
Result<ProjectConfig> FindProjectConfig(const std::filesystem::path& cwd);

/// Loads `file` (absolute): a pyproject.toml (reads [tool.patchgen]) or a patchgen.toml (reads
/// top-level keys). `cwd` is used to print the file's path in diagnostics.
Result<ProjectConfig> LoadProjectConfig(const std::filesystem::path& file,
                                        const std::filesystem::path& cwd);

}  // namespace patchgen::cli
