#include "rewriter/name_resolution.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <cctype>
#include <vector>

#include "base/unicode_nfkc.h"
#include "parser/ts_node.h"
#include "rewriter/name_resolution_types.h"

namespace patchgen::rewriter {
namespace {

using name_types::Is;
using name_types::Type;
using name_types::TypeOfNode;
using parser::Field;

/// A set of names, looked up only (never iterated for output).
using Names = absl::flat_hash_set<std::string>;

bool Same(TSNode a, TSNode b) { return ts_node_eq(a, b); }

bool IsFieldOf(TSNode child, TSNode parent, const char* field) {
  TSNode f = Field(parent, field);
  return !ts_node_is_null(f) && Same(f, child);
}

std::string_view TextOf(TSNode n, std::string_view source) {
  return source.substr(ts_node_start_byte(n), ts_node_end_byte(n) - ts_node_start_byte(n));
}

/// The name an identifier (or an import's dotted name) binds or reads, as Python compares it:
/// NFKC when it is not ASCII (PEP 3131), so `ﬁnd` and `find` are one name.
std::string NameOf(TSNode n, std::string_view source) { return IdentifierKey(TextOf(n, source)); }

bool Inside(TSNode inner, TSNode outer) {
  return !ts_node_is_null(outer) && ts_node_start_byte(outer) <= ts_node_start_byte(inner) &&
         ts_node_end_byte(inner) <= ts_node_end_byte(outer);
}

bool IsComprehension(TSNode n) {
  return Is(n, Type::kListComprehension) || Is(n, Type::kSetComprehension) ||
         Is(n, Type::kDictionaryComprehension) || Is(n, Type::kGeneratorExpression);
}

bool IsPatternContainer(TSNode n) {
  return Is(n, Type::kPatternList) || Is(n, Type::kTuplePattern) || Is(n, Type::kListPattern) ||
         Is(n, Type::kListSplatPattern) || Is(n, Type::kDictionarySplatPattern);
}

enum class Role { kUse, kBinding, kOther };

/// The visible ancestors of a node, the root (or where a walk started) first and its parent last:
/// the path a walk down the tree took. tree-sitter 0.20's ts_node_parent searches down from the
/// root on every call, and ts_node_named_child(i) walks the first i children, so the walks below
/// keep the path themselves and use one cursor each.
using Path = std::vector<TSNode>;

/// The parent of `node`, the `k`-th entry of `path` from the end being its parent (k counts down
/// as the caller climbs); past the path's start, tree-sitter's own parent.
TSNode Up(const Path& path, size_t& k, TSNode node) {
  if (k > 0) return path[--k];
  return ts_node_parent(node);
}

/// Depth-first over the named nodes below `root` in document order, with one cursor: `visit(n,
/// path)` (path: root .. parent of n) returns whether to go into n's children. Unnamed nodes are
/// tokens and are skipped.
template <class Visit>
void WalkNamed(TSNode root, Path& path, Visit visit) {
  const size_t base = path.size();
  TSTreeCursor c = ts_tree_cursor_new(root);
  path.push_back(root);
  bool more = ts_tree_cursor_goto_first_child(&c);
  while (more) {
    TSNode n = ts_tree_cursor_current_node(&c);
    if (ts_node_is_named(n) && visit(n, path) && ts_tree_cursor_goto_first_child(&c)) {
      path.push_back(n);
      continue;
    }
    while (!(more = ts_tree_cursor_goto_next_sibling(&c)) && path.size() > base + 1) {
      ts_tree_cursor_goto_parent(&c);
      path.pop_back();
    }
  }
  path.resize(base);
  ts_tree_cursor_delete(&c);
}

/// The role of an identifier decided by its parent's type alone: `in_field` when the identifier
/// is the parent's `field` (or always, without a field), `otherwise` else.
struct ParentRule {
  Type parent;
  const char* field;  ///< nullptr: `in_field` whatever the field.
  Role in_field;
  Role otherwise;
};

constexpr ParentRule kParentRules[] = {
    {Type::kAttribute, "attribute", Role::kOther, Role::kUse},
    {Type::kKeywordArgument, "name", Role::kOther, Role::kUse},
    {Type::kDottedName, nullptr, Role::kOther, Role::kOther},
    {Type::kAliasedImport, nullptr, Role::kOther, Role::kOther},
    {Type::kImportStatement, nullptr, Role::kOther, Role::kOther},
    {Type::kImportFromStatement, nullptr, Role::kOther, Role::kOther},
    {Type::kRelativeImport, nullptr, Role::kOther, Role::kOther},
    {Type::kGlobalStatement, nullptr, Role::kOther, Role::kOther},
    {Type::kNonlocalStatement, nullptr, Role::kOther, Role::kOther},
    {Type::kFutureImportStatement, nullptr, Role::kOther, Role::kOther},
    {Type::kFunctionDefinition, "name", Role::kBinding, Role::kUse},
    {Type::kClassDefinition, "name", Role::kBinding, Role::kUse},
    {Type::kParameters, nullptr, Role::kBinding, Role::kBinding},
    {Type::kLambdaParameters, nullptr, Role::kBinding, Role::kBinding},
    {Type::kDefaultParameter, "name", Role::kBinding, Role::kUse},
    {Type::kTypedDefaultParameter, "name", Role::kBinding, Role::kUse},
    {Type::kTypedParameter, "type", Role::kUse, Role::kBinding},
    {Type::kNamedExpression, "name", Role::kBinding, Role::kUse},
    {Type::kAsPatternTarget, nullptr, Role::kBinding, Role::kBinding},
    {Type::kExceptClause, "alias", Role::kBinding, Role::kUse},
};

/// What an identifier node does: read a name, bind one, or neither (attribute names, keyword
/// names, import paths, global/nonlocal lists). `path`: its ancestors as far as known (Path).
Role RoleOf(TSNode id, const Path& path) {
  size_t k = path.size();
  TSNode p = Up(path, k, id);
  if (ts_node_is_null(p)) return Role::kUse;
  const Type parent = TypeOfNode(p);
  for (const ParentRule& r : kParentRules) {
    if (parent != r.parent) continue;
    return !r.field || IsFieldOf(id, p, r.field) ? r.in_field : r.otherwise;
  }
  // Assignment-like targets, possibly nested in tuple/list patterns.
  TSNode child = id;
  while (IsPatternContainer(p)) {
    child = p;
    p = Up(path, k, p);
    if (ts_node_is_null(p)) return Role::kUse;
  }
  if ((Is(p, Type::kAssignment) || Is(p, Type::kAugmentedAssignment) ||
       Is(p, Type::kForStatement) || Is(p, Type::kForInClause)) &&
      IsFieldOf(child, p, "left")) {
    return Role::kBinding;
  }
  // Parameters written as patterns: `*args`, `**kwargs` (possibly typed).
  if (!Same(child, id) && (Is(p, Type::kParameters) || Is(p, Type::kLambdaParameters) ||
                           Is(p, Type::kTypedParameter))) {
    return Role::kBinding;
  }
  return Role::kUse;
}

/// Names bound by an import statement: aliases, or the first component of `import a.b`.
void ImportBindings(TSNode stmt, std::string_view source, Names& out, bool& wildcard) {
  bool from = Is(stmt, Type::kImportFromStatement);
  uint32_t n = ts_node_named_child_count(stmt);
  for (uint32_t i = 0; i < n; ++i) {
    TSNode c = ts_node_named_child(stmt, i);
    if (from && IsFieldOf(c, stmt, "module_name")) continue;
    if (Is(c, Type::kWildcardImport)) wildcard = true;
    if (Is(c, Type::kAliasedImport)) {
      out.insert(NameOf(Field(c, "alias"), source));
    } else if (Is(c, Type::kDottedName)) {
      std::string text = NameOf(c, source);
      if (!from) text = text.substr(0, text.find('.'));
      out.insert(std::move(text));
    }
  }
}

bool IsScope(TSNode n) {
  return Is(n, Type::kFunctionDefinition) || Is(n, Type::kClassDefinition) ||
         Is(n, Type::kLambda) || IsComprehension(n);
}

/// The names a global or nonlocal statement declares.
void DeclaredNames(TSNode stmt, std::string_view source, Names& out) {
  uint32_t m = ts_node_named_child_count(stmt);
  for (uint32_t j = 0; j < m; ++j) out.insert(NameOf(ts_node_named_child(stmt, j), source));
}

/// Collects the names bound in `node`'s subtree without entering nested scopes (whose own names
/// are recorded: a nested def/class binds its name here).
void CollectBindings(TSNode node, std::string_view source, Names& out, bool& wildcard) {
  Path path;
  WalkNamed(node, path, [&](TSNode c, const Path& up) {
    if (Is(c, Type::kIdentifier)) {
      if (RoleOf(c, up) == Role::kBinding) out.insert(NameOf(c, source));
    } else if (Is(c, Type::kImportStatement) || Is(c, Type::kImportFromStatement)) {
      ImportBindings(c, source, out, wildcard);
    } else if (Is(c, Type::kGlobalStatement) || Is(c, Type::kNonlocalStatement)) {
      DeclaredNames(c, source, out);
    } else if (Is(c, Type::kFunctionDefinition) || Is(c, Type::kClassDefinition)) {
      TSNode name = Field(c, "name");
      if (!ts_node_is_null(name)) out.insert(NameOf(name, source));
      // Decorators, defaults, annotations and base classes are evaluated here, but bind nothing.
    } else {
      return !IsScope(c);
    }
    return false;
  });
}

/// Names declared `global` anywhere in the module.
void CollectGlobals(TSNode root, std::string_view source, Names& out) {
  if (Is(root, Type::kGlobalStatement)) {
    DeclaredNames(root, source, out);
    return;
  }
  Path path;
  WalkNamed(root, path, [&](TSNode n, const Path&) {
    if (!Is(n, Type::kGlobalStatement)) return true;
    DeclaredNames(n, source, out);
    return false;
  });
}

/// Whether `source` may hold a `global` statement: the keyword as a word of its own followed by
/// a blank or a line continuation (the statement is `global NAME, ...`). Words like
/// `global_attention_mask` or a docstring's "global" followed by other text do not count; a
/// mention in a comment or a string does, and only costs the walk.
bool MayHaveGlobalStatement(std::string_view source) {
  constexpr std::string_view kWord = "global";
  for (size_t at = source.find(kWord); at != std::string_view::npos;
       at = source.find(kWord, at + 1)) {
    auto c = at > 0 ? static_cast<unsigned char>(source[at - 1]) : ' ';
    if (c == '_' || c >= 0x80 || std::isalnum(c) || c == '.') continue;
    size_t next = at + kWord.size();
    if (next < source.size() &&
        (source[next] == ' ' || source[next] == '\t' || source[next] == '\\'))
      return true;
  }
  return false;
}

/// Resolves uses against the scopes around them, caching each scope's bindings.
class Resolver {
 public:
  Resolver(TSNode root, std::string_view source) : source_(source) {
    CollectBindings(root, source, module_, module_wildcard_);
    // A `global` statement starts with its keyword: without it there is none to look for.
    if (MayHaveGlobalStatement(source)) CollectGlobals(root, source, module_);
  }

  /// Whether identifier `id`, whose enclosing scopes (IsScope) are `scopes` (outermost first),
  /// resolves.
  bool Resolves(TSNode id, const std::vector<TSNode>& scopes) {
    std::string name = NameOf(id, source_);
    if (module_wildcard_ || module_.contains(name) || IsBuiltinName(name)) return true;
    bool crossed_function = false;
    for (size_t k = scopes.size(); k-- > 0;) {
      TSNode a = scopes[k];
      if (Is(a, Type::kFunctionDefinition) || Is(a, Type::kLambda)) {
        if (!Inside(id, Field(a, "body"))) continue;  // defaults/annotations: enclosing scope
        crossed_function = true;
        if (Bindings(a).contains(name)) return true;
      } else if (Is(a, Type::kClassDefinition)) {
        if (crossed_function || !Inside(id, Field(a, "body"))) continue;
        if (Bindings(a).contains(name)) return true;
      } else if (IsComprehension(a)) {
        if (Bindings(a).contains(name)) return true;
      }
    }
    return false;
  }

 private:
  const Names& Bindings(TSNode scope) {
    // A scope is its first byte and its grammar symbol (a lambda and its body's first expression
    // start at one byte).
    uint64_t key = uint64_t{ts_node_start_byte(scope)} << 16 | ts_node_symbol(scope);
    auto [it, inserted] = cache_.try_emplace(key);
    if (!inserted) return it->second;
    Names& out = it->second;
    bool wildcard = false;
    if (Is(scope, Type::kFunctionDefinition) || Is(scope, Type::kLambda)) {
      TSNode params = Field(scope, "parameters");
      if (!ts_node_is_null(params)) CollectParams(params, out);
      CollectBindings(Field(scope, "body"), source_, out, wildcard);
    } else if (Is(scope, Type::kClassDefinition)) {
      CollectBindings(Field(scope, "body"), source_, out, wildcard);
    } else {
      uint32_t n = ts_node_named_child_count(scope);
      for (uint32_t i = 0; i < n; ++i) {
        TSNode c = ts_node_named_child(scope, i);
        if (Is(c, Type::kForInClause)) CollectBindings(c, source_, out, wildcard);
      }
    }
    return out;
  }

  /// The parameter names of `params` (not of lambdas in its default values).
  void CollectParams(TSNode params, Names& out) {
    if (Is(params, Type::kIdentifier)) {
      if (RoleOf(params, {}) == Role::kBinding) out.insert(NameOf(params, source_));
      return;
    }
    if (IsScope(params)) return;
    Path path;
    WalkNamed(params, path, [&](TSNode n, const Path& up) {
      if (Is(n, Type::kIdentifier)) {
        if (RoleOf(n, up) == Role::kBinding) out.insert(NameOf(n, source_));
        return false;
      }
      return !IsScope(n);
    });
  }

  std::string_view source_;
  Names module_;
  bool module_wildcard_ = false;
  absl::flat_hash_map<uint64_t, Names> cache_;  ///< Each scope's bindings (Bindings' key).
};

bool Touches(TSNode node, const std::vector<ByteRange>& ranges) {
  uint32_t s = ts_node_start_byte(node), e = ts_node_end_byte(node);
  bool touches = false;
  for (const ByteRange& r : ranges) {
    if (s < r.end && r.start < e) touches = true;
  }
  return touches;
}

/// The scopes (IsScope) among the ancestors of the node a WalkNamed visits, kept as the walk
/// goes, so that resolving a name costs its scope depth, not its depth in the tree (a chain
/// `x + x + ...` nests thousands deep).
class ScopeStack {
 public:
  /// The scopes around a node whose ancestors are `path`; `n` itself is entered next when it is
  /// a scope and the walk goes into it.
  const std::vector<TSNode>& Around(const Path& path) {
    while (!depth_.empty() &&
           (depth_.back() >= path.size() || !Same(path[depth_.back()], scopes_.back()))) {
      depth_.pop_back();
      scopes_.pop_back();
    }
    return scopes_;
  }
  void Enter(TSNode scope, size_t depth) {
    scopes_.push_back(scope);
    depth_.push_back(depth);
  }

 private:
  std::vector<TSNode> scopes_;
  std::vector<size_t> depth_;  ///< Each scope's index in the path of the nodes below it.
};

}  // namespace

std::vector<NameUse> FindUnresolvedNames(TSNode root, std::string_view source,
                                         const std::vector<ByteRange>& ranges) {
  std::vector<NameUse> out;
  if (!Touches(root, ranges) || Is(root, Type::kIdentifier)) return out;  // (a root is a module)
  Resolver resolver(root, source);
  ScopeStack scopes;
  if (IsScope(root)) scopes.Enter(root, 0);
  Path path;
  // Each identifier inside a range (once per range that holds it), in document order, resolved
  // where it is found: keeping every identifier's ancestors took memory quadratic in the depth.
  WalkNamed(root, path, [&](TSNode node, const Path& up) {
    if (!Touches(node, ranges)) return false;
    const std::vector<TSNode>& around = scopes.Around(up);
    if (!Is(node, Type::kIdentifier)) {
      if (IsScope(node)) scopes.Enter(node, up.size());
      return true;
    }
    if (RoleOf(node, up) != Role::kUse || resolver.Resolves(node, around)) return false;
    uint32_t s = ts_node_start_byte(node), e = ts_node_end_byte(node);
    for (const ByteRange& r : ranges) {
      if (r.start <= s && e <= r.end) out.push_back({NameOf(node, source), s, e});
    }
    return false;
  });
  return out;
}

}  // namespace patchgen::rewriter
