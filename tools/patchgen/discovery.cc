// Discovery (pipeline.h): the spec files named on the command line, or every spec under the specs
// root (parent specs without `output` left out).
#include <algorithm>
#include <map>

#include "base/text_util.h"
#include "pipeline.h"

namespace patchgen::cli {
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
/// for each in `notes` (docs/spec-format.md, "Composition").
void SkipAbstractParents(std::vector<std::pair<std::string, fs::path>>& found,
                         const fs::path& shown_base, std::string& notes) {
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
    notes += "note: " + DisplayPath(f.second, shown_base) +
             ": skipped: a parent spec without `output` (extended by " +
             DisplayPath(child->second, shown_base) + "), generated only through its children\n";
    return true;
  });
}

/// The specs root is missing: what to print.
std::string NoSpecsFolder(const RunContext& ctx) {
  const ProjectConfig& config = ctx.config;
  return "patchgen: error: specs folder '" + ctx.Show(config.specs) + "' does not exist\n" +
         "help: set `specs` in the project config (" +
         (config.file
              ? ctx.Show(*config.file)
              : std::string("no pyproject.toml with [tool.patchgen] or patchgen.toml found")) +
         ") or name spec files on the command line\n";
}

}  // namespace

std::vector<fs::path> DiscoverSpecs(const fs::path& root, const fs::path& shown_base,
                                    std::vector<Diagnostic>& errors, std::string& notes) {
  std::vector<std::pair<std::string, fs::path>> found;
  auto error = [&](const fs::path& at, std::string message, std::string help) {
    SourceLoc loc = SourceLoc::InFile(DisplayPath(at, shown_base));
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
  SkipAbstractParents(found, shown_base, notes);
  std::vector<fs::path> out;
  for (auto& [rel, path] : found) out.push_back(path);
  SortDiagnostics(errors);
  return out;
}

Discovery Discover(const RunContext& ctx) {
  Discovery d;
  const bool discover = ctx.opts.specs.empty();
  std::vector<fs::path> paths;
  if (!discover) {
    for (const auto& s : ctx.opts.specs) paths.push_back(ctx.FromCwd(s));
  } else if (std::error_code ec; !fs::is_directory(ctx.config.specs, ec)) {
    d.printed.Err(NoSpecsFolder(ctx));
    d.stop = Stop::kUsage;
    return d;
  } else {
    std::vector<Diagnostic> errors;
    std::string notes;
    paths = DiscoverSpecs(ctx.config.specs, ctx.shown_base, errors, notes);
    d.printed.Err(notes);
    if (!errors.empty()) {  // a gate that cannot see every spec must not pass: nothing runs
      d.printed.Diagnostics(errors);
      d.stop = Stop::kSpecsUnreadable;
      return d;
    }
  }
  for (const auto& p : paths) d.specs.push_back({p, ctx.Show(p), discover});
  return d;
}

}  // namespace patchgen::cli
