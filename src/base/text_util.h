// Small text helpers shared by every layer: edit distance for "did you mean", joining names,
// indentation handling.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace patchgen {

/// Levenshtein distance.
size_t EditDistance(std::string_view a, std::string_view b);

/// The closest candidate to `name` if it is close enough to be a plausible typo
/// (distance <= max(1, len/3)); ties go to the earlier candidate.
std::optional<std::string> DidYouMean(std::string_view name,
                                      const std::vector<std::string>& candidates);

/// `help` after "did you mean '<closest>'? " when `name` is a plausible typo of one of
/// `candidates` (DidYouMean), else `help` unchanged: the one way a help line suggests a name.
std::string WithDidYouMean(std::string_view name, const std::vector<std::string>& candidates,
                           std::string help);

/// "did you mean '<closest>'?" when `name` is a plausible typo of one of `candidates`, else
/// `otherwise`: for help lines where the suggestion replaces the general advice.
std::string DidYouMeanOr(std::string_view name, const std::vector<std::string>& candidates,
                         std::string otherwise);

/// "a, b, c" (at most `limit` names, then ", ... (N more)").
std::string JoinNames(const std::vector<std::string>& names, size_t limit = 12);

/// Byte offset of the start of the line holding `offset`.
uint32_t LineStartOf(std::string_view text, uint32_t offset);

/// Byte offset of the end of the line holding `offset`: its '\n', or the end of `text`.
uint32_t LineEndOf(std::string_view text, uint32_t offset);

/// True when `line` holds only spaces, tabs or '\r'.
bool IsBlank(std::string_view line);

/// Splits into lines keeping no terminators; a trailing '\n' does not produce an empty last line.
std::vector<std::string_view> SplitLines(std::string_view text);

}  // namespace patchgen
