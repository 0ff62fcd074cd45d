// Helpers the Runner's stages and modes share (runner.h): exit codes, diagnostics and JSON output,
// spec discovery, and the checks of a generated module's upstream targets and bytes.
#include "base/text_util.h"
#include "runner.h"

namespace patchgen::cli {

int ExitCodeOf(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSpec:
      return kExitSpec;
    case ErrorKind::kUpstream:
      return kExitUpstream;
    case ErrorKind::kIo:
      return kExitIo;
    case ErrorKind::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

const char* StatusName(JobStatus status) {
  switch (status) {
    case JobStatus::kPending:
      return "";
    case JobStatus::kWritten:
      return "written";
    case JobStatus::kUnchanged:
      return "unchanged";
    case JobStatus::kWouldWrite:
      return "would write";
    case JobStatus::kUpToDate:
      return "up to date";
    case JobStatus::kStale:
      return "stale";
    case JobStatus::kFixed:
      return "fixed";
    case JobStatus::kMissing:
      return "missing";
    case JobStatus::kUpstreamNotFound:
      return "upstream not found";
    case JobStatus::kValid:
      return "valid";
    case JobStatus::kInvalid:
      return "invalid";
    case JobStatus::kError:
      return "error";
    case JobStatus::kPinned:
      return "pinned";
    case JobStatus::kNeedsAttention:
      return "needs attention";
    case JobStatus::kOk:
      return "ok";
  }
  return "";
}

const char* KindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSpec:
      return "spec";
    case ErrorKind::kUpstream:
      return "upstream";
    case ErrorKind::kIo:
      return "io";
    case ErrorKind::kInternal:
      return "internal";
  }
  return "internal";
}

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
  return {{"path", d.loc.path},       {"line", d.loc.line},   {"col", d.loc.col},
          {"kind", KindName(d.kind)}, {"message", d.message}, {"help", d.help}};
}

std::string Short(const std::string& sha) { return sha.substr(0, 12); }

/// "1.0.0 (sha256 0123456789ab)", leaving out what is unknown.
std::string Fingerprint(const std::string& version, const std::string& sha) {
  std::string s = version.empty() ? "" : version;
  if (!sha.empty())
    s += (s.empty() ? "sha256 " : " (sha256 ") + Short(sha) + (s.empty() ? "" : ")");
  return s.empty() ? "unknown" : s;
}

namespace {

/// The value of top-level key `key` in spec text (quotes and a trailing comment removed), or
/// nullopt. A line scan, not a YAML parse: enough to find `extends:` and `output:`.
std::optional<std::string> TopLevelValue(const std::string& text, std::string_view key) {
  for (std::string_view line : SplitLines(text)) {
    if (!line.starts_with(key) || line.substr(key.size(), 1) != ":") continue;
    std::string_view v = line.substr(key.size() + 1);
    if (size_t hash = v.find(" #"); hash != std::string_view::npos) v = v.substr(0, hash);
    size_t b = v.find_first_not_of(" \t");
    size_t e = v.find_last_not_of(" \t\r");
    std::string value = b == std::string_view::npos ? "" : std::string(v.substr(b, e - b + 1));
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    return value;
  }
  return std::nullopt;
}

/// Leaves out of `found` the abstract parents: specs that another found spec `extends` and that
/// have no `output` of their own (meant only to be extended, they generate nothing), with a note
/// on stderr for each (docs/spec-format.md, "Composition").
void SkipAbstractParents(std::vector<std::pair<std::string, fs::path>>& found,
                         const fs::path& cwd) {
  std::map<fs::path, fs::path> extended_by;  // parent -> first child
  std::map<fs::path, bool> has_output;
  for (const auto& [rel, path] : found) {
    std::optional<std::string> text = ReadFile(path);
    if (!text) continue;
    has_output[path.lexically_normal()] = TopLevelValue(*text, "output").has_value();
    std::optional<std::string> parent = TopLevelValue(*text, "extends");
    if (parent && !parent->empty()) {
      extended_by.emplace((path.parent_path() / *parent).lexically_normal(), path);
    }
  }
  std::erase_if(found, [&](const std::pair<std::string, fs::path>& f) {
    fs::path p = f.second.lexically_normal();
    auto child = extended_by.find(p);
    if (child == extended_by.end() || has_output[p]) return false;
    std::cerr << "note: " << DisplayPath(f.second, cwd)
              << ": skipped: a parent spec without `output` (extended by "
              << DisplayPath(child->second, cwd) << "), generated only through its children\n";
    return true;
  });
}

}  // namespace

/// Spec files under `root`: *.yaml and *.yml, recursively, sorted by their '/'-separated relative
/// path. Nothing is skipped silently: a folder that cannot be read and a symbolic link to a folder
/// (not followed: it could lead out of the tree or into a loop) are errors in `errors`, and the
/// walk goes on with the rest. A link to a file is a spec like any other.
std::vector<fs::path> DiscoverSpecs(const fs::path& root, const fs::path& cwd,
                                    std::vector<Diagnostic>& errors) {
  std::vector<std::pair<std::string, fs::path>> found;
  auto error = [&](const fs::path& at, std::string message, std::string help) {
    SourceLoc loc = SourceLoc::InFile(DisplayPath(at, cwd));
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
        error(p,
              "spec folder is a symbolic link (to '" + fs::read_symlink(p, ec2).string() + "'); " +
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
  SkipAbstractParents(found, cwd);
  std::vector<fs::path> out;
  for (auto& [rel, path] : found) out.push_back(path);
  SortDiagnostics(errors);
  return out;
}

/// The first thing in a generated module that CPython rejects in any source file whatever its
/// grammar: a byte sequence that is not UTF-8 (no coding cookie survives the generated header), a
/// NUL byte, or U+FEFF (a byte order mark inside the file, e.g. from a patch file saved with one).
/// Returns its byte offset and what it is.
namespace {

// The length of the UTF-8 sequence starting with the byte at `i` (not ASCII), or 0 when it is not
// valid UTF-8: a bad lead or continuation byte, truncated, an overlong form or a surrogate.
size_t Utf8SequenceLength(std::string_view text, size_t i) {
  auto c = static_cast<unsigned char>(text[i]);
  size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
  bool ok = n > 0 && i + n <= text.size();
  for (size_t k = 1; ok && k < n; ++k)
    ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
  if (ok && n == 3) {  // no overlong forms, no surrogates
    auto c1 = static_cast<unsigned char>(text[i + 1]);
    ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
  }
  if (ok && n == 4) {
    auto c1 = static_cast<unsigned char>(text[i + 1]);
    ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
  }
  return ok ? n : 0;
}

}  // namespace

std::optional<std::pair<uint32_t, std::string>> FirstSourceBlocker(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) return std::pair{static_cast<uint32_t>(i), std::string("a NUL byte")};
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", c);
      return std::pair{static_cast<uint32_t>(i),
                       "the byte " + std::string(hex) + ", which is not UTF-8"};
    }
    if (text.substr(i, 3) == "\xEF\xBB\xBF") {
      return std::pair{static_cast<uint32_t>(i), std::string("U+FEFF (a byte order mark)")};
    }
    i += n;
  }
  return std::nullopt;
}

namespace {

/// The error for an entry whose target `d` (or a class around it) upstream rebinds after its
/// definition (PyModule::Rebindings, `f = other`): the patched definition would be dead code.
std::optional<Diagnostic> RebindingError(const rewriter::ContractPin& pin,
                                         const parser::PyModule& upstream,
                                         const parser::Definition& d, const std::string& shown) {
  std::vector<ByteRange> again = upstream.Rebindings(d);
  if (again.empty()) return std::nullopt;
  LineCol lc = upstream.lines().At(again.front().start);
  std::string text(upstream.Text(again.front()).substr(0, 60));
  Diagnostic e =
      ErrorAt(pin.loc,
              "'" + d.qualname + "' (line " + std::to_string(d.line) + ") is rebound at line " +
                  std::to_string(lc.line) + " of the upstream module " + shown + " (`" +
                  text.substr(0, text.find('\n')) +
                  "`): Python uses that value, the patched definition " + "would be dead code",
              "patchgen does not patch a definition that upstream replaces; patch what line " +
                  std::to_string(lc.line) +
                  " binds, or generate against an upstream that does not "
                  "rebind '" +
                  d.qualname + "'",
              ErrorKind::kUpstream);
  e.notes.push_back(Note::At(SourceLoc{shown, lc.line, lc.col, 1, {}}, "rebound here"));
  return e;
}

}  // namespace

/// Errors for entries whose upstream target (or a class around it) is defined more than once in one
/// scope (PyModule::Redefinitions): Python keeps the last definition, the splice would patch the
/// first; or is rebound later in its scope (RebindingError). Located at the spec entry, naming
/// every definition.
std::vector<Diagnostic> AmbiguousTargets(const std::vector<rewriter::ContractPin>& contract,
                                         const parser::PyModule& upstream,
                                         const std::string& shown) {
  std::vector<Diagnostic> out;
  auto where = [&](const parser::Definition& d) {
    LineCol lc = upstream.lines().At(d.definition.start);
    return SourceLoc{shown, lc.line, lc.col, 1, {}};
  };
  for (const rewriter::ContractPin& pin : contract) {
    if (pin.qualname.empty()) continue;
    for (const parser::Definition* d = upstream.Find(pin.qualname); d != nullptr;
         d = d->parent >= 0 ? &upstream.definitions()[d->parent] : nullptr) {
      if (auto rebound = RebindingError(pin, upstream, *d, shown)) {
        out.push_back(std::move(*rebound));
        break;
      }
      std::vector<const parser::Definition*> again = upstream.Redefinitions(*d);
      if (again.empty()) continue;
      const char* what = d->kind == parser::Definition::Kind::kClass ? "class"
                         : d->parent >= 0 && upstream.definitions()[d->parent].kind ==
                                                 parser::Definition::Kind::kClass
                             ? "method"
                             : "function";
      Diagnostic e = ErrorAt(
          pin.loc,
          std::string(what) + " '" + d->qualname + "' is defined " +
              std::to_string(again.size() + 1) + " times in the upstream module " + shown +
              ": Python keeps the last (line " + std::to_string(again.back()->line) +
              "), patchgen would patch the first (line " + std::to_string(d->line) + ")",
          "patchgen does not guess which definition is meant; remove the dead definition upstream "
          "or generate against an upstream that defines '" +
              d->qualname + "' once",
          ErrorKind::kUpstream);
      e.notes.push_back(Note::At(where(*d), "first definition"));
      for (const parser::Definition* r : again)
        e.notes.push_back(Note::At(where(*r), "defined again here"));
      out.push_back(std::move(e));
      break;
    }
  }
  SortDiagnostics(out);
  return out;
}

// The one failure path of a job in every mode: status "error", its diagnostics on stderr; returns
// its exit code (the worst of its errors).
int Runner::Failed(Job& job) const {
  job.status = JobStatus::kError;
  PrintDiagnostics(job.errors);
  return WorstExit(job.errors);
}

// A spec skipped because its upstream package is on no source root: status and (text mode) the
// line `skipped SPEC: upstream package 'P' not found<why>`.
void Runner::ReportSkipped(const Job& job, const char* why) const {
  if (opts_.json) return;
  std::cout << "skipped " << job.spec_shown << ": upstream package '"
            << TopPackage(job.spec->upstream) << "' not found" << why << "\n";
}

}  // namespace patchgen::cli
