// PyModule: parses one Python file with tree-sitter-python, refuses files that do not parse, and
// answers lookups over the index that the Indexer (py_indexer.cc) builds.
#include "parser/py_module.h"

#include <cctype>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "base/unicode_nfkc.h"
#include "parser/py_indexer.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"

namespace patchgen::parser {

extern "C" const TSLanguage* tree_sitter_python(void);

const char* KindName(TopLevelStatement::Kind kind) {
  switch (kind) {
    case TopLevelStatement::Kind::kImport:
      return "import";
    case TopLevelStatement::Kind::kClass:
      return "class";
    case TopLevelStatement::Kind::kFunction:
      return "function";
    case TopLevelStatement::Kind::kAssignment:
      return "assignment";
    case TopLevelStatement::Kind::kOther:
      return "other";
  }
  return "other";
}

const TSLanguage* PythonLanguage() { return tree_sitter_python(); }

TreePtr ParseTree(std::string_view source) {
  TSParser* parser = ts_parser_new();
  ts_parser_set_language(parser, PythonLanguage());
  TreePtr tree(
      ts_parser_parse_string(parser, nullptr, source.data(), static_cast<uint32_t>(source.size())));
  ts_parser_delete(parser);
  return tree;
}

Result<std::unique_ptr<PyModule>> PyModule::Parse(std::string path, std::string source) {
  std::unique_ptr<PyModule> m(new PyModule());
  m->path_ = std::move(path);
  m->source_ = std::move(source);
  m->lines_ = LineIndex(m->source_);  // After source_ is final: LineIndex views it.
  m->tree_ = ParseTree(m->source_);
  if (!m->tree_) {
    Diagnostic d;
    d.kind = ErrorKind::kInternal;
    d.loc.path = m->path_;
    d.message = "tree-sitter returned no tree";
    return d;
  }
  if (auto deep = NestedTooDeep(m->root())) {
    return MakeDiagnostic(
        m->path_, m->source_, m->lines_, RangeOf(*deep),
        "cannot parse Python: nesting deeper than " + std::to_string(kMaxNesting) + " levels",
        "patchgen refuses code nested this deep, as CPython does; check the "
        "file with `python3 -m py_compile " +
            m->path_ + "`",
        ErrorKind::kUpstream);
  }
  if (auto err = FirstErrorNode(m->root())) {
    std::string message = "cannot parse Python: ";
    if (ts_node_is_missing(*err)) {
      message += "missing ";
      // Named tokens read as words ("missing identifier"), punctuation is quoted ("missing ')'").
      message += ts_node_is_named(*err) ? std::string(ts_node_type(*err))
                                        : "'" + std::string(ts_node_type(*err)) + "'";
    } else {
      message += "syntax error";
    }
    ByteRange r = RangeOf(*err);
    // An ERROR node can span many lines; the caret covers its part on the first line.
    return MakeDiagnostic(m->path_, m->source_, m->lines_, r, std::move(message),
                          "patchgen indexes only valid Python; check the file with "
                          "`python3 -m py_compile " +
                              m->path_ + "`",
                          ErrorKind::kUpstream);
  }
  if (auto bad = FirstCompileError(m->root(), m->source_)) {
    return MakeDiagnostic(m->path_, m->source_, m->lines_, RangeOf(bad->first),
                          "cannot parse Python: " + bad->second,
                          "patchgen indexes only valid Python; check the file with "
                          "`python3 -m py_compile " +
                              m->path_ + "`",
                          ErrorKind::kUpstream);
  }
  IndexModule(*m);
  return m;
}

TSNode PyModule::root() const { return ts_tree_root_node(tree_.get()); }

// Names are looked up as Python compares them (the index holds NFKC names): a non-ASCII name is
// normalised once, an ASCII one is compared as is.
const Definition* PyModule::FindTopLevel(std::string_view name) const {
  std::string key;
  name = IdentifierKeyView(name, key);
  for (const TopLevelStatement& s : top_level_) {
    if (s.definition >= 0 && definitions_[s.definition].name == name)
      return &OverloadImplementation(definitions_[s.definition]);
  }
  return nullptr;
}

const Definition* PyModule::Find(std::string_view qualname) const {
  std::string key;
  qualname = IdentifierKeyView(qualname, key);
  for (const Definition& d : definitions_) {
    if (d.qualname == qualname) return &OverloadImplementation(d);
  }
  return nullptr;
}

bool PyModule::IsOverloadStub(const Definition& def) const {
  if (def.kind != Definition::Kind::kFunction || def.decorators.empty()) return false;
  // As Python reads the decorators' names: `@ｏverload` is `@overload`.
  std::string key;
  std::string_view text = IdentifierKeyView(Text(def.decorators), key);
  for (size_t at = text.find('@'); at != std::string_view::npos; at = text.find('@', at + 1)) {
    size_t end = at + 1;
    while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) ||
                                 static_cast<unsigned char>(text[end]) >= 0x80 ||
                                 text[end] == '_' || text[end] == '.')) {
      ++end;
    }
    std::string_view name = text.substr(at + 1, end - at - 1);
    if (name == "overload" || (name.size() > 9 && name.ends_with(".overload"))) return true;
  }
  return false;
}

const Definition& PyModule::OverloadImplementation(const Definition& def) const {
  if (!IsOverloadStub(def)) return def;
  const Definition* impl = &def;
  for (const Definition& d : definitions_) {
    if (d.definition.start > def.definition.start && d.parent == def.parent &&
        d.qualname == def.qualname) {
      impl = IsOverloadStub(d) ? impl : &d;
    }
  }
  return *impl;
}

std::vector<const Definition*> PyModule::Redefinitions(const Definition& def) const {
  // A definition that does not rebind the name as a plain new object: property accessors keep the
  // property (`@x.setter def x`), typing.overload stubs are replaced by the implementation.
  auto exempt = [&](const Definition& d) {
    std::string key;  // names as d.name is held
    std::string_view decorators = IdentifierKeyView(Text(d.decorators), key);
    for (std::string_view accessor : {".setter", ".getter", ".deleter"}) {
      if (decorators.find("@" + d.name + std::string(accessor)) != std::string_view::npos)
        return true;
    }
    return IsOverloadStub(d);
  };
  std::vector<const Definition*> out;
  if (!def.direct || exempt(def)) return out;
  for (const Definition& d : definitions_) {
    if (&d == &def || !d.direct || d.parent != def.parent || d.qualname != def.qualname ||
        exempt(d)) {
      continue;
    }
    out.push_back(&d);
  }
  return out;
}

std::vector<std::string> PyModule::ChildNames(const Definition& def, Definition::Kind kind) const {
  std::vector<std::string> out;
  for (int c : def.children) {
    if (definitions_[c].kind == kind) out.push_back(definitions_[c].name);
  }
  return out;
}

std::vector<std::string> PyModule::TopLevelNames(std::optional<Definition::Kind> kind) const {
  std::vector<std::string> out;
  for (const TopLevelStatement& s : top_level_) {
    if (s.definition < 0) continue;
    const Definition& d = definitions_[s.definition];
    if (!kind || d.kind == *kind) out.push_back(d.name);
  }
  return out;
}

}  // namespace patchgen::parser
