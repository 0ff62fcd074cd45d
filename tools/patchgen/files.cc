// File helpers for the CLI (see files.h).
#include "files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace patchgen::cli {

namespace fs = std::filesystem;

namespace {

// Temporary files being written, removed by the signal handler when SIGINT/SIGTERM/SIGHUP ends the
// process mid-write. Slots hold strdup'd paths; the handler only reads them and calls unlink(),
// which is async-signal-safe.
constexpr int kTempSlots = 64;
std::atomic<char*> g_temp_files[kTempSlots];

void RemoveTempFilesAndDie(int sig) {
  for (auto& slot : g_temp_files) {
    if (char* p = slot.load()) ::unlink(p);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

class TempFileGuard {
 public:
  explicit TempFileGuard(const fs::path& tmp) {
    char* copy = ::strdup(tmp.c_str());
    for (auto& slot : g_temp_files) {
      char* expected = nullptr;
      if (slot.compare_exchange_strong(expected, copy)) {
        slot_ = &slot;
        return;
      }
    }
    std::free(copy);  // all slots busy: the file is still removed on every error path below
  }
  ~TempFileGuard() {
    if (slot_) std::free(slot_->exchange(nullptr));
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

 private:
  std::atomic<char*>* slot_ = nullptr;
};

std::string Reason(int err) { return std::strerror(err); }

// Where `dir` really is: its existing part resolved (symbolic links followed), the rest appended.
fs::path RealPath(const fs::path& dir) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  return ec ? fs::absolute(dir).lexically_normal() : real;
}

bool Inside(const fs::path& path, const fs::path& root) {
  fs::path rel = path.lexically_relative(root);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

void InstallTempFileCleanup() {
  struct sigaction sa {};
  sa.sa_handler = RemoveTempFilesAndDie;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    // Leave a signal alone that the parent asked us to ignore (nohup).
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
  // A file size limit (ulimit -f) makes write() fail with EFBIG instead of killing the process, so
  // the error is reported and the temporary file removed.
  ::signal(SIGXFSZ, SIG_IGN);
}

namespace {

// Why `path` (lstat `st` when it `exists`) may not be written: a symbolic link, not a regular
// file, or in a folder that leads out of `root` through a link; nullopt when it may.
std::optional<std::string> RefusedOutput(const fs::path& path, const struct stat& st, bool exists,
                                         const fs::path& root) {
  if (exists && S_ISLNK(st.st_mode)) {
    return std::string(
        "the output is a symbolic link; patchgen writes only regular files and never "
        "writes through a link (remove the link)");
  }
  if (exists && !S_ISREG(st.st_mode)) {
    return std::string(S_ISDIR(st.st_mode) ? "the output is a folder, not a file"
                                           : "the output is not a regular file");
  }
  if (!root.empty() && path.has_parent_path()) {
    fs::path real_root = RealPath(root);
    fs::path real_dir = RealPath(path.parent_path());
    if (Inside(fs::absolute(path).lexically_normal(), fs::absolute(root).lexically_normal()) &&
        real_dir != real_root && !Inside(real_dir, real_root)) {
      return "the output folder leads out of the output root through a symbolic link (to '" +
             real_dir.string() + "'); patchgen never writes through a link out of the output root";
    }
  }
  return std::nullopt;
}

// Writes all of `bytes` to `fd`; 0, or the errno of the write that failed.
int WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

std::optional<WriteOutcome> WriteIfChanged(const fs::path& path, const std::string& bytes,
                                           std::string* error, const fs::path& root) {
  struct stat st {};
  bool exists = ::lstat(path.c_str(), &st) == 0;
  if (auto why = RefusedOutput(path, st, exists, root)) {
    *error = std::move(*why);
    return std::nullopt;
  }
  if (exists) {
    if (auto existing = ReadFile(path); existing && *existing == bytes)
      return WriteOutcome::kUnchanged;
  }
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
  TempFileGuard guard(tmp);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot write: " + Reason(errno);
    return std::nullopt;
  }
  auto fail = [&](int err) -> std::optional<WriteOutcome> {
    *error = "cannot write: " + Reason(err);
    ::close(fd);
    ::unlink(tmp.c_str());
    return std::nullopt;
  };
  // An existing output keeps its permission bits (e.g. read-only for others, or executable).
  if (exists && ::fchmod(fd, st.st_mode & 07777) != 0) return fail(errno);
  if (int err = WriteAll(fd, bytes)) return fail(err);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    *error = "cannot write: " + Reason(err);
    return std::nullopt;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    *error = "cannot write: " + Reason(err);
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
