// name_map renaming with use tracking (name_map.h).
#include "rewriter/name_map.h"

#include "base/text_util.h"
#include "base/unicode_nfkc.h"
#include "spec/python_names.h"

namespace patchgen::rewriter {

NameMap::NameMap(const std::vector<spec::NameMapEntry>& entries) {
  for (const spec::NameMapEntry& e : entries) uses_.push_back({&e, false, {}});
}

namespace {

/// The prefix of the UsedKeys() element that records a rename of `e` into a keyword.
std::string KeywordMark(const spec::NameMapEntry& e) { return "\x01keyword " + e.Key() + "\x01"; }

}  // namespace

std::optional<std::string> NameMap::Map(std::string_view name) {
  // As Python compares names (the entries are NFKC already): `ｆｏｏ` is mapped like `foo`.
  std::string key;
  name = IdentifierKeyView(name, key);
  for (Use& u : uses_) {
    if (!u.entry->prefix && u.entry->from == name) {
      u.used = true;
      return u.entry->to;
    }
  }
  Use* best = nullptr;
  for (Use& u : uses_) {
    if (!u.entry->prefix || !name.starts_with(u.entry->from)) continue;
    // `Qwen3_5*: Qwen3_5Moe*` leaves Qwen3_5MoeMLP alone: it is a name of the new family.
    if (u.entry->to.starts_with(u.entry->from) && name.starts_with(u.entry->to)) continue;
    if (!best || u.entry->from.size() > best->entry->from.size()) best = &u;
  }
  if (!best) return std::nullopt;
  best->used = true;
  std::string to = best->entry->to + std::string(name.substr(best->entry->from.size()));
  if (spec::IsPythonKeyword(to)) {  // never rename into a keyword: an error (ReportUnused)
    if (best->keyword_from.empty()) best->keyword_from = std::string(name);
    return std::nullopt;
  }
  return to;
}

std::string NameMap::MapDotted(const std::string& dotted) {
  std::string out;
  for (size_t pos = 0; pos <= dotted.size();) {
    size_t dot = std::min(dotted.find('.', pos), dotted.size());
    std::string part = dotted.substr(pos, dot - pos);
    if (std::optional<std::string> to = Map(part)) part = *to;
    out += (pos == 0 ? "" : ".") + part;
    pos = dot + 1;
  }
  return out;
}

std::set<std::string> NameMap::UsedKeys() const {
  std::set<std::string> out;
  for (const Use& u : uses_) {
    if (u.used) out.insert(u.entry->Key());
    // A rename into a keyword travels with the keys to the stage that reports (ReportUnused).
    if (!u.keyword_from.empty()) out.insert(KeywordMark(*u.entry) + u.keyword_from);
  }
  return out;
}

void NameMap::ReportUnused(const std::set<std::string>& used_elsewhere,
                           std::vector<Diagnostic>& errors) const {
  for (const Use& u : uses_) {
    std::string keyword_from = u.keyword_from;
    auto mark = used_elsewhere.lower_bound(KeywordMark(*u.entry));
    if (keyword_from.empty() && mark != used_elsewhere.end() &&
        mark->starts_with(KeywordMark(*u.entry))) {
      keyword_from = mark->substr(KeywordMark(*u.entry).size());
    }
    if (!keyword_from.empty()) {
      const spec::NameMapEntry& e = *u.entry;
      std::string to = e.to + keyword_from.substr(e.from.size());
      errors.push_back(
          ErrorAt(e.loc,
                  "name_map rule '" + e.Key() + "' renames '" + keyword_from +
                      "' to the Python keyword '" + to + "'",
                  "a keyword cannot be a name; map '" + keyword_from +
                      "' to a name of its own with a whole-name key, which wins over the rule"));
    }
    if (u.used || used_elsewhere.count(u.entry->Key())) continue;
    const spec::NameMapEntry& e = *u.entry;
    if (e.prefix) {
      errors.push_back(ErrorAt(
          e.loc, "name_map rule '" + e.Key() + "' is never used",
          "name_map renames identifiers in patch bodies, helpers, blocks and guard targets; "
          "none of them starts with '" +
              e.from + "'" +
              (e.to.starts_with(e.from)
                   ? " (identifiers that already start with '" + e.to + "' are left alone)"
                   : std::string())));
      continue;
    }
    errors.push_back(ErrorAt(e.loc, "name_map key '" + e.from + "' is never used",
                             "name_map renames identifiers in patch bodies, helpers, blocks and "
                             "guard targets; no identifier '" +
                                 e.from + "' appears in them"));
  }
}

}  // namespace patchgen::rewriter
