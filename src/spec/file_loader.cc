// FileLoader (file_loader.h): the spec level (version, upstream, output, ...), its lists, imports
// and helpers.
#include "spec/file_loader.h"

#include <algorithm>
#include <map>

#include "base/text_util.h"
#include "spec/python_names.h"

namespace patchgen::spec {

OneSpec FileLoader::Load() {
  OneSpec out;
  out.spec.path = path_;
  out.spec.text = text_;
  Result<RawNode> raw = ParseRawYaml(path_, *text_);
  if (!raw.ok()) {
    for (Diagnostic& d : raw.errors()) diags_.push_back(std::move(d));
    return out;
  }
  const RawNode& root = *raw;
  if (root.kind != Kind::kMapping) {
    if (root.kind == Kind::kNull && !root.explicit_null) {
      diags_.push_back(ErrorAt(LocAt(ByteRange{0, 0}), "the spec is empty",
                               "a spec needs at least `upstream:` and `output:`"));
    } else {
      Error(root, std::string("expected a mapping, found ") + DescribeKind(root),
            "a spec is a mapping of keys such as `upstream:` and `output:`");
    }
    return out;
  }
  out.parsed = true;
  LoadTop(root, out);
  return out;
}

void FileLoader::LoadTop(const RawNode& root, OneSpec& out) {
  KeyMap keys = Keys(root, KeyLevel::kSpec);
  size_t before = diags_.size();
  LoadHead(keys, out);  // Sets has_extends_, which the entries below depend on.
  out.fatal_errors += diags_.size() - before;
  LoadEntries(keys, out);
}

// The scalars: version, upstream, output, description, runtime, extends.
void FileLoader::LoadHead(const KeyMap& keys, OneSpec& out) {
  PatchSpec& spec = out.spec;
  if (const RawNode* v = ValueOf(keys, "version")) LoadVersion(*v, out);
  if (const RawNode* v = ValueOf(keys, "upstream")) {
    out.has_upstream = true;
    if (auto s = Dotted(*v, "upstream", "transformers.models.qwen3.modeling_qwen3")) {
      spec.upstream = *s;
      spec.upstream_loc = Loc(*v);
    }
  }
  if (const RawNode* v = ValueOf(keys, "output")) LoadOutput(*v, out);
  if (const RawNode* v = ValueOf(keys, "description")) {
    if (auto s = OneLine(*v, "description")) {
      spec.description = *s;
      out.has_description = true;
    }
  }
  if (const RawNode* v = ValueOf(keys, "runtime")) {
    if (auto s = Dotted(*v, "runtime", "opslot")) spec.runtime = *s;
  }
  if (const RawNode* v = ValueOf(keys, "extends")) {
    if (auto s = String(*v, "extends")) out.extends = LocatedName{*s, Loc(*v)};
    has_extends_ = true;
  }
}

void FileLoader::LoadVersion(const RawNode& v, OneSpec& out) {
  out.has_version = true;
  if (v.kind != Kind::kScalar || v.style != RawNode::Style::kPlain) {
    Error(v, std::string("expected an integer, found ") + DescribeKind(v), "write `version: 1`");
  } else if (v.scalar != "1") {
    Error(v, "unsupported spec version '" + v.scalar + "'", "this patchgen reads `version: 1`");
  }
}

void FileLoader::LoadOutput(const RawNode& v, OneSpec& out) {
  out.has_output = true;
  auto s = String(v, "output");
  if (!s) return;
  if (s->size() < 4 || s->substr(s->size() - 3) != ".py" || s->find('/') != std::string::npos ||
      s->find('\\') != std::string::npos) {
    Error(v, "'output' must be a file name ending in '.py'",
          "the folder comes from the spec's place under the specs root (or `-o`)");
    return;
  }
  out.spec.output = *s;
  out.spec.output_loc = Loc(v);
}

// The lists and mappings: name_map, imports, slots, patches, helpers, blocks, exclude, remove.
void FileLoader::LoadEntries(const KeyMap& keys, OneSpec& out) {
  PatchSpec& spec = out.spec;
  size_t before = diags_.size();
  if (const RawNode* v = ValueOf(keys, "name_map")) spec.name_map = NameMap(*v);
  out.fatal_errors += diags_.size() - before;
  if (const RawNode* v = ValueOf(keys, "imports")) LoadImports(*v, spec);
  if (const RawNode* v = ValueOf(keys, "slots")) LoadSlots(*v, spec);
  if (const RawNode* v = ValueOf(keys, "patches")) LoadPatches(*v, spec);
  if (const RawNode* v = ValueOf(keys, "helpers")) LoadHelpers(*v, spec);
  if (const RawNode* v = ValueOf(keys, "blocks")) spec.blocks = Blocks(*v, "blocks");
  if (const RawNode* v = ValueOf(keys, "exclude")) spec.excludes = Names(*v, "exclude", false);
  if (const RawNode* v = ValueOf(keys, "remove")) {
    before = diags_.size();
    out.removes = Names(*v, "remove", true);
    if (!out.extends) {
      Error(*KeyNodeOf(keys, "remove"), "'remove' needs 'extends'",
            "'remove' drops entries inherited from the spec named by `extends`");
    }
    out.fatal_errors += diags_.size() - before;
  }
}

void FileLoader::LoadImports(const RawNode& v, PatchSpec& spec) {
  if (!Mapping(v, "imports")) return;
  KeyMap ik = Keys(v, KeyLevel::kImports);
  if (const RawNode* add = ValueOf(ik, "add")) spec.import_adds = Blocks(*add, "add");
  if (const RawNode* drop = ValueOf(ik, "drop")) spec.import_drops = Names(*drop, "drop", true);
}

std::optional<std::string> FileLoader::EnumValue(const RawNode& n, std::string_view what,
                                                 const std::vector<std::string>& values) {
  auto s = String(n, what);
  if (!s) return s;
  if (std::find(values.begin(), values.end(), *s) != values.end()) return s;
  std::string help = WithDidYouMean(*s, values, "valid values: " + JoinNames(values, 100));
  Error(n, "invalid value '" + *s + "' for '" + std::string(what) + "'", help);
  return std::nullopt;
}

bool FileLoader::RequireKeys(const RawNode& entry, const KeyMap& keys, KeyLevel level) {
  bool ok = true;
  for (const std::string& k : RequiredKeys(level)) {
    if (!keys.count(k)) {
      Error(entry.entries.empty() ? entry : entry.entries.front().first,
            std::string("missing key '") + k + "' in " + Article(level),
            std::string("a ") + KeyLevelName(level) +
                " needs: " + JoinNames(RequiredKeys(level), 100));
      ok = false;
    }
  }
  return ok;
}

// A helper's name: `name:`, else the `symbol` of its file, else the first def/class of its
// code (extends replaces and removes helpers by name). Nullopt when none (reported).
std::optional<std::string> FileLoader::HelperName(const KeyMap& keys, const Body& body) {
  if (const RawNode* name_node = ValueOf(keys, "name")) return Identifier(*name_node, "name");
  if (body.source == Body::Source::kFile) return body.symbol;
  if (auto derived = FirstDefName(body.text)) return derived;
  Error(*KeyNodeOf(keys, "code"),
        "cannot tell the helper's name: its code has no top-level def or class",
        "add `name:` so that specs extending this one can replace or remove it");
  return std::nullopt;
}

void FileLoader::LoadHelpers(const RawNode& n, PatchSpec& spec) {
  const auto* items = Sequence(n, "helpers");
  if (!items) return;
  std::map<std::string, SourceLoc> names;
  for (const RawNode& item : *items) {
    if (!Mapping(item, "helpers")) continue;
    auto keys = Keys(item, KeyLevel::kHelper);
    Helper h;
    h.loc = Loc(item.entries.empty() ? item : item.entries.front().first);
    if (auto it = keys.find("after"); it != keys.end()) {
      auto after = Identifier(*it->second.second, "after");
      if (!after) continue;
      h.after = *after;
      h.after_loc = Loc(*it->second.second);
    }
    if (!LoadCondition(keys, h.when)) continue;
    size_t before = diags_.size();
    h.body = BodyOf(item, keys, false, "a helper");
    if (h.body.source == Body::Source::kNone || diags_.size() != before) continue;
    const RawNode* name_node = ValueOf(keys, "name");
    std::optional<std::string> name = HelperName(keys, h.body);
    if (!name) continue;
    h.name = *name;
    auto [it, inserted] = names.emplace(h.name, h.loc);
    if (!inserted) {
      Diagnostic d =
          ErrorAt(name_node ? Loc(*name_node) : h.body.loc, "duplicate helper '" + h.name + "'");
      d.notes.push_back(Note::At(it->second, "first defined here"));
      diags_.push_back(std::move(d));
      continue;
    }
    spec.helpers.push_back(std::move(h));
  }
}

}  // namespace patchgen::spec
