// The exclude stage: top-level definitions left out, and their entries in `__all__`.
#include <tree_sitter/api.h>

#include <algorithm>

#include "base/text_util.h"
#include "parser/ts_node.h"
#include "rewriter/stages.h"

namespace patchgen::rewriter {
namespace {

using parser::Field;
using parser::Is;
using parser::PyModule;
using parser::RangeOf;
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

/// The list/tuple literal of the last top-level `__all__ = [...]` and its string items.
void FindAllList(const PyModule& up, ByteRange& list, std::vector<ByteRange>& items) {
  for (const TopLevelStatement& s : up.top_level()) {
    if (s.kind != TopLevelStatement::Kind::kAssignment ||
        std::find(s.names.begin(), s.names.end(), "__all__") == s.names.end()) {
      continue;
    }
    TSNode n = NodeAt(up.root(), s.range);
    while (!ts_node_is_null(n) && !Is(n, "assignment")) {
      n = ts_node_named_child_count(n) > 0 ? ts_node_named_child(n, 0) : TSNode{};
      if (ts_node_is_null(n)) break;
    }
    if (ts_node_is_null(n)) continue;
    TSNode right = Field(n, "right");
    if (ts_node_is_null(right) || !(Is(right, "list") || Is(right, "tuple"))) continue;
    list = RangeOf(right);
    items.clear();
    for (uint32_t i = 0; i < ts_node_named_child_count(right); ++i) {
      TSNode c = ts_node_named_child(right, i);
      if (!Is(c, "comment")) items.push_back(RangeOf(c));
    }
  }
}

}  // namespace

ExcludeStage PlanExcludes(const spec::PatchSpec& spec, const PyModule& up) {
  ExcludeStage st;
  std::vector<size_t> all_removed;
  const spec::LocatedName* first_in_all = nullptr;
  std::vector<ByteRange> all_items;
  ByteRange all_list{};
  FindAllList(up, all_list, all_items);
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
    std::string_view list = up.Text(all_list);
    text = std::string(1, list.front()) + std::string(1, list.back());
  } else {
    text = SpliceRange(up.source(), all_list, RemoveListItems(all_items, all_removed));
  }
  st.out.edits.push_back(TextEdit{all_list, text, first_in_all->loc,
                                  "exclude " + first_in_all->name + " from __all__", std::nullopt});
  return st;
}

}  // namespace patchgen::rewriter
