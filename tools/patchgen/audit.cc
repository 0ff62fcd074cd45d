#include "audit.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "base/file_util.h"
#include "base/unicode_nfkc.h"
#include "parser/tree_queries.h"

namespace patchgen::cli {
namespace fs = std::filesystem;

namespace {

std::string Trimmed(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  std::string out;
  bool space = false;
  for (char c : s.substr(b, e - b + 1)) {  // Collapse runs of whitespace (multi-line defaults).
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

std::string Text(const parser::PyModule& m, std::optional<ByteRange> r) {
  return r ? Trimmed(m.Text(*r)) : std::string();
}

}  // namespace

std::vector<Param> ParametersOf(const parser::PyModule& m, const parser::Definition& def) {
  std::vector<Param> out;
  for (const parser::Parameter& p : parser::Parameters(m, def)) {
    // Parameter names as Python compares them (NFKC): respelling one is no signature change.
    out.push_back(
        Param{IdentifierKey(Text(m, p.name)), Text(m, p.annotation), Text(m, p.default_value)});
  }
  return out;
}

std::vector<std::string> DecoratorsOf(const parser::PyModule& m, const parser::Definition& def) {
  std::vector<std::string> out;
  if (def.decorators.empty()) return out;
  std::string_view text = m.Text(def.decorators);
  // Decorators start lines with '@'; a decorator may span lines (its arguments).
  std::string current;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = std::min(text.find('\n', pos), text.size());
    std::string line = Trimmed(text.substr(pos, end - pos));
    pos = end + 1;
    if (line.starts_with("@")) {
      if (!current.empty()) out.push_back(current);
      current = line;
    } else if (!line.empty() && !line.starts_with("#")) {
      current += " " + line;
    }
    if (end == text.size()) break;
  }
  if (!current.empty()) out.push_back(current);
  return out;
}

namespace {

using ParamsByName = std::map<std::string, const Param*>;

// "parameter 'x' removed" / "parameter 'y' added (default ...)".
void AddedAndRemoved(const std::vector<Param>& old_params, const std::vector<Param>& new_params,
                     const ParamsByName& old_by, const ParamsByName& new_by,
                     std::vector<std::string>& out) {
  for (const Param& p : old_params) {
    if (!new_by.count(p.name)) out.push_back("parameter '" + p.name + "' removed");
  }
  for (const Param& p : new_params) {
    if (!old_by.count(p.name)) {
      out.push_back(
          "parameter '" + p.name + "' added" +
          (p.default_value.empty() ? " (no default)" : " (default " + p.default_value + ")"));
    }
  }
}

// The names of `params` that the other list has too, in the order of `params`.
std::vector<std::string> CommonNames(const std::vector<Param>& params,
                                     const ParamsByName& other_by) {
  std::vector<std::string> common;
  for (const Param& p : params) {
    if (other_by.count(p.name)) common.push_back(p.name);
  }
  return common;
}

std::string Joined(const std::vector<std::string>& names) {
  std::string joined;
  for (const auto& n : names) joined += (joined.empty() ? "" : ", ") + n;
  return joined;
}

// A changed default or annotation of a parameter both lists have.
void ValueChanges(const Param& o, const Param& p, std::vector<std::string>& out) {
  if (o.default_value != p.default_value) {
    out.push_back("default of '" + p.name +
                  "' changed: " + (o.default_value.empty() ? "none" : o.default_value) + " -> " +
                  (p.default_value.empty() ? "none" : p.default_value));
  }
  if (o.annotation != p.annotation) {
    out.push_back("annotation of '" + p.name +
                  "' changed: " + (o.annotation.empty() ? "none" : o.annotation) + " -> " +
                  (p.annotation.empty() ? "none" : p.annotation));
  }
}

// Each of `from` that `to` lacks, as "<what><decorator>".
void MissingFrom(const std::vector<std::string>& from, const std::vector<std::string>& to,
                 const std::string& what, std::vector<std::string>& out) {
  for (const std::string& d : from) {
    if (std::find(to.begin(), to.end(), d) == to.end()) out.push_back(what + d);
  }
}

}  // namespace

std::vector<std::string> SignatureChanges(const std::vector<Param>& old_params,
                                          const std::vector<Param>& new_params,
                                          const std::vector<std::string>& old_decorators,
                                          const std::vector<std::string>& new_decorators) {
  std::vector<std::string> out;
  ParamsByName old_by, new_by;
  for (const Param& p : old_params) old_by[p.name] = &p;
  for (const Param& p : new_params) new_by[p.name] = &p;
  AddedAndRemoved(old_params, new_params, old_by, new_by, out);
  std::vector<std::string> old_common = CommonNames(old_params, new_by);
  std::vector<std::string> new_common = CommonNames(new_params, old_by);
  if (old_common != new_common) {
    out.push_back("parameters reordered: " + Joined(old_common) + " -> " + Joined(new_common));
  }
  for (const Param& p : new_params) {
    auto it = old_by.find(p.name);
    if (it != old_by.end()) ValueChanges(*it->second, p, out);
  }
  MissingFrom(old_decorators, new_decorators, "decorator removed: ", out);
  MissingFrom(new_decorators, old_decorators, "decorator added: ", out);
  return out;
}

namespace {

// The absolute module a `from` import names, seen from `upstream_module`; nullopt when its
// relative level climbs above the top package.
std::optional<std::string> AbsoluteModule(const parser::Import& imp,
                                          const std::string& upstream_module) {
  if (imp.relative_level <= 0) return imp.module_name;
  std::vector<std::string> parts;
  for (size_t pos = 0; pos <= upstream_module.size();) {
    size_t dot = std::min(upstream_module.find('.', pos), upstream_module.size());
    parts.push_back(upstream_module.substr(pos, dot - pos));
    pos = dot + 1;
  }
  if (parts.size() < static_cast<size_t>(imp.relative_level)) return std::nullopt;
  parts.resize(parts.size() - static_cast<size_t>(imp.relative_level));
  std::string module;
  for (const auto& p : parts) module += (module.empty() ? "" : ".") + p;
  if (!imp.module_name.empty()) module += (module.empty() ? "" : ".") + imp.module_name;
  return module;
}

// "a.b.c" as the relative path a/b/c.
fs::path DottedPath(const std::string& module) {
  fs::path rel;
  for (size_t pos = 0; pos <= module.size();) {
    size_t dot = std::min(module.find('.', pos), module.size());
    rel /= module.substr(pos, dot - pos);
    pos = dot + 1;
  }
  return rel;
}

// The names a module binds at its top level, imports inside top-level `if`/`try` blocks included.
std::set<std::string> BoundNames(const parser::PyModule& target) {
  std::set<std::string> bound;
  for (const auto& st : target.top_level()) {
    for (const std::string& n : st.names) bound.insert(n);
  }
  // Names bound inside top-level `if`/`try` blocks (lazy imports, fallbacks) count too.
  for (const parser::Import& ti : target.imports()) {
    for (const auto& n : ti.names) {
      std::string b = n.alias.empty() ? n.name.substr(0, n.name.find('.')) : n.alias;
      bound.insert(b);
    }
  }
  for (const auto& d : target.definitions()) {
    if (d.parent < 0) bound.insert(d.name);
  }
  return bound;
}

// What `imp` (from `module`, at `file` without its .py) names that the module lacks.
void MissingFromModule(const parser::Import& imp, const std::string& module, const fs::path& file,
                       std::vector<std::string>& out) {
  std::error_code ec;
  fs::path py = file;
  py += ".py";
  fs::path init = file / "__init__.py";
  std::optional<std::string> text = ReadFile(fs::is_regular_file(py, ec) ? py : init);
  if (!text) {
    out.push_back("module " + module + " not found");
    return;
  }
  auto target = parser::PyModule::Parse(module, std::move(*text));
  if (!target.ok()) return;
  std::set<std::string> bound = BoundNames(**target);
  for (const auto& n : imp.names) {
    if (bound.count(n.name)) continue;
    fs::path sub = file / n.name;
    fs::path sub_py = sub;
    sub_py += ".py";
    if (fs::is_regular_file(sub_py, ec) || fs::is_directory(sub, ec)) continue;  // A submodule.
    out.push_back("'" + n.name + "' not defined in " + module);
  }
}

}  // namespace

std::vector<std::string> MissingImportedNames(const std::string& statement,
                                              const std::string& upstream_module,
                                              const fs::path& root) {
  std::vector<std::string> out;
  auto parsed = parser::PyModule::Parse("<imports.add>", statement);
  if (!parsed.ok()) return out;
  const parser::PyModule& m = **parsed;
  std::string top = upstream_module.substr(0, upstream_module.find('.'));
  for (const parser::Import& imp : m.imports()) {
    if (imp.kind != parser::Import::Kind::kFrom) continue;
    std::optional<std::string> module = AbsoluteModule(imp, upstream_module);
    if (!module) continue;
    if (*module != top && !module->starts_with(top + ".")) continue;  // Another package.
    MissingFromModule(imp, *module, root / DottedPath(*module), out);
  }
  return out;
}

}  // namespace patchgen::cli
