// Statements of a function body, located by their leading text: the one anchor machinery of
// call-site guards (`at`/`through`, docs/guards.md) and statement edits (`edit_body`,
// docs/spec-format.md). A statement is found at any depth of the body (inside `if`, `for`, `with`,
// `try`, `match` ...) but never inside a nested def or class; `at` must match exactly one
// statement, `through` a later statement of the same block. Errors list the candidates with their
// upstream line numbers and are located at the spec value that named the anchor.
#pragma once

#include <tree_sitter/api.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"

namespace patchgen::rewriter {

/// Statement of a function body, found at any depth (not inside nested defs/classes): the node,
/// its block, its position there, its range and line (parser::NestedStatements).
using Stmt = parser::NestedStatement;

/// What to look up, and how errors name it.
struct AnchorQuery {
  std::string_view at;  ///< Leading text of the first statement.
  SourceLoc at_loc;
  std::string at_key = "at";  ///< Spec key of `at` in messages ("at", "replace", ...).
  std::optional<std::string_view> through;  ///< Leading text of the last statement.
  SourceLoc through_loc;
  /// Errors when the range does not own its lines: "the last <noun> statement ... ; <why>".
  std::string noun = "guarded";  ///< "guarded", "edited"
  std::string why = "a call-site guard moves whole lines";
};

/// The located range: `first` .. `last` (the same statement without `through`).
struct AnchorRange {
  const Stmt* first = nullptr;
  const Stmt* last = nullptr;
};

/// The statements of one function body.
class BodyStatements {
 public:
  /// Collects the statements of `def` (a function). `ok()` is false when its body is not found.
  BodyStatements(const parser::PyModule& m, const parser::Definition& def);

  bool ok() const { return ok_; }
  const std::vector<Stmt>& all() const { return stmts_; }

  /// Statements whose text starts with `prefix` (trimmed by the caller), as written or NFKC-equal
  /// (names as Python reads them, PEP 3131).
  std::vector<const Stmt*> Matching(std::string_view prefix) const;

  /// Locates `q.at` .. `q.through` in the body; on failure appends one located error to
  /// `errors` and returns nullopt. The statements must start and end their lines.
  std::optional<AnchorRange> Locate(const AnchorQuery& q, std::vector<Diagnostic>& errors) const;

  /// Why an anchor is absent ("no statement starting with 'x' in f"), or nullopt when every text
  /// of `q` matches some statement (used by `optional: true` entries).
  std::optional<std::string> Absent(const AnchorQuery& q) const;

  /// True when [first, last] are all the statements of their block.
  bool WholeBlock(const AnchorRange& r) const;

  /// The statement's text from its start to the end of its first line, trimmed.
  std::string FirstLineOf(const Stmt& s) const;

 private:
  /// The statement `q.through` names: a later sibling of `first` (or `first` itself); nullptr
  /// with an error when none or several match, or when it matches elsewhere only.
  const Stmt* LocateThrough(const AnchorQuery& q, const Stmt& first,
                            std::vector<Diagnostic>& errors) const;
  std::vector<Note> StatementNotes(const std::vector<const Stmt*>& stmts) const;
  std::vector<const Stmt*> Closest(const std::vector<const Stmt*>& stmts,
                                   std::string_view prefix) const;
  void NoMatch(const SourceLoc& loc, std::string_view key, std::string_view prefix,
               const std::string& where, const std::vector<const Stmt*>& candidates,
               std::vector<Diagnostic>& errors) const;
  /// True when every statement of `stmts` has the same text (a longer anchor cannot help).
  bool AllIdentical(const std::vector<const Stmt*>& stmts) const;
  void Ambiguous(const SourceLoc& loc, std::string_view key, std::string_view prefix,
                 const std::string& where, const std::vector<const Stmt*>& matches,
                 std::vector<Diagnostic>& errors) const;

  const parser::PyModule& m_;
  std::string where_;  ///< Qualified name of the function.
  std::vector<Stmt> stmts_;
  bool ok_ = false;
};

/// Leading/trailing whitespace (spaces, tabs, CR, LF) removed.
std::string_view TrimSpace(std::string_view s);

/// True when only whitespace precedes `offset` on its line.
bool StartsLine(const parser::PyModule& m, uint32_t offset);
/// True when only whitespace or a comment follows `offset` on its line.
bool EndsLine(const parser::PyModule& m, uint32_t offset);
/// Leading whitespace of the line holding `offset`.
std::string IndentAt(const parser::PyModule& m, uint32_t offset);

/// Upstream bytes of `range` (whole lines) with `shift` put in front of every non-blank line that
/// does not start inside a string literal (so a string's value never changes).
std::string ShiftLines(const parser::PyModule& m, ByteRange range, std::string_view shift);

// A tree query of the parser (tree_queries.h), used unqualified by the rewriter.
using parser::BodyBlock;

}  // namespace patchgen::rewriter
