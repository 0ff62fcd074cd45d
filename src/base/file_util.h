// Whole-file reads, shared by the spec loader and the CLI.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace patchgen {

/// Reads the whole file in binary mode; nullopt when it cannot be opened or read, with the
/// reason (e.g. "No such file or directory") in `*error` when `error` is given.
std::optional<std::string> ReadFile(const std::filesystem::path& path, std::string* error = nullptr);

}  // namespace patchgen
