// The Runner's stages (runner.h): collect and load specs, find and parse upstream modules once,
// generate every job in memory (the checks made before anything is written are
// runner_outputs.cc).
#include "parser/tree_queries.h"
#include "rewriter/sha256.h"
#include "runner.h"

namespace patchgen::cli {

bool Runner::CollectSpecs() {
  const bool discover = opts_.specs.empty();
  std::vector<fs::path> paths;
  if (discover) {
    std::error_code ec;
    if (!fs::is_directory(config_.specs, ec)) {
      std::cerr << "patchgen: error: specs folder '" << Show(config_.specs) << "' does not exist\n"
                << "help: set `specs` in the project config ("
                << (config_.file
                        ? Show(*config_.file)
                        : std::string(
                              "no pyproject.toml with [tool.patchgen] or patchgen.toml found"))
                << ") or name spec files on the command line\n";
      return false;
    }
    std::vector<Diagnostic> errors;
    paths = DiscoverSpecs(config_.specs, shown_base_, errors);
    if (!errors.empty()) {
      // A gate that cannot see every spec must not pass: nothing runs.
      PrintDiagnostics(errors);
      discovery_failed_ = true;
      return false;
    }
  } else {
    for (const auto& s : opts_.specs) {
      fs::path p(s);
      paths.push_back((p.is_absolute() ? p : cwd_ / p).lexically_normal());
    }
  }
  for (const auto& p : paths) {
    Job job;
    job.spec_abs = p;
    job.spec_shown = Show(p);
    job.discovered = discover;
    jobs_.push_back(std::move(job));
  }
  return true;
}

void Runner::LoadSpecs() {
  ParallelFor(jobs_.size(), opts_.jobs, [&](size_t i) {
    Job& job = jobs_[i];
    std::error_code ec;
    // A path that exists but is no regular file (a folder, a FIFO, a device) is refused by
    // LoadSpec's read, which says what it is.
    if (!fs::exists(job.spec_abs, ec)) {
      job.errors.push_back(
          ErrorAt(SourceLoc::InFile(job.spec_shown), "spec file not found", {}, ErrorKind::kIo));
      return;
    }
    // A spec saved with a UTF-8 byte order mark is read without it: yaml-cpp skips it but counts
    // positions after it, so every column of every message would be off. (LoadSpec reports a
    // file it cannot read.)
    std::optional<std::string> text = ReadFile(job.spec_abs, nullptr, kMaxSpecFileBytes);
    if (text && text->starts_with("\xEF\xBB\xBF")) text->erase(0, 3);
    if (text) {
      spec::PartialLoad loaded = spec::LoadSpecKeepingEntries(job.spec_shown, std::move(*text));
      Fail(job, std::move(loaded.errors));
      if (job.errors.empty()) {
        job.spec = std::move(loaded.spec);
      } else {
        job.partial_spec = std::move(loaded.spec);
        job.entries_dropped = loaded.entries_dropped;
      }
      return;
    }
    auto loaded = spec::LoadSpec(job.spec_shown);
    if (!loaded.ok()) {
      Fail(job, loaded.errors());
      return;
    }
    job.spec = std::move(loaded.value());
  });
}

// The upstream lookup of this run: --source-root flags, PATCHGEN_SOURCE_PATH, the config's
// source_roots, then the interpreter's sys.path.
SourceLookup Runner::MakeSourceLookup() const {
  std::vector<SourceRoot> roots;
  for (const auto& r : opts_.source_roots) {
    fs::path p(r);
    roots.push_back({(p.is_absolute() ? p : cwd_ / p).lexically_normal(), "--source-root"});
  }
  if (const char* env = std::getenv("PATCHGEN_SOURCE_PATH")) {
    for (auto& p : SourceLookup::SplitPathList(env, cwd_))
      roots.push_back({p, "PATCHGEN_SOURCE_PATH"});
  }
  for (const auto& p : config_.source_roots) {
    roots.push_back(
        {p, "source_roots in " + (config_.file ? Show(*config_.file) : std::string("config"))});
  }
  return SourceLookup(std::move(roots), config_.python, cwd_, shown_base_);
}

void Runner::FindUpstreams() {
  SourceLookup lookup = MakeSourceLookup();
  for (Job& job : jobs_) {
    if (!job.spec && !job.partial_spec) continue;
    const spec::PatchSpec& s = job.spec ? *job.spec : *job.partial_spec;
    job.lookup = lookup.Find(s.upstream);
    const std::string top = TopPackage(s.upstream);
    using Status = LookupResult::Status;
    // A spec with load errors fails with them; its upstream, when found, adds the generator's.
    if (job.lookup.status == Status::kFound || job.partial_spec) continue;
    if (job.lookup.status == Status::kPackageMissing && job.discovered && !opts_.validate) {
      job.skipped = true;
      continue;
    }
    Diagnostic d = ErrorAt(s.upstream_loc, "upstream module '" + s.upstream + "' not found",
                           SourceLookup::Help(top), ErrorKind::kUpstream);
    d.notes.push_back(Note::Verbatim("looked in:"));
    for (const auto& place : job.lookup.looked) d.notes.push_back(Note::Verbatim("  " + place));
    job.errors.push_back(std::move(d));
  }
}

namespace {

// Reads and parses one upstream file into `u` (on a worker), or sets u.errors: unreadable, a CR
// line ending, a syntax error, tab indentation.
void ReadUpstream(Upstream& u, const fs::path& path, const std::string& shown) {
  auto text = ReadFile(path);
  if (!text) {
    u.errors.push_back(
        ErrorAt(SourceLoc::InFile(shown), "cannot read upstream file", {}, ErrorKind::kIo));
    return;
  }
  u.source = *text;
  // A UTF-8 byte order mark says nothing Python needs (UTF-8 is its default) and would land after
  // the generated header, where CPython rejects U+FEFF: it is left out of what is patched. The
  // .diff, made from the file as read, shows it removed.
  if (text->starts_with("\xEF\xBB\xBF")) text->erase(0, 3);
  // CR line endings (a '\r' not followed by '\n'): lines patchgen could not tell apart.
  for (size_t cr = text->find('\r'); cr != std::string::npos; cr = text->find('\r', cr + 1)) {
    if (cr + 1 < text->size() && (*text)[cr + 1] == '\n') continue;
    LineIndex lines(*text);
    u.errors.push_back(MakeDiagnostic(shown, *text, lines,
                                      {static_cast<uint32_t>(cr), static_cast<uint32_t>(cr + 1)},
                                      "upstream module has a CR line ending ('\\r' without '\\n')",
                                      "patchgen reads modules with LF or CRLF line endings; "
                                      "convert the file (e.g. `dos2unix -c mac`)",
                                      ErrorKind::kUpstream));
    return;
  }
  size_t lf = 0, crlf = 0;
  for (size_t i = 0; i < text->size(); ++i) {
    if ((*text)[i] != '\n') continue;
    ++lf;
    if (i > 0 && (*text)[i - 1] == '\r') ++crlf;
  }
  u.crlf = lf > 0 && crlf == lf;
  auto parsed = parser::PyModule::Parse(shown, std::move(*text));
  if (!parsed.ok()) {
    u.errors = parsed.errors();
    return;
  }
  if (auto tab = parser::FirstTabIndentation(**parsed)) {
    const parser::PyModule& m = **parsed;
    u.errors.push_back(MakeDiagnostic(
        shown, m.source(), m.lines(), *tab, "upstream module is indented with tabs",
        "code patchgen inserts is indented with spaces, and CPython rejects a block that mixes "
        "tabs and spaces; convert the module's indentation to spaces (e.g. `expand -i -t 8`)",
        ErrorKind::kUpstream));
    return;
  }
  u.module = std::move(parsed.value());
  // One hash per upstream file, shared by its specs (the header's sha256 and the check stamps).
  u.source_sha256 = rewriter::Sha256Hex(u.source);
  u.module_sha256 = u.module->source().size() == u.source.size()
                        ? u.source_sha256
                        : rewriter::Sha256Hex(u.module->source());
}

}  // namespace

void Runner::ParseUpstreams() {
  std::vector<Upstream*> todo;
  std::vector<fs::path> paths;
  for (Job& job : jobs_) {
    bool partial = job.partial_spec && job.lookup.status == LookupResult::Status::kFound;
    if (!partial && (!job.spec || !job.errors.empty() || job.skipped)) continue;
    auto& slot = upstreams_[job.lookup.file.file];
    if (!slot) {
      slot = std::make_unique<Upstream>();
      todo.push_back(slot.get());
      paths.push_back(job.lookup.file.file);
    }
    job.upstream = slot.get();
  }
  // Largest file first: the last file a worker starts is then a small one, so that the two cores
  // of the target machine finish together (the same in GenerateAll).
  std::vector<size_t> order = LargestFirst(paths.size(), [&](size_t i) {
    std::error_code ec;
    uintmax_t size = fs::file_size(paths[i], ec);
    return ec ? 0 : size;
  });
  ParallelFor(todo.size(), opts_.jobs, [&](size_t k) {
    size_t i = order[k];
    ReadUpstream(*todo[i], paths[i], Show(paths[i]));
  });
}

bool Runner::NeedDiff(const Job& job) const {
  std::error_code ec;
  return opts_.diff || (opts_.check && fs::is_regular_file(job.out_diff, ec)) || opts_.list;
}

void Runner::GenerateAll() {
  PlaceOutputs();
  std::vector<size_t> order = LargestFirst(jobs_.size(), [&](size_t i) -> uintmax_t {
    const Upstream* u = jobs_[i].upstream;
    return u ? u->source.size() : 0;
  });
  ParallelFor(jobs_.size(), opts_.jobs, [&](size_t k) { GenerateJob(jobs_[order[k]]); });
}

// Where each job's .py and .diff go: -o DIR, else the output root mirroring the spec's folder
// under the specs root.
void Runner::PlaceOutputs() {
  for (Job& job : jobs_) {
    if (!job.spec) continue;
    const std::string& name = job.spec->output;
    if (!opts_.output_dir.empty()) {
      fs::path dir(opts_.output_dir);
      job.out_py = ((dir.is_absolute() ? dir : cwd_ / dir) / name).lexically_normal();
    } else {
      fs::path rel = job.spec_abs.parent_path().lexically_relative(config_.specs);
      bool inside = !rel.empty() && *rel.begin() != "..";
      job.out_py =
          (inside ? config_.output / rel / name : config_.output / name).lexically_normal();
    }
    job.out_diff = job.out_py.parent_path() / DiffNameFor(job.out_py.filename().string());
  }
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

}  // namespace

// One job in memory (runs on a worker): generate, check what was generated, compare the contract
// with the pins, and make the .diff when needed. A failure goes to job.errors.
void Runner::GenerateJob(Job& job) {
  if (job.partial_spec) {
    GeneratePartial(job);
    return;
  }
  if (!job.spec || job.skipped || !job.errors.empty() || job.upstream == nullptr) return;
  if (!job.upstream->errors.empty()) {
    Fail(job, job.upstream->errors);
    return;
  }
  rewriter::GenerateOptions options;
  options.upstream_path = job.lookup.file.rel_path;
  options.upstream_version = job.lookup.file.version;
  options.default_runtime = config_.runtime;
  options.upstream_sha256 = job.upstream->module_sha256;
  // The header names the spec relative to the project root, wherever patchgen runs from.
  spec::PatchSpec spec = *job.spec;
  spec.path = DisplayPath(job.spec_abs, config_.root);
  auto result = rewriter::Generate(spec, *job.upstream->module, options);
  if (!result.ok()) {
    Fail(job, result.errors());
    if (opts_.audit) {  // audit still compares what the pins name with the new upstream
      fs::path pins_path = PinsPathFor(job.spec_abs);
      if (auto pins = ReadPins(pins_path, Show(pins_path)); pins.ok()) job.pins = std::move(*pins);
    }
    return;
  }
  if (!AcceptGenerated(job, *result)) return;
  job.py_text = std::move(result->text);
  // An upstream with CRLF line endings throughout gets a generated file with CRLF throughout
  // (inserted code and the header are written with LF).
  if (job.upstream->crlf) job.py_text = WithCrlf(job.py_text);
  job.patches = result->applied.size();
  job.upstream_sha = result->upstream_sha256;
  job.contract = std::move(result->contract);
  job.skipped_entries = std::move(result->skipped);
  if (!MatchPins(job)) return;
  if (NeedDiff(job)) {
    job.diff_text = diff::UnifiedDiff(job.upstream->source, job.py_text,
                                      "a/" + job.lookup.file.rel_path, "b/" + job.spec->output);
  }
}

// A spec that loaded with errors: the generator's errors in its other entries join them, sorted,
// so that one run reports all of them. Nothing is written.
void Runner::GeneratePartial(Job& job) {
  if (job.upstream == nullptr) return;
  if (!job.upstream->errors.empty()) {  // an upstream patchgen cannot read: its errors join
    Fail(job, job.upstream->errors);
    SortDiagnostics(job.errors);
    return;
  }
  rewriter::GenerateOptions options;
  options.upstream_path = job.lookup.file.rel_path;
  options.upstream_version = job.lookup.file.version;
  options.default_runtime = config_.runtime;
  options.entries_dropped = job.entries_dropped;
  spec::PatchSpec spec = *job.partial_spec;
  spec.path = DisplayPath(job.spec_abs, config_.root);
  auto result = rewriter::Generate(spec, *job.upstream->module, options);
  if (result.ok()) return;
  Fail(job, result.errors());
  SortDiagnostics(job.errors);
}

// False (the job failed) when a target is defined twice upstream or the generated module would
// hold bytes CPython rejects.
bool Runner::AcceptGenerated(Job& job, const rewriter::GenerateResult& result) {
  if (auto ambiguous =
          AmbiguousTargets(result.contract, *job.upstream->module, Show(job.lookup.file.file));
      !ambiguous.empty()) {
    Fail(job, std::move(ambiguous));
    return false;
  }
  if (auto blocker = FirstSourceBlocker(result.text)) {
    LineIndex lines(result.text);
    Diagnostic d = MakeDiagnostic(
        Show(job.out_py), result.text, lines, {blocker->first, blocker->first + 1},
        "the generated module would hold " + blocker->second + ", which CPython rejects",
        "it comes from the upstream module, a patch file or the spec at that place of the "
        "output; save them as UTF-8 without a byte order mark",
        ErrorKind::kSpec);
    Fail(job, {std::move(d)});
    return false;
  }
  return true;
}

// Contract pins: a spec with a pin file fails when upstream changed what it relies on. Reads the
// pin file into the job and compares; false when the job failed.
bool Runner::MatchPins(Job& job) {
  fs::path pins_path = PinsPathFor(job.spec_abs);
  auto pins = ReadPins(pins_path, Show(pins_path));
  if (!pins.ok()) {
    Fail(job, pins.errors());
    return false;
  }
  job.pins = std::move(*pins);
  if (!job.pins || opts_.pin) return true;
  job.pin_findings = ComparePins(*job.pins, job.contract);
  if (opts_.audit || job.pin_findings.empty()) return true;
  // A changed contract fails the spec; an entry without a pin (added to the spec since the last
  // `patchgen pin`) is a warning.
  std::vector<Diagnostic> errors;
  for (const PinFinding& f : job.pin_findings) {
    Diagnostic d = PinDiagnostic(f, Show(job.lookup.file.file), job.lookup.file.version,
                                 Show(pins_path), job.spec_shown);
    if (f.kind == PinFinding::Kind::kUnpinned) {
      d.severity = Severity::kWarning;
      job.warnings.push_back(std::move(d));
    } else {
      errors.push_back(std::move(d));
    }
  }
  SortDiagnostics(errors);
  SortDiagnostics(job.warnings);
  if (errors.empty()) return true;
  Fail(job, std::move(errors));
  return false;
}

}  // namespace patchgen::cli
