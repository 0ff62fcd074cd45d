// Check stamps: what a successful generation of one spec read and wrote, by sha256, so that
// `patchgen --check` can tell "up to date" without parsing anything when nothing changed
// (docs/cli.md, "--check without parsing"). A stamp is a cache beside the project, never an input
// of generation: a missing, unreadable or mismatching stamp only sends --check down the full path
// (regenerate in memory and compare), which stays the reference.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace patchgen::cli {

/// One spec's stamp.
struct CheckStamp {
  std::string
      key;  ///< The run's settings (StampKey (check_stamps.cc)): version, binary, config, options.
  std::filesystem::path spec;      ///< The spec file (absolute).
  std::string module;              ///< Its `upstream:` module.
  std::filesystem::path upstream;  ///< The upstream file it was found at (absolute).
  std::string upstream_rel;        ///< Its path under the source root.
  std::string upstream_version;
  std::string upstream_sha;  ///< sha256 of the upstream file's bytes as read.
  std::filesystem::path out_py, out_diff;
  std::string py_sha;    ///< sha256 of the .py written.
  std::string diff_sha;  ///< sha256 of the .diff written, or "-" when none was written.
  /// Every other file generation read, with its sha256 ("-": absent): the spec, its `extends`
  /// parents, patch files, the pin file.
  std::vector<std::pair<std::string, std::filesystem::path>> inputs;
};

/// The stamp as text: a first line naming the format, then one tab-separated record per line.
/// nullopt when a path holds a tab or a newline (such a spec gets no stamp).
std::optional<std::string> FormatStamp(const CheckStamp& stamp);

/// The stamp FormatStamp wrote, or nullopt for anything else.
std::optional<CheckStamp> ParseStamp(std::string_view text);

/// sha256 of the file's bytes, or "-" when it does not exist or is no regular file; nullopt when
/// it exists but cannot be read.
std::optional<std::string> FileSha(const std::filesystem::path& path);

/// What identifies the running patchgen binary beyond its version: its path and the sha256 of its
/// bytes (so that another build copied in place, `cp -p` keeping its size, inode and modification
/// time, is another generator), and path, size, inode, modification and change time of every
/// shared library it has loaded. Hashing the executable (tens of MB) is cached under
/// `cache_dir`/binary/, keyed by the executable's device, inode, size, modification and change
/// time (no copy or `touch` can set a change time back), and written there only when
/// `may_write` (generation: `--check` stays read-only). "" when it cannot be told (then no stamp
/// is written or trusted).
std::string ExecutableIdentity(const std::filesystem::path& cache_dir, bool may_write);

/// Creates the cache folder `cache_dir` (.patchgen_cache) with its `.gitignore` of `*` when it is
/// missing; silent on failure (it is a cache).
void EnsureCacheFolder(const std::filesystem::path& cache_dir);

/// Where the stamp of `spec` lives under `cache_dir`: one file per spec and output option.
std::filesystem::path StampPath(const std::filesystem::path& cache_dir,
                                const std::filesystem::path& spec, std::string_view output_dir);

}  // namespace patchgen::cli
