// How the output check tells tree-sitter about a splice before the incremental reparse
// (docs/rewriter.md, "Validation of the output"): the plan's edits, grown so that the parser's
// external scanner is back in step with the old tree where reuse resumes.
#pragma once

#include <tree_sitter/api.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/byte_range.h"
#include "base/line_index.h"
#include "rewriter/edit_plan.h"

namespace patchgen::rewriter {

/// One edit as tree-sitter is told about it: upstream bytes `range` replaced by `text`. The text
/// after all of them is the same as after the plan's own edits.
struct ReparseEdit {
  ByteRange range;
  std::string text;
};

/// Where reuse of the old tree may resume after an edit ending at upstream byte `end`: the end of
/// the first token at or after `end` (whitespace, blank and comment lines skipped; a word, or one
/// byte of anything else). Why: tree-sitter tries to reuse an old subtree as soon as the parser
/// reaches its start, before it has lexed the zero-width NEWLINE/INDENT/DEDENT tokens there, and
/// refuses it when the external scanner's state (the indentation stack) differs from the old
/// tree's at that point, which it does after an edit that ends deeper-indented than the code
/// after it; tree-sitter 0.20.7 then skips that whole subtree (often the rest of the module)
/// instead of looking inside it (0.23.2's parser.c has the same check). Past the first token of the
/// old code, those tokens have been lexed and the states agree again.
uint32_t ResyncPoint(std::string_view upstream, uint32_t end);

/// Where an edit starting at upstream byte `start` is said to start: on the last byte of the
/// token before it (whitespace skipped; a UTF-8 character's first byte), so that the zero-width
/// tokens between that token and the edit are lexed again too: left in place, they would be
/// "changed" and the subtree after them would meet the state check above unlexed.
uint32_t ReparseStart(std::string_view upstream, uint32_t start);

/// The header (an insertion at 0, first) and the plan's edits (validated, sorted), each grown to
/// its ResyncPoint, merged where grown edits meet. In upstream order.
std::vector<ReparseEdit> ReparseEdits(std::string_view upstream, const EditPlan& plan,
                                      std::string_view header);

/// Tells `tree` (the upstream tree) about `edits`, last first so that each one's upstream
/// coordinates still hold.
void ApplyReparseEdits(TSTree* tree, const LineIndex& lines, const std::vector<ReparseEdit>& edits);

}  // namespace patchgen::rewriter
