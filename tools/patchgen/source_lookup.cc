// Upstream module lookup (see source_lookup.h).
#include "source_lookup.h"

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
  for (std::string_view line : SplitLines(text)) {
    if (line.rfind("__version__", 0) != 0) continue;
    std::string_view rest = line.substr(11);
    size_t eq = rest.find_first_not_of(" \t");
    if (eq == std::string_view::npos || rest[eq] != '=') continue;
    size_t q = rest.find_first_not_of(" \t", eq + 1);
    if (q == std::string_view::npos || (rest[q] != '"' && rest[q] != '\'')) continue;
    size_t end = rest.find(rest[q], q + 1);
    if (end == std::string_view::npos) continue;
    return std::string(rest.substr(q + 1, end - q - 1));
  }
  return std::nullopt;
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
  std::vector<fs::path> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(':', start);
    if (end == std::string::npos) end = value.size();
    std::string item = value.substr(start, end - start);
    if (!item.empty()) {
      fs::path p(item);
      out.push_back((p.is_absolute() ? p : cwd / p).lexically_normal());
    }
    start = end + 1;
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

LookupResult SourceLookup::Find(const std::string& module) {
  std::string rel;
  for (char c : module) rel += c == '.' ? '/' : c;
  const std::string top = TopPackage(module);

  LookupResult result;
  bool package_seen = false;
  auto search = [&](size_t from) -> bool {
    for (size_t i = from; i < roots_.size(); ++i) {
      const SourceRoot& root = roots_[i];
      std::error_code ec;
      fs::path file = root.path / (rel + ".py");
      fs::path init = root.path / rel / "__init__.py";
      if (fs::is_directory(root.path / top, ec) ||
          fs::is_regular_file(root.path / (top + ".py"), ec)) {
        package_seen = true;
      }
      for (const fs::path& candidate : {file, init}) {
        if (fs::is_regular_file(candidate, ec)) {
          result.status = LookupResult::Status::kFound;
          result.file.file = candidate;
          result.file.rel_path = candidate.lexically_relative(root.path).generic_string();
          result.file.version = Version(root.path, top);
          return true;
        }
      }
      result.looked.push_back(DisplayPath(file, shown_base_) + " (" + root.origin + ")");
    }
    return false;
  };
  size_t explicit_roots = roots_.size();
  if (!asked_interpreter_) {
    if (search(0)) return result;
    EnsureSysPath();
    if (search(explicit_roots)) return result;
  } else if (search(0)) {
    return result;
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
