#include "spec/raw_node.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include "base/line_index.h"
#include "base/unicode_nfkc.h"

namespace patchgen::spec {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

// End of a quoted scalar starting at `pos` (its quote): after the closing quote, or `eol`.
uint32_t QuotedEnd(const std::string& text, size_t pos, size_t eol) {
  char q = text[pos];
  for (size_t i = pos + 1; i < eol; ++i) {
    if (q == '"' && text[i] == '\\') {
      ++i;  // An escaped character.
    } else if (text[i] == q && q == '\'' && i + 1 < eol && text[i + 1] == '\'') {
      ++i;  // '' inside a single-quoted scalar.
    } else if (text[i] == q) {
      return static_cast<uint32_t>(i + 1);
    }
  }
  return static_cast<uint32_t>(eol);
}

// End of a plain scalar starting at `pos`: before a comment, a `: ` (keys) or, in flow context, a
// flow indicator; trailing spaces left out.
uint32_t PlainEnd(const std::string& text, size_t pos, size_t eol, bool flow) {
  size_t i = pos;
  for (; i < eol; ++i) {
    char c = text[i];
    if (c == '#' && i > pos && IsSpace(text[i - 1])) break;
    if (c == ':' && (i + 1 == eol || IsSpace(text[i + 1]) || (flow && text[i + 1] == ','))) break;
    if (flow && (c == ',' || c == ']' || c == '}')) break;
  }
  while (i > pos && IsSpace(text[i - 1])) --i;
  return static_cast<uint32_t>(i);
}

// End of the token that starts at `pos` on its line: a quoted scalar up to its closing quote, a
// block indicator (`|-`, `>2`), or a plain scalar up to a comment, a `: ` (keys) or, in flow
// context, a flow indicator.
uint32_t TokenEnd(const std::string& text, uint32_t pos, RawNode::Style style, bool flow) {
  size_t eol = text.find('\n', pos);
  if (eol == std::string::npos) eol = text.size();
  if (eol > pos && text[eol - 1] == '\r') --eol;
  if (style == RawNode::Style::kQuoted) return QuotedEnd(text, pos, eol);
  if (style == RawNode::Style::kLiteral || style == RawNode::Style::kFolded) {
    size_t i = pos;
    while (i < eol && !IsSpace(text[i])) ++i;
    return static_cast<uint32_t>(i);
  }
  return PlainEnd(text, pos, eol, flow);
}

RawNode::Style StyleAt(const std::string& text, uint32_t pos) {
  if (pos >= text.size()) return RawNode::Style::kPlain;
  switch (text[pos]) {
    case '"':
    case '\'':
      return RawNode::Style::kQuoted;
    case '|':
      return RawNode::Style::kLiteral;
    case '>':
      return RawNode::Style::kFolded;
    default:
      return RawNode::Style::kPlain;
  }
}

// Bounds on the tree built from one spec: aliases are expanded (a node reached through an alias
// is converted again), so a small file could otherwise name a huge or, with a recursive alias,
// an endless tree.
constexpr size_t kMaxNodes = 1000000;
constexpr size_t kMaxDepth = 200;

struct Walk {
  explicit Walk(const std::string& t) : text(t) {}
  const std::string& text;
  size_t nodes = 0;
  std::vector<YAML::Node> ancestors;  ///< The nodes being converted, outermost first.
  bool failed = false;
  uint32_t error_pos = 0;
  std::string error, help;
};

uint32_t PosOf(const YAML::Node& node, const std::string& text) {
  YAML::Mark mark = node.Mark();
  return mark.is_null() ? 0 : static_cast<uint32_t>(std::min<size_t>(mark.pos, text.size()));
}

// True (with the error in `w`) when converting `node` at `pos` would pass kMaxNodes or kMaxDepth.
bool OverLimits(const YAML::Node& node, Walk& w, uint32_t pos) {
  if (++w.nodes > kMaxNodes) {
    w.failed = true;
    w.error_pos = pos;
    w.error = "the spec has more than " + std::to_string(kMaxNodes) +
              " YAML nodes once aliases are expanded";
    w.help = "a spec is limited to " + std::to_string(kMaxNodes) +
             " nodes; write it without nested aliases";
    return true;
  }
  if (w.ancestors.size() < kMaxDepth) return false;
  w.failed = true;
  w.error_pos = pos;
  bool recursive = false;
  for (const YAML::Node& a : w.ancestors) recursive = recursive || a.is(node);
  if (recursive) {
    w.error = "recursive alias: this node contains itself";
    w.help = "an alias (`*name`) cannot refer to a node that contains it";
  } else {
    w.error = "the spec nests deeper than the limit of " + std::to_string(kMaxDepth) + " levels";
    w.help = "a spec's mappings and sequences nest at most " + std::to_string(kMaxDepth) +
             " levels deep";
  }
  return true;
}

RawNode Convert(const YAML::Node& node, Walk& w, bool flow);

void ConvertSequence(const YAML::Node& node, Walk& w, bool flow, RawNode& out) {
  const std::string& text = w.text;
  out.kind = RawNode::Kind::kSequence;
  for (const YAML::Node& item : node) {
    RawNode raw = Convert(item, w, flow);
    if (raw.kind == RawNode::Kind::kNull && !raw.explicit_null) {
      // An empty item (`-` alone) is marked at the next token; point at its `-` instead.
      uint32_t i = raw.range.start;
      while (i > 0 && (text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n' ||
                       text[i - 1] == '\r')) {
        --i;
      }
      if (i > 0 && text[i - 1] == '-') raw.range = ByteRange{i - 1, i};
    }
    out.items.push_back(std::move(raw));
  }
}

void ConvertMap(const YAML::Node& node, Walk& w, bool flow, RawNode& out) {
  out.kind = RawNode::Kind::kMapping;
  for (const auto& kv : node) {
    RawNode key = Convert(kv.first, w, flow);
    RawNode value = Convert(kv.second, w, flow);
    if (value.kind == RawNode::Kind::kNull && !value.explicit_null) {
      // yaml-cpp marks an empty value at the next token; point at the key instead.
      value.range = key.range;
    }
    out.entries.emplace_back(std::move(key), std::move(value));
  }
}

RawNode Convert(const YAML::Node& node, Walk& w, bool flow) {
  const std::string& text = w.text;
  RawNode out;
  uint32_t pos = PosOf(node, text);
  out.range = ByteRange{pos, pos};
  if (w.failed) return out;
  if (OverLimits(node, w, pos)) return out;
  struct Enter {
    Walk& w;
    Enter(Walk& w, const YAML::Node& n) : w(w) { w.ancestors.push_back(n); }
    ~Enter() { w.ancestors.pop_back(); }
  } enter(w, node);
  switch (node.Type()) {
    case YAML::NodeType::Scalar: {
      out.kind = RawNode::Kind::kScalar;
      out.scalar = node.Scalar();
      out.style = StyleAt(text, pos);
      out.range.end = std::max(pos + 1, TokenEnd(text, pos, out.style, flow));
      if (!IsWellFormedUtf8(out.scalar)) {
        // at the offending byte when the token shows it (yaml-cpp itself refuses escapes of
        // surrogates and of code points above U+10FFFF)
        std::string_view token = std::string_view(text).substr(pos, out.range.end - pos);
        size_t bad = FirstInvalidUtf8(token);
        w.failed = true;
        w.error_pos = pos + static_cast<uint32_t>(bad == std::string_view::npos ? 0 : bad);
        w.error = "this string is not valid UTF-8";
        w.help = "a spec is UTF-8 text; the names and code it holds are written into Python source";
      }
      break;
    }
    case YAML::NodeType::Sequence:
      ConvertSequence(node, w, flow || node.Style() == YAML::EmitterStyle::Flow, out);
      out.range.end = pos + 1;
      break;
    case YAML::NodeType::Map:
      ConvertMap(node, w, flow || node.Style() == YAML::EmitterStyle::Flow, out);
      out.range.end = pos + 1;
      break;
    default: {
      out.kind = RawNode::Kind::kNull;
      out.explicit_null =
          pos < text.size() && (text[pos] == '~' || text[pos] == 'n' || text[pos] == 'N');
      out.range.end =
          out.explicit_null ? TokenEnd(text, pos, RawNode::Style::kPlain, flow) : pos + 1;
      break;
    }
  }
  return out;
}

}  // namespace

const char* DescribeKind(const RawNode& node) {
  switch (node.kind) {
    case RawNode::Kind::kNull:
      return "nothing";
    case RawNode::Kind::kScalar:
      return "a string";
    case RawNode::Kind::kSequence:
      return "a sequence";
    case RawNode::Kind::kMapping:
      return "a mapping";
  }
  return "?";
}

Result<RawNode> ParseRawYaml(const std::string& path, const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own bound, far above ours
    LineIndex lines(text);
    uint32_t pos =
        e.mark.is_null() ? 0 : static_cast<uint32_t>(std::min<size_t>(e.mark.pos, text.size()));
    return MakeDiagnostic(
        path, text, lines, ByteRange{pos, pos + 1},
        "the spec nests deeper than the limit of " + std::to_string(kMaxDepth) + " levels",
        "a spec's mappings and sequences nest at most " + std::to_string(kMaxDepth) +
            " levels deep");
  } catch (const YAML::ParserException& e) {
    LineIndex lines(text);
    uint32_t pos =
        e.mark.is_null() ? 0 : static_cast<uint32_t>(std::min<size_t>(e.mark.pos, text.size()));
    return MakeDiagnostic(path, text, lines, ByteRange{pos, pos + 1}, "invalid YAML: " + e.msg);
  } catch (const YAML::Exception& e) {
    return ErrorAt(SourceLoc::InFile(path), std::string("invalid YAML: ") + e.msg);
  }
  Walk walk(text);
  RawNode out = Convert(root, walk, false);
  if (walk.failed) {
    LineIndex lines(text);
    return MakeDiagnostic(path, text, lines, ByteRange{walk.error_pos, walk.error_pos + 1},
                          walk.error, walk.help);
  }
  return out;
}

}  // namespace patchgen::spec
