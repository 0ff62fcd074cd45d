// EditPlan: a rewrite as data. Every spec operation becomes TextEdits tagged with the spec
// location that asked for them; the plan is validated (overlaps are errors naming both origins)
// and applied in one forward splice.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/byte_range.h"
#include "base/diagnostic.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// Where code inside an edit's text came from, so that errors found in the generated output
/// (parse errors, undefined names) can be reported in the spec or patch file. Bytes
/// [begin, end) of `TextEdit::text` are consecutive lines of `origin`; the line holding
/// `text[begin]` is line `first_line` (1-based) of `origin.path`, and an output column `c` maps
/// to column `c - col_shift` there (re-indentation moved the code by `col_shift` columns).
struct CodeSpan {
  uint32_t begin = 0;
  uint32_t end = 0;
  spec::TextOrigin origin;
  uint32_t first_line = 1;
  int32_t col_shift = 0;
};

struct TextEdit {
  ByteRange range;   ///< Upstream bytes replaced: 0-based, start inclusive, end exclusive. Empty =
                     ///< insertion at `range.start`.
  std::string text;  ///< Replacement text.
  SourceLoc origin;  ///< Spec location of the operation that produced this edit.
  std::string
      what;  ///< Short description for overlap errors, e.g. "override_method Qwen3MLP.forward".
  std::optional<CodeSpan> code;  ///< Inserted code with a known origin (optional).
  /// A second span, after upstream text inside the same edit (a `wrap`'s code after the
  /// wrapped statements).
  std::optional<CodeSpan> tail_code = std::nullopt;
};

/// The error for two spec entries that change the same upstream region: reported at `later`, with
/// a note naming `earlier`.
Diagnostic OverlapError(const SourceLoc& later, const std::string& later_what,
                        const SourceLoc& earlier, const std::string& earlier_what);

class EditPlan {
 public:
  void Add(TextEdit edit) { edits_.push_back(std::move(edit)); }
  const std::vector<TextEdit>& edits() const { return edits_; }

  /// Sorts edits by start (insertions before a replacement at the same offset; among insertions
  /// at one offset deeper-indented text first, then the order in which they were added), and
  /// reports every pair of overlapping edits as an error at the later
  /// origin, with a note naming the other origin. Two insertions at the same offset do not overlap;
  /// an insertion strictly inside a replaced range does. Message:
  ///   `<later origin>: error: edits overlap: <what of later> and <what of earlier>`
  ///   `note: <what of earlier> is at <path>:<line>:<col>`
  /// ("later" = the origin that sorts after the other by path, line, column).
  std::vector<Diagnostic> Validate();

  /// Applies the (validated, sorted) edits to `source` in one forward pass.
  std::string Apply(const std::string& source) const;

  /// Where each edit's text lies in the output of Apply() (same order as edits()).
  std::vector<ByteRange> OutputRanges() const;

 private:
  std::vector<TextEdit> edits_;
};

}  // namespace patchgen::rewriter
