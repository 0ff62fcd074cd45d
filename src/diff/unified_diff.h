// Unified diff (3 lines of context by default) in the format `patch -p1` applies, including
// `\ No newline at end of file` and hunk headers for empty files (`@@ -0,0 +1,3 @@`).
#pragma once

#include <string>
#include <string_view>

namespace patchgen::diff {

/// Returns "" when `a == b`. Labels are printed after `--- ` / `+++ ` as given (e.g. "a/x.py").
std::string UnifiedDiff(std::string_view a, std::string_view b, std::string_view a_label,
                        std::string_view b_label, int context = 3);

}  // namespace patchgen::diff
