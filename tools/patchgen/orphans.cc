// Orphaned outputs (modes.h): files under the output root that carry patchgen's header but that
// no spec produces; --check reports them, --check --fix removes those patchgen wrote in this
// project (docs/cli.md, "What `--check --fix` removes").
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "modes.h"
#include "output_record.h"
#include "rewriter/header.h"
#include "rewriter/sha256.h"
#include "stamp_file.h"

namespace patchgen::cli {

void RecordWritten(const RunContext& ctx, const fs::path& path, const std::string& bytes) {
  RecordOutput(ctx.CacheDir(), path, rewriter::Sha256Hex(bytes));
}

namespace {

/// An output under the output root that no spec of the run produces but that carries patchgen's
/// header, as --check found it.
struct Orphan {
  fs::path path;    ///< As walked: under the output root, no symbolic link below it.
  std::string sha;  ///< sha256 of its bytes when it was found.
  fs::path spec;    ///< The spec its header names (absolute), empty when none.
};

bool Under(const fs::path& p, const fs::path& dir) {
  fs::path rel = p.lexically_normal().lexically_relative(dir.lexically_normal());
  return !rel.empty() && *rel.begin() != "..";
}

// A folder the orphan search does not enter: a dot-folder, or one of `not_entered`.
bool SkipFolder(const fs::path& dir, const std::vector<fs::path>& not_entered) {
  bool skip = dir.filename().string().starts_with(".");
  for (const fs::path& d : not_entered) skip |= dir.lexically_normal() == d.lexically_normal();
  return skip;
}

// The orphan at `p`: a .py or .diff that no spec produces (`produced`: file identities, so that an
// output written through a folder link, or a link to an output, is the file it leads to) and that
// carries patchgen's header. The spec its header names is resolved against `root`.
std::optional<Orphan> OrphanAt(const fs::path& p, const std::set<std::string>& produced,
                               const fs::path& root) {
  std::string ext = p.extension().string();
  if ((ext != ".py" && ext != ".diff") || produced.count(FileIdentity(p))) return std::nullopt;
  auto text = ReadFile(p, nullptr, kMaxSpecFileBytes * 4);
  if (!text || !rewriter::CarriesGeneratedHeader(*text)) return std::nullopt;
  fs::path spec = rewriter::ReadHeaderSpec(*text);
  if (!spec.empty()) spec = (spec.is_absolute() ? spec : root / spec).lexically_normal();
  return Orphan{p, rewriter::Sha256Hex(*text), spec};
}

// Why `p` (found under `root`) must not be removed through its path: it is no regular file any
// more, a link, or reached through one; nullopt when it may be.
std::optional<std::string> LinkOnTheWay(const fs::path& p, const fs::path& root) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return "it no longer exists";
  if (S_ISLNK(st.st_mode)) return "it is a symbolic link";
  if (!S_ISREG(st.st_mode)) return "it is no regular file";
  std::error_code ec, ec2;
  fs::path real = fs::canonical(p, ec), real_root = fs::canonical(root, ec2);
  if (ec || ec2) return "its real path cannot be told";
  if (!Under(real, real_root))
    return "its real path is outside the output root (through a symbolic link)";
  fs::path rel = p.lexically_normal().lexically_relative(root.lexically_normal());
  if (real != (real_root / rel).lexically_normal()) return "its path leads through a symbolic link";
  return std::nullopt;
}

// Whether what every spec produces is known: every spec was discovered (no SPEC argument) and
// loaded (or is up to date by its stamp).
bool AllKnown(const RunContext& ctx, const std::vector<SpecRecord>& specs, bool fresh) {
  bool all_known = ctx.opts.specs.empty();
  for (const SpecRecord& rec : specs) all_known &= (rec.spec() || fresh) && !rec.out.py.empty();
  return all_known;
}

// The orphaned outputs under the output root. An output root that holds the whole project
// (`output = "."`) would take test expectations and files of other tools for orphans: it is not
// searched. Below the output root, the specs root, the source roots and dot-folders are not
// entered.
std::vector<Orphan> FindOrphans(const RunContext& ctx, const std::vector<SpecRecord>& specs,
                                bool fresh) {
  std::vector<Orphan> found;
  const fs::path out_root = ctx.OutputRoot();
  if (!AllKnown(ctx, specs, fresh) || Under(ctx.config.root, out_root)) return found;
  std::vector<fs::path> not_entered = {ctx.config.specs};
  for (const auto& r : ctx.config.source_roots) not_entered.push_back(r);
  for (const auto& r : ctx.opts.source_roots) not_entered.push_back(ctx.cwd / r);
  std::set<std::string> produced;
  for (const SpecRecord& rec : specs) {
    produced.insert(FileIdentity(rec.out.py));
    produced.insert(FileIdentity(rec.out.diff));
  }
  std::error_code ec;
  for (fs::recursive_directory_iterator it(out_root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->is_directory(ec2) && !it->is_symlink(ec2)) {
      if (SkipFolder(it->path(), not_entered)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink(ec2) || !it->is_regular_file(ec2)) continue;
    if (auto o = OrphanAt(it->path().lexically_normal(), produced, ctx.config.root))
      found.push_back(std::move(*o));
  }
  std::sort(found.begin(), found.end(),
            [](const Orphan& a, const Orphan& b) { return a.path < b.path; });
  return found;
}

// Whether `spec` is one of the specs this run checked.
bool RunChecks(const std::vector<SpecRecord>& specs, const fs::path& spec) {
  const std::string id = FileIdentity(spec);
  return std::any_of(specs.begin(), specs.end(),
                     [&](const SpecRecord& rec) { return FileIdentity(rec.file.abs) == id; });
}

// Why an orphan must stay, or nullopt when --fix may remove it: only a file patchgen wrote in this
// project (its record), still holding those bytes (`reread`: read again right before removal),
// reached from the output root without a symbolic link, whose spec did not appear during the run.
std::optional<std::string> KeepOrphan(const RunContext& ctx, const std::vector<SpecRecord>& specs,
                                      const Orphan& o, bool reread) {
  if (auto why = LinkOnTheWay(o.path, ctx.OutputRoot())) return why;
  std::error_code ec;
  if (!o.spec.empty() && !RunChecks(specs, o.spec) && fs::exists(o.spec, ec)) {
    return "its spec '" + ctx.Show(o.spec) +
           "' exists but was not checked in this run (added during the run?); run `patchgen "
           "--check` again";
  }
  if (reread && FileSha(o.path) != o.sha) return std::string("it changed while --check ran");
  std::optional<bool> recorded = RecordedAs(ctx.CacheDir(), fs::canonical(o.path, ec), o.sha);
  if (!recorded) {
    return std::string(
        "patchgen has no record of writing it in this project; remove it by hand if no other "
        "project writes it");
  }
  if (!*recorded) {
    return std::string(
        "its bytes are not the ones patchgen wrote there; remove it by hand if the change is not "
        "needed");
  }
  return std::nullopt;
}

// Reports an orphaned output, or removes it with --fix when nothing says it must stay (then it is
// reported as kept).
void HandleOrphan(const RunContext& ctx, const std::vector<SpecRecord>& specs, const Orphan& o,
                  OrphansFound& out) {
  const std::string shown = ctx.Show(o.path);
  const bool text = !ctx.opts.json;
  if (!ctx.opts.fix) {
    ++out.left;
    if (!text) return;
    std::optional<std::string> why = KeepOrphan(ctx, specs, o, /*reread=*/false);
    out.printed.Out("orphaned: " + shown +
                    " (carries patchgen's header, but no spec produces it; `patchgen --check "
                    "--fix` " +
                    (why ? "leaves it: " + *why : std::string("removes it")) + ")\n");
    return;
  }
  if (std::optional<std::string> why = KeepOrphan(ctx, specs, o, /*reread=*/true)) {
    ++out.left;
    out.kept.push_back(shown);
    if (text) out.printed.Out("kept: " + shown + " (orphaned, not removed: " + *why + ")\n");
    return;
  }
  if (::unlink(o.path.c_str()) != 0) {
    Diagnostic d = ErrorAt(SourceLoc::InFile(shown),
                           "cannot remove orphaned output: " +
                               std::error_code(errno, std::generic_category()).message(),
                           {}, ErrorKind::kIo);
    out.printed.Diagnostics({d});
    out.errors.push_back(std::move(d));
    return;
  }
  if (text) out.printed.Out("removed: " + shown + " (orphaned: no spec produces it)\n");
}

}  // namespace

OrphansFound CheckOrphans(const RunContext& ctx, const std::vector<SpecRecord>& specs, bool fresh) {
  OrphansFound out;
  for (const Orphan& o : FindOrphans(ctx, specs, fresh)) {
    out.found.push_back(ctx.Show(o.path));
    HandleOrphan(ctx, specs, o, out);
  }
  return out;
}

}  // namespace patchgen::cli
