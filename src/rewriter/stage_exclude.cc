// The exclude stage: top-level definitions left out, and their entries in `__all__`.
#include <algorithm>

#include "base/text_util.h"
#include "parser/py_cst_queries.h"
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

}  // namespace

ExcludeStage PlanExcludes(const spec::PatchSpec& spec, const PyModule& up) {
  ExcludeStage st;
  std::vector<size_t> all_removed;
  const spec::LocatedName* first_in_all = nullptr;
  // `__all__`'s list literal (none: no items, nothing to remove from it).
  const parser::DunderAll all = parser::FindDunderAll(up).value_or(parser::DunderAll{});
  const std::vector<ByteRange>& all_items = all.items;
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
    for (size_t i = 0; i < all_items.size(); ++i) {
      std::string_view item = up.Text(all_items[i]);
      if (item.size() >= 2 && item.substr(1, item.size() - 2) == ex.name) {
        all_removed.push_back(i);
        if (!first_in_all) first_in_all = &ex;
      }
    }
  }
  if (all_removed.empty()) return st;
  std::sort(all_removed.begin(), all_removed.end());
  all_removed.erase(std::unique(all_removed.begin(), all_removed.end()), all_removed.end());
  std::string text;
  if (all_removed.size() == all_items.size()) {
    std::string_view list = up.Text(all.list);
    text = std::string(1, list.front()) + std::string(1, list.back());
  } else {
    text = SpliceRange(up.source(), all.list, RemoveListItems(all_items, all_removed));
  }
  st.out.edits.push_back(TextEdit{all.list, text, first_in_all->loc,
                                  "exclude " + first_in_all->name + " from __all__", std::nullopt});
  return st;
}

}  // namespace patchgen::rewriter
