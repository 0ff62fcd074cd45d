// PyModule: one Python source file, its tree-sitter tree, and the index patchgen splices by.
//
// The index is exact to the byte: every range is half-open and 0-based (see base/byte_range.h).
// A PyModule owns the text and the tree together, so TSNode values obtained from it stay valid
// while it lives. Files with ERROR or MISSING nodes are refused at Parse(). Questions about the
// tree beyond the index are the tree queries of tree_queries.h.
#pragma once

#include <tree_sitter/api.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/byte_range.h"
#include "base/diagnostic.h"
#include "base/line_index.h"

namespace patchgen::parser {

/// One name of an import statement: `a.b` or `a.b as c` (for `import`), `x` or `x as y` (for
/// `from`). Every name of the index (imports, definitions, bound names) is held as Python compares
/// it: NFKC when it is not ASCII (PEP 3131; base/unicode_nfkc.h), so `ﬁnd` is held as `find`; the
/// ranges give upstream's bytes, which patchgen never rewrites.
struct ImportedName {
  std::string name;   ///< Dotted name (NFKC), e.g. "torch.nn" or "ACT2FN".
  std::string alias;  ///< "" when there is no `as`.
  ByteRange range;    ///< The whole `name` or `name as alias` node.
};

/// One import statement at any depth.
struct Import {
  enum class Kind { kImport, kFrom, kFuture };
  Kind kind = Kind::kImport;
  ByteRange stmt;  ///< The whole statement (no trailing newline).
  ByteRange
      module;  ///< `from` imports: the module part incl. leading dots ("..utils"); empty otherwise.
  int relative_level = 0;   ///< Number of leading dots of a `from` import.
  std::string module_name;  ///< Module part without the dots ("utils"; "" for `from . import x`);
                            ///< NFKC like every name (the text as written: `module`).
  std::vector<ImportedName> names;
  bool wildcard = false;       ///< `from x import *`.
  bool parenthesized = false;  ///< `from x import (a, b)`.
  int depth = 0;               ///< 0 = directly in the module body; >0 nested (if/try/def...).
  /// Qualified name of the enclosing def/class ("" when none), e.g. "LlamaModel.forward".
  std::string scope;
};

/// Deletes a tree-sitter tree (the deleter of TreePtr).
struct TreeDeleter {
  void operator()(TSTree* tree) const { ts_tree_delete(tree); }
};

/// A tree-sitter tree and its owner.
using TreePtr = std::unique_ptr<TSTree, TreeDeleter>;

/// A class or a function/method.
struct Definition {
  enum class Kind { kClass, kFunction };
  Kind kind = Kind::kFunction;
  std::string name;      ///< "forward" (NFKC when not ASCII, as Python compares it)
  std::string qualname;  ///< "Outer.Inner.forward" (names joined as held)
  bool is_async = false;
  /// Whole definition: first attached leading comment line (comment block directly above, no blank
  /// line between) or first decorator or the keyword, through the last byte of the body.
  ByteRange whole;
  /// Like `whole` but without the leading comments: first decorator (or keyword) through body end.
  ByteRange definition;
  ByteRange decorators;  ///< From the first `@` through the end of the last decorator line; empty
                         ///< when none.
  ByteRange comments;    ///< The attached leading comment block; empty when none.
  ByteRange header;  ///< `def`/`class` (or `async`) keyword through the header's colon, inclusive.
  ByteRange name_range;  ///< The name identifier.
  ByteRange
      parameters;  ///< `(...)` of a function, superclasses `(...)` of a class; empty when absent.
  ByteRange body;  ///< The body block: first statement (or comment) through last byte of the last
                   ///< statement.
  std::optional<ByteRange>
      docstring;        ///< The docstring expression statement, when the body starts with a string.
  uint32_t indent = 0;  ///< Column (bytes) of the first decorator / keyword.
  /// Column (bytes) of the body's statements. For an inline body (`class A(B): ...`) it is
  /// `indent + 4`, the column a re-indented body should use.
  uint32_t body_indent = 0;
  bool inline_body = false;  ///< Body on the header's line (`class A(B): ...`).
  bool empty_body = false;   ///< Body is only `...` or `pass` (optionally after a docstring).
  /// Directly in the body of the module or of its enclosing def/class, not under an `if`, `try`,
  /// `with`, `for` or `while` there: a definition Python always executes in that scope.
  bool direct = false;
  int parent = -1;  ///< Index into PyModule::definitions() of the enclosing def/class, or -1.
  std::vector<int>
      children;       ///< Indices of directly nested classes and functions (methods), in order.
  uint32_t line = 0;  ///< 1-based line of `definition.start` (for printing).
};

/// One statement directly in the module body, in source order.
struct TopLevelStatement {
  enum class Kind { kImport, kClass, kFunction, kAssignment, kOther };
  Kind kind = Kind::kOther;
  bool decorated = false;  ///< A decorated class/function.
  ByteRange range;         ///< The statement (for definitions: Definition::whole).
  std::vector<std::string>
      names;            ///< Names it binds: class/def name, assignment targets, import aliases.
  int definition = -1;  ///< Index into definitions() for classes and functions.
};

const char* KindName(TopLevelStatement::Kind kind);

class PyModule {
 public:
  /// Parses `source`. `path` is used only in diagnostics. Refuses files with ERROR or MISSING
  /// nodes (first one's line:col, an excerpt, ErrorKind::kUpstream).
  static Result<std::unique_ptr<PyModule>> Parse(std::string path, std::string source);

  ~PyModule() = default;
  PyModule(const PyModule&) = delete;
  PyModule& operator=(const PyModule&) = delete;

  const std::string& path() const { return path_; }
  const std::string& source() const { return source_; }
  std::string_view Text(ByteRange r) const { return r.In(source_); }
  const LineIndex& lines() const { return lines_; }

  const std::vector<Import>& imports() const { return imports_; }
  const std::vector<TopLevelStatement>& top_level() const { return top_level_; }
  const std::vector<Definition>& definitions() const { return definitions_; }

  /// Top-level class or function by name (a direct child of the module; a definition under a
  /// module-level `if`/`try` is found by Find only); nullptr when absent.
  const Definition* FindTopLevel(std::string_view name) const;
  /// Definition by qualified name ("A", "A.B", "A.B.m", "f"); the first in document order when
  /// several share it (a property and its setter), except that `@overload` stubs give way to the
  /// implementation (OverloadImplementation); nullptr when absent.
  const Definition* Find(std::string_view qualname) const;
  /// When `def` is a `typing.overload` stub (IsOverloadStub), the definition Python keeps: the
  /// last later definition of the same name in the same scope that is not a stub; `def` itself
  /// otherwise (a stub without implementation, or not a stub).
  const Definition& OverloadImplementation(const Definition& def) const;
  /// True when one of `def`'s decorators is `@overload` or `@<module>.overload`
  /// (`@typing.overload`, `@typing_extensions.overload`).
  bool IsOverloadStub(const Definition& def) const;
  /// Statements of `def`'s scope (the module body, or the body of its class/def) after `def` that
  /// rebind its name without referring to it: `f = other`, `f: T = g`, `a, f = ...`, `f += x`,
  /// `from m import f`, `import f`, `del f`, and, at the top level for a method of a top-level
  /// class, `Cls.f = other`. Their ranges, in document order. `f = wrap(f)` keeps `f` reachable
  /// and is not counted; neither are statements under `if`/`try`/... of that scope.
  std::vector<ByteRange> Rebindings(const Definition& def) const;
  /// Other definitions of `def`'s qualified name that rebind it in the same scope (two `class X`
  /// or two `def f` in the module body, a method defined twice in one class body), in document
  /// order: Python keeps the last, so patching the first would patch dead code. Not counted: a
  /// definition under `if`/`try`/..., property accessors (`@name.setter`, `.getter`, `.deleter`)
  /// and `@overload` stubs. Empty when `def` is the only one.
  std::vector<const Definition*> Redefinitions(const Definition& def) const;
  /// Names of the direct children of `def` of the given kind (methods: kFunction).
  std::vector<std::string> ChildNames(const Definition& def, Definition::Kind kind) const;
  /// Names of all top-level classes and functions.
  std::vector<std::string> TopLevelNames(std::optional<Definition::Kind> kind = std::nullopt) const;

  TSTree* tree() const { return tree_.get(); }
  TSNode root() const;

 private:
  PyModule() : lines_("") {}
  std::string path_;
  std::string source_;
  LineIndex lines_;
  TreePtr tree_;
  std::vector<Import> imports_;
  std::vector<TopLevelStatement> top_level_;
  std::vector<Definition> definitions_;
  friend class Indexer;
};

/// The tree-sitter-python language (ABI 14), compiled from the npm grammar.
const TSLanguage* PythonLanguage();

/// Parses `source` and returns its tree, or null. No error checking.
TreePtr ParseTree(std::string_view source);

}  // namespace patchgen::parser
