// Generation in memory (pipeline.h): where each spec's files go, each spec generated and checked
// on worker threads, its contract compared with its pins, its .diff made when the mode needs one.
#include "diff/unified_diff.h"
#include "parallel.h"
#include "pipeline.h"
#include "rewriter/generate.h"

namespace patchgen::cli {

std::vector<Diagnostic> SpecRecord::Errors() const {
  std::vector<Diagnostic> all = load.errors;
  for (const auto* part : {&upstream.errors, &gen.errors, &clashes})
    all.insert(all.end(), part->begin(), part->end());
  if (load.partial && !gen.errors.empty()) SortDiagnostics(all);
  return all;
}

std::string DiffNameFor(const std::string& output_name) {
  if (output_name.size() > 3 && output_name.compare(output_name.size() - 3, 3, ".py") == 0) {
    return output_name.substr(0, output_name.size() - 3) + ".diff";
  }
  return output_name + ".diff";
}

std::vector<OutputPaths> PlaceOutputs(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  std::vector<OutputPaths> out(specs.size());
  const ProjectConfig& config = ctx.config;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].spec()) continue;
    const std::string& name = specs[i].spec()->output;
    fs::path& py = out[i].py;
    if (!ctx.opts.output_dir.empty()) {
      fs::path dir(ctx.opts.output_dir);
      py = ((dir.is_absolute() ? dir : ctx.cwd / dir) / name).lexically_normal();
    } else {
      fs::path rel = specs[i].file.abs.parent_path().lexically_relative(config.specs);
      bool inside = !rel.empty() && *rel.begin() != "..";
      py = (inside ? config.output / rel / name : config.output / name).lexically_normal();
    }
    out[i].diff = py.parent_path() / DiffNameFor(py.filename().string());
  }
  return out;
}

namespace {

// `text` with CRLF line endings throughout (a '\n' not already after '\r' gets one).
std::string WithCrlf(const std::string& text) {
  std::string crlf;
  crlf.reserve(text.size() + text.size() / 16);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' && (i == 0 || text[i - 1] != '\r')) crlf += '\r';
    crlf += text[i];
  }
  return crlf;
}

/// Whether the mode needs a spec's .diff: --diff, --list, or --check with one on disk.
bool NeedDiff(const RunContext& ctx, const SpecRecord& rec) {
  std::error_code ec;
  return ctx.opts.diff || (ctx.opts.check && fs::is_regular_file(rec.out.diff, ec)) ||
         ctx.opts.list;
}

rewriter::GenerateOptions OptionsFor(const RunContext& ctx, const SpecRecord& rec) {
  rewriter::GenerateOptions options;
  options.upstream_path = rec.upstream.lookup.file.rel_path;
  options.upstream_version = rec.upstream.lookup.file.version;
  options.default_runtime = ctx.config.runtime;
  return options;
}

/// The errors of a generated module: a target defined twice upstream, or bytes CPython rejects.
std::vector<Diagnostic> Refusals(const RunContext& ctx, const SpecRecord& rec,
                                 const rewriter::GenerateResult& result) {
  if (auto ambiguous = AmbiguousTargets(result.contract, *rec.parsed->module,
                                        ctx.Show(rec.upstream.lookup.file.file));
      !ambiguous.empty()) {
    return ambiguous;
  }
  auto blocker = FirstSourceBlocker(result.text);
  if (!blocker) return {};
  LineIndex lines(result.text);
  return {MakeDiagnostic(
      ctx.Show(rec.out.py), result.text, lines, {blocker->first, blocker->first + 1},
      "the generated module would hold " + blocker->second + ", which CPython rejects",
      "it comes from the upstream module, a patch file or the spec at that place of the output; "
      "save them as UTF-8 without a byte order mark",
      ErrorKind::kSpec)};
}

/// Contract pins: reads the spec's pin file into `g` and compares its contract with it. A changed
/// contract fails the spec; an entry without a pin (added to the spec since the last `patchgen
/// pin`) is a warning. `pin` records the contract and `audit` reports the findings instead.
void MatchPins(const RunContext& ctx, const SpecRecord& rec, Generated& g) {
  fs::path pins_path = PinsPathFor(rec.file.abs);
  auto pins = ReadPins(pins_path, ctx.Show(pins_path));
  if (!pins.ok()) {
    g.errors = pins.errors();
    return;
  }
  g.pins = std::move(*pins);
  if (!g.pins || ctx.opts.pin) return;
  g.pin_findings = ComparePins(*g.pins, g.contract);
  if (ctx.opts.audit || g.pin_findings.empty()) return;
  for (const PinFinding& f : g.pin_findings) {
    Diagnostic d =
        PinDiagnostic(f, ctx.Show(rec.upstream.lookup.file.file), rec.upstream.lookup.file.version,
                      ctx.Show(pins_path), rec.file.shown);
    if (f.kind == PinFinding::Kind::kUnpinned) {
      d.severity = Severity::kWarning;
      g.warnings.push_back(std::move(d));
    } else {
      g.errors.push_back(std::move(d));
    }
  }
  SortDiagnostics(g.errors);
  SortDiagnostics(g.warnings);
}

/// A spec that loaded with errors: the generator's errors in its other entries (its upstream's,
/// when patchgen cannot read it), so that one run reports all of them. Nothing is written.
Generated GeneratePartial(const RunContext& ctx, const SpecRecord& rec) {
  Generated g;
  if (rec.parsed == nullptr) return g;
  if (!rec.parsed->errors.empty()) {
    g.errors = rec.parsed->errors;
    return g;
  }
  rewriter::GenerateOptions options = OptionsFor(ctx, rec);
  options.entries_dropped = rec.load.entries_dropped;
  spec::PatchSpec spec = *rec.load.partial;
  spec.path = DisplayPath(rec.file.abs, ctx.config.root);
  auto result = rewriter::Generate(spec, *rec.parsed->module, options);
  if (!result.ok()) g.errors = result.errors();
  return g;
}

/// One spec in memory (on a worker): generate, check what was generated, compare the contract
/// with the pins, and make the .diff when needed.
Generated GenerateOne(const RunContext& ctx, const SpecRecord& rec) {
  if (rec.load.partial) return GeneratePartial(ctx, rec);
  Generated g;
  if (!rec.spec() || rec.skipped() || !rec.upstream.errors.empty() || rec.parsed == nullptr)
    return g;
  if (!rec.parsed->errors.empty()) {
    g.errors = rec.parsed->errors;
    return g;
  }
  rewriter::GenerateOptions options = OptionsFor(ctx, rec);
  options.upstream_sha256 = rec.parsed->module_sha256;
  // The header names the spec relative to the project root, wherever patchgen runs from.
  spec::PatchSpec spec = *rec.spec();
  spec.path = DisplayPath(rec.file.abs, ctx.config.root);
  auto result = rewriter::Generate(spec, *rec.parsed->module, options);
  if (!result.ok()) {
    g.errors = result.errors();
    if (ctx.opts.audit) {  // audit still compares what the pins name with the new upstream
      fs::path pins_path = PinsPathFor(rec.file.abs);
      if (auto pins = ReadPins(pins_path, ctx.Show(pins_path)); pins.ok())
        g.pins = std::move(*pins);
    }
    return g;
  }
  g.errors = Refusals(ctx, rec, *result);
  if (!g.errors.empty()) return g;
  // An upstream with CRLF line endings throughout gets a generated file with CRLF throughout
  // (inserted code and the header are written with LF).
  g.py_text = rec.parsed->crlf ? WithCrlf(result->text) : std::move(result->text);
  g.patches = result->applied.size();
  g.upstream_sha = result->upstream_sha256;
  g.contract = std::move(result->contract);
  g.skipped_entries = std::move(result->skipped);
  MatchPins(ctx, rec, g);
  if (!g.errors.empty() || !NeedDiff(ctx, rec)) return g;
  g.diff_text = diff::UnifiedDiff(rec.parsed->source, g.py_text,
                                  "a/" + rec.upstream.lookup.file.rel_path, "b/" + spec.output);
  return g;
}

}  // namespace

std::vector<Generated> GenerateSpecs(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  std::vector<Generated> out(specs.size());
  std::vector<size_t> order = LargestFirst(specs.size(), [&](size_t i) -> uintmax_t {
    const Upstream* u = specs[i].parsed;
    return u ? u->source.size() : 0;
  });
  ParallelFor(specs.size(), ctx.opts.jobs,
              [&](size_t k) { out[order[k]] = GenerateOne(ctx, specs[order[k]]); });
  return out;
}

}  // namespace patchgen::cli
