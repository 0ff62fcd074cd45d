// Structural queries over a parsed module's concrete syntax tree that the rewriter asks: the
// statements of a block (and of a body at any depth), the last statement of a body, the
// `super().__init__(...)` statement of an `__init__`, the `__all__` list, whether a statement is
// alone in its block, the references to a bare name, the identifiers of a region, the `...`
// lines of a snippet and the parameters of a def. They were re-implemented in src/rewriter (issue
// #19). Each is a pure function of the tree: it decides nothing about edits (where text goes and
// what replaces what stay in src/rewriter). Tests: py_cst_queries_test.cc. The older queries
// (NodeAt, DefNode, BodyBlock, ParameterNames) are declared in py_module.h; docs/parser.md lists
// them all.
#pragma once

#include <tree_sitter/api.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "base/byte_range.h"
#include "base/line_index.h"
#include "parser/py_module.h"

namespace patchgen::parser {

/// The statements of `block` (a `block` or the `module` node), in order: its named children
/// other than comments. A `match` statement's block holds `case_clause`s; they are returned as
/// they are. Empty for a null node.
std::vector<TSNode> BlockStatements(TSNode block);

/// The last statement of `def`'s body: `pass` of `class A:\n    pass`, `return x` of
/// `def f(): return x`, a whole `if` statement when the body ends with one; comments after it are
/// not statements. A null node when `def`'s body block is not found (PyModule::Parse refuses a
/// block without a statement).
TSNode LastStatement(const PyModule& m, const Definition& def);

/// The `super().__init__(...)` statement directly in the body of `init` (an `__init__`): the first
/// expression statement of the body block whose text starts with `super(` and contains
/// `.__init__(` (`super().__init__(config)`, `super(A, self).__init__()`). Statements nested in
/// `if`/`try`/... are not looked at, and the test is on the statement's text, not its structure.
/// Its range (without a trailing comment); nullopt when none.
std::optional<ByteRange> SuperInitStatement(const PyModule& m, const Definition& init);

/// The `__all__` list of a module: the list or tuple literal and its items.
struct DunderAll {
  ByteRange list;                ///< The literal, brackets included: `[...]` or `(...)`.
  std::vector<ByteRange> items;  ///< Its elements as written (quotes included), comments left out.
};

/// The value of the last top-level assignment `__all__ = [...]` (or `__all__ = (...)`, or
/// annotated `__all__: list[str] = [...]`) whose value is a list or tuple literal; later
/// assignments of another value (`__all__ = names()`), augmented ones (`__all__ += [...]`) and
/// chained ones (`__all__ = x = [...]`) are not looked at. nullopt when there is none.
std::optional<DunderAll> FindDunderAll(const PyModule& m);

/// True when the statement exactly at `stmt` is the only statement of its `block` (comments do
/// not count): removing it would leave the block empty. False for a statement directly in the
/// module body, which is not a `block`.
bool OnlyStatementInBlock(const PyModule& m, ByteRange stmt);

/// A statement of a body found at any depth (NestedStatements).
struct NestedStatement {
  TSNode node;
  TSNode block;        ///< The block the statement belongs to (siblings share it).
  uint32_t index = 0;  ///< Position among the block's statements.
  ByteRange range;
  uint32_t line = 0;  ///< 1-based line of the statement's first byte.
};

/// Every statement of `block` in document order, at any depth: those of the blocks of `if`,
/// `elif`, `else`, `for`, `while`, `try`, `except`, `finally`, `with`, `match`/`case`, but not
/// those inside a nested def or class (the def/class statement itself is one). A `case_clause` is
/// not a statement; its block's statements are. `lines` is the module's line index.
std::vector<NestedStatement> NestedStatements(TSNode block, const LineIndex& lines);

/// Every identifier under `node` whose text (in `code`, the source `node` was parsed from) is
/// `name` for Python (SameIdentifier: NFKC-equal) and that refers to the bare name: not an
/// attribute's name (`x.name`) nor a keyword argument's name (`f(name=1)`). In document order.
std::vector<ByteRange> NameReferences(TSNode node, std::string_view code, std::string_view name);

/// Every identifier node under `node` that overlaps `region`, in document order: names in any
/// role (definitions, parameters, attribute names, keyword-argument names, the expressions of an
/// f-string), never the text of strings or comments.
std::vector<ByteRange> IdentifiersIn(TSNode node, ByteRange region);

/// Every `attribute` node under `node` whose text (in `code`) is `text` (`self.x`; NFKC-equal), in
/// document order, at any depth (nested defs included).
std::vector<ByteRange> AttributeReferences(TSNode node, std::string_view code,
                                           std::string_view text);

/// The nodes under `block` (a def's body) whose type is one of `types` (`yield`,
/// `global_statement`, ...) and that belong to the def's own scope: not inside a nested def,
/// class or lambda (skipped whole, their decorators and default values too). In document order.
/// Empty for a null node.
std::vector<TSNode> OwnScopeNodes(TSNode block, const std::vector<std::string_view>& types);

/// Every statement of `m` that is `...` alone on its line (blanks before it, blanks or a comment
/// after it), at any depth, in document order: the placeholder of an edit_body `wrap`'s code.
/// `x = ...`, `f(...)`, `...; y` and a `...` sharing its line with a header (`if a: ...`) are not.
std::vector<TSNode> EllipsisLines(const PyModule& m);

/// One parameter of a def, as written (Parameters).
struct Parameter {
  ByteRange name;                       ///< `x`, `*args`, `**kwargs`, or the separator `*` / `/`.
  bool plain = false;                   ///< `name` is an identifier: not a splat, not a separator.
  std::optional<ByteRange> annotation;  ///< `int` of `x: int`.
  std::optional<ByteRange> default_value;  ///< `1` of `x=1` / `x: int = 1`.
};

/// The parameters of function `def` in order, comments left out: plain (`self`), typed
/// (`x: int`, `*args: int`), default (`y=1`), typed default (`z: str = 'a'`), splats (`*args`,
/// `**kwargs`) and the separators `*` and `/`. Empty when `def` has no parameter list.
/// ParameterNames is the names of the plain ones.
std::vector<Parameter> Parameters(const PyModule& m, const Definition& def);

}  // namespace patchgen::parser
