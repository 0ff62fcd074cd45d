// The command line of patchgen: its options, the mode they select, and their parsing (CLI11).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace patchgen::cli {

/// What one run of patchgen does (Options::mode()).
enum class Mode { kGenerate, kCheck, kList, kValidate, kPin, kAudit, kIndex };

struct Options {
  std::vector<std::string> specs;
  bool all = false;
  bool diff = false;
  bool dry_run = false;
  bool verbose = false;
  bool json = false;
  bool list = false;
  bool check = false;
  bool fix = false;
  bool validate = false;
  std::string output_dir;
  unsigned jobs = 0;
  std::vector<std::string> source_roots;
  // `patchgen pin` / `patchgen audit`
  bool pin = false;
  bool audit = false;
  std::vector<std::string> old_roots;  ///< audit --source-root-old
  // `patchgen index`
  bool index = false;
  std::vector<std::string> index_files;
  bool index_json = false;

  /// The mode the flags select (CombinationError refuses combinations that select two).
  Mode mode() const {
    if (index) return Mode::kIndex;
    if (pin) return Mode::kPin;
    if (audit) return Mode::kAudit;
    if (check) return Mode::kCheck;
    if (list) return Mode::kList;
    return validate ? Mode::kValidate : Mode::kGenerate;
  }
};

/// The options of `argv`, or nullopt when the run ends with parsing: --help and --version (CLI11
/// printed them; `ok` is then true) or a flag CLI11 refuses (it printed why).
struct ParsedArgs {
  std::optional<Options> options;
  bool ok = false;
};
ParsedArgs ParseArgs(int argc, char** argv);

/// What is wrong when the options combine in a way no mode takes (the text for stderr), or
/// nullopt. `pin`, `audit` and `index` are set from the subcommand that was given.
std::optional<std::string> CombinationError(const Options& opts);

}  // namespace patchgen::cli
