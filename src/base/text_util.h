// Small text helpers shared by every layer: edit distance for "did you mean", joining names,
// indentation handling.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace patchgen {

/// Levenshtein distance.
size_t EditDistance(std::string_view a, std::string_view b);

/// The closest candidate to `name` if it is close enough to be a plausible typo
/// (distance <= max(1, len/3)); ties go to the earlier candidate.
std::optional<std::string> DidYouMean(std::string_view name, const std::vector<std::string>& candidates);

/// "a, b, c" (at most `limit` names, then ", ... (N more)").
std::string JoinNames(const std::vector<std::string>& names, size_t limit = 12);

/// Splits into lines keeping no terminators; a trailing '\n' does not produce an empty last line.
std::vector<std::string_view> SplitLines(std::string_view text);

}  // namespace patchgen
