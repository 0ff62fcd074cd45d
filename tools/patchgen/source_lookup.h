// Upstream module lookup: dotted module -> .py file under the first source root that has it.
//
// Roots are searched in order: --source-root flags, PATCHGEN_SOURCE_PATH, the config's
// source_roots, then the interpreter's sys.path. The interpreter is asked at most once per run
// (`python -c 'import sys,json;print(json.dumps(sys.path))'`), only when a module is not found in
// the earlier roots, and never imports the package. Not thread-safe: resolve specs serially.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace patchgen::cli {

struct SourceRoot {
  std::filesystem::path path;  ///< Absolute.
  std::string origin;  ///< Where it came from, e.g. "--source-root", "PATCHGEN_SOURCE_PATH".
};

struct UpstreamFile {
  std::filesystem::path file;  ///< Absolute path of the .py file.
  std::string rel_path;  ///< Relative to its root, '/'-separated: "pkg/models/x/modeling_x.py".
  std::string version;   ///< Package version, or "unknown".
};

struct LookupResult {
  enum class Status { kFound, kPackageMissing, kModuleMissing };
  Status status = Status::kPackageMissing;
  UpstreamFile file;                ///< kFound only.
  std::vector<std::string> looked;  ///< kPackageMissing/kModuleMissing: "<candidate> (<origin>)".
};

class SourceLookup {
 public:
  /// `roots` in priority order (before sys.path); `python` is the interpreter for sys.path;
  /// `cwd` (absolute) resolves relative sys.path entries; the places looked are printed relative
  /// to `shown_base` (default: `cwd`).
  SourceLookup(std::vector<SourceRoot> roots, std::string python, std::filesystem::path cwd,
               std::filesystem::path shown_base = {});

  /// Finds `module` ("a.b.c" -> <root>/a/b/c.py or <root>/a/b/c/__init__.py).
  LookupResult Find(const std::string& module);

  /// One line telling how to add a source root, for the "not found" help.
  static std::string Help(const std::string& top_package);

  /// Splits an os.pathsep (':') separated list, dropping empty entries; relative entries are
  /// resolved against `cwd`.
  static std::vector<std::filesystem::path> SplitPathList(const std::string& value,
                                                          const std::filesystem::path& cwd);

  /// True once the interpreter has been asked for sys.path (tests; at most once per run).
  bool asked_interpreter() const { return asked_interpreter_; }

 private:
  void EnsureSysPath();
  std::string Version(const std::filesystem::path& root, const std::string& top);

  std::vector<SourceRoot> roots_;
  std::string python_;
  std::filesystem::path cwd_;
  std::filesystem::path shown_base_;
  bool asked_interpreter_ = false;
  std::optional<std::string> sys_path_error_;
  std::map<std::string, std::string> versions_;
};

/// `__version__ = "x"` from a package's __init__.py text; nullopt when absent.
/// The top-level package of a dotted module: "transformers" for "transformers.models.x".
std::string TopPackage(const std::string& module);

std::optional<std::string> VersionFromInit(const std::string& text);
/// `Version: x` from a dist-info METADATA text; nullopt when absent.
std::optional<std::string> VersionFromMetadata(const std::string& text);

}  // namespace patchgen::cli
