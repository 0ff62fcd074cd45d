// The exclude stage: top-level definitions left out, and their entries in `__all__`.
#include <algorithm>

#include "base/text_util.h"
#include "base/unicode_nfkc.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"
#include "rewriter/stages.h"

namespace patchgen::rewriter {
namespace {

using parser::PyModule;
using parser::TopLevelStatement;

/// Range removing a top-level statement's lines (with its attached comments) and the blank
/// lines before it, so that the blank lines that separated it from the next statement now
/// separate the previous one from it: spacing stays as upstream had it.
ByteRange ExcludedRange(const std::string& src, ByteRange stmt) {
  uint32_t start = LineStartOf(src, stmt.start);
  while (start > 0) {
    uint32_t prev = LineStartOf(src, start - 1);
    if (!IsBlank(std::string_view(src).substr(prev, start - 1 - prev))) break;
    start = prev;
  }
  return {start, WholeLines(src, stmt).end};
}

/// The list literals of `__all__`: the value of its last plain assignment (FindDunderAll) and
/// of every top-level `__all__ += [...]` (or `(...)`), in source order.
std::vector<parser::DunderAll> DunderAllLists(const PyModule& up) {
  std::vector<parser::DunderAll> out;
  if (std::optional<parser::DunderAll> all = parser::FindDunderAll(up)) out.push_back(*all);
  TSNode root = up.root();
  for (uint32_t i = 0; i < ts_node_named_child_count(root); ++i) {
    TSNode stmt = ts_node_named_child(root, i);
    if (!parser::Is(stmt, "expression_statement") || ts_node_named_child_count(stmt) != 1) continue;
    TSNode aug = ts_node_named_child(stmt, 0);
    if (!parser::Is(aug, "augmented_assignment")) continue;
    TSNode left = parser::Field(aug, "left");
    TSNode op = parser::Field(aug, "operator");
    TSNode right = parser::Field(aug, "right");
    if (ts_node_is_null(left) || !SameIdentifier(up.Text(parser::RangeOf(left)), "__all__") ||
        ts_node_is_null(op) || up.Text(parser::RangeOf(op)) != "+=" || ts_node_is_null(right) ||
        !(parser::Is(right, "list") || parser::Is(right, "tuple"))) {
      continue;
    }
    parser::DunderAll extra{parser::RangeOf(right), {}};
    for (uint32_t j = 0; j < ts_node_named_child_count(right); ++j) {
      TSNode item = ts_node_named_child(right, j);
      if (!parser::Is(item, "comment")) extra.items.push_back(parser::RangeOf(item));
    }
    out.push_back(std::move(extra));
  }
  return out;
}

/// The edit removing the entries of `excluded` from one `__all__` list, if it names any.
std::optional<TextEdit> RemoveFromAll(const PyModule& up, const parser::DunderAll& all,
                                      const std::vector<const spec::LocatedName*>& excluded) {
  std::vector<size_t> removed;
  const spec::LocatedName* first = nullptr;
  for (size_t i = 0; i < all.items.size(); ++i) {
    std::string_view item = up.Text(all.items[i]);
    for (const spec::LocatedName* ex : excluded) {
      if (item.size() < 2 || item.substr(1, item.size() - 2) != ex->name) continue;
      removed.push_back(i);
      if (!first) first = ex;
      break;
    }
  }
  if (removed.empty()) return std::nullopt;
  std::string text;
  if (removed.size() == all.items.size()) {
    std::string_view list = up.Text(all.list);
    text = std::string(1, list.front()) + std::string(1, list.back());
  } else {
    text = SpliceRange(up.source(), all.list, RemoveListItems(all.items, removed));
  }
  return TextEdit{all.list, text, first->loc, "exclude " + first->name + " from __all__",
                  std::nullopt};
}

}  // namespace

ExcludeStage PlanExcludes(const spec::PatchSpec& spec, const PyModule& up) {
  ExcludeStage st;
  for (const spec::LocatedName& ex : spec.excludes) {
    const TopLevelStatement* s = TopLevelBinding(up, ex.name);
    if (!s) {
      st.out.errors.push_back(MissingTopLevel(up, ex.loc, "exclude", ex.name));
      continue;
    }
    st.out.edits.push_back(TextEdit{ExcludedRange(up.source(), s->range), "", ex.loc,
                                    "exclude " + ex.name, std::nullopt});
    st.out.applied.push_back({"exclude", ex.name, ""});
    st.excluded.push_back(&ex);
  }
  for (const parser::DunderAll& all : DunderAllLists(up)) {
    if (std::optional<TextEdit> e = RemoveFromAll(up, all, st.excluded)) {
      st.out.edits.push_back(std::move(*e));
    }
  }
  return st;
}

}  // namespace patchgen::rewriter
