// What the generator's stages share: the data a stage returns (StageOutput), name_map renaming
// with use tracking (NameMap), and code taken from a spec or patch file (ParseCode, Snippet).
// The stages themselves are declared in stages.h; generate.cc runs them in order.
#pragma once

#include <tree_sitter/api.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "rewriter/edit_plan.h"
#include "rewriter/generate.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// What every stage returns: its edits, in the order they enter the plan (at one offset, plan
/// order decides); the header's `applied:` entries; its errors; the spec-level name_map keys it
/// used (a key no stage used is an error, reported by the orchestrator).
struct StageOutput {
  std::vector<TextEdit> edits;
  std::vector<AppliedPatch> applied;
  std::vector<Diagnostic> errors;
  std::set<std::string> used_keys;  ///< NameMapEntry::Key() of the spec-level entries used.
};

/// A name_map (spec- or patch-level) and which of its entries renamed something.
class NameMap {
 public:
  explicit NameMap(const std::vector<spec::NameMapEntry>& entries);

  /// The new name of identifier `name` (marking the entry used), or nullopt. A whole-name key
  /// wins over prefix rules, a longer prefix over a shorter one; when a rule's new prefix extends
  /// the old one, an identifier that already starts with the new prefix is left alone.
  std::optional<std::string> Map(std::string_view name);

  /// `A.B.m` with every dotted component mapped (spec-level name_map on targets).
  std::string MapDotted(const std::string& dotted);

  /// Keys (NameMapEntry::Key()) of the entries used so far.
  std::set<std::string> UsedKeys() const;

  /// "name_map key 'X' is never used" for each entry not used and not in `used_elsewhere`.
  void ReportUnused(const std::set<std::string>& used_elsewhere,
                    std::vector<Diagnostic>& errors) const;

 private:
  struct Use {
    const spec::NameMapEntry* entry;
    bool used;
    std::string keyword_from = {};  ///< The first name a prefix rule would turn into a keyword.
  };
  std::vector<Use> uses_;
};

/// Code taken from a body, ready to splice: re-indented lines (no final newline) and where they
/// came from.
struct Snippet {
  std::string text;
  spec::TextOrigin origin;
  uint32_t first_line = 1;
  int32_t col_shift = 0;
};

/// Text with `prefix` in front of a snippet, as a TextEdit whose CodeSpan covers the snippet.
TextEdit SnippetEdit(ByteRange range, const std::string& prefix, const Snippet& s,
                     const std::string& suffix, SourceLoc origin, std::string what);

/// A location inside code text: line `line0` (0-based, of the text), 1-based column `col`.
SourceLoc OriginLoc(const spec::TextOrigin& o, uint32_t line0, uint32_t col, uint32_t length = 1);

/// Parses code from a spec or patch file; a syntax error is reported at its place there.
std::unique_ptr<parser::PyModule> ParseCode(const std::string& text, const spec::TextOrigin& origin,
                                            std::vector<Diagnostic>& errors);

/// The renames a snippet gets: patch-level entries win over spec-level ones.
struct Renames {
  NameMap* patch = nullptr;
  NameMap* spec = nullptr;
};

/// Renames identifiers in `region` of `m` (`renames`; `rename` for one node) and re-indents the
/// region's lines to `column`.
Snippet MakeSnippet(const parser::PyModule& m, ByteRange region, const spec::TextOrigin& origin,
                    Renames renames, std::optional<std::pair<ByteRange, std::string>> rename,
                    size_t column);

/// The whole of `m` as a snippet at `column` (statements, added imports, blocks).
Snippet WholeSnippet(const parser::PyModule& m, const spec::TextOrigin& origin, Renames renames,
                     size_t column);

/// The one def/class a body provides, or nullptr (with an error).
const parser::Definition* BodyDefinition(const parser::PyModule& m, const spec::Body& body,
                                         const std::string& what, std::vector<Diagnostic>& errors);

/// One line for headers and markers: newlines folded, non-ASCII kept (the output is UTF-8).
std::string OneLine(std::string s);
std::string TrimTrailingNewlines(std::string s);
/// "A.B" of "A.B.m" ("" for a top-level name) and "m".
std::string Owner(const std::string& qualname);
std::string LastComponent(const std::string& qualname);

// Tree queries of the parser (py_module.h), used unqualified by the stages.
using parser::DefNode;
using parser::NodeAt;

/// Range that removes the whole lines `r` lies on, with the last one's newline.
ByteRange WholeLines(const std::string& src, ByteRange r);
/// `range` of `src` with `local` replacements (disjoint) applied.
std::string SpliceRange(const std::string& src, ByteRange range,
                        std::vector<std::pair<ByteRange, std::string>> local);
/// Ranges that remove `items[i]` for i in `removed` (sorted; not all of them) from a
/// comma-separated list, with their separators, so that the rest keeps its layout.
std::vector<std::pair<ByteRange, std::string>> RemoveListItems(const std::vector<ByteRange>& items,
                                                               const std::vector<size_t>& removed);

/// The top-level statement of `up` binding `name` (class, def or assignment), or nullptr.
const parser::TopLevelStatement* TopLevelBinding(const parser::PyModule& up,
                                                 const std::string& name);
/// "<context>: no top-level definition or assignment '<name>' in <upstream>" with "did you mean".
Diagnostic MissingTopLevel(const parser::PyModule& up, const SourceLoc& loc,
                           const std::string& context, const std::string& name);

/// A contract pin on `ranges` of `up` (none: the "absent" fingerprint).
ContractPin MakePin(const parser::PyModule& up, std::string key, std::string region,
                    std::string expects, std::string qualname, const SourceLoc& loc,
                    const std::vector<ByteRange>& ranges, const std::vector<ByteRange>& skip);

}  // namespace patchgen::rewriter
