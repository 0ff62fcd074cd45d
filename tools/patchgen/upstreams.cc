// Upstream modules (pipeline.h): where each spec's module is (FindUpstreams), and each distinct
// upstream file read and parsed once (ParseUpstreams), refusing what patchgen cannot patch.
#include "parallel.h"
#include "parser/tree_queries.h"
#include "pipeline.h"
#include "rewriter/sha256.h"

namespace patchgen::cli {

SourceLookup MakeSourceLookup(const RunContext& ctx) {
  std::vector<SourceRoot> roots;
  for (const auto& r : ctx.opts.source_roots) roots.push_back({ctx.FromCwd(r), "--source-root"});
  if (const char* env = std::getenv("PATCHGEN_SOURCE_PATH")) {
    for (auto& p : SourceLookup::SplitPathList(env, ctx.cwd))
      roots.push_back({p, "PATCHGEN_SOURCE_PATH"});
  }
  const ProjectConfig& config = ctx.config;
  for (const auto& p : config.source_roots) {
    roots.push_back(
        {p, "source_roots in " + (config.file ? ctx.Show(*config.file) : std::string("config"))});
  }
  return SourceLookup(std::move(roots), config.python, ctx.cwd, ctx.shown_base);
}

namespace {

/// Where the upstream of spec `s` is; a spec with load errors fails with them (its upstream, when
/// found, adds the generator's).
FoundUpstream FindOne(const RunContext& ctx, SourceLookup& lookup, const SpecRecord& rec,
                      const spec::PatchSpec& s) {
  FoundUpstream out;
  out.lookup = lookup.Find(s.upstream);
  using Status = LookupResult::Status;
  if (out.lookup.status == Status::kFound || rec.load.partial) return out;
  if (out.lookup.status == Status::kPackageMissing && rec.file.discovered && !ctx.opts.validate) {
    out.skipped = true;
    return out;
  }
  Diagnostic d = ErrorAt(s.upstream_loc, "upstream module '" + s.upstream + "' not found",
                         SourceLookup::Help(TopPackage(s.upstream)), ErrorKind::kUpstream);
  d.notes.push_back(Note::Verbatim("looked in:"));
  for (const auto& place : out.lookup.looked) d.notes.push_back(Note::Verbatim("  " + place));
  out.errors.push_back(std::move(d));
  return out;
}

/// The errors of an upstream file with a CR line ending ('\r' without '\n'): lines patchgen could
/// not tell apart.
std::optional<Diagnostic> CrLineEnding(const std::string& text, const std::string& shown) {
  for (size_t cr = text.find('\r'); cr != std::string::npos; cr = text.find('\r', cr + 1)) {
    if (cr + 1 < text.size() && text[cr + 1] == '\n') continue;
    LineIndex lines(text);
    return MakeDiagnostic(shown, text, lines,
                          {static_cast<uint32_t>(cr), static_cast<uint32_t>(cr + 1)},
                          "upstream module has a CR line ending ('\\r' without '\\n')",
                          "patchgen reads modules with LF or CRLF line endings; "
                          "convert the file (e.g. `dos2unix -c mac`)",
                          ErrorKind::kUpstream);
  }
  return std::nullopt;
}

/// Whether every line of `text` ends with CRLF (and there is one).
bool AllCrlf(const std::string& text) {
  size_t lf = 0, crlf = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\n') continue;
    ++lf;
    if (i > 0 && text[i - 1] == '\r') ++crlf;
  }
  return lf > 0 && crlf == lf;
}

/// The module `text` parsed, or sets u.errors: a syntax error, tab indentation.
void ParseInto(Upstream& u, std::string text, const std::string& shown) {
  auto parsed = parser::PyModule::Parse(shown, std::move(text));
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
}

/// Reads and parses one upstream file into `u` (on a worker), or sets u.errors: unreadable, a CR
/// line ending, a syntax error, tab indentation.
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
  if (auto cr = CrLineEnding(*text, shown)) {
    u.errors.push_back(std::move(*cr));
    return;
  }
  u.crlf = AllCrlf(*text);
  ParseInto(u, std::move(*text), shown);
  if (!u.module) return;
  // One hash per upstream file, shared by its specs (the header's sha256 and the check stamps).
  u.source_sha256 = rewriter::Sha256Hex(u.source);
  u.module_sha256 = u.module->source().size() == u.source.size()
                        ? u.source_sha256
                        : rewriter::Sha256Hex(u.module->source());
}

/// Whether a spec's upstream file is parsed: it loaded (partly, or whole without an error so far)
/// and its module was found.
bool NeedsUpstream(const SpecRecord& rec) {
  if (rec.load.partial) return rec.found();
  return rec.spec() && rec.upstream.errors.empty() && !rec.skipped();
}

}  // namespace

std::vector<FoundUpstream> FindUpstreams(const RunContext& ctx,
                                         const std::vector<SpecRecord>& specs) {
  SourceLookup lookup = MakeSourceLookup(ctx);
  std::vector<FoundUpstream> found(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const LoadedSpec& load = specs[i].load;
    if (!load.spec && !load.partial) continue;
    found[i] = FindOne(ctx, lookup, specs[i], load.spec ? *load.spec : *load.partial);
  }
  return found;
}

Upstreams ParseUpstreams(const RunContext& ctx, const std::vector<SpecRecord>& specs) {
  Upstreams ups;
  ups.of.resize(specs.size());
  std::vector<Upstream*> todo;
  std::vector<fs::path> paths;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!NeedsUpstream(specs[i])) continue;
    const fs::path& file = specs[i].upstream.lookup.file.file;
    auto& slot = ups.files[file];
    if (!slot) {
      slot = std::make_unique<Upstream>();
      todo.push_back(slot.get());
      paths.push_back(file);
    }
    ups.of[i] = slot.get();
  }
  // Largest file first: the last file a worker starts is then a small one, so that the two cores
  // of the target machine finish together (the same in GenerateSpecs).
  std::vector<size_t> order = LargestFirst(paths.size(), [&](size_t i) {
    std::error_code ec;
    uintmax_t size = fs::file_size(paths[i], ec);
    return ec ? 0 : size;
  });
  ParallelFor(todo.size(), ctx.opts.jobs, [&](size_t k) {
    size_t i = order[k];
    ReadUpstream(*todo[i], paths[i], ctx.Show(paths[i]));
  });
  return ups;
}

}  // namespace patchgen::cli
