// Project configuration discovery and loading with toml++ (see project_config.h).
#include "project_config.h"

#include <toml++/toml.h>

#include "base/text_util.h"
#include "files.h"

namespace patchgen::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKeys[] = {"specs", "output", "source_roots", "python", "runtime"};

/// True when `file` is a pyproject.toml with a [tool.patchgen] table. A file that does not parse
/// counts as having the table when its text mentions it, so that its syntax error is reported.
bool HasPatchgenTable(const fs::path& file) {
  auto text = ReadFile(file);
  if (!text) return false;
  try {
    toml::table t = toml::parse(*text, file.string());
    return t["tool"]["patchgen"].is_table();
  } catch (const toml::parse_error&) {
    return text->find("[tool.patchgen]") != std::string::npos;
  }
}

struct ConfigSource {
  std::string printed;  // path as printed
  std::string text;
};

Diagnostic ErrorAtRegion(const ConfigSource& src, const toml::source_region& region,
                         std::string message, std::string help = {}) {
  SourceLoc loc;
  loc.path = src.printed;
  loc.line = static_cast<uint32_t>(region.begin.line);
  loc.col = static_cast<uint32_t>(region.begin.column);
  if (region.end.line == region.begin.line && region.end.column > region.begin.column) {
    loc.length = static_cast<uint32_t>(region.end.column - region.begin.column);
  }
  auto lines = SplitLines(src.text);
  if (loc.line >= 1 && loc.line <= lines.size()) SetSourceLine(loc, lines[loc.line - 1]);
  return ErrorAt(loc, std::move(message), std::move(help));
}

fs::path Resolve(const fs::path& root, const std::string& value) {
  fs::path p(value);
  return (p.is_absolute() ? p : root / p).lexically_normal();
}

// `source_roots`: a list of strings, each resolved against the project root.
void ReadSourceRoots(ProjectConfig& cfg, const ConfigSource& src, const toml::node& node,
                     std::vector<Diagnostic>& errors) {
  const toml::array* arr = node.as_array();
  bool ok = arr != nullptr;
  if (arr) {
    for (const auto& item : *arr) {
      if (auto s = item.value<std::string>()) {
        cfg.source_roots.push_back(Resolve(cfg.root, *s));
      } else {
        ok = false;
      }
    }
  }
  if (!ok) {
    errors.push_back(ErrorAtRegion(src, node.source(), "'source_roots' must be a list of strings"));
  }
}

// One key of the config table into `cfg`, or an error (a wrong type, an unknown key).
void ApplyKey(ProjectConfig& cfg, const ConfigSource& src, bool is_pyproject, const toml::key& key,
              const toml::node& node, std::vector<Diagnostic>& errors) {
  const std::string name(key.str());
  auto string_value = [&]() -> std::optional<std::string> {
    if (auto s = node.value<std::string>()) return *s;
    errors.push_back(ErrorAtRegion(src, node.source(), "'" + name + "' must be a string"));
    return std::nullopt;
  };
  if (name == "specs") {
    if (auto v = string_value()) cfg.specs = Resolve(cfg.root, *v);
  } else if (name == "output") {
    if (auto v = string_value()) cfg.output = Resolve(cfg.root, *v);
  } else if (name == "python") {
    if (auto v = string_value()) {
      cfg.python = v->find('/') == std::string::npos ? *v : Resolve(cfg.root, *v).string();
    }
  } else if (name == "runtime") {
    if (auto v = string_value()) cfg.runtime = *v;
  } else if (name == "source_roots") {
    ReadSourceRoots(cfg, src, node, errors);
  } else {
    const std::vector<std::string> known(std::begin(kKeys), std::end(kKeys));
    std::string help = WithDidYouMean(name, known, "known keys: " + JoinNames(known));
    errors.push_back(ErrorAtRegion(
        src, key.source(),
        "unknown key '" + name + "' in " + (is_pyproject ? "[tool.patchgen]" : "patchgen.toml"),
        help));
  }
}

}  // namespace

Result<ProjectConfig> LoadProjectConfig(const fs::path& file, const fs::path& cwd) {
  ProjectConfig cfg;
  cfg.root = file.parent_path();
  cfg.file = file;
  cfg.specs = cfg.root / "specs";
  cfg.output = cfg.root / "generated";

  auto text = ReadFile(file);
  std::string printed = DisplayPath(file, cwd);
  if (!text) {
    return ErrorAt(SourceLoc::InFile(printed), "cannot read project config", {}, ErrorKind::kIo);
  }
  ConfigSource src{printed, *text};
  toml::table doc;
  try {
    doc = toml::parse(*text, printed);
  } catch (const toml::parse_error& e) {
    return ErrorAtRegion(src, e.source(), "invalid TOML: " + std::string(e.description()));
  }
  const bool is_pyproject = file.filename() == "pyproject.toml";
  const toml::table* table = is_pyproject ? doc["tool"]["patchgen"].as_table() : &doc;
  if (table == nullptr) return cfg;

  std::vector<Diagnostic> errors;
  for (const auto& [key, node] : *table) ApplyKey(cfg, src, is_pyproject, key, node, errors);
  if (!errors.empty()) {
    SortDiagnostics(errors);
    return errors;
  }
  return cfg;
}

Result<ProjectConfig> FindProjectConfig(const fs::path& cwd) {
  for (fs::path dir = cwd;; dir = dir.parent_path()) {
    std::error_code ec;
    fs::path pyproject = dir / "pyproject.toml";
    if (fs::is_regular_file(pyproject, ec) && HasPatchgenTable(pyproject)) {
      return LoadProjectConfig(pyproject, cwd);
    }
    fs::path own = dir / "patchgen.toml";
    if (fs::is_regular_file(own, ec)) return LoadProjectConfig(own, cwd);
    if (dir == dir.parent_path()) break;
  }
  ProjectConfig cfg;
  cfg.root = cwd;
  cfg.specs = cwd / "specs";
  cfg.output = cwd / "generated";
  return cfg;
}

}  // namespace patchgen::cli
