// The command line of patchgen (options.h): CLI11's flags and subcommands, the number of worker
// threads, and the combinations no mode takes.
#include "options.h"

#include <sched.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <thread>

namespace patchgen::cli {
namespace {

/// The most worker threads --jobs accepts.
constexpr unsigned kMaxJobs = 1024;

/// --jobs N: a whole number of threads from 1 to kMaxJobs, with a message that says so.
CLI::Validator JobsValidator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        bool digits = !value.empty() && value.size() <= 6 &&
                      value.find_first_not_of("0123456789") == std::string::npos;
        unsigned long n = digits ? std::stoul(value) : 0;
        if (digits && n >= 1 && n <= kMaxJobs) return {};
        return "takes a number of worker threads from 1 to " + std::to_string(kMaxJobs) +
               ", not '" + value + "' (leave --jobs out to use every core this process may use)";
      },
      "1.." + std::to_string(kMaxJobs));
}

/// Cores this process may run on (its CPU affinity, e.g. under `taskset`), at least 1.
unsigned AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

/// The flags of generation, --check, --list and --validate (no subcommand).
void AddMainFlags(CLI::App& app, Options& opts) {
  app.set_version_flag("--version", std::string("patchgen ") + PATCHGEN_VERSION);
  app.add_option("SPEC", opts.specs,
                 "spec files (default with --check/--list/--validate: every spec)");
  app.add_flag("--all", opts.all, "generate every spec under the specs root");
  app.add_flag("--diff", opts.diff, "also write <output>.diff (upstream -> generated)");
  app.add_option("-o,--output", opts.output_dir, "write outputs to DIR instead of the output root");
  app.add_flag("--dry-run", opts.dry_run, "say what would be written; write nothing");
  app.add_flag("-v,--verbose", opts.verbose,
               "also report unchanged files and where upstreams came from");
  app.add_option("-j,--jobs", opts.jobs, "worker threads (default: the cores this process may use)")
      ->check(JobsValidator());
  app.add_flag("--json", opts.json, "machine-readable report on stdout");
  app.add_flag("--list", opts.list, "list specs with upstream, output and status");
  app.add_flag("--check", opts.check,
               "compare with the files on disk; exit 1 on drift; write nothing");
  app.add_flag("--fix", opts.fix, "with --check: write what differs");
  app.add_flag("--validate", opts.validate, "validate specs without their upstream modules");
  app.add_option("--source-root", opts.source_roots,
                 "folder searched first for upstream modules (repeatable)");
}

/// The subcommands `pin`, `audit` and `index`, in this order.
std::vector<CLI::App*> AddSubcommands(CLI::App& app, Options& opts) {
  CLI::App* pin = app.add_subcommand(
      "pin", "record the upstream contracts of specs in their .pins files (docs/cli.md)");
  pin->add_option("SPEC", opts.specs, "spec files");
  pin->add_flag("--all", opts.all, "every spec under the specs root");
  pin->add_option("--source-root", opts.source_roots,
                  "folder searched first for upstream modules (repeatable)");
  pin->add_flag("--json", opts.json, "machine-readable report on stdout");
  pin->add_option("-j,--jobs", opts.jobs, "worker threads")->check(JobsValidator());
  CLI::App* audit = app.add_subcommand(
      "audit", "upgrade survey: what a new upstream changes for every spec; writes nothing");
  audit->add_option("SPEC", opts.specs, "spec files (default: every spec)");
  audit->add_option("--source-root", opts.source_roots, "the new upstream (repeatable)")
      ->required();
  audit->add_option("--source-root-old", opts.old_roots,
                    "the old upstream to compare with (repeatable)");
  audit->add_flag("--json", opts.json, "machine-readable report on stdout");
  audit->add_option("-j,--jobs", opts.jobs, "worker threads")->check(JobsValidator());
  CLI::App* index = app.add_subcommand("index", "print the index of Python files");
  index->add_option("FILE", opts.index_files, "Python files")->required();
  index->add_flag("--json", opts.index_json, "JSON instead of text");
  index
      ->add_option("-j,--jobs", opts.jobs,
                   "worker threads (default: the cores this process may use)")
      ->check(JobsValidator());
  return {pin, audit, index};
}

}  // namespace

ParsedArgs ParseArgs(int argc, char** argv) {
  Options opts;
  CLI::App app{"patchgen: generate patched modeling files from YAML specs (docs/cli.md)",
               "patchgen"};
  AddMainFlags(app, opts);
  std::vector<CLI::App*> sub = AddSubcommands(app, opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return {std::nullopt, app.exit(e) == 0};
  }
  if (opts.jobs == 0) opts.jobs = AvailableCores();
  opts.pin = sub[0]->parsed();
  opts.audit = sub[1]->parsed();
  opts.index = sub[2]->parsed();
  return {std::move(opts), true};
}

std::optional<std::string> CombinationError(const Options& opts) {
  if (opts.index) return std::nullopt;
  if (opts.pin || opts.audit) {
    if (opts.check || opts.list || opts.validate || opts.fix || opts.dry_run || opts.diff ||
        !opts.output_dir.empty()) {
      return std::string("patchgen: error: `") + (opts.pin ? "pin" : "audit") +
             "` takes no --check/--list/--validate/--fix/--dry-run/--diff/-o\n";
    }
    if (opts.pin && opts.all == !opts.specs.empty())
      return "patchgen: error: `pin` needs SPEC files or --all (not both)\n";
  }
  auto usage = [](const std::string& msg) {
    return "patchgen: error: " + msg + "\nRun with --help for more information.\n";
  };
  int modes = opts.check + opts.list + opts.validate;
  if (modes > 1) return usage("--check, --list and --validate cannot be combined");
  if (opts.fix && !opts.check) return usage("--fix needs --check");
  if (opts.all && !opts.specs.empty()) return usage("give SPEC files or --all, not both");
  if (modes == 0 && !opts.all && opts.specs.empty() && !opts.audit)
    return usage("give SPEC files or --all");
  if (opts.dry_run && (opts.check || opts.list || opts.validate))
    return usage("--dry-run only applies when generating");
  return std::nullopt;
}

}  // namespace patchgen::cli
