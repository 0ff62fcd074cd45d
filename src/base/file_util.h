// Whole-file reads, shared by the spec loader and the CLI.
#pragma once

#include <cstddef>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

namespace patchgen {

/// The most bytes read from one spec or patch file (specs, `extends` parents, `file:` bodies).
inline constexpr size_t kMaxSpecFileBytes = size_t{4} << 20;  // 4 MiB

/// Reads the whole file in binary mode; nullopt when it cannot be opened or read, with the
/// reason (e.g. "No such file or directory") in `*error` when `error` is given. Only regular files
/// are read: a folder, FIFO, socket or device is refused at once (it is opened non-blocking, so a
/// FIFO without a writer cannot hang the read), with what it is in the reason ("is a FIFO (named
/// pipe), not a regular file"). A file larger than `max_bytes` is refused without being read.
std::optional<std::string> ReadFile(const std::filesystem::path& path, std::string* error = nullptr,
                                    size_t max_bytes = std::numeric_limits<size_t>::max());

}  // namespace patchgen
