// Upstream module lookup (see source_lookup.h).
#include "source_lookup.h"

#include <absl/strings/str_split.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/text_util.h"
#include "files.h"

namespace patchgen::cli {

namespace fs = std::filesystem;

namespace {

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

std::optional<std::string> VersionFromInit(const std::string& text) {
  // Python keeps the last assignment: a later one replaces an earlier version, and a later one
  // whose value is not a string literal makes the version unknown.
  std::optional<std::string> found;
  for (std::string_view line : SplitLines(text)) {
    if (line.rfind("__version__", 0) != 0) continue;
    std::string_view rest = line.substr(11);
    size_t eq = rest.find_first_not_of(" \t");
    if (eq == std::string_view::npos || rest[eq] != '=' || rest.substr(eq, 2) == "==") continue;
    found.reset();
    size_t q = rest.find_first_not_of(" \t", eq + 1);
    if (q == std::string_view::npos || (rest[q] != '"' && rest[q] != '\'')) continue;
    size_t end = rest.find(rest[q], q + 1);
    if (end != std::string_view::npos) found = std::string(rest.substr(q + 1, end - q - 1));
  }
  return found;
}

std::optional<std::string> VersionFromMetadata(const std::string& text) {
  for (std::string_view line : SplitLines(text)) {
    if (line.empty()) break;  // end of the header block
    if (line.rfind("Version:", 0) == 0) return Trim(line.substr(8));
  }
  return std::nullopt;
}

SourceLookup::SourceLookup(std::vector<SourceRoot> roots, std::string python, fs::path cwd,
                           fs::path shown_base)
    : roots_(std::move(roots)),
      python_(std::move(python)),
      cwd_(std::move(cwd)),
      shown_base_(shown_base.empty() ? cwd_ : std::move(shown_base)) {}

std::vector<fs::path> SourceLookup::SplitPathList(const std::string& value, const fs::path& cwd) {
  std::vector<std::string> items = absl::StrSplit(value, ':', absl::SkipEmpty());
  std::vector<fs::path> out;
  for (const std::string& item : items) {
    fs::path p(item);
    out.push_back((p.is_absolute() ? p : cwd / p).lexically_normal());
  }
  return out;
}

void SourceLookup::EnsureSysPath() {
  if (asked_interpreter_) return;
  asked_interpreter_ = true;
  std::string cmd = ShellQuote(python_) +
                    " -c 'import sys,json;print(json.dumps(sys.path))' 2>/dev/null </dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    sys_path_error_ = "could not run '" + python_ + "'";
    return;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int rc = ::pclose(pipe);
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (rc != 0 || !j.is_array()) {
    sys_path_error_ = "could not ask '" + python_ + "' for sys.path";
    return;
  }
  const std::string origin = "sys.path of " + python_;
  for (const auto& item : j) {
    if (!item.is_string() || item.get<std::string>().empty()) continue;
    fs::path p(item.get<std::string>());
    roots_.push_back({(p.is_absolute() ? p : cwd_ / p).lexically_normal(), origin});
  }
}

std::string SourceLookup::Version(const fs::path& root, const std::string& top) {
  std::string key = (root / top).string();
  if (auto it = versions_.find(key); it != versions_.end()) return it->second;
  std::string version = "unknown";
  if (auto init = ReadFile(root / top / "__init__.py"); init && VersionFromInit(*init)) {
    version = *VersionFromInit(*init);
  } else {
    std::error_code ec;
    std::vector<fs::path> infos;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.rfind(top + "-", 0) == 0 && name.size() > 10 &&
          name.compare(name.size() - 10, 10, ".dist-info") == 0) {
        infos.push_back(it->path());
      }
    }
    std::sort(infos.begin(), infos.end());
    for (const auto& info : infos) {
      if (auto meta = ReadFile(info / "METADATA"); meta && VersionFromMetadata(*meta)) {
        version = *VersionFromMetadata(*meta);
        break;
      }
    }
  }
  versions_[key] = version;
  return version;
}

std::string TopPackage(const std::string& module) { return module.substr(0, module.find('.')); }

namespace {

/// A folder Python searches for the next component of a dotted name, and the index of the root
/// it descends from.
struct SearchDir {
  fs::path dir;
  size_t root = 0;
};

/// Where Python's path-based import finds module `parts` when `dirs` is the search path (the
/// CPython FileFinder/PathFinder rules for source files): at each component, the first folder
/// holding `<part>/__init__.py` (a regular package) or `<part>.py` (a module) ends the search;
/// folders `<part>/` without `__init__.py` seen before that are namespace portions, used only
/// when no folder has a package or module. The next component is searched in the package's
/// folder, or in every portion in order. `top_namespace` tells whether the top-level component
/// was a namespace package (then a later root could still hold a regular package that wins).
std::optional<SearchDir> PythonImport(const std::vector<std::string>& parts,
                                      std::vector<SearchDir> dirs, bool& top_namespace) {
  std::error_code ec;
  for (size_t k = 0; k < parts.size(); ++k) {
    bool last = k + 1 == parts.size();
    std::vector<SearchDir> portions;
    bool regular = false;
    for (const SearchDir& d : dirs) {
      fs::path pkg = d.dir / parts[k];
      if (fs::is_regular_file(pkg / "__init__.py", ec)) {
        if (last) return SearchDir{pkg / "__init__.py", d.root};
        portions = {SearchDir{pkg, d.root}};
        regular = true;
        break;
      }
      if (fs::is_regular_file(d.dir / (parts[k] + ".py"), ec)) {
        if (last) return SearchDir{d.dir / (parts[k] + ".py"), d.root};
        return std::nullopt;  // A module is not a package: `a.b` with `a.py`.
      }
      if (fs::is_directory(pkg, ec)) portions.push_back(SearchDir{pkg, d.root});
    }
    if (k == 0) top_namespace = !regular;
    if (last || portions.empty()) return std::nullopt;  // A namespace package has no file.
    dirs = std::move(portions);
  }
  return std::nullopt;
}

}  // namespace

LookupResult SourceLookup::Find(const std::string& module) {
  std::string rel;
  for (char c : module) rel += c == '.' ? '/' : c;
  const std::string top = TopPackage(module);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t dot = module.find('.', start);
    parts.push_back(module.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }

  LookupResult result;
  // Python's rules over roots_[0, roots_.size()): true when it found a file that no root after
  // them could take away (the top-level package is regular, or a module).
  auto resolve = [&](bool final) -> bool {
    std::vector<SearchDir> dirs;
    for (size_t i = 0; i < roots_.size(); ++i) dirs.push_back({roots_[i].path, i});
    bool top_namespace = false;
    std::optional<SearchDir> found = PythonImport(parts, dirs, top_namespace);
    if (!found || (top_namespace && !final)) return false;
    const SourceRoot& root = roots_[found->root];
    result.status = LookupResult::Status::kFound;
    result.file.file = found->dir;
    result.file.rel_path = found->dir.lexically_relative(root.path).generic_string();
    result.file.version = Version(root.path, top);
    return true;
  };
  if (resolve(asked_interpreter_)) return result;
  if (!asked_interpreter_) {
    EnsureSysPath();
    if (resolve(true)) return result;
  }
  bool package_seen = false;
  for (const SourceRoot& root : roots_) {
    std::error_code ec;
    if (fs::is_directory(root.path / top, ec) ||
        fs::is_regular_file(root.path / (top + ".py"), ec)) {
      package_seen = true;
    }
    result.looked.push_back(DisplayPath(root.path / (rel + ".py"), shown_base_) + " (" +
                            root.origin + ")");
  }
  if (sys_path_error_) result.looked.push_back("sys.path: " + *sys_path_error_);
  result.status =
      package_seen ? LookupResult::Status::kModuleMissing : LookupResult::Status::kPackageMissing;
  return result;
}

std::string SourceLookup::Help(const std::string& top_package) {
  return "add the folder that contains '" + top_package +
         "/' with --source-root DIR, PATCHGEN_SOURCE_PATH=DIR[:DIR...], or source_roots = "
         "[\"DIR\"] "
         "in the project config ([tool.patchgen] in pyproject.toml)";
}

}  // namespace patchgen::cli
