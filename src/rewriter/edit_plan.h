// EditPlan: a rewrite as data. Every spec operation becomes TextEdits tagged with the spec
// location that asked for them; the plan is validated (overlaps are errors naming both origins)
// and applied in one forward splice.
#pragma once

#include <string>
#include <vector>

#include "base/byte_range.h"
#include "base/diagnostic.h"

namespace patchgen::rewriter {

struct TextEdit {
  ByteRange range;      ///< Upstream bytes replaced: 0-based, start inclusive, end exclusive. Empty = insertion at `range.start`.
  std::string text;     ///< Replacement text.
  SourceLoc origin;     ///< Spec location of the operation that produced this edit.
  std::string what;     ///< Short description for overlap errors, e.g. "override_method Qwen3MLP.forward".
};

class EditPlan {
 public:
  void Add(TextEdit edit) { edits_.push_back(std::move(edit)); }
  const std::vector<TextEdit>& edits() const { return edits_; }

  /// Sorts edits by start (stable: zero-width insertions at one offset keep the order in which
  /// they were added), and reports every pair of overlapping edits as an error at the later
  /// origin, with a note naming the other origin. Two insertions at the same offset do not overlap;
  /// an insertion strictly inside a replaced range does.
  std::vector<Diagnostic> Validate();

  /// Applies the (validated, sorted) edits to `source` in one forward pass.
  std::string Apply(const std::string& source) const;

 private:
  std::vector<TextEdit> edits_;
};

}  // namespace patchgen::rewriter
