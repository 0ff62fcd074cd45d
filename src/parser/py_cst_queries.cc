// Structural queries the rewriter asks of a parsed module (py_cst_queries.h).
#include "parser/py_cst_queries.h"

#include "parser/ts_node.h"

namespace patchgen::parser {

std::vector<TSNode> BlockStatements(TSNode block) {
  std::vector<TSNode> out;
  if (ts_node_is_null(block)) return out;
  // A cursor visits the children in one pass (ts_node_named_child(i) walks the first i each time).
  TSTreeCursor c = ts_tree_cursor_new(block);
  for (bool more = ts_tree_cursor_goto_first_child(&c); more;
       more = ts_tree_cursor_goto_next_sibling(&c)) {
    TSNode n = ts_tree_cursor_current_node(&c);
    if (ts_node_is_named(n) && !Is(n, "comment")) out.push_back(n);
  }
  ts_tree_cursor_delete(&c);
  return out;
}

TSNode LastStatement(const PyModule& m, const Definition& def) {
  std::vector<TSNode> stmts = BlockStatements(BodyBlock(m, def));
  return stmts.empty() ? TSNode{} : stmts.back();
}

std::optional<ByteRange> SuperInitStatement(const PyModule& m, const Definition& init) {
  for (TSNode s : BlockStatements(BodyBlock(m, init))) {
    if (!Is(s, "expression_statement")) continue;
    std::string_view text = m.Text(RangeOf(s));
    if (text.starts_with("super(") && text.find(".__init__(") != std::string_view::npos) {
      return RangeOf(s);
    }
  }
  return std::nullopt;
}

}  // namespace patchgen::parser
