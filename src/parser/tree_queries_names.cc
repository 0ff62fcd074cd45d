// Tree queries about names and scopes (tree_queries.h): the references to a bare name, the
// identifiers of a region, attribute references, the nodes of a def's own scope, and
// PyModule::Rebindings (py_module.h), the statements after a definition that rebind its name in
// its own scope, so that a patch of the definition would patch an object nothing reaches.
#include <string>
#include <string_view>
#include <vector>

#include "base/unicode_nfkc.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"

namespace patchgen::parser {
namespace {

/// True when the code text `text` (an identifier, an attribute, an import's name) is `name` for
/// Python: names are compared in NFKC.
bool SameName(std::string_view text, std::string_view name) { return SameIdentifier(text, name); }

/// True when assignment target `t` (an identifier, a pattern, or an attribute) binds `name`; an
/// attribute target binds only when its text is `name` (`Cls.m`).
bool TargetBinds(TSNode t, std::string_view code, std::string_view name) {
  if (ts_node_is_null(t)) return false;
  if (Is(t, "identifier") || Is(t, "attribute")) return SameName(RangeOf(t).In(code), name);
  if (Is(t, "pattern_list") || Is(t, "tuple_pattern") || Is(t, "list_pattern") ||
      Is(t, "list_splat_pattern") || Is(t, "parenthesized_expression") ||
      Is(t, "expression_list")) {
    for (uint32_t i = 0; i < ts_node_named_child_count(t); ++i) {
      if (TargetBinds(ts_node_named_child(t, i), code, name)) return true;
    }
  }
  return false;
}

/// `a = b = value`, `a: T = value`, `a += value`: true when a target binds `name` and no value
/// refers to `bare` (the definition's own name, which keeps it reachable: `f = wrap(f)`).
bool AssignmentRebinds(TSNode a, std::string_view code, std::string_view name,
                       std::string_view bare) {
  bool binds = false;
  for (TSNode n = a; !ts_node_is_null(n) && (Is(n, "assignment") || Is(n, "augmented_assignment"));
       n = Field(n, "right")) {
    binds = binds || TargetBinds(Field(n, "left"), code, name);
    TSNode right = Field(n, "right");
    if (ts_node_is_null(right) || Is(right, "assignment")) continue;
    // `Cls.m = wrap(Cls.m)` refers to the method through the attribute.
    std::string key;
    if (!NameReferences(right, code, bare).empty() ||
        (name != bare &&
         IdentifierKeyView(RangeOf(right).In(code), key).find(name) != std::string_view::npos)) {
      return false;
    }
  }
  return binds;
}

/// `import a.b` binds `a`; `import a as b` and `from m import a as b` bind `b`.
bool ImportBinds(TSNode stmt, std::string_view code, std::string_view name) {
  bool from = Is(stmt, "import_from_statement");
  TSNode module = Field(stmt, "module_name");
  for (uint32_t i = 0; i < ts_node_named_child_count(stmt); ++i) {
    TSNode c = ts_node_named_child(stmt, i);
    if (from && ts_node_eq(c, module)) continue;
    std::string_view bound;
    if (Is(c, "aliased_import")) {
      bound = RangeOf(Field(c, "alias")).In(code);
    } else if (Is(c, "dotted_name")) {
      bound = RangeOf(c).In(code);
      if (!from) bound = bound.substr(0, bound.find('.'));
    }
    if (!bound.empty() && SameName(bound, name)) return true;
  }
  return false;
}

bool StatementRebinds(TSNode stmt, std::string_view code, std::string_view name,
                      std::string_view bare) {
  if (Is(stmt, "import_statement") || Is(stmt, "import_from_statement"))
    return name == bare && ImportBinds(stmt, code, name);
  if (Is(stmt, "delete_statement")) {
    for (uint32_t i = 0; i < ts_node_named_child_count(stmt); ++i) {
      if (TargetBinds(ts_node_named_child(stmt, i), code, name)) return true;
    }
    return false;
  }
  if (!Is(stmt, "expression_statement") || ts_node_named_child_count(stmt) != 1) return false;
  return AssignmentRebinds(ts_node_named_child(stmt, 0), code, name, bare);
}

void CollectOwnScope(TSNode node, const std::vector<std::string_view>& types,
                     std::vector<TSNode>& out) {
  for (uint32_t i = 0; i < ts_node_named_child_count(node); ++i) {
    TSNode c = ts_node_named_child(node, i);
    std::string_view t = TypeOf(c);
    if (t == "function_definition" || t == "class_definition" || t == "lambda") continue;
    for (std::string_view want : types) {
      if (t == want) out.push_back(c);
    }
    CollectOwnScope(c, types, out);
  }
}

void CollectAttributes(TSNode node, std::string_view code, std::string_view text,
                       std::vector<ByteRange>& out) {
  for (uint32_t i = 0; i < ts_node_named_child_count(node); ++i) {
    TSNode c = ts_node_named_child(node, i);
    if (Is(c, "attribute") && SameName(RangeOf(c).In(code), text)) out.push_back(RangeOf(c));
    CollectAttributes(c, code, text, out);
  }
}

void CollectNameReferences(TSNode node, std::string_view code, std::string_view name,
                           std::vector<ByteRange>& out) {
  uint32_t n = ts_node_child_count(node);
  for (uint32_t i = 0; i < n; ++i) {
    TSNode c = ts_node_child(node, i);
    ByteRange r = RangeOf(c);
    if (TypeOf(c) == "identifier" && SameIdentifier(r.In(code), name)) {
      bool attribute = TypeOf(node) == "attribute" && ts_node_eq(c, Field(node, "attribute"));
      bool keyword = TypeOf(node) == "keyword_argument" && ts_node_eq(c, Field(node, "name"));
      if (!attribute && !keyword) out.push_back(r);
    }
    CollectNameReferences(c, code, name, out);
  }
}

void CollectIdentifiers(TSNode node, ByteRange region, std::vector<ByteRange>& out) {
  ByteRange r = RangeOf(node);
  if (r.end <= region.start || r.start >= region.end) return;
  if (Is(node, "identifier")) {
    out.push_back(r);
    return;
  }
  uint32_t count = ts_node_named_child_count(node);
  for (uint32_t i = 0; i < count; ++i)
    CollectIdentifiers(ts_node_named_child(node, i), region, out);
}

}  // namespace

std::vector<ByteRange> NameReferences(TSNode node, std::string_view code, std::string_view name) {
  std::vector<ByteRange> out;
  if (!ts_node_is_null(node)) CollectNameReferences(node, code, name, out);
  return out;
}

std::vector<ByteRange> IdentifiersIn(TSNode node, ByteRange region) {
  std::vector<ByteRange> out;
  if (!ts_node_is_null(node)) CollectIdentifiers(node, region, out);
  return out;
}

std::vector<ByteRange> AttributeReferences(TSNode node, std::string_view code,
                                           std::string_view text) {
  std::vector<ByteRange> out;
  if (!ts_node_is_null(node)) CollectAttributes(node, code, text, out);
  return out;
}

std::vector<TSNode> OwnScopeNodes(TSNode block, const std::vector<std::string_view>& types) {
  std::vector<TSNode> out;
  if (!ts_node_is_null(block)) CollectOwnScope(block, types, out);
  return out;
}

std::vector<ByteRange> PyModule::Rebindings(const Definition& def) const {
  std::vector<ByteRange> out;
  TSNode scope = def.parent < 0 ? root() : BodyBlock(*this, definitions_[def.parent]);
  bool method_of_top_class = def.parent >= 0 && definitions_[def.parent].parent < 0 &&
                             definitions_[def.parent].kind == Definition::Kind::kClass;
  for (TSNode stmt : BlockStatements(scope)) {
    if (ts_node_start_byte(stmt) < def.definition.end) continue;
    if (StatementRebinds(stmt, source_, def.name, def.name)) out.push_back(RangeOf(stmt));
  }
  if (!method_of_top_class) return out;
  const Definition& cls = definitions_[def.parent];
  for (TSNode stmt : BlockStatements(root())) {
    if (ts_node_start_byte(stmt) < cls.definition.end) continue;
    if (StatementRebinds(stmt, source_, def.qualname, def.name)) out.push_back(RangeOf(stmt));
  }
  return out;
}

}  // namespace patchgen::parser
