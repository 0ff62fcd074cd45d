#include "rewriter/fingerprint.h"

#include <algorithm>

#include "base/unicode_nfkc.h"
#include "parser/ts_node.h"
#include "rewriter/sha256.h"

namespace patchgen::rewriter {
namespace {

using parser::RangeOf;
using parser::TypeOf;

/// A leaf token of the region, or a mark of its structure (`marker` != 0, `range` unused): a
/// statement's start (';'), a block's start ('{') and end ('}'), so that moving a statement into
/// or out of a block, or splitting one statement into two, changes the fingerprint.
struct Token {
  ByteRange range;
  char marker = 0;
  bool identifier = false;  ///< Hashed as Python compares it (NFKC): `ﬁnd` and `find` agree.
};

bool Inside(ByteRange r, const std::vector<ByteRange>& skip) {
  for (const ByteRange& s : skip) {
    if (s.start <= r.start && r.end <= s.end && s.end > s.start) return true;
  }
  return false;
}

bool Overlaps(ByteRange a, ByteRange b) { return a.start < b.end && b.start < a.end; }

/// What one walk collects: the tokens of `range` outside `skip`.
struct Walk {
  ByteRange range;
  const std::vector<ByteRange>& skip;
  std::vector<Token>& out;
};

/// A node whose children the walk is visiting.
struct Frame {
  uint32_t children = 0;             ///< Its child count.
  uint32_t index = 0;                ///< Index of the child the cursor is on.
  bool drop_trailing_comma = false;  ///< A trailing comma before its closing bracket is formatting.
  bool statements = false;           ///< Its children are statements (a block, the module).
  bool close = false;                ///< A block inside the range: mark its end when leaving it.
  bool whole = false;                ///< The node lies inside the range.
};

/// Visits the cursor's node (`parent`: the frame of its parent, null for the walk's root): adds
/// its token or its marks to `w.out`; when its children are to be walked, pushes its frame, moves
/// the cursor to its first child and returns true. Strings are one token; comments are left out.
/// A block is marked only when the statement that owns it lies inside the range too: the block
/// around a range of statements is where they are, not what they are (a leading comment can make
/// tree-sitter start a block at the range's first statement).
bool Visit(Walk& w, TSTreeCursor& cursor, const Frame* parent, std::vector<Frame>& stack) {
  const bool statement = parent && parent->statements;
  TSNode node = ts_tree_cursor_current_node(&cursor);
  ByteRange r = RangeOf(node);
  if (!Overlaps(r, w.range) && !(r.start == r.end && w.range.Contains(r.start))) return false;
  std::string_view t = TypeOf(node);
  // A `;` between two statements is said by the statement marks (`a = 1; b = 2` is two lines).
  if (t == "comment" || (statement && t == ";")) return false;
  bool whole = r.start >= w.range.start && r.end <= w.range.end && !Inside(r, w.skip);
  if (statement && whole && r.end > r.start) w.out.push_back({r, ';'});
  uint32_t n = ts_node_child_count(node);
  if (n == 0 || t == "string") {
    if (whole && r.end > r.start) w.out.push_back({r, 0, t == "identifier"});
    return false;
  }
  // A trailing comma before the closing bracket of a parameter list, an argument list or a
  // list/dict/set display is formatting (black's "magic trailing comma"); in a tuple it is not.
  Frame f;
  f.children = n;
  f.drop_trailing_comma = t == "parameters" || t == "argument_list" || t == "list" ||
                          t == "dictionary" || t == "set" || t == "lambda_parameters";
  f.statements = t == "block" || t == "module";
  f.close = t == "block" && whole && parent && parent->whole;
  f.whole = whole;
  if (f.close) w.out.push_back({r, '{'});
  stack.push_back(f);
  ts_tree_cursor_goto_first_child(&cursor);
  return true;
}

/// Visits the child the cursor is on and moves to what comes next: into its children, or to its
/// next sibling. False when the frame is done (no next sibling, or the child starts after the
/// range, as every later one does).
bool Step(Walk& w, TSTreeCursor& cursor, std::vector<Frame>& stack) {
  TSNode c = ts_tree_cursor_current_node(&cursor);
  if (ts_node_start_byte(c) > w.range.end) return false;
  const Frame f = stack.back();
  bool dropped = f.drop_trailing_comma && f.index + 2 == f.children && TypeOf(c) == ",";
  ++stack.back().index;
  if (!dropped && Visit(w, cursor, &f, stack)) return true;
  return ts_tree_cursor_goto_next_sibling(&cursor);
}

/// The tokens of the cursor's node inside `w.range`, walked without recursion (any nesting
/// depth). The children are walked with the cursor (tree-sitter 0.20's ts_node_child(i) walks
/// the first i children, which made a module's top level quadratic); the cursor is back on the
/// node when it returns.
void Collect(Walk& w, TSTreeCursor& cursor) {
  std::vector<Frame> stack;
  if (!Visit(w, cursor, nullptr, stack)) return;
  while (!stack.empty()) {
    if (Step(w, cursor, stack)) continue;
    do {  // Leave finished frames up to one whose node has a next sibling.
      if (stack.back().close) w.out.push_back({{}, '}'});
      stack.pop_back();
      ts_tree_cursor_goto_parent(&cursor);
    } while (!stack.empty() && !ts_tree_cursor_goto_next_sibling(&cursor));
  }
}

/// What a token adds to the hashed stream: its text, an identifier's in NFKC.
std::string TokenText(const parser::PyModule& module, const Token& t) {
  std::string_view text = module.Text(t.range);
  return t.identifier ? IdentifierKey(text) : std::string(text);
}

}  // namespace

Fingerprint FingerprintOf(const parser::PyModule& module, const std::vector<ByteRange>& ranges,
                          const std::vector<ByteRange>& skip) {
  std::vector<Token> tokens;
  TSTreeCursor cursor = ts_tree_cursor_new(module.root());
  for (const ByteRange& range : ranges) {
    Walk w{range, skip, tokens};
    Collect(w, cursor);
  }
  ts_tree_cursor_delete(&cursor);
  Fingerprint fp;
  std::string stream;
  const LineIndex& lines = module.lines();
  // Display text: per source line, the source from its first token to its last (comments and
  // skipped tokens left out), indented two spaces per indentation step relative to the first line.
  std::vector<uint32_t> stack;  // Indentation columns seen, for steps.
  uint32_t group_start = 0, group_end = 0, group_line = UINT32_MAX, group_col = 0;
  auto flush = [&] {
    if (group_line == UINT32_MAX) return;
    if (stack.empty()) {
      stack = {group_col};
    } else {
      fp.text += '\n';
      uint32_t col = std::max(group_col, stack.front());
      while (stack.size() > 1 && stack.back() > col) stack.pop_back();
      if (stack.back() < col) stack.push_back(col);
    }
    fp.text += std::string(2 * (stack.size() - 1), ' ');
    fp.text += module.Text({group_start, group_end});
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) stream += '\x1f';
    if (tokens[i].marker) {
      stream += '\x02';  // not the text of any token: a token is never a lone control character
      stream += tokens[i].marker;
      continue;
    }
    ++fp.tokens;
    const ByteRange& r = tokens[i].range;
    stream += TokenText(module, tokens[i]);
    uint32_t line = lines.LineOf(r.start);
    uint32_t end_line_of_group = group_line == UINT32_MAX ? 0 : lines.LineOf(group_end - 1);
    if (group_line == UINT32_MAX || (line != group_line && line > end_line_of_group)) {
      flush();
      group_start = r.start;
      group_line = line;
      group_col = r.start - lines.LineStart(line);
    }
    group_end = r.end;
  }
  flush();
  fp.sha256 = Sha256Hex(stream);
  return fp;
}

Fingerprint AbsentFingerprint() {
  Fingerprint fp;
  fp.text = "(absent)";
  fp.sha256 = Sha256Hex("\x1f(absent)");
  return fp;
}

ContractPin MakePin(const parser::PyModule& up, std::string key, std::string region,
                    std::string expects, std::string qualname, const SourceLoc& loc,
                    const std::vector<ByteRange>& ranges, const std::vector<ByteRange>& skip) {
  ContractPin pin{std::move(key),
                  std::move(region),
                  std::move(expects),
                  std::move(qualname),
                  loc,
                  0,
                  0,
                  {},
                  {}};
  Fingerprint fp = ranges.empty() ? AbsentFingerprint() : FingerprintOf(up, ranges, skip);
  if (!ranges.empty()) {
    pin.first_line = up.lines().LineOf(ranges.front().start) + 1;
    uint32_t last = 0;
    for (const ByteRange& r : ranges) {
      last = std::max(last, up.lines().LineOf(r.end > r.start ? r.end - 1 : r.start) + 1);
    }
    pin.last_line = last;
  }
  pin.sha256 = std::move(fp.sha256);
  pin.text = std::move(fp.text);
  return pin;
}

std::optional<ContractPin> RefingerprintContract(const ContractPin& pin,
                                                 const parser::PyModule& upstream) {
  ContractPin out = pin;
  const parser::Definition* def = upstream.Find(pin.qualname);
  std::vector<ByteRange> ranges, skip;
  if (pin.region == "absent") {
    if (!def) {
      Fingerprint fp = AbsentFingerprint();
      out.sha256 = fp.sha256;
      out.text = fp.text;
      return out;
    }
    out.text = "(defined upstream)";
    out.sha256 = Sha256Hex(out.text);
    out.first_line = out.last_line = def->line;
    return out;
  }
  if (!def || pin.region == "statements") return std::nullopt;
  if (pin.region == "function") {
    ranges.push_back(def->definition);
    if (def->docstring) skip.push_back(*def->docstring);
  } else {
    ranges.push_back({def->definition.start, def->header.end});
    if (pin.key.starts_with("modify_init ")) {
      const parser::Definition* init = upstream.Find(pin.qualname + ".__init__");
      if (!init) return std::nullopt;
      ranges.push_back({init->definition.start, init->header.end});
    }
  }
  Fingerprint fp = FingerprintOf(upstream, ranges, skip);
  out.sha256 = fp.sha256;
  out.text = fp.text;
  out.first_line = upstream.lines().LineOf(ranges.front().start) + 1;
  out.last_line = upstream.lines().LineOf(ranges.back().end - 1) + 1;
  return out;
}

}  // namespace patchgen::rewriter
