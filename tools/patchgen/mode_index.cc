// `patchgen index` (modes.h): what patchgen's parser sees in Python files (parser/index_printer.h),
// parsed on worker threads and printed in argument order.
#include "modes.h"
#include "parallel.h"
#include "parser/index_printer.h"
#include "report.h"

namespace patchgen::cli {
namespace {

/// One file's index as printed, or why it has none.
struct Indexed {
  std::string output;
  std::vector<Diagnostic> errors;
};

Indexed IndexFile(const std::string& file, bool json) {
  Indexed out;
  auto text = ReadFile(file);
  if (!text) {
    out.errors.push_back(ErrorAt(SourceLoc::InFile(file), "cannot read file", {}, ErrorKind::kIo));
    return out;
  }
  auto module = parser::PyModule::Parse(file, std::move(*text));
  if (!module.ok()) {
    out.errors = module.errors();
    for (auto& d : out.errors) d.kind = ErrorKind::kUpstream;
    return out;
  }
  out.output = json ? parser::FormatIndexJson(**module) : parser::FormatIndexText(**module);
  return out;
}

}  // namespace

RunResult IndexMode(const Options& opts) {
  RunResult r;
  r.mode = Mode::kIndex;
  std::vector<Indexed> results(opts.index_files.size());
  ParallelFor(results.size(), opts.jobs,
              [&](size_t i) { results[i] = IndexFile(opts.index_files[i], opts.index_json); });
  std::vector<std::string> outputs;
  for (Indexed& ix : results) {
    r.printed.Diagnostics(ix.errors);
    if (ix.errors.empty()) outputs.push_back(std::move(ix.output));
    r.specs.push_back(
        {ix.errors.empty() ? JobStatus::kOk : JobStatus::kError, std::move(ix.errors), true});
  }
  if (opts.index_json && opts.index_files.size() > 1) {
    nlohmann::json all = nlohmann::json::array();
    for (const std::string& o : outputs) all.push_back(nlohmann::json::parse(o));
    r.printed.Out(JsonText(all) + "\n");
    return r;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i) r.printed.Out("\n");
    r.printed.Out(std::move(outputs[i]));
  }
  return r;
}

}  // namespace patchgen::cli
