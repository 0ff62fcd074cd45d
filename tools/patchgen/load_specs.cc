// LoadSpecs (pipeline.h): every spec file loaded on worker threads, with its errors; a spec that
// loads with errors in some entries keeps the rest (LoadedSpec::partial).
#include "parallel.h"
#include "pipeline.h"
#include "spec/spec_loader.h"

namespace patchgen::cli {
namespace {

LoadedSpec LoadOne(const SpecFile& file) {
  LoadedSpec out;
  std::error_code ec;
  // A path that exists but is no regular file (a folder, a FIFO, a device) is refused by
  // LoadSpec's read, which says what it is.
  if (!fs::exists(file.abs, ec)) {
    out.errors.push_back(
        ErrorAt(SourceLoc::InFile(file.shown), "spec file not found", {}, ErrorKind::kIo));
    return out;
  }
  // A spec saved with a UTF-8 byte order mark is read without it: yaml-cpp skips it but counts
  // positions after it, so every column of every message would be off. (LoadSpec reports a file
  // it cannot read.)
  std::optional<std::string> text = ReadFile(file.abs, nullptr, kMaxSpecFileBytes);
  if (text && text->starts_with("\xEF\xBB\xBF")) text->erase(0, 3);
  if (text) {
    spec::PartialLoad loaded = spec::LoadSpecKeepingEntries(file.shown, std::move(*text));
    out.errors = std::move(loaded.errors);
    if (out.errors.empty()) {
      out.spec = std::move(loaded.spec);
    } else {
      out.partial = std::move(loaded.spec);
      out.entries_dropped = loaded.entries_dropped;
    }
    return out;
  }
  auto loaded = spec::LoadSpec(file.shown);
  if (!loaded.ok()) {
    out.errors = loaded.errors();
    return out;
  }
  out.spec = std::move(loaded.value());
  return out;
}

}  // namespace

std::vector<LoadedSpec> LoadSpecs(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  std::vector<LoadedSpec> loaded(specs.size());
  ParallelFor(specs.size(), ctx.opts.jobs, [&](size_t i) { loaded[i] = LoadOne(specs[i].file); });
  return loaded;
}

}  // namespace patchgen::cli
