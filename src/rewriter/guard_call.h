// A guard's `call:` text (docs/guards.md) made ready to splice: parsed, its shape checked (an entry
// guard's call is one expression, a call-site guard's one or more statements), dedented, and an
// instance-scoped slot's bare name rewritten to `self.<name>`. Errors are located at the line and
// column of the `call` text in the spec (or patch file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "rewriter/edit_plan.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// A guard's `call`, dedented, and where its lines are in the spec (for TextEdit::code).
struct PreparedCall {
  std::vector<std::string> lines;
  uint32_t first_line = 1;  ///< Spec line of lines[0].
  int32_t col_shift = 0;    ///< -(removed indentation + YAML column offset); see GuardCallSpan.
};

/// Parses `g.call` and checks its shape (`entry`: one expression, which becomes `return <call>`;
/// otherwise one or more statements). Returns its lines dedented, with `slot`'s bare name
/// rewritten to `self.<name>` when the slot is instance-scoped; nullopt with the error appended
/// to `errors` when the call is empty, does not parse or has the wrong shape.
std::optional<PreparedCall> PrepareGuardCall(const spec::Slot& slot, const spec::Guard& g,
                                             bool entry, std::vector<Diagnostic>& errors);

/// The CodeSpan of call text placed at `column` over bytes [begin, end) of an edit's text, or
/// nullopt when the call has no origin in a file.
std::optional<CodeSpan> GuardCallSpan(const spec::Guard& g, const PreparedCall& call, size_t begin,
                                      size_t end, size_t column);

/// Removes the common leading whitespace of non-blank lines and any leading and trailing blank
/// lines. (Spec `call:` text is short code written by hand; multi-line strings in it are not
/// protected.)
std::vector<std::string> DedentLines(std::string_view code);

}  // namespace patchgen::rewriter
