// File helpers for the CLI (see files.h).
#include "files.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace patchgen::cli {

namespace fs = std::filesystem;

std::optional<WriteOutcome> WriteIfChanged(const fs::path& path, const std::string& bytes,
                                           std::string* error) {
  if (auto existing = ReadFile(path); existing && *existing == bytes) return WriteOutcome::kUnchanged;
  std::error_code ec;
  if (path.has_parent_path()) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) {
      *error = "cannot create folder '" + path.parent_path().string() + "': " + ec.message();
      return std::nullopt;
    }
  }
  static std::atomic<unsigned> counter{0};
  fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp." +
                                       std::to_string(getpid()) + "." + std::to_string(counter++));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot write '" + tmp.string() + "': " + std::strerror(errno);
    return std::nullopt;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = "cannot write '" + tmp.string() + "': " + std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return std::nullopt;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot write '" + path.string() + "': " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return std::nullopt;
  }
  return WriteOutcome::kWritten;
}

std::string DisplayPath(const fs::path& path, const fs::path& base) {
  fs::path abs = path.is_absolute() ? path : base / path;
  abs = abs.lexically_normal();
  fs::path rel = abs.lexically_relative(base.lexically_normal());
  if (rel.empty()) return abs.generic_string();
  std::string s = rel.generic_string();
  if (s == ".") return ".";
  return s;
}

}  // namespace patchgen::cli
