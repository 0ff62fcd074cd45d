#include "output_record.h"

#include <system_error>

#include "files.h"
#include "rewriter/sha256.h"
#include "stamp_file.h"

namespace patchgen::cli {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormat = "patchgen output record 1\n";

fs::path RecordPath(const fs::path& cache_dir, const fs::path& real) {
  return cache_dir / "written" / (rewriter::Sha256Hex(real.string()).substr(0, 32) + ".out");
}

}  // namespace

void RecordOutput(const fs::path& cache_dir, const fs::path& output, const std::string& sha) {
  std::error_code ec;
  fs::path real = fs::canonical(output, ec);
  if (ec || real.string().find_first_of("\t\n") != std::string::npos) return;
  EnsureCacheFolder(cache_dir);
  std::string error;
  WriteIfChanged(RecordPath(cache_dir, real),
                 std::string(kFormat) + sha + "\t" + real.string() + "\n", &error);
}

std::optional<bool> RecordedAs(const fs::path& cache_dir, const fs::path& real,
                               const std::string& sha) {
  std::optional<std::string> text = ReadFile(RecordPath(cache_dir, real));
  std::string tail = "\t" + real.string() + "\n";
  if (!text || !text->starts_with(kFormat) || !text->ends_with(tail)) return std::nullopt;
  return text->substr(kFormat.size(), text->size() - kFormat.size() - tail.size()) == sha;
}

}  // namespace patchgen::cli
