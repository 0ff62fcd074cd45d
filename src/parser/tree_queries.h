// Tree queries: every question patchgen asks of a parsed module's concrete syntax tree beyond its
// index, as pure functions of the tree. They decide nothing about edits (where text goes and what
// replaces what stay in src/rewriter). docs/parser.md, "Tree queries", lists them. Defined in
// tree_queries.cc (nodes, statements, parameters, what the indexer builds on),
// tree_queries_names.cc (names and scopes) and tree_queries_refusals.cc (what PyModule::Parse
// refuses, lines inside strings); tests in tree_queries_test.cc.
#pragma once

#include <tree_sitter/api.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/byte_range.h"
#include "base/line_index.h"
#include "parser/py_module.h"

namespace patchgen::parser {

// ----- nodes of index ranges (tree_queries.cc) ---------------------------------------------------

/// The smallest named node exactly covering `r` (walking up from the deepest one).
TSNode NodeAt(TSNode root, ByteRange r);

/// The function_definition / class_definition node of `def` in `m`'s tree.
TSNode DefNode(const PyModule& m, const Definition& def);

/// The `block` node of a function (or class) definition; null when not found.
TSNode BodyBlock(const PyModule& m, const Definition& def);

// ----- statements and parameters (tree_queries.cc) -----------------------------------------------

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

/// Names of the parameters of function `def` of `m` (NFKC like the index's), in order: plain,
/// typed and default parameters (`self`, `x: int`, `y=1`); `*args`, `**kwargs`, `/` and `*`
/// separators are not included. Empty when `def` has no parameter list.
std::vector<std::string> ParameterNames(const PyModule& m, const Definition& def);

// ----- names and scopes (tree_queries_names.cc; PyModule::Rebindings is defined there too) -------

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

// ----- what the indexer builds on (tree_queries.cc) ----------------------------------------------

/// True for a comment node.
bool IsComment(TSNode n);

/// Python's whitespace characters (space, tab, newline, carriage return, form feed, vertical tab).
bool IsSpace(char c);

/// The node's end without trailing comments, blank lines or whitespace folded into it.
uint32_t TrimmedEnd(TSNode n, std::string_view src);

/// Python statements that can hold other statements (where imports and definitions can nest).
bool IsContainer(TSNode n);

/// Names bound by an assignment target (identifiers in patterns; attributes/subscripts bind none),
/// as Python compares them (IdentifierKey: NFKC when not ASCII).
void CollectTargetNames(TSNode n, std::string_view src, std::vector<std::string>& out);

/// A type_alias_statement is genuine only when `type` is followed by a (possibly generic) name;
/// `type(x).attr = v` is an assignment the grammar misreads. Sets `*name` (IdentifierKey) when it
/// is.
bool IsGenuineTypeAlias(TSNode n, std::string_view src, std::string* name);

// ----- refusals and strings (tree_queries_refusals.cc) -------------------------------------------

/// First ERROR or MISSING node of `tree` in document order, if any.
std::optional<TSNode> FirstErrorNode(TSNode root);

/// The first construct (document order) of an error-free tree that tree-sitter-python accepts and
/// CPython rejects, with CPython 3.11's message: a starred expression alone as an assignment or
/// `for` target (`*a = b`, `*a.b = c`, `for *a in b`), alone as a statement or an assignment's
/// value (`*a`, `x = *a`), in parentheses alone (`(*a)`), as a dictionary value (`{k: *v}`) or as
/// an operand of an operator (`a & *b`, CPython's "invalid syntax");
/// and a block with no statement (a header at the end of the file, or comments only).
/// Found by the fuzz suite (a spec body patchgen accepted and CPython did not compile). Only
/// contexts that are errors whatever tree-sitter's reading: it parses `*a.b` as `(*a).b`, so a
/// starred operand inside a chain says nothing by itself. `source` is the text the tree was parsed
/// from (subtrees whose bytes hold no `*` are only walked for blocks).
std::optional<std::pair<TSNode, std::string>> FirstCompileError(TSNode root,
                                                                std::string_view source);

/// The deepest nesting of syntax tree nodes PyModule::Parse accepts ("nesting deeper than N
/// levels"): every walk over a parsed module may recurse this deep.
inline constexpr uint32_t kMaxNesting = 4000;

/// The first node nested deeper than kMaxNesting levels below `root`, if any.
std::optional<TSNode> NestedTooDeep(TSNode root);

/// The leading whitespace of the first code line of `m` whose indentation holds a tab (lines inside
/// multi-line strings, blank lines and comment-only lines are not code lines); nullopt when the
/// module is indented with spaces only. Code patchgen inserts is indented with spaces, and CPython
/// rejects a block that mixes tabs and spaces (TabError), so such an upstream is refused.
std::optional<ByteRange> FirstTabIndentation(const PyModule& m);

/// Adds to `out` the 0-based numbers of the lines that start inside a multi-line string literal
/// overlapping `within` (the lines after a string's first line, through its last). Re-indenting
/// code must leave those lines alone: they are part of the string's value.
void MarkLinesInsideStrings(TSNode node, ByteRange within, const LineIndex& lines,
                            std::set<uint32_t>& out);

}  // namespace patchgen::parser
