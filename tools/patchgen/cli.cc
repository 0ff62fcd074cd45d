// The patchgen command line (see cli.h and docs/cli.md).
//
// Every run goes through the same stages, each spec independently:
//   1. load specs (parallel)                 -> PatchSpec or spec errors (exit 3)
//   2. find upstream modules (serial, cached) -> file, version; "not found" (exit 4 or skipped)
//   3. read + parse each distinct upstream file once (parallel), shared read-only by its specs
//   4. generate in memory (parallel)         -> .py text and, when needed, the .diff text
//   5. act in spec order (serial): write / dry-run / check / list / report
// Nothing is written for a spec that failed, and nothing at all under --check (without --fix),
// --dry-run, --list or --validate.
#include "cli.h"

#include <sched.h>

#include <CLI/CLI.hpp>

#include "runner.h"

namespace patchgen::cli {

namespace fs = std::filesystem;

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

int RunIndex(const Options& opts) {
  // Files are parsed on all workers; results are printed in argument order.
  struct Indexed {
    std::string output;
    std::vector<Diagnostic> errors;
  };
  std::vector<Indexed> results(opts.index_files.size());
  ParallelFor(results.size(), opts.jobs, [&](size_t i) {
    const std::string& file = opts.index_files[i];
    auto text = ReadFile(file);
    if (!text) {
      results[i].errors.push_back(
          ErrorAt(SourceLoc::InFile(file), "cannot read file", {}, ErrorKind::kIo));
      return;
    }
    auto module = parser::PyModule::Parse(file, std::move(*text));
    if (!module.ok()) {
      results[i].errors = module.errors();
      for (auto& d : results[i].errors) d.kind = ErrorKind::kUpstream;
      return;
    }
    results[i].output =
        opts.index_json ? parser::FormatIndexJson(**module) : parser::FormatIndexText(**module);
  });
  int code = kExitOk;
  std::vector<const std::string*> outputs;
  for (const auto& r : results) {
    PrintDiagnostics(r.errors);
    code = std::max(code, WorstExit(r.errors));
    if (r.errors.empty()) outputs.push_back(&r.output);
  }
  if (opts.index_json && opts.index_files.size() > 1) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto* o : outputs) all.push_back(nlohmann::json::parse(*o));
    std::cout << JsonText(all) << "\n";
  } else {
    for (size_t i = 0; i < outputs.size(); ++i) std::cout << (i ? "\n" : "") << *outputs[i];
  }
  return code;
}

}  // namespace

// Messages print paths relative to the project root, wherever patchgen was started (issue #18
// item 4). A path printed for a spec is also the one the spec loader resolves `extends` parents
// and `file:` patch files against and opens them by, so the Runner works from the project root:
// every path from the command line and the environment is made absolute against the working
// directory it was started in (cwd_) before it is used. When the root cannot be entered, paths
// stay relative to the working directory.
bool Runner::WorkFromProjectRoot() {
  std::error_code ec;
  fs::current_path(config_.root, ec);
  shown_base_ = ec ? cwd_ : config_.root;
  return !ec;
}

int Runner::Main() {
  WorkFromProjectRoot();
  if (!CollectSpecs()) return discovery_failed_ ? kExitIo : kExitUsage;
  const Mode mode = opts_.mode();
  // --check and audit: every source root given exists (audit: the new and old ones).
  if (mode == Mode::kCheck && !RootsExist(RootSet::kAll)) return kExitUsage;
  if (mode == Mode::kAudit && !RootsExist(RootSet::kAudit)) return kExitUsage;
  if (mode == Mode::kCheck) {
    if (std::optional<int> code = QuickCheck()) return *code;  // every spec up to date by stamps
  }
  LoadSpecs();
  if (mode == Mode::kValidate) return Validate();
  if (!RootsHoldTheSpecs(mode)) return kExitUsage;
  FindUpstreams();
  if (mode == Mode::kCheck && !SkipsExplained()) return kExitUsage;
  ParseUpstreams();
  GenerateAll();
  switch (mode) {
    case Mode::kPin:
      return Pin();
    case Mode::kAudit:
      return Audit();
    case Mode::kList:
      return List();
    case Mode::kCheck:
      CheckOutputs();
      return Check();
    case Mode::kGenerate:
      CheckOutputs();
      return Generate();
    case Mode::kValidate:
      break;
  }
  return kExitInternal;
}

std::string DiffNameFor(const std::string& output_name) {
  if (output_name.size() > 3 && output_name.compare(output_name.size() - 3, 3, ".py") == 0) {
    return output_name.substr(0, output_name.size() - 3) + ".diff";
  }
  return output_name + ".diff";
}

namespace {

// False, after printing why, when the options combine in a way no mode takes (exit 2).
bool OptionsCombine(const Options& opts) {
  if (opts.pin || opts.audit) {
    if (opts.check || opts.list || opts.validate || opts.fix || opts.dry_run || opts.diff ||
        !opts.output_dir.empty()) {
      std::cerr << "patchgen: error: `" << (opts.pin ? "pin" : "audit")
                << "` takes no --check/--list/--validate/--fix/--dry-run/--diff/-o\n";
      return false;
    }
    if (opts.pin && opts.all == !opts.specs.empty()) {
      std::cerr << "patchgen: error: `pin` needs SPEC files or --all (not both)\n";
      return false;
    }
  }

  auto usage = [](const std::string& msg) {
    std::cerr << "patchgen: error: " << msg << "\nRun with --help for more information.\n";
    return false;
  };
  int modes = opts.check + opts.list + opts.validate;
  if (modes > 1) return usage("--check, --list and --validate cannot be combined");
  if (opts.fix && !opts.check) return usage("--fix needs --check");
  if (opts.all && !opts.specs.empty()) return usage("give SPEC files or --all, not both");
  if (modes == 0 && !opts.all && opts.specs.empty() && !opts.audit) {
    return usage("give SPEC files or --all");
  }
  if (opts.dry_run && (opts.check || opts.list || opts.validate)) {
    return usage("--dry-run only applies when generating");
  }
  return true;
}

}  // namespace

int Run(int argc, char** argv) {
  Options opts;
  CLI::App app{"patchgen: generate patched modeling files from YAML specs (docs/cli.md)",
               "patchgen"};
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (opts.jobs == 0) opts.jobs = AvailableCores();
  InstallTempFileCleanup();
  if (index->parsed()) return RunIndex(opts);
  opts.pin = pin->parsed();
  opts.audit = audit->parsed();
  if (!OptionsCombine(opts)) return kExitUsage;

  try {
    fs::path cwd = fs::current_path();
    auto config = FindProjectConfig(cwd);
    if (!config.ok()) {
      PrintDiagnostics(config.errors());
      return kExitUsage;
    }
    Runner runner(std::move(opts), cwd, std::move(config.value()));
    return runner.Main();
  } catch (const std::exception& e) {
    std::cerr << "patchgen: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
}

}  // namespace patchgen::cli
