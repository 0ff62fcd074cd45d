#include "base/file_util.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <system_error>

namespace patchgen {

std::optional<std::string> ReadFile(const std::filesystem::path& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (error) *error = std::error_code(errno, std::generic_category()).message();
    return std::nullopt;
  }
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) {
    if (error) *error = "read error";
    return std::nullopt;
  }
  return s.str();
}

}  // namespace patchgen
