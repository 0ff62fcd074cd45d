// What every stage and mode of a run reads and none writes (RunContext), and entering the
// project root, where the run works from.
#pragma once

#include <filesystem>
#include <string>

#include "files.h"
#include "options.h"
#include "project_config.h"

namespace patchgen::cli {

namespace fs = std::filesystem;

/// The options, where patchgen was started, the project config, the folder messages are relative
/// to, and when the run started.
struct RunContext {
  Options opts;
  fs::path cwd;  ///< Where patchgen was started: command-line paths are relative to it.
  ProjectConfig config;
  fs::path shown_base;  ///< The project root, or `cwd` when patchgen cannot work from there.
  /// When the run started: a file modified less than a second before gets no check stamp.
  fs::file_time_type start = fs::file_time_type::clock::now();

  /// A path as messages print it: relative to the project root (shown_base).
  std::string Show(const fs::path& p) const { return DisplayPath(p, shown_base); }
  /// The absolute path of a path as printed (a spec's `extends` parent or patch file).
  fs::path Unshow(const std::string& shown) const {
    fs::path p(shown);
    return (p.is_absolute() ? p : shown_base / p).lexically_normal();
  }
  /// A path given on the command line or in the environment, made absolute against `cwd`.
  fs::path FromCwd(const std::string& given) const {
    fs::path p(given);
    return (p.is_absolute() ? p : cwd / p).lexically_normal();
  }
  /// Where generated files go: -o DIR, else the configured output root.
  fs::path OutputRoot() const {
    return opts.output_dir.empty() ? config.output : FromCwd(opts.output_dir);
  }
  /// The project's cache (.patchgen_cache): check stamps, the records of written outputs.
  fs::path CacheDir() const { return config.root / ".patchgen_cache"; }
};

/// Enters the project root and returns the folder messages are relative to: the root, or `cwd`
/// when it cannot be entered (docs/cli.md, "Paths in messages"). A path printed for a spec is then
/// also the one the spec loader resolves its `extends` parents and `file:` patch files against.
inline fs::path EnterProjectRoot(const ProjectConfig& config, const fs::path& cwd) {
  std::error_code ec;
  fs::current_path(config.root, ec);
  return ec ? cwd : config.root;
}

}  // namespace patchgen::cli
