// Unified diff on lines. dtl computes the edit script (deletions before additions in each run of
// changes); hunking, headers and the `\ No newline at end of file` marker are done here, since
// dtl writes no ---/+++ header and treats a missing final newline like any other line.
//
// Lines are compared with their terminator, so "x" at the end of a file without a final newline
// differs from "x\n" — exactly as GNU diff does, which is what lets `patch` reproduce the bytes.
#include "diff/unified_diff.h"

#include <algorithm>
#include <dtl/dtl.hpp>
#include <vector>

namespace patchgen::diff {
namespace {

/// Lines of `text`, each with its '\n' (the last one may lack it).
std::vector<std::string_view> LinesWithTerminators(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(start, end - start));
    start = end;
  }
  return lines;
}

struct Op {
  char mark;              // ' ', '-', '+'
  std::string_view line;  // with its terminator, if any
  size_t a_index;         // 0-based line index in `a` before this op
  size_t b_index;         // 0-based line index in `b` before this op
};

/// "l,s" of a hunk side in GNU style: ",1" is omitted; an empty side names the line before it.
std::string Range(size_t start, size_t count) {
  size_t first = count == 0 ? start : start + 1;
  if (count == 1) return std::to_string(first);
  return std::to_string(first) + "," + std::to_string(count);
}

void AppendLine(std::string& out, char mark, std::string_view line) {
  out += mark;
  out += line;
  if (line.empty() || line.back() != '\n') out += "\n\\ No newline at end of file\n";
}

/// The edit script of `a` → `b` as one op per line, with each op's position in both files.
std::vector<Op> EditOps(std::string_view a, std::string_view b) {
  const std::vector<std::string_view> a_lines = LinesWithTerminators(a);
  const std::vector<std::string_view> b_lines = LinesWithTerminators(b);
  dtl::Diff<std::string_view, std::vector<std::string_view>> engine(a_lines, b_lines,
                                                                    /*deletesFirst=*/true);
  engine.onHuge();
  engine.compose();

  std::vector<Op> ops;
  size_t ai = 0, bi = 0;
  for (const auto& [line, info] : engine.getSes().getSequence()) {
    if (info.type == dtl::SES_COMMON) {
      ops.push_back({' ', line, ai++, bi++});
    } else if (info.type == dtl::SES_DELETE) {
      ops.push_back({'-', line, ai++, bi});
    } else {
      ops.push_back({'+', line, ai, bi++});
    }
  }
  return ops;
}

/// Ops [begin, end) of one hunk.
struct Hunk {
  size_t begin;
  size_t end;
};

/// The hunk around the change at ops[first_change]: `ctx` lines of context before it, extended
/// while the gap to the following change is at most 2*ctx, then `ctx` lines of context after.
Hunk HunkFrom(const std::vector<Op>& ops, size_t first_change, size_t ctx) {
  size_t begin = first_change >= ctx ? first_change - ctx : 0;
  size_t last_change = first_change;
  for (size_t j = first_change; j < ops.size(); ++j) {
    if (ops[j].mark != ' ') {
      last_change = j;
    } else if (j - last_change > 2 * ctx) {
      break;
    }
  }
  return {begin, std::min(ops.size(), last_change + 1 + ctx)};
}

/// "@@ -a +b @@" and the hunk's lines.
void AppendHunk(std::string& out, const std::vector<Op>& ops, Hunk h) {
  size_t a_count = 0, b_count = 0;
  for (size_t k = h.begin; k < h.end; ++k) {
    if (ops[k].mark != '+') ++a_count;
    if (ops[k].mark != '-') ++b_count;
  }
  out += "@@ -" + Range(ops[h.begin].a_index, a_count) + " +" +
         Range(ops[h.begin].b_index, b_count) + " @@\n";
  for (size_t k = h.begin; k < h.end; ++k) AppendLine(out, ops[k].mark, ops[k].line);
}

}  // namespace

std::string UnifiedDiff(std::string_view a, std::string_view b, std::string_view a_label,
                        std::string_view b_label, int context) {
  if (a == b) return "";
  const std::vector<Op> ops = EditOps(a, b);
  const size_t ctx = context < 0 ? 0 : static_cast<size_t>(context);
  std::string out;
  out += "--- ";
  out += a_label;
  out += "\n+++ ";
  out += b_label;
  out += "\n";

  size_t i = 0;
  while (i < ops.size()) {
    // The next change starts a hunk.
    while (i < ops.size() && ops[i].mark == ' ') ++i;
    if (i == ops.size()) break;
    Hunk h = HunkFrom(ops, i, ctx);
    AppendHunk(out, ops, h);
    i = h.end;
  }
  return out;
}

}  // namespace patchgen::diff
