#include "stamp_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <system_error>

#include "base/file_util.h"
#include "files.h"
#include "rewriter/sha256.h"

namespace patchgen::cli {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormat = "patchgen check stamp 1";

bool Printable(const std::string& s) { return s.find_first_of("\t\n") == std::string::npos; }

/// The tab-separated fields of `line`.
std::vector<std::string> Fields(std::string_view line) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t tab = line.find('\t', pos);
    out.emplace_back(line.substr(pos, tab == std::string_view::npos ? tab : tab - pos));
    if (tab == std::string_view::npos) return out;
    pos = tab + 1;
  }
}

/// Fills the field of `s` that record `f` names; false for a record that is not known or has the
/// wrong number of fields.
bool TakeRecord(const std::vector<std::string>& f, CheckStamp& s) {
  const std::string& tag = f[0];
  if (tag == "key" && f.size() == 2) {
    s.key = f[1];
  } else if (tag == "spec" && f.size() == 3) {
    s.module = f[1];
    s.spec = f[2];
  } else if (tag == "upstream" && f.size() == 5) {
    s.upstream_sha = f[1];
    s.upstream_version = f[2];
    s.upstream_rel = f[3];
    s.upstream = f[4];
  } else if (tag == "py" && f.size() == 3) {
    s.py_sha = f[1];
    s.out_py = f[2];
  } else if (tag == "diff" && f.size() == 3) {
    s.diff_sha = f[1];
    s.out_diff = f[2];
  } else if (tag == "input" && f.size() == 3) {
    s.inputs.emplace_back(f[1], fs::path(f[2]));
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> FormatStamp(const CheckStamp& s) {
  std::vector<std::string> fields = {s.key,
                                     s.module,
                                     s.spec.string(),
                                     s.upstream_sha,
                                     s.upstream_version,
                                     s.upstream_rel,
                                     s.upstream.string(),
                                     s.py_sha,
                                     s.out_py.string(),
                                     s.diff_sha,
                                     s.out_diff.string()};
  for (const auto& [sha, path] : s.inputs) fields.push_back(path.string());
  for (const std::string& f : fields) {
    if (!Printable(f)) return std::nullopt;
  }
  std::string t = std::string(kFormat) + "\n";
  t += "key\t" + s.key + "\n";
  t += "spec\t" + s.module + "\t" + s.spec.string() + "\n";
  t += "upstream\t" + s.upstream_sha + "\t" + s.upstream_version + "\t" + s.upstream_rel + "\t" +
       s.upstream.string() + "\n";
  t += "py\t" + s.py_sha + "\t" + s.out_py.string() + "\n";
  t += "diff\t" + s.diff_sha + "\t" + s.out_diff.string() + "\n";
  for (const auto& [sha, path] : s.inputs) t += "input\t" + sha + "\t" + path.string() + "\n";
  return t;
}

std::optional<CheckStamp> ParseStamp(std::string_view text) {
  size_t nl = text.find('\n');
  if (nl == std::string_view::npos || text.substr(0, nl) != kFormat) return std::nullopt;
  CheckStamp s;
  size_t pos = nl + 1;
  while (pos < text.size()) {
    nl = text.find('\n', pos);
    if (nl == std::string_view::npos) return std::nullopt;  // every record ends with '\n'
    if (!TakeRecord(Fields(text.substr(pos, nl - pos)), s)) return std::nullopt;
    pos = nl + 1;
  }
  bool complete = !s.key.empty() && !s.spec.empty() && !s.upstream.empty() && !s.py_sha.empty() &&
                  !s.diff_sha.empty() && !s.inputs.empty();
  return complete ? std::optional<CheckStamp>(std::move(s)) : std::nullopt;
}

std::optional<std::string> FileSha(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return fs::exists(path, ec) ? std::nullopt : std::optional<std::string>("-");
  std::optional<std::string> text = ReadFile(path);
  if (!text) return std::nullopt;
  return rewriter::Sha256Hex(*text);
}

namespace {

/// "size dev:inode mtime ctime" of a file's stat.
std::string StatText(const struct stat& st) {
  return std::to_string(st.st_size) + " " + std::to_string(st.st_dev) + ":" +
         std::to_string(st.st_ino) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + " " + std::to_string(st.st_ctim.tv_sec) + "." +
         std::to_string(st.st_ctim.tv_nsec);
}

/// "path size dev:inode mtime ctime" of a file, or "" when it cannot be read.
std::string Identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return path + " " + StatText(st) + "\n";
}

bool IsShaLine(const std::string& text) {
  return text.size() == 65 && text.back() == '\n' &&
         text.find_first_not_of("0123456789abcdef") == 64;
}

/// sha256 of the open executable `fd` (whose stat is `st`): from the cache when it holds it,
/// else hashed (and cached when `may_write`); "" when it cannot be read or changed meanwhile.
std::string ExecutableSha(int fd, const struct stat& st, const fs::path& cache_dir,
                          bool may_write) {
  std::string key = rewriter::Sha256Hex("patchgen executable " + StatText(st)).substr(0, 32);
  fs::path cached = cache_dir / "binary" / (key + ".sha256");
  if (std::optional<std::string> text = ReadFile(cached); text && IsShaLine(*text))
    return text->substr(0, 64);
  std::optional<std::string> sha = rewriter::Sha256HexOfFd(fd);
  struct stat after {};
  if (!sha || ::fstat(fd, &after) != 0 || StatText(after) != StatText(st)) return "";
  if (may_write) {
    EnsureCacheFolder(cache_dir);
    std::string error;
    WriteIfChanged(cached, *sha + "\n", &error);
  }
  return *sha;
}

/// The shared libraries in /proc/self/maps' text (tree-sitter, yaml-cpp, the C++ runtime).
std::set<std::string> SharedLibraries(const std::string& maps) {
  std::set<std::string> libs;
  for (size_t pos = 0; pos < maps.size();) {
    size_t nl = std::min(maps.find('\n', pos), maps.size());
    std::string_view line(maps.data() + pos, nl - pos);
    size_t slash = line.find('/');
    if (slash != std::string_view::npos && line.find(".so", slash) != std::string_view::npos) {
      libs.insert(std::string(line.substr(slash)));
    }
    pos = nl + 1;
  }
  return libs;
}

}  // namespace

void EnsureCacheFolder(const fs::path& cache_dir) {
  std::error_code ec;
  if (fs::exists(cache_dir / ".gitignore", ec)) return;
  std::string error;
  WriteIfChanged(cache_dir / ".gitignore", "# patchgen's cache (docs/cli.md)\n*\n", &error);
}

std::string ExecutableIdentity(const fs::path& cache_dir, bool may_write) {
  // The file the process runs, whatever its path became since (/proc/self/exe opens it).
  int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string sha = ::fstat(fd, &st) == 0 ? ExecutableSha(fd, st, cache_dir, may_write) : "";
  ::close(fd);
  std::optional<std::string> maps = ReadFile("/proc/self/maps");
  if (sha.empty() || !maps) return "";
  // Its path too (a copy elsewhere trusts no stamp of the original), and the shared libraries it
  // runs with: a system upgrade of one of them is another generator too.
  std::error_code ec;
  std::string id =
      "executable " + fs::read_symlink("/proc/self/exe", ec).string() + " sha256 " + sha + "\n";
  for (const std::string& lib : SharedLibraries(*maps)) id += Identity(lib);
  return id;
}

fs::path StampPath(const fs::path& cache_dir, const fs::path& spec, std::string_view output_dir) {
  std::string id = rewriter::Sha256Hex(spec.string() + '\0' + std::string(output_dir));
  return cache_dir / (id.substr(0, 32) + ".stamp");
}

}  // namespace patchgen::cli
