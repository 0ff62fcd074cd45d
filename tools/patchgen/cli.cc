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
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <cstdio>
#include <set>
#include <thread>

#include "audit.h"
#include "base/line_index.h"
#include "diff/unified_diff.h"
#include "files.h"
#include "parser/index_printer.h"
#include "parser/py_module.h"
#include "pins.h"
#include "project_config.h"
#include "rewriter/generate.h"
#include "source_lookup.h"
#include "spec/spec_loader.h"
#include "validate.h"

namespace patchgen::cli {

namespace fs = std::filesystem;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitDrift = 1;
constexpr int kExitUsage = 2;

int ExitCodeOf(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSpec: return 3;
    case ErrorKind::kUpstream: return 4;
    case ErrorKind::kIo: return 5;
    case ErrorKind::kInternal: return 70;
  }
  return 70;
}

const char* KindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSpec: return "spec";
    case ErrorKind::kUpstream: return "upstream";
    case ErrorKind::kIo: return "io";
    case ErrorKind::kInternal: return "internal";
  }
  return "internal";
}

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
        return "takes a number of worker threads from 1 to " + std::to_string(kMaxJobs) + ", not '" +
               value + "' (leave --jobs out to use every core this process may use)";
      },
      "1.." + std::to_string(kMaxJobs));
}

/// Cores this process may run on (its CPU affinity, e.g. under `taskset`), at least 1.
unsigned AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

/// Runs fn(i) for i in [0, n) on up to `jobs` threads.
template <class F>
void ParallelFor(size_t n, unsigned jobs, F fn) {
  unsigned threads = std::max(1u, std::min<unsigned>(jobs, static_cast<unsigned>(n)));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

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
  std::vector<std::string> index_files;
  bool index_json = false;
};

/// A parsed upstream file, shared by every spec that names it.
struct Upstream {
  std::string source;  ///< As read (a byte order mark included), for the .diff.
  bool crlf = false;   ///< Every line ends with CRLF: so does the generated file.
  std::unique_ptr<parser::PyModule> module;
  std::vector<Diagnostic> errors;
};

/// One spec's journey through the stages.
struct Job {
  fs::path spec_abs;
  std::string spec_shown;   // as printed (relative to cwd)
  bool discovered = false;  // found by --all / bare --check rather than named
  std::optional<spec::PatchSpec> spec;
  std::vector<Diagnostic> errors;
  LookupResult lookup;
  bool skipped = false;     // upstream package absent on a discovered spec
  Upstream* upstream = nullptr;
  fs::path out_py, out_diff;
  std::string py_text, diff_text;
  size_t patches = 0;
  std::string upstream_sha;
  std::vector<rewriter::ContractPin> contract;    // what the applied entries rely on upstream
  std::vector<rewriter::SkippedEntry> skipped_entries;  // conditional entries left out
  std::optional<PinFile> pins;                    // the spec's pin file, when it has one
  std::vector<PinFinding> pin_findings;           // contract entries that differ from the pins
  std::vector<Diagnostic> warnings;               // entries without a pin
  std::string status;       // final, for reports
};

int WorstExit(const std::vector<Diagnostic>& errors) {
  int code = 0;
  for (const auto& d : errors) code = std::max(code, ExitCodeOf(d.kind));
  return code;
}

void PrintDiagnostics(const std::vector<Diagnostic>& errors) {
  for (const auto& d : errors) std::cerr << FormatDiagnostic(d);
}

/// JSON as printed by --json: valid UTF-8 whatever the bytes of paths, names and messages (a byte
/// that is not UTF-8 prints as U+FFFD, like Python's errors="replace").
std::string JsonText(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json DiagnosticJson(const Diagnostic& d) {
  return {{"path", d.path}, {"line", d.line}, {"col", d.col},   {"kind", KindName(d.kind)},
          {"message", d.message}, {"help", d.help}};
}

std::string Short(const std::string& sha) { return sha.substr(0, 12); }

/// "1.0.0 (sha256 0123456789ab)", leaving out what is unknown.
std::string Fingerprint(const std::string& version, const std::string& sha) {
  std::string s = version.empty() ? "" : version;
  if (!sha.empty()) s += (s.empty() ? "sha256 " : " (sha256 ") + Short(sha) + (s.empty() ? "" : ")");
  return s.empty() ? "unknown" : s;
}

/// Spec files under `root`: *.yaml and *.yml, recursively, sorted by their '/'-separated relative
/// path. Nothing is skipped silently: a folder that cannot be read and a symbolic link to a folder
/// (not followed: it could lead out of the tree or into a loop) are errors in `errors`, and the
/// walk goes on with the rest. A link to a file is a spec like any other.
std::vector<fs::path> DiscoverSpecs(const fs::path& root, const fs::path& cwd, std::vector<Diagnostic>& errors) {
  std::vector<std::pair<std::string, fs::path>> found;
  auto error = [&](const fs::path& at, std::string message, std::string help) {
    SourceLoc loc{DisplayPath(at, cwd), 0, 0, 1, {}};
    errors.push_back(ErrorAt(loc, std::move(message), std::move(help), ErrorKind::kIo));
  };
  std::vector<fs::path> todo = {root};
  while (!todo.empty()) {
    fs::path dir = todo.back();
    todo.pop_back();
    std::error_code ec;
    fs::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      std::error_code ec2;
      bool link = it->is_symlink(ec2);
      if (!link && it->is_directory(ec2)) {
        todo.push_back(p);
        continue;
      }
      if (link && fs::is_directory(p, ec2)) {
        error(p, "spec folder is a symbolic link (to '" + fs::read_symlink(p, ec2).string() + "'); " +
                     "patchgen does not follow folder links under the specs root",
              "replace the link with the folder, or name its specs on the command line");
        continue;
      }
      std::string ext = p.extension().string();
      if (ext == ".yaml" || ext == ".yml") {
        found.emplace_back(p.lexically_relative(root).generic_string(), p);
      }
    }
    if (ec) {
      error(dir, "cannot read the specs folder: " + ec.message(),
            "patchgen must see every spec under the specs root; fix the folder's permissions");
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [rel, path] : found) out.push_back(path);
  SortDiagnostics(errors);
  return out;
}

/// True when `text` starts like a file patchgen generated: its header's first two lines (a .py), or
/// those lines added by a .diff of one.
bool CarriesGeneratedHeader(std::string_view text) {
  constexpr std::string_view kRule = "# ====";
  constexpr std::string_view kBanner = "# GENERATED by patchgen";
  if (text.starts_with(kRule)) {
    size_t nl = text.find('\n');
    return nl != std::string_view::npos && text.substr(nl + 1).starts_with(kBanner);
  }
  if (text.starts_with("--- a/")) {  // a .diff: "+# ====" then "+# GENERATED by patchgen" in its first hunk
    size_t at = text.find("\n+# ====");
    return at != std::string_view::npos && at < 4096 &&
           text.substr(text.find('\n', at + 1) + 1).starts_with("+" + std::string(kBanner));
  }
  return false;
}

/// The first thing in a generated module that CPython rejects in any source file whatever its
/// grammar: a byte sequence that is not UTF-8 (no coding cookie survives the generated header), a
/// NUL byte, or U+FEFF (a byte order mark inside the file, e.g. from a patch file saved with one).
/// Returns its byte offset and what it is.
std::optional<std::pair<uint32_t, std::string>> FirstSourceBlocker(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) return std::pair{static_cast<uint32_t>(i), std::string("a NUL byte")};
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (ok && n == 3) {  // no overlong forms, no surrogates
      auto c1 = static_cast<unsigned char>(text[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
    }
    if (ok && n == 4) {
      auto c1 = static_cast<unsigned char>(text[i + 1]);
      ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
    }
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", c);
      return std::pair{static_cast<uint32_t>(i), "the byte " + std::string(hex) + ", which is not UTF-8"};
    }
    if (text.substr(i, 3) == "\xEF\xBB\xBF") {
      return std::pair{static_cast<uint32_t>(i), std::string("U+FEFF (a byte order mark)")};
    }
    i += n;
  }
  return std::nullopt;
}

/// Errors for entries whose upstream target (or a class around it) is defined more than once in one
/// scope (PyModule::Redefinitions): Python keeps the last definition, the splice would patch the
/// first. Located at the spec entry, naming every definition.
std::vector<Diagnostic> AmbiguousTargets(const std::vector<rewriter::ContractPin>& contract,
                                         const parser::PyModule& upstream, const std::string& shown) {
  std::vector<Diagnostic> out;
  auto where = [&](const parser::Definition& d) {
    LineCol lc = upstream.lines().At(d.definition.start);
    return shown + ":" + std::to_string(lc.line) + ":" + std::to_string(lc.col);
  };
  for (const rewriter::ContractPin& pin : contract) {
    if (pin.qualname.empty()) continue;
    for (const parser::Definition* d = upstream.Find(pin.qualname); d != nullptr;
         d = d->parent >= 0 ? &upstream.definitions()[d->parent] : nullptr) {
      std::vector<const parser::Definition*> again = upstream.Redefinitions(*d);
      if (again.empty()) continue;
      const char* what = d->kind == parser::Definition::Kind::kClass ? "class"
                         : d->parent >= 0 && upstream.definitions()[d->parent].kind ==
                                                 parser::Definition::Kind::kClass
                             ? "method"
                             : "function";
      Diagnostic e = ErrorAt(
          pin.loc,
          std::string(what) + " '" + d->qualname + "' is defined " + std::to_string(again.size() + 1) +
              " times in the upstream module " + shown + ": Python keeps the last (line " +
              std::to_string(again.back()->line) + "), patchgen would patch the first (line " +
              std::to_string(d->line) + ")",
          "patchgen does not guess which definition is meant; remove the dead definition upstream "
          "or generate against an upstream that defines '" + d->qualname + "' once",
          ErrorKind::kUpstream);
      e.notes.push_back(where(*d) + ": note: first definition");
      for (const parser::Definition* r : again) e.notes.push_back(where(*r) + ": note: defined again here");
      out.push_back(std::move(e));
      break;
    }
  }
  SortDiagnostics(out);
  return out;
}

class Runner {
 public:
  Runner(Options opts, fs::path cwd, ProjectConfig config)
      : opts_(std::move(opts)), cwd_(std::move(cwd)), config_(std::move(config)) {}

  int Main();

 private:
  std::string Show(const fs::path& p) const { return DisplayPath(p, cwd_); }
  /// Where generated files go: -o DIR, else the configured output root.
  fs::path OutputRoot() const {
    if (opts_.output_dir.empty()) return config_.output;
    fs::path dir(opts_.output_dir);
    return (dir.is_absolute() ? dir : cwd_ / dir).lexically_normal();
  }
  bool CollectSpecs();
  void LoadSpecs();
  void FindUpstreams();
  void ParseUpstreams();
  void GenerateAll();
  void CheckOutputs();
  bool CheckSourceRoots();
  int Validate();
  int Generate();
  int Check();
  int List();
  int Pin();
  int Audit();
  nlohmann::json JobJson(const Job& job) const;
  void Fail(Job& job, std::vector<Diagnostic> errors) {
    for (auto& d : errors) job.errors.push_back(std::move(d));
  }
  bool NeedDiff(const Job& job) const;

  Options opts_;
  fs::path cwd_;
  ProjectConfig config_;
  std::vector<Job> jobs_;
  bool discovery_failed_ = false;
  std::map<fs::path, std::unique_ptr<Upstream>> upstreams_;
};

bool Runner::CollectSpecs() {
  const bool discover = opts_.specs.empty();
  std::vector<fs::path> paths;
  if (discover) {
    std::error_code ec;
    if (!fs::is_directory(config_.specs, ec)) {
      std::cerr << "patchgen: error: specs folder '" << Show(config_.specs) << "' does not exist\n"
                << "help: set `specs` in the project config (" <<
                   (config_.file ? Show(*config_.file) : std::string("no pyproject.toml with [tool.patchgen] or patchgen.toml found"))
                << ") or name spec files on the command line\n";
      return false;
    }
    std::vector<Diagnostic> errors;
    paths = DiscoverSpecs(config_.specs, cwd_, errors);
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
      SourceLoc loc{job.spec_shown, 0, 0, 1, {}};
      job.errors.push_back(ErrorAt(loc, "spec file not found", {}, ErrorKind::kIo));
      return;
    }
    // A spec saved with a UTF-8 byte order mark is read without it: yaml-cpp skips it but counts
    // positions after it, so every column of every message would be off. (LoadSpec reports a
    // file it cannot read.)
    std::optional<std::string> text = ReadFile(job.spec_abs, nullptr, kMaxSpecFileBytes);
    if (text && text->starts_with("\xEF\xBB\xBF")) text->erase(0, 3);
    auto loaded = text ? spec::LoadSpecFromString(job.spec_shown, std::move(*text))
                       : spec::LoadSpec(job.spec_shown);
    if (!loaded.ok()) {
      Fail(job, loaded.errors());
      return;
    }
    job.spec = std::move(loaded.value());
  });
}

void Runner::FindUpstreams() {
  std::vector<SourceRoot> roots;
  for (const auto& r : opts_.source_roots) {
    fs::path p(r);
    roots.push_back({(p.is_absolute() ? p : cwd_ / p).lexically_normal(), "--source-root"});
  }
  if (const char* env = std::getenv("PATCHGEN_SOURCE_PATH")) {
    for (auto& p : SourceLookup::SplitPathList(env, cwd_)) roots.push_back({p, "PATCHGEN_SOURCE_PATH"});
  }
  for (const auto& p : config_.source_roots) {
    roots.push_back({p, "source_roots in " + (config_.file ? Show(*config_.file) : std::string("config"))});
  }
  SourceLookup lookup(std::move(roots), config_.python, cwd_);

  for (Job& job : jobs_) {
    if (!job.spec) continue;
    const spec::PatchSpec& s = *job.spec;
    job.lookup = lookup.Find(s.upstream);
    const std::string top = TopPackage(s.upstream);
    using Status = LookupResult::Status;
    if (job.lookup.status == Status::kFound) continue;
    if (job.lookup.status == Status::kPackageMissing && job.discovered && !opts_.validate) {
      job.skipped = true;
      continue;
    }
    Diagnostic d = ErrorAt(s.upstream_loc, "upstream module '" + s.upstream + "' not found",
                           SourceLookup::Help(top), ErrorKind::kUpstream);
    d.notes.push_back("looked in:");
    for (const auto& place : job.lookup.looked) d.notes.push_back("  " + place);
    job.errors.push_back(std::move(d));
  }
}

void Runner::ParseUpstreams() {
  std::vector<Upstream*> todo;
  std::vector<fs::path> paths;
  for (Job& job : jobs_) {
    if (!job.spec || !job.errors.empty() || job.skipped) continue;
    auto& slot = upstreams_[job.lookup.file.file];
    if (!slot) {
      slot = std::make_unique<Upstream>();
      todo.push_back(slot.get());
      paths.push_back(job.lookup.file.file);
    }
    job.upstream = slot.get();
  }
  ParallelFor(todo.size(), opts_.jobs, [&](size_t i) {
    Upstream& u = *todo[i];
    std::string shown = Show(paths[i]);
    auto text = ReadFile(paths[i]);
    if (!text) {
      SourceLoc loc{shown, 0, 0, 1, {}};
      u.errors.push_back(ErrorAt(loc, "cannot read upstream file", {}, ErrorKind::kIo));
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
      u.errors.push_back(MakeDiagnostic(
          shown, *text, lines, {static_cast<uint32_t>(cr), static_cast<uint32_t>(cr + 1)},
          "upstream module has a CR line ending ('\\r' without '\\n')",
          "patchgen reads modules with LF or CRLF line endings; convert the file (e.g. `dos2unix -c mac`)",
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
  });
}

bool Runner::NeedDiff(const Job& job) const {
  std::error_code ec;
  return opts_.diff || (opts_.check && fs::is_regular_file(job.out_diff, ec)) || opts_.list;
}

void Runner::GenerateAll() {
  for (Job& job : jobs_) {
    if (!job.spec) continue;
    const std::string& name = job.spec->output;
    if (!opts_.output_dir.empty()) {
      fs::path dir(opts_.output_dir);
      job.out_py = ((dir.is_absolute() ? dir : cwd_ / dir) / name).lexically_normal();
    } else {
      fs::path rel = job.spec_abs.parent_path().lexically_relative(config_.specs);
      bool inside = !rel.empty() && *rel.begin() != "..";
      job.out_py = (inside ? config_.output / rel / name : config_.output / name).lexically_normal();
    }
    job.out_diff = job.out_py.parent_path() / DiffNameFor(job.out_py.filename().string());
  }
  ParallelFor(jobs_.size(), opts_.jobs, [&](size_t i) {
    Job& job = jobs_[i];
    if (!job.spec || job.skipped || !job.errors.empty() || job.upstream == nullptr) return;
    if (!job.upstream->errors.empty()) {
      Fail(job, job.upstream->errors);
      return;
    }
    rewriter::GenerateOptions options;
    options.upstream_path = job.lookup.file.rel_path;
    options.upstream_version = job.lookup.file.version;
    options.default_runtime = config_.runtime;
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
    if (auto ambiguous = AmbiguousTargets(result->contract, *job.upstream->module,
                                          Show(job.lookup.file.file));
        !ambiguous.empty()) {
      Fail(job, std::move(ambiguous));
      return;
    }
    if (auto blocker = FirstSourceBlocker(result->text)) {
      LineIndex lines(result->text);
      Diagnostic d = MakeDiagnostic(
          Show(job.out_py), result->text, lines, {blocker->first, blocker->first + 1},
          "the generated module would hold " + blocker->second + ", which CPython rejects",
          "it comes from the upstream module, a patch file or the spec at that place of the "
          "output; save them as UTF-8 without a byte order mark",
          ErrorKind::kSpec);
      Fail(job, {std::move(d)});
      return;
    }
    job.py_text = std::move(result->text);
    // An upstream with CRLF line endings throughout gets a generated file with CRLF throughout
    // (inserted code and the header are written with LF).
    if (job.upstream->crlf) {
      std::string crlf;
      crlf.reserve(job.py_text.size() + job.py_text.size() / 16);
      for (size_t i = 0; i < job.py_text.size(); ++i) {
        if (job.py_text[i] == '\n' && (i == 0 || job.py_text[i - 1] != '\r')) crlf += '\r';
        crlf += job.py_text[i];
      }
      job.py_text = std::move(crlf);
    }
    job.patches = result->applied.size();
    job.upstream_sha = result->upstream_sha256;
    job.contract = std::move(result->contract);
    job.skipped_entries = std::move(result->skipped);
    // Contract pins: a spec with a pin file fails when upstream changed what it relies on.
    fs::path pins_path = PinsPathFor(job.spec_abs);
    auto pins = ReadPins(pins_path, Show(pins_path));
    if (!pins.ok()) {
      Fail(job, pins.errors());
      return;
    }
    job.pins = std::move(*pins);
    if (job.pins && !opts_.pin) {
      job.pin_findings = ComparePins(*job.pins, job.contract);
      if (!opts_.audit && !job.pin_findings.empty()) {
        // A changed contract fails the spec; an entry without a pin (added to the spec since
        // the last `patchgen pin`) is a warning.
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
        if (!errors.empty()) {
          Fail(job, std::move(errors));
          return;
        }
      }
    }
    if (NeedDiff(job)) {
      job.diff_text = diff::UnifiedDiff(job.upstream->source, job.py_text,
                                        "a/" + job.lookup.file.rel_path, "b/" + job.spec->output);
    }
  });
}

namespace {

// What identifies a file on disk: its device and inode when it exists (so symlinks and hard links
// to one file compare equal), otherwise its normalised absolute path.
std::string FileIdentity(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) return "#" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return (ec ? p.lexically_normal() : c).generic_string();
}

}  // namespace

// Never lose a file: an output that is one of the run's inputs (a spec, a parent spec, a patch
// file, a pin file, an upstream file) or that two specs would both write fails those specs
// before anything is written.
void Runner::CheckOutputs() {
  struct Input {
    std::string what;  // "the upstream file 'x'"
  };
  std::map<std::string, Input> inputs;
  auto add_input = [&](const fs::path& p, std::string what) {
    std::error_code ec;
    if (fs::exists(p, ec)) inputs.emplace(FileIdentity(p), Input{std::move(what)});
  };
  auto abs = [&](const std::string& shown) {
    fs::path p(shown);
    return (p.is_absolute() ? p : cwd_ / p).lexically_normal();
  };
  for (const Job& job : jobs_) {
    add_input(job.spec_abs, "the spec '" + job.spec_shown + "'");
    add_input(PinsPathFor(job.spec_abs), "the pin file '" + Show(PinsPathFor(job.spec_abs)) + "'");
    if (!job.spec) continue;
    for (const std::string& parent : job.spec->extends_chain) {
      add_input(abs(parent), "the spec '" + Show(abs(parent)) + "'");
    }
    auto add_body = [&](const spec::Body& b) {
      if (b.source == spec::Body::Source::kFile) {
        add_input(abs(b.origin.path), "the patch file '" + Show(abs(b.origin.path)) + "'");
      }
    };
    for (const spec::Patch& p : job.spec->patches) add_body(p.body);
    for (const spec::Helper& h : job.spec->helpers) add_body(h.body);
    if (job.lookup.status == LookupResult::Status::kFound) {
      add_input(job.lookup.file.file, "the upstream file '" + Show(job.lookup.file.file) + "'");
    }
  }
  std::map<std::string, size_t> writer;  // output identity -> index of the first job writing it
  std::vector<std::vector<Diagnostic>> errors(jobs_.size());
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const Job& job = jobs_[i];
    if (!job.spec || job.skipped || !job.errors.empty() || job.out_py.empty()) continue;
    std::vector<fs::path> outs = {job.out_py};
    std::error_code ec;
    if (opts_.diff || (opts_.check && fs::is_regular_file(job.out_diff, ec))) outs.push_back(job.out_diff);
    for (const fs::path& out : outs) {
      std::string id = FileIdentity(out);
      if (auto in = inputs.find(id); in != inputs.end()) {
        errors[i].push_back(ErrorAt(job.spec->output_loc,
                                    "output '" + Show(out) + "' would overwrite " + in->second.what,
                                    "patchgen never writes over its inputs; choose another `output:` "
                                    "name or output folder"));
        continue;
      }
      auto [it, inserted] = writer.emplace(id, i);
      if (inserted) continue;
      const Job& other = jobs_[it->second];
      if (FileIdentity(other.spec_abs) == FileIdentity(job.spec_abs)) continue;  // one spec named twice
      auto clash = [&](size_t at, const Job& with) {
        Diagnostic d = ErrorAt(jobs_[at].spec->output_loc,
                               "output '" + Show(out) + "' is also written by the spec '" + with.spec_shown + "'",
                               "two specs cannot write one file; give one of them another `output:` name");
        d.notes.push_back(with.spec->output_loc.path + ":" + std::to_string(with.spec->output_loc.line) + ":" +
                          std::to_string(with.spec->output_loc.col) + ": note: its output is set here");
        errors[at].push_back(std::move(d));
      };
      clash(i, other);
      clash(it->second, job);
    }
  }
  for (size_t i = 0; i < jobs_.size(); ++i) Fail(jobs_[i], std::move(errors[i]));
}

// --check: a configured source root that does not exist would skip every spec whose package
// lives there (an empty gate that passes); it is an error instead.
bool Runner::CheckSourceRoots() {
  bool ok = true;
  std::string config_shown = config_.file ? Show(*config_.file) : std::string("config");
  std::optional<std::string> text = config_.file ? ReadFile(*config_.file) : std::nullopt;
  for (const fs::path& root : config_.source_roots) {
    std::error_code ec;
    if (fs::is_directory(root, ec)) continue;
    std::string written = DisplayPath(root, config_.root);
    SourceLoc loc{config_shown, 0, 0, 1, {}};
    if (text) {  // point at the value in the config file when it is written there as given
      size_t at = std::string::npos, key = text->find("source_roots");
      for (char q : {'"', '\''}) {
        if (key != std::string::npos) at = std::min(at, text->find(std::string(1, q) + written + q, key));
      }
      if (at != std::string::npos) {
        LineIndex lines(*text);
        loc = LocOf(config_shown, *text, lines,
                    ByteRange{static_cast<uint32_t>(at), static_cast<uint32_t>(at + written.size() + 2)});
      }
    }
    Diagnostic d = ErrorAt(loc, "source root '" + Show(root) + "' does not exist",
                           "--check would skip every spec whose upstream package lives there; create it "
                           "(e.g. `make upstream`) or remove it from `source_roots`");
    PrintDiagnostics({d});
    ok = false;
  }
  return ok;
}

nlohmann::json Runner::JobJson(const Job& job) const {
  nlohmann::json j;
  j["spec"] = job.spec_shown;
  j["upstream"] = job.spec ? nlohmann::json(job.spec->upstream) : nlohmann::json(nullptr);
  bool found = job.spec && job.lookup.status == LookupResult::Status::kFound;
  j["upstream_path"] = found ? nlohmann::json(Show(job.lookup.file.file)) : nlohmann::json(nullptr);
  j["upstream_version"] = found ? nlohmann::json(job.lookup.file.version) : nlohmann::json(nullptr);
  j["output"] = job.out_py.empty() ? nlohmann::json(nullptr) : nlohmann::json(Show(job.out_py));
  j["status"] = job.status;
  j["patches"] = job.patches;
  j["bytes"] = job.py_text.size();
  nlohmann::json errors = nlohmann::json::array();
  for (const auto& d : job.errors) errors.push_back(DiagnosticJson(d));
  j["errors"] = errors;
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& sk : job.skipped_entries) {
    skipped.push_back({{"kind", sk.kind}, {"target", sk.target}, {"why", sk.why},
                       {"spec", sk.loc.path}, {"line", sk.loc.line}});
  }
  j["skipped_entries"] = skipped;
  nlohmann::json warnings = nlohmann::json::array();
  for (const auto& d : job.warnings) warnings.push_back(DiagnosticJson(d));
  j["warnings"] = warnings;
  return j;
}

int Runner::Validate() {
  int code = kExitOk;
  size_t ok = 0;
  nlohmann::json report = nlohmann::json::array();
  for (Job& job : jobs_) {
    if (job.spec) Fail(job, ValidateSpecWithoutUpstream(*job.spec));
    job.status = job.errors.empty() ? "valid" : "invalid";
    if (job.errors.empty()) {
      ++ok;
      if (opts_.verbose && !opts_.json) std::cout << "valid: " << job.spec_shown << "\n";
    }
    PrintDiagnostics(job.errors);
    code = std::max(code, WorstExit(job.errors));
    report.push_back(JobJson(job));
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << "validate: " << ok << " of " << jobs_.size() << " specs valid\n";
  }
  return code;
}

int Runner::Generate() {
  int code = kExitOk;
  size_t written = 0, unchanged = 0, skipped = 0, failed = 0;
  nlohmann::json report = nlohmann::json::array();
  for (Job& job : jobs_) {
    if (job.skipped) {
      ++skipped;
      job.status = "upstream not found";
      if (!opts_.json) {
        std::cout << "skipped " << job.spec_shown << ": upstream package '"
                  << TopPackage(job.spec->upstream)
                  << "' not found (upstream not found)\n";
      }
    } else if (!job.errors.empty()) {
      ++failed;
      job.status = "error";
      PrintDiagnostics(job.errors);
      code = std::max(code, WorstExit(job.errors));
    } else {
      PrintDiagnostics(job.warnings);
      std::vector<std::pair<fs::path, const std::string*>> files = {{job.out_py, &job.py_text}};
      if (opts_.diff) files.push_back({job.out_diff, &job.diff_text});
      bool any_written = false;
      for (const auto& [path, bytes] : files) {
        std::string verb;
        if (opts_.dry_run) {
          auto existing = ReadFile(path);
          bool same = existing && *existing == *bytes;
          verb = same ? "unchanged" : "would write";
          any_written |= !same;
        } else {
          std::string error;
          auto outcome = WriteIfChanged(path, *bytes, &error, OutputRoot());
          if (!outcome) {
            SourceLoc loc{Show(path), 0, 0, 1, {}};
            job.errors.push_back(ErrorAt(loc, error, {}, ErrorKind::kIo));
            PrintDiagnostics({job.errors.back()});
            code = std::max(code, 5);
            break;
          }
          verb = *outcome == WriteOutcome::kWritten ? "wrote" : "unchanged";
          any_written |= *outcome == WriteOutcome::kWritten;
        }
        if (opts_.json || (verb == "unchanged" && !opts_.verbose)) continue;
        std::cout << verb << " " << Show(path) << " (" << bytes->size() << " bytes";
        if (path == job.out_py) std::cout << ", " << job.patches << (job.patches == 1 ? " patch" : " patches");
        std::cout << ")\n";
      }
      if (!job.errors.empty()) {
        ++failed;
        job.status = "error";
      } else {
        any_written ? ++written : ++unchanged;
        job.status = opts_.dry_run ? (any_written ? "would write" : "unchanged")
                                   : (any_written ? "written" : "unchanged");
        if (opts_.verbose && !opts_.json) {
          std::cout << "  " << job.spec_shown << ": " << job.spec->upstream << " "
                    << job.lookup.file.version << " from " << Show(job.lookup.file.file) << "\n";
          for (const rewriter::SkippedEntry& sk : job.skipped_entries) {
            std::cout << "  skipped " << sk.kind << " " << sk.target << " (" << sk.loc.path << ":"
                      << sk.loc.line << "): " << sk.why << "\n";
          }
        }
      }
    }
    report.push_back(JobJson(job));
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << jobs_.size() << " specs: " << written << (opts_.dry_run ? " to write, " : " written, ")
              << unchanged << " unchanged, " << skipped << " skipped, " << failed << " failed\n";
  }
  return code;
}

int Runner::Check() {
  int code = kExitOk;
  size_t clean = 0, stale = 0, skipped = 0, failed = 0, fixed = 0;
  nlohmann::json report = nlohmann::json::array();
  for (Job& job : jobs_) {
    if (job.skipped) {
      ++skipped;
      job.status = "upstream not found";
      if (!opts_.json) {
        std::cout << "skipped " << job.spec_shown << ": upstream package '"
                  << TopPackage(job.spec->upstream)
                  << "' not found on any source root\n";
      }
      report.push_back(JobJson(job));
      continue;
    }
    if (!job.errors.empty()) {
      ++failed;
      job.status = "error";
      PrintDiagnostics(job.errors);
      code = std::max(code, WorstExit(job.errors));
      report.push_back(JobJson(job));
      continue;
    }
    PrintDiagnostics(job.warnings);
    std::error_code ec;
    std::vector<std::pair<fs::path, const std::string*>> files = {{job.out_py, &job.py_text}};
    if (opts_.diff || fs::is_regular_file(job.out_diff, ec)) files.push_back({job.out_diff, &job.diff_text});
    bool drift = false;
    bool py_missing = false;
    for (const auto& [path, bytes] : files) {
      auto on_disk = ReadFile(path);
      if (on_disk && *on_disk == *bytes) continue;
      drift = true;
      py_missing |= !on_disk && path == job.out_py;
      if (opts_.json) continue;
      std::string shown = Show(path);
      std::cout << (on_disk ? "stale: " : "missing: ") << shown << " (from " << job.spec_shown << ")\n";
      if (on_disk && path == job.out_py) {
        HeaderUpstream old = ParseHeaderUpstream(*on_disk);
        if (!old.sha256.empty() && old.sha256 != job.upstream_sha) {
          std::cout << "upstream changed since generation: " << Fingerprint(old.version, old.sha256)
                    << " -> " << Fingerprint(job.lookup.file.version, job.upstream_sha) << "\n";
        }
      }
      std::cout << diff::UnifiedDiff(on_disk.value_or(""), *bytes, "a/" + shown, "b/" + shown);
    }
    if (!drift) {
      ++clean;
      job.status = "up to date";
    } else if (opts_.fix) {
      job.status = "fixed";
      for (const auto& [path, bytes] : files) {
        std::string error;
        if (!WriteIfChanged(path, *bytes, &error, OutputRoot())) {
          SourceLoc loc{Show(path), 0, 0, 1, {}};
          job.errors.push_back(ErrorAt(loc, error, {}, ErrorKind::kIo));
        }
      }
      if (job.errors.empty()) {
        ++fixed;
        if (!opts_.json) std::cout << "fixed: " << Show(job.out_py) << "\n";
      } else {
        ++failed;
        job.status = "error";
        PrintDiagnostics(job.errors);
        code = std::max(code, WorstExit(job.errors));
      }
    } else {
      ++stale;
      job.status = py_missing ? "missing" : "stale";
      code = std::max(code, kExitDrift);
    }
    report.push_back(JobJson(job));
  }
  // Orphaned outputs: files under the output root that carry patchgen's header but that no spec
  // produces (their spec was deleted, renamed or given another `output:`). Only when every spec
  // was discovered and loaded: otherwise what the others produce is not known.
  nlohmann::json orphans = nlohmann::json::array();
  size_t orphaned = 0;
  bool all_known = opts_.specs.empty();
  for (const Job& job : jobs_) all_known &= job.spec.has_value() && !job.out_py.empty();
  // An output root that holds the whole project (`output = "."`) would take test expectations and
  // files of other tools for orphans: it is not searched. Below the output root, the specs root,
  // the source roots and dot-folders are not entered.
  const fs::path out_root = OutputRoot();
  auto under = [](const fs::path& p, const fs::path& dir) {
    fs::path rel = p.lexically_normal().lexically_relative(dir.lexically_normal());
    return !rel.empty() && *rel.begin() != "..";
  };
  std::vector<fs::path> not_entered = {config_.specs};
  for (const auto& r : config_.source_roots) not_entered.push_back(r);
  for (const auto& r : opts_.source_roots) not_entered.push_back(cwd_ / r);
  if (all_known && !under(config_.root, out_root)) {
    std::set<fs::path> produced;
    for (const Job& job : jobs_) {
      produced.insert(job.out_py);
      produced.insert(job.out_diff);
    }
    std::vector<fs::path> found;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(out_root, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      if (it->is_directory(ec2) && !it->is_symlink(ec2)) {
        bool skip = it->path().filename().string().starts_with(".");
        for (const fs::path& d : not_entered) skip |= it->path().lexically_normal() == d.lexically_normal();
        if (skip) it.disable_recursion_pending();
        continue;
      }
      if (it->is_symlink(ec2) || !it->is_regular_file(ec2)) continue;
      fs::path p = it->path().lexically_normal();
      std::string ext = p.extension().string();
      if ((ext != ".py" && ext != ".diff") || produced.count(p)) continue;
      auto text = ReadFile(p, nullptr, kMaxSpecFileBytes * 4);
      if (text && CarriesGeneratedHeader(*text)) found.push_back(p);
    }
    std::sort(found.begin(), found.end());
    for (const fs::path& p : found) {
      ++orphaned;
      orphans.push_back(Show(p));
      if (opts_.fix) {
        std::error_code rm;
        if (fs::remove(p, rm); rm) {
          SourceLoc loc{Show(p), 0, 0, 1, {}};
          Diagnostic d = ErrorAt(loc, "cannot remove orphaned output: " + rm.message(), {}, ErrorKind::kIo);
          PrintDiagnostics({d});
          code = std::max(code, ExitCodeOf(ErrorKind::kIo));
        } else if (!opts_.json) {
          std::cout << "removed: " << Show(p) << " (orphaned: no spec produces it)\n";
        }
      } else {
        code = std::max(code, kExitDrift);
        if (!opts_.json) {
          std::cout << "orphaned: " << Show(p) << " (carries patchgen's header, but no spec produces it; "
                    << "`patchgen --check --fix` removes it)\n";
        }
      }
    }
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"orphaned", orphans}, {"exit_code", code}})
              << "\n";
  } else {
    std::cout << "check: " << clean << " up to date, " << stale << " stale, ";
    if (opts_.fix) std::cout << fixed << " fixed, ";
    std::cout << skipped << " skipped, " << failed << " failed";
    if (orphaned) std::cout << ", " << orphaned << (opts_.fix ? " orphaned removed" : " orphaned");
    std::cout << "\n";
  }
  return code;
}

int Runner::List() {
  int code = kExitOk;
  nlohmann::json report = nlohmann::json::array();
  std::vector<std::array<std::string, 4>> rows = {{"SPEC", "UPSTREAM", "OUTPUT", "STATUS"}};
  for (Job& job : jobs_) {
    if (!job.spec || (!job.errors.empty() && job.lookup.status == LookupResult::Status::kFound)) {
      job.status = "error";
      PrintDiagnostics(job.errors);
      code = std::max(code, WorstExit(job.errors));
    } else if (job.lookup.status != LookupResult::Status::kFound) {
      job.status = "upstream not found";
    } else {
      auto py = ReadFile(job.out_py);
      std::error_code ec;
      bool diff_stale = fs::is_regular_file(job.out_diff, ec) && ReadFile(job.out_diff) != job.diff_text;
      job.status = !py ? "missing" : (*py == job.py_text && !diff_stale) ? "up to date" : "stale";
    }
    // `--list` never fails because an upstream is absent; it only reports it.
    if (job.status == "upstream not found") job.errors.clear();
    report.push_back(JobJson(job));
    rows.push_back({job.spec_shown, job.spec ? job.spec->upstream : "-",
                    job.out_py.empty() ? "-" : Show(job.out_py), job.status});
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
    return code;
  }
  std::array<size_t, 3> width{};
  for (const auto& r : rows) {
    for (size_t c = 0; c < 3; ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < 3; ++c) line += r[c] + std::string(width[c] - r[c].size() + 2, ' ');
    std::cout << line << r[3] << "\n";
  }
  return code;
}

int Runner::Pin() {
  int code = kExitOk;
  size_t written = 0, unchanged = 0, skipped = 0, failed = 0;
  nlohmann::json report = nlohmann::json::array();
  for (Job& job : jobs_) {
    nlohmann::json j = JobJson(job);
    if (job.skipped) {
      ++skipped;
      job.status = "upstream not found";
      if (!opts_.json) {
        std::cout << "skipped " << job.spec_shown << ": upstream package '"
                  << TopPackage(job.spec->upstream) << "' not found\n";
      }
    } else if (!job.errors.empty()) {
      ++failed;
      job.status = "error";
      PrintDiagnostics(job.errors);
      code = std::max(code, WorstExit(job.errors));
    } else {
      fs::path path = PinsPathFor(job.spec_abs);
      PinFile pins = job.pins.value_or(PinFile{});
      size_t added = UpdatePins(pins, job.contract, job.lookup.file.version);
      std::string error;
      auto outcome =
          WriteIfChanged(path, FormatPins(pins, DisplayPath(job.spec_abs, config_.root)), &error);
      if (!outcome) {
        job.errors.push_back(ErrorAt(SourceLoc{Show(path), 0, 0, 1, {}}, error, {}, ErrorKind::kIo));
        PrintDiagnostics(job.errors);
        code = std::max(code, 5);
        ++failed;
        job.status = "error";
      } else {
        bool wrote = *outcome == WriteOutcome::kWritten;
        wrote ? ++written : ++unchanged;
        job.status = wrote ? "pinned" : "unchanged";
        if (!opts_.json) {
          std::cout << (wrote ? "pinned " : "unchanged ") << Show(path) << " ("
                    << job.contract.size() << " entries, " << added << " new fingerprints, "
                    << job.spec->upstream << " " << job.lookup.file.version << ")\n";
        }
      }
      j = JobJson(job);
      j["pins"] = Show(path);
      j["new_fingerprints"] = added;
    }
    j["status"] = job.status;
    report.push_back(j);
  }
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << "pin: " << jobs_.size() << " specs: " << written << " pinned, " << unchanged
              << " unchanged, " << skipped << " skipped, " << failed << " failed\n";
  }
  return code;
}

namespace {

/// One thing `audit` reports about a spec.
struct Finding {
  std::string kind;      ///< "target missing", "body changed under a guard", ...
  std::string entry;     ///< The spec entry (contract key or kind + target), "" for the spec.
  SourceLoc spec_loc;    ///< Where in the spec.
  std::string upstream;  ///< Upstream place (path:line[-line] (version)), "" when none.
  std::string message;
  std::vector<std::string> details;  ///< Signature changes, diff lines, notes.
  bool attention = true;             ///< False for information (skipped entries).
};

/// Kind of a generation error, from its message.
std::string ErrorFindingKind(const Diagnostic& d) {
  const std::string& m = d.message;
  if (m.starts_with("no statement in ")) return "anchor gone";
  if (m.starts_with("no method ") || m.starts_with("no class or function ") ||
      m.starts_with("no top-level ") || m.starts_with("no nested function ") ||
      m.starts_with("no class ")) {
    return "target missing";
  }
  if (m.find("already exists") != std::string::npos) return "target added upstream";
  if (m.find("undefined name") != std::string::npos) return "name undefined";
  if (m.find("imports.drop") != std::string::npos || m.find("import") != std::string::npos) {
    return "import gone";
  }
  if (m.find("upstream module") != std::string::npos) return "module missing";
  return "error";
}

std::string RegionFindingKind(const rewriter::ContractPin& c) {
  const std::string& region = c.region;
  if (region == "function") return "body changed under a guard";
  if (region == "statements") {
    return c.key.starts_with("edit_body ") ? "edited statements changed" : "guarded statements changed";
  }
  if (region == "absent") return "added method now defined upstream";
  return "signature changed";
}

std::string Loc(const SourceLoc& l) {
  return l.path + (l.line ? ":" + std::to_string(l.line) + ":" + std::to_string(l.col) : "");
}

}  // namespace

int Runner::Audit() {
  // The old upstream (optional): every spec generated against it too, for the contract and the
  // definitions to compare with.
  std::map<size_t, rewriter::GenerateResult> old_results;
  std::map<size_t, std::pair<UpstreamFile, parser::PyModule*>> old_modules;
  std::map<fs::path, std::unique_ptr<parser::PyModule>> old_parsed;
  if (!opts_.old_roots.empty()) {
    std::vector<SourceRoot> roots;
    for (const auto& r : opts_.old_roots) {
      fs::path p(r);
      roots.push_back({(p.is_absolute() ? p : cwd_ / p).lexically_normal(), "--source-root-old"});
    }
    SourceLookup lookup(std::move(roots), config_.python, cwd_);
    for (size_t i = 0; i < jobs_.size(); ++i) {
      Job& job = jobs_[i];
      if (!job.spec) continue;
      LookupResult found = lookup.Find(job.spec->upstream);
      if (found.status != LookupResult::Status::kFound) continue;
      auto& slot = old_parsed[found.file.file];
      if (!slot) {
        auto text = ReadFile(found.file.file);
        if (!text) continue;
        auto parsed = parser::PyModule::Parse(Show(found.file.file), std::move(*text));
        if (!parsed.ok()) continue;
        slot = std::move(parsed.value());
      }
      old_modules[i] = {found.file, slot.get()};
      rewriter::GenerateOptions options;
      options.upstream_path = found.file.rel_path;
      options.upstream_version = found.file.version;
      options.default_runtime = config_.runtime;
      auto result = rewriter::Generate(*job.spec, *slot, options);
      if (result.ok()) old_results[i] = std::move(result.value());
    }
  }

  int code = kExitOk;
  size_t attention = 0, clean = 0, skipped = 0;
  nlohmann::json report = nlohmann::json::array();
  std::string text;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    Job& job = jobs_[i];
    std::vector<Finding> findings;
    std::string version = job.lookup.file.version;
    std::string up_shown = job.spec && job.lookup.status == LookupResult::Status::kFound
                               ? Show(job.lookup.file.file)
                               : std::string();
    auto where = [&](const rewriter::ContractPin& c) {
      std::string w = up_shown;
      if (c.first_line) {
        w += ":" + std::to_string(c.first_line);
        if (c.last_line > c.first_line) w += "-" + std::to_string(c.last_line);
      }
      return w + " (" + version + ")";
    };
    if (job.skipped) {
      ++skipped;
      job.status = "upstream not found";
      report.push_back(JobJson(job));
      text += job.spec_shown + ": skipped (upstream package '" + TopPackage(job.spec->upstream) +
              "' not found)\n";
      continue;
    }
    if (!job.spec) {
      code = std::max(code, WorstExit(job.errors));
      PrintDiagnostics(job.errors);
    }
    // 1. What no longer generates: missing targets, anchors, names, imports.
    for (const Diagnostic& d : job.errors) {
      Finding f{ErrorFindingKind(d), "", SourceLoc{d.path, d.line, d.col, 1, {}}, up_shown,
                d.message, d.notes, true};
      if (!d.help.empty()) f.details.push_back("help: " + d.help);
      findings.push_back(std::move(f));
    }
    // 2. Contracts: against the pins, else against the old upstream.
    const rewriter::GenerateResult* old = old_results.count(i) ? &old_results[i] : nullptr;
    auto old_pin = [&](const std::string& key) -> const rewriter::ContractPin* {
      if (!old) return nullptr;
      for (const auto& c : old->contract) {
        if (c.key == key) return &c;
      }
      return nullptr;
    };
    auto signature_details = [&](const rewriter::ContractPin& c) {
      std::vector<std::string> out;
      if (!old_modules.count(i) || !job.upstream || !job.upstream->module) return out;
      const parser::PyModule& om = *old_modules[i].second;
      const parser::PyModule& nm = *job.upstream->module;
      std::vector<std::string> names = {c.qualname};
      if (c.key.starts_with("modify_init ")) names.push_back(c.qualname + ".__init__");
      for (const std::string& q : names) {
        const parser::Definition* od = om.Find(q);
        const parser::Definition* nd = nm.Find(q);
        if (!od || !nd) continue;
        for (std::string& l : SignatureChanges(ParametersOf(om, *od), ParametersOf(nm, *nd),
                                               DecoratorsOf(om, *od), DecoratorsOf(nm, *nd))) {
          out.push_back(q + ": " + l);
        }
      }
      return out;
    };
    std::set<std::string> reported;
    for (const PinFinding& pf : job.pin_findings) {
      const rewriter::ContractPin& c = *pf.pin;
      reported.insert(c.key);
      if (pf.kind == PinFinding::Kind::kUnpinned) {
        findings.push_back({"unpinned", c.key, c.loc, where(c),
                            "no pin for this entry in " + Show(PinsPathFor(job.spec_abs)),
                            {}, true});
        continue;
      }
      Finding f{RegionFindingKind(c), c.key, c.loc, where(c),
                "differs from the pin (verified with " + [&] {
                  std::string v;
                  for (const auto& x : pf.pinned->versions) v += (v.empty() ? "" : ", ") + x;
                  return v;
                }() + ")",
                signature_details(c), true};
      for (std::string& l : TextDiffLines(pf.pinned->text, c.text)) f.details.push_back("  " + l);
      findings.push_back(std::move(f));
    }
    // A spec that no longer generates has no contract: its entries are looked up in the new
    // upstream by name instead, so that a broken anchor does not hide a changed body.
    std::vector<rewriter::ContractPin> refound;
    if (!job.errors.empty() && job.upstream && job.upstream->module) {
      std::set<std::string> keys;
      if (old) {
        for (const rewriter::ContractPin& c : old->contract) {
          if (auto now = rewriter::RefingerprintContract(c, *job.upstream->module)) {
            keys.insert(c.key);
            refound.push_back(std::move(*now));
          }
        }
      }
      // Without the old upstream (or for entries it does not have), the pins name the targets.
      if (job.pins) {
        for (const PinEntry& e : job.pins->entries) {
          if (keys.count(e.key) || e.target.empty() || e.verified.empty()) continue;
          rewriter::ContractPin c;
          c.key = e.key;
          c.region = e.region;
          c.expects = e.expects;
          c.qualname = e.target;
          c.loc = SourceLoc{job.spec_shown, 0, 0, 1, {}};
          if (auto now = rewriter::RefingerprintContract(c, *job.upstream->module)) {
            refound.push_back(std::move(*now));
          }
        }
      }
    }
    const std::vector<rewriter::ContractPin>& current = job.errors.empty() ? job.contract : refound;
    for (const rewriter::ContractPin& c : current) {
      if (reported.count(c.key)) continue;
      // A fingerprint a person verified (in the pin file) needs no attention.
      if (const PinEntry* e = job.pins ? job.pins->Find(c.key) : nullptr) {
        bool verified = false;
        for (const PinRecord& r : e->verified) verified |= r.sha256 == c.sha256;
        if (verified) continue;
      }
      const rewriter::ContractPin* o = old_pin(c.key);
      if (o) {
        if (o->sha256 == c.sha256) continue;
        Finding f{RegionFindingKind(c), c.key, c.loc, where(c),
                  "differs from " + old_modules[i].first.version, signature_details(c), true};
        for (std::string& l : TextDiffLines(o->text, c.text)) f.details.push_back("  " + l);
        findings.push_back(std::move(f));
      } else if (const PinEntry* e = job.pins ? job.pins->Find(c.key) : nullptr) {
        // Found by name through the pins (the spec does not generate): differs from every
        // verified fingerprint (checked above); show the newest.
        const PinRecord& newest = e->verified.back();
        std::string versions;
        for (const auto& x : newest.versions) versions += (versions.empty() ? "" : ", ") + x;
        Finding f{RegionFindingKind(c), c.key, c.loc, where(c),
                  "differs from the pin (verified with " + versions + ")", {}, true};
        for (std::string& l : TextDiffLines(newest.text, c.text)) f.details.push_back("  " + l);
        findings.push_back(std::move(f));
      }
    }
    if (!job.pins && job.errors.empty()) {
      findings.push_back({"unpinned", "", SourceLoc{job.spec_shown, 0, 0, 1, {}}, "",
                          "the spec has no pin file; run `patchgen pin " + job.spec_shown + "`",
                          {}, false});
    }
    // 3. Entries the old upstream applied that the new one leaves out.
    if (old && job.errors.empty()) {
      for (const rewriter::ContractPin& c : old->contract) {
        bool now = false;
        for (const auto& n : job.contract) now |= n.key == c.key;
        if (!now) {
          findings.push_back({"entry no longer applies", c.key, c.loc, "",
                              "applied to " + old_modules[i].first.version + ", not to " + version,
                              {}, false});
        }
      }
    }
    for (const rewriter::SkippedEntry& sk : job.skipped_entries) {
      findings.push_back({"skipped", sk.kind + " " + sk.target, sk.loc, "", sk.why, {}, false});
    }
    // 4. Imports the spec adds from the upstream package that the new upstream lacks.
    if (job.spec && job.lookup.status == LookupResult::Status::kFound) {
      fs::path root = job.lookup.file.file;
      std::string rel = job.lookup.file.rel_path;
      for (size_t n = std::count(rel.begin(), rel.end(), '/') + 1; n > 0; --n) root = root.parent_path();
      for (const spec::Block& b : job.spec->import_adds) {
        for (std::string& m : MissingImportedNames(b.code, job.spec->upstream, root)) {
          findings.push_back({"import gone", "imports.add", b.loc, "", m, {}, true});
        }
      }
    }
    std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
      return std::tie(a.spec_loc.path, a.spec_loc.line) < std::tie(b.spec_loc.path, b.spec_loc.line);
    });
    size_t need = std::count_if(findings.begin(), findings.end(),
                                [](const Finding& f) { return f.attention; });
    need ? ++attention : ++clean;
    job.status = need ? "needs attention" : "ok";
    nlohmann::json j = JobJson(job);
    j["status"] = job.status;
    j["upstream_old_version"] =
        old_modules.count(i) ? nlohmann::json(old_modules[i].first.version) : nlohmann::json(nullptr);
    nlohmann::json fj = nlohmann::json::array();
    text += job.spec_shown + " (" + (job.spec ? job.spec->upstream : std::string("?")) + " " +
            (old_modules.count(i) ? old_modules[i].first.version + " -> " : std::string()) +
            version + "): " + job.status + "\n";
    for (const Finding& f : findings) {
      fj.push_back({{"kind", f.kind},
                    {"entry", f.entry},
                    {"spec", f.spec_loc.path},
                    {"line", f.spec_loc.line},
                    {"upstream", f.upstream},
                    {"message", f.message},
                    {"details", f.details},
                    {"attention", f.attention}});
      text += std::string("  ") + (f.attention ? "! " : "- ") + f.kind + ": " +
              (f.entry.empty() ? "" : f.entry + " ") + "(" + Loc(f.spec_loc) + ")\n";
      if (!f.upstream.empty()) text += "      upstream: " + f.upstream + "\n";
      text += "      " + f.message + "\n";
      for (const std::string& d : f.details) text += "      " + d + "\n";
    }
    j["findings"] = fj;
    report.push_back(j);
  }
  if (attention) code = std::max(code, kExitDrift);
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << text << "audit: " << jobs_.size() << " specs: " << attention
              << " need attention, " << clean << " ok, " << skipped << " skipped\n";
  }
  return code;
}

int Runner::Main() {
  if (!CollectSpecs()) return discovery_failed_ ? ExitCodeOf(ErrorKind::kIo) : kExitUsage;
  LoadSpecs();
  if (opts_.validate) return Validate();
  if (opts_.check && !CheckSourceRoots()) return kExitUsage;
  FindUpstreams();
  ParseUpstreams();
  GenerateAll();
  if (opts_.pin) return Pin();
  if (opts_.audit) return Audit();
  if (opts_.list) return List();
  CheckOutputs();
  if (opts_.check) return Check();
  return Generate();
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
      SourceLoc loc{file, 0, 0, 1, {}};
      results[i].errors.push_back(ErrorAt(loc, "cannot read file", {}, ErrorKind::kIo));
      return;
    }
    auto module = parser::PyModule::Parse(file, std::move(*text));
    if (!module.ok()) {
      results[i].errors = module.errors();
      for (auto& d : results[i].errors) d.kind = ErrorKind::kUpstream;
      return;
    }
    results[i].output = opts.index_json ? parser::FormatIndexJson(**module)
                                        : parser::FormatIndexText(**module);
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

std::string DiffNameFor(const std::string& output_name) {
  if (output_name.size() > 3 && output_name.compare(output_name.size() - 3, 3, ".py") == 0) {
    return output_name.substr(0, output_name.size() - 3) + ".diff";
  }
  return output_name + ".diff";
}

HeaderUpstream ParseHeaderUpstream(const std::string& text) {
  // patchgen's own header has exact `#   version:` / `#   sha256:` fields; they win when both are
  // present, so that a spec path or description containing "version" cannot be mistaken for it.
  // Other headers are read loosely: the first 64-hex-digit run on a line that mentions sha256, and
  // the word after the first "version".
  HeaderUpstream exact;
  HeaderUpstream loose;
  auto is_hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  auto field = [](std::string_view line, std::string_view key) -> std::optional<std::string> {
    if (line.substr(0, key.size()) != key) return std::nullopt;
    std::string_view v = line.substr(key.size());
    size_t b = v.find_first_not_of(' ');
    if (b == std::string_view::npos) return std::nullopt;
    return std::string(v.substr(b));
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos) continue;  // blank lines inside the header
    if (line[first] != '#') break;                    // end of the leading comment block
    if (auto v = field(line, "#   version:")) exact.version = *v;
    if (auto v = field(line, "#   sha256:")) exact.sha256 = *v;
    if (loose.sha256.empty() && line.find("sha256") != std::string_view::npos) {
      for (size_t i = 0; i + 64 <= line.size(); ++i) {
        if ((i > 0 && is_hex(line[i - 1])) || !is_hex(line[i])) continue;
        size_t n = 0;
        while (i + n < line.size() && is_hex(line[i + n])) ++n;
        if (n == 64) {
          loose.sha256 = std::string(line.substr(i, 64));
          break;
        }
        i += n;
      }
    }
    if (loose.version.empty()) {
      size_t v = line.find("version");
      if (v != std::string_view::npos) {
        size_t b = line.find_first_not_of(" \t:=", v + 7);
        size_t e = b == std::string_view::npos ? b : line.find_first_of(" \t,;()", b);
        if (b != std::string_view::npos) {
          loose.version = std::string(line.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
        }
      }
    }
  }
  return !exact.version.empty() && exact.sha256.size() == 64 ? exact : loose;
}

int Run(int argc, char** argv) {
  Options opts;
  CLI::App app{"patchgen: generate patched modeling files from YAML specs (docs/cli.md)", "patchgen"};
  app.set_version_flag("--version", std::string("patchgen ") + PATCHGEN_VERSION);
  app.add_option("SPEC", opts.specs, "spec files (default with --check/--list/--validate: every spec)");
  app.add_flag("--all", opts.all, "generate every spec under the specs root");
  app.add_flag("--diff", opts.diff, "also write <output>.diff (upstream -> generated)");
  app.add_option("-o,--output", opts.output_dir, "write outputs to DIR instead of the output root");
  app.add_flag("--dry-run", opts.dry_run, "say what would be written; write nothing");
  app.add_flag("-v,--verbose", opts.verbose, "also report unchanged files and where upstreams came from");
  app.add_option("-j,--jobs", opts.jobs, "worker threads (default: the cores this process may use)")->check(JobsValidator());
  app.add_flag("--json", opts.json, "machine-readable report on stdout");
  app.add_flag("--list", opts.list, "list specs with upstream, output and status");
  app.add_flag("--check", opts.check, "compare with the files on disk; exit 1 on drift; write nothing");
  app.add_flag("--fix", opts.fix, "with --check: write what differs");
  app.add_flag("--validate", opts.validate, "validate specs without their upstream modules");
  app.add_option("--source-root", opts.source_roots, "folder searched first for upstream modules (repeatable)");
  CLI::App* pin = app.add_subcommand(
      "pin", "record the upstream contracts of specs in their .pins files (docs/cli.md)");
  pin->add_option("SPEC", opts.specs, "spec files");
  pin->add_flag("--all", opts.all, "every spec under the specs root");
  pin->add_option("--source-root", opts.source_roots, "folder searched first for upstream modules (repeatable)");
  pin->add_flag("--json", opts.json, "machine-readable report on stdout");
  pin->add_option("-j,--jobs", opts.jobs, "worker threads")->check(JobsValidator());
  CLI::App* audit = app.add_subcommand(
      "audit", "upgrade survey: what a new upstream changes for every spec; writes nothing");
  audit->add_option("SPEC", opts.specs, "spec files (default: every spec)");
  audit->add_option("--source-root", opts.source_roots, "the new upstream (repeatable)")->required();
  audit->add_option("--source-root-old", opts.old_roots, "the old upstream to compare with (repeatable)");
  audit->add_flag("--json", opts.json, "machine-readable report on stdout");
  audit->add_option("-j,--jobs", opts.jobs, "worker threads")->check(JobsValidator());
  CLI::App* index = app.add_subcommand("index", "print the index of Python files");
  index->add_option("FILE", opts.index_files, "Python files")->required();
  index->add_flag("--json", opts.index_json, "JSON instead of text");
  index->add_option("-j,--jobs", opts.jobs, "worker threads (default: the cores this process may use)")
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
  if (opts.pin || opts.audit) {
    if (opts.check || opts.list || opts.validate || opts.fix || opts.dry_run || opts.diff ||
        !opts.output_dir.empty()) {
      std::cerr << "patchgen: error: `" << (opts.pin ? "pin" : "audit")
                << "` takes no --check/--list/--validate/--fix/--dry-run/--diff/-o\n";
      return kExitUsage;
    }
    if (opts.pin && opts.all == !opts.specs.empty()) {
      std::cerr << "patchgen: error: `pin` needs SPEC files or --all (not both)\n";
      return kExitUsage;
    }
  }

  auto usage = [](const std::string& msg) {
    std::cerr << "patchgen: error: " << msg << "\nRun with --help for more information.\n";
    return kExitUsage;
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
    return 70;
  }
}

}  // namespace patchgen::cli
