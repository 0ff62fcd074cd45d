// Text and JSON renderings of a PyModule's index (see index_printer.h).
#include "parser/index_printer.h"

#include <nlohmann/json.hpp>

namespace patchgen::parser {
namespace {

using Json = nlohmann::ordered_json;

std::string Pos(const PyModule& m, uint32_t offset) {
  LineCol lc = m.lines().At(offset);
  return std::to_string(lc.line) + ":" + std::to_string(lc.col);
}

/// `L:C-L:C`, end exclusive.
std::string Span(const PyModule& m, ByteRange r) { return Pos(m, r.start) + "-" + Pos(m, r.end); }

const char* ImportKindName(Import::Kind k) {
  switch (k) {
    case Import::Kind::kImport:
      return "import";
    case Import::Kind::kFrom:
      return "from";
    case Import::Kind::kFuture:
      return "future";
  }
  return "import";
}

const char* DefKindName(Definition::Kind k) {
  return k == Definition::Kind::kClass ? "class" : "def";
}

std::string NameList(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string ImportedNames(const Import& imp) {
  std::string out;
  if (imp.wildcard) out = "*";
  for (const ImportedName& n : imp.names) {
    if (!out.empty()) out += ", ";
    out += n.name;
    if (!n.alias.empty()) out += " as " + n.alias;
  }
  return out;
}

void DefinitionText(const PyModule& m, int idx, int level, std::string& out) {
  const Definition& d = m.definitions()[idx];
  out += std::string(2 + 2 * level, ' ');
  out += std::string(d.is_async ? "async " : "") + DefKindName(d.kind) + " " + d.qualname + " " +
         Span(m, d.definition);
  if (!d.comments.empty()) out += " comments=" + Span(m, d.comments);
  if (!d.decorators.empty()) out += " decorators=" + Span(m, d.decorators);
  out += " header=" + Span(m, d.header) + " body=" + Span(m, d.body);
  if (d.docstring) out += " docstring=" + Span(m, *d.docstring);
  out += " indent=" + std::to_string(d.indent) + " body_indent=" + std::to_string(d.body_indent);
  if (d.inline_body) out += " inline";
  if (d.empty_body) out += " empty";
  out += '\n';
  for (int c : d.children) DefinitionText(m, c, level + 1, out);
}

Json RangeJson(const PyModule& m, ByteRange r) {
  Json j;
  j["bytes"] = {r.start, r.end};
  j["from"] = Pos(m, r.start);
  j["to"] = Pos(m, r.end);
  return j;
}

Json OptRangeJson(const PyModule& m, ByteRange r) { return r.empty() ? Json() : RangeJson(m, r); }

}  // namespace

std::string FormatIndexText(const PyModule& m) {
  std::string out = m.path() + ": " + std::to_string(m.source().size()) + " bytes, " +
                    std::to_string(m.imports().size()) + " imports, " +
                    std::to_string(m.top_level().size()) + " top-level statements, " +
                    std::to_string(m.definitions().size()) + " definitions\n";
  out += "imports:\n";
  for (const Import& imp : m.imports()) {
    out += "  " + Span(m, imp.stmt) + " " + ImportKindName(imp.kind);
    if (imp.kind != Import::Kind::kImport) {
      out += " " + std::string(m.Text(imp.module));
      if (imp.relative_level > 0) out += " level=" + std::to_string(imp.relative_level);
    }
    out += " names=[" + ImportedNames(imp) + "]";
    if (imp.parenthesized) out += " parenthesized";
    out += " depth=" + std::to_string(imp.depth);
    if (!imp.scope.empty()) out += " scope=" + imp.scope;
    out += '\n';
  }
  out += "top-level:\n";
  for (const TopLevelStatement& s : m.top_level()) {
    out += "  " + Span(m, s.range) + " " + KindName(s.kind);
    if (s.decorated) out += " decorated";
    if (!s.names.empty()) out += " " + NameList(s.names);
    out += '\n';
  }
  out += "definitions:\n";
  for (size_t i = 0; i < m.definitions().size(); ++i) {
    if (m.definitions()[i].parent == -1) DefinitionText(m, static_cast<int>(i), 0, out);
  }
  return out;
}

std::string FormatIndexJson(const PyModule& m) {
  Json j;
  j["path"] = m.path();
  j["bytes"] = m.source().size();
  Json imports = Json::array();
  for (const Import& imp : m.imports()) {
    Json i;
    i["kind"] = ImportKindName(imp.kind);
    i["range"] = RangeJson(m, imp.stmt);
    i["module"] = imp.kind == Import::Kind::kImport ? Json() : RangeJson(m, imp.module);
    i["module_name"] = imp.module_name;
    i["relative_level"] = imp.relative_level;
    Json names = Json::array();
    for (const ImportedName& n : imp.names) {
      Json nj;
      nj["name"] = n.name;
      nj["alias"] = n.alias.empty() ? Json() : Json(n.alias);
      nj["range"] = RangeJson(m, n.range);
      names.push_back(std::move(nj));
    }
    i["names"] = std::move(names);
    i["wildcard"] = imp.wildcard;
    i["parenthesized"] = imp.parenthesized;
    i["depth"] = imp.depth;
    i["scope"] = imp.scope;
    imports.push_back(std::move(i));
  }
  j["imports"] = std::move(imports);
  Json top = Json::array();
  for (const TopLevelStatement& s : m.top_level()) {
    Json t;
    t["kind"] = KindName(s.kind);
    t["decorated"] = s.decorated;
    t["range"] = RangeJson(m, s.range);
    t["names"] = s.names;
    t["definition"] = s.definition >= 0 ? Json(s.definition) : Json();
    top.push_back(std::move(t));
  }
  j["top_level"] = std::move(top);
  Json defs = Json::array();
  for (const Definition& d : m.definitions()) {
    Json dj;
    dj["kind"] = DefKindName(d.kind);
    dj["name"] = d.name;
    dj["qualname"] = d.qualname;
    dj["async"] = d.is_async;
    dj["line"] = d.line;
    dj["whole"] = RangeJson(m, d.whole);
    dj["definition"] = RangeJson(m, d.definition);
    dj["comments"] = OptRangeJson(m, d.comments);
    dj["decorators"] = OptRangeJson(m, d.decorators);
    dj["header"] = RangeJson(m, d.header);
    dj["name_range"] = RangeJson(m, d.name_range);
    dj["parameters"] = OptRangeJson(m, d.parameters);
    dj["body"] = RangeJson(m, d.body);
    dj["docstring"] = d.docstring ? RangeJson(m, *d.docstring) : Json();
    dj["indent"] = d.indent;
    dj["body_indent"] = d.body_indent;
    dj["inline_body"] = d.inline_body;
    dj["empty_body"] = d.empty_body;
    dj["parent"] = d.parent >= 0 ? Json(d.parent) : Json();
    dj["children"] = d.children;
    defs.push_back(std::move(dj));
  }
  j["definitions"] = std::move(defs);
  // Valid UTF-8 whatever the source holds: a byte that is not UTF-8 prints as U+FFFD.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace patchgen::parser
