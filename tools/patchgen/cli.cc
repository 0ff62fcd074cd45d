// The patchgen command line (cli.h, docs/cli.md): a short pipeline over stages that return data.
//
//   ParseArgs, FindProjectConfig, EnterProjectRoot -> the run's context (RunContext)
//   Discover        -> the spec files              (or stop: usage, unreadable specs folder)
//   QuickCheck      -> --check: every spec up to date by its check stamp, nothing parsed
//   LoadSpecs, FindUpstreams, ParseUpstreams, PlaceOutputs, GenerateSpecs, OutputClashes
//                   -> one record per spec, a field per stage (pipeline.h)
//   the mode        -> what it made of each spec, what it prints (modes.h)
//   ExitStatus      -> the exit status, decided in one place (exit_status.h); PrintResult prints
//
// The source roots given to --check and audit are checked between the stages (source_roots.h).
// Nothing is written for a spec that failed, and nothing at all under --check (without --fix),
// --dry-run, --list, --validate or audit.
#include "cli.h"

#include "exit_status.h"
#include "modes.h"
#include "report.h"
#include "source_roots.h"

namespace patchgen::cli {
namespace {

/// What `before` printed in front of what `r` printed.
RunResult After(Printout before, RunResult r) {
  before.Append(std::move(r.printed));
  r.printed = std::move(before);
  return r;
}

/// A run stopped by `errors` (a source root's): usage.
RunResult StoppedBy(Mode mode, const std::vector<Diagnostic>& errors, Printout printed) {
  printed.Diagnostics(errors);
  return Stopped(mode, Stop::kUsage, std::move(printed));
}

/// The mode the options select, over the records of every spec.
RunResult RunMode(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  switch (ctx.opts.mode()) {
    case Mode::kGenerate:
      return GenerateMode(ctx, specs);
    case Mode::kCheck:
      return CheckMode(ctx, specs, /*fresh=*/false);
    case Mode::kList:
      return ListMode(ctx, specs);
    case Mode::kPin:
      return PinMode(ctx, specs);
    case Mode::kAudit:
      return AuditMode(ctx, specs);
    case Mode::kValidate:
      return ValidateMode(ctx, specs);
    case Mode::kIndex:
      break;
  }
  return IndexMode(ctx.opts);
}

/// The loaded specs through the upstream and generation stages, then the mode. A source root
/// that holds none of the specs' packages (--check, audit) stops the run.
RunResult GenerateAndAct(const RunContext& ctx, std::vector<SpecRecord>& specs, Printout printed) {
  const Mode mode = ctx.opts.mode();
  if (auto errors = RootsWithoutTheSpecs(ctx, specs); !errors.empty())
    return StoppedBy(mode, errors, std::move(printed));
  Fill(specs, FindUpstreams(ctx, specs), &SpecRecord::upstream);
  if (mode == Mode::kCheck) {
    if (auto errors = UnexplainedSkips(ctx, specs); !errors.empty())
      return StoppedBy(mode, errors, std::move(printed));
  }
  Upstreams upstreams = ParseUpstreams(ctx, specs);  // outlives the mode: records point into it
  Fill(specs, std::move(upstreams.of), &SpecRecord::parsed);
  Fill(specs, PlaceOutputs(ctx, specs), &SpecRecord::out);
  Fill(specs, GenerateSpecs(ctx, specs), &SpecRecord::gen);
  if (mode == Mode::kGenerate || mode == Mode::kCheck)
    Fill(specs, OutputClashes(ctx, specs), &SpecRecord::clashes);
  return After(std::move(printed), RunMode(ctx, specs));
}

/// Every spec of the run through the stages, then the mode.
RunResult RunSpecs(const RunContext& ctx) {
  const Mode mode = ctx.opts.mode();
  Discovery found = Discover(ctx);
  if (found.stop) return Stopped(mode, *found.stop, std::move(found.printed));
  std::vector<SpecRecord> specs(found.specs.size());
  Fill(specs, std::move(found.specs), &SpecRecord::file);
  if (mode == Mode::kCheck || mode == Mode::kAudit) {
    if (auto errors = MissingRoots(ctx); !errors.empty())
      return StoppedBy(mode, errors, std::move(found.printed));
  }
  if (mode == Mode::kCheck) {
    if (std::optional<std::vector<OutputPaths>> outs = QuickCheck(ctx, specs)) {
      Fill(specs, std::move(*outs), &SpecRecord::out);
      return After(std::move(found.printed), CheckMode(ctx, specs, /*fresh=*/true));
    }
  }
  Fill(specs, LoadSpecs(ctx, specs), &SpecRecord::load);
  if (mode == Mode::kValidate) return After(std::move(found.printed), ValidateMode(ctx, specs));
  return GenerateAndAct(ctx, specs, std::move(found.printed));
}

/// The run of `opts` in the current working directory: its project config, then its specs.
RunResult RunWith(const Options& opts) {
  const Mode mode = opts.mode();
  if (mode == Mode::kIndex) return IndexMode(opts);
  Printout printed;
  if (std::optional<std::string> error = CombinationError(opts)) {
    printed.Err(*error);
    return Stopped(mode, Stop::kUsage, std::move(printed));
  }
  try {
    fs::path cwd = fs::current_path();
    auto config = FindProjectConfig(cwd);
    if (!config.ok()) {
      printed.Diagnostics(config.errors());
      return Stopped(mode, Stop::kUsage, std::move(printed));
    }
    fs::path shown_base = EnterProjectRoot(*config, cwd);
    return RunSpecs(RunContext{opts, cwd, std::move(config.value()), shown_base});
  } catch (const std::exception& e) {
    printed.Err(std::string("patchgen: internal error: ") + e.what() + "\n");
    return Stopped(mode, Stop::kInternal, std::move(printed));
  }
}

}  // namespace

int Run(int argc, char** argv) {
  ParsedArgs args = ParseArgs(argc, argv);
  if (!args.options) {  // --help, --version, or a flag CLI11 refused: it printed what to
    return ExitStatus(Stopped(Mode::kGenerate, args.ok ? Stop::kDone : Stop::kUsage, {}));
  }
  InstallTempFileCleanup();
  RunResult result = RunWith(*args.options);
  int code = ExitStatus(result);
  PrintResult(result, code);
  return code;
}

}  // namespace patchgen::cli
