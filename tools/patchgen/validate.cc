// Validate-only checks (see validate.h).
#include "validate.h"

#include <map>
#include <memory>

#include "base/line_index.h"
#include "base/text_util.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"

namespace patchgen::cli {
namespace {

/// The text of 1-based line `line` of `text`, or "".
std::string LineOf(const std::shared_ptr<const std::string>& text, uint32_t line) {
  if (!text || line == 0) return "";
  auto lines = SplitLines(*text);
  return line <= lines.size() ? std::string(lines[line - 1]) : "";
}

/// Parses `code` as a Python module; on a syntax error, a diagnostic located through `origin`.
void CheckParses(const std::string& code, const spec::TextOrigin& origin, const std::string& what,
                 std::vector<Diagnostic>& out) {
  parser::TreePtr tree = parser::ParseTree(code);
  if (!tree) return;
  std::optional<TSNode> deep = parser::NestedTooDeep(ts_tree_root_node(tree.get()));
  std::optional<TSNode> bad = deep ? deep : parser::FirstErrorNode(ts_tree_root_node(tree.get()));
  if (bad) {
    // tree-sitter's column counts bytes; a SourceLoc's counts code points, like every column
    // patchgen prints. `col_offset` is the block scalar's indentation (spaces: bytes = columns).
    LineCol at = LineIndex(code).At(ts_node_start_byte(*bad));
    SourceLoc loc;
    loc.path = origin.path;
    loc.line = origin.first_line + at.line - 1;
    loc.col = at.col + origin.col_offset;
    SetSourceLine(loc, LineOf(origin.file_text, loc.line));
    out.push_back(deep ? ErrorAt(loc,
                                 what + " nests deeper than " +
                                     std::to_string(parser::kMaxNesting) + " levels",
                                 "patchgen refuses code nested this deep, as CPython does")
                       : ErrorAt(loc, what + " does not parse as Python",
                                 "fix the syntax error at this position"));
  }
}

void CheckBody(const spec::Body& body, const std::string& what, std::vector<Diagnostic>& out) {
  if (body.source == spec::Body::Source::kCode) {
    CheckParses(body.text, body.origin, what, out);
  } else if (body.source == spec::Body::Source::kFile) {
    size_t before = out.size();
    CheckParses(body.text, body.origin, "patch file '" + body.file + "'", out);
    if (out.size() != before || body.symbol.empty()) return;
    auto module = parser::PyModule::Parse(body.origin.path, body.text);
    if (!module.ok()) return;
    if ((*module)->FindTopLevel(body.symbol) != nullptr) return;
    std::vector<std::string> names = (*module)->TopLevelNames();
    std::string help =
        WithDidYouMean(body.symbol, names, "definitions in " + body.file + ": " + JoinNames(names));
    out.push_back(ErrorAt(body.symbol_loc,
                          "no def or class '" + body.symbol + "' in '" + body.file + "'", help));
  }
}

}  // namespace

std::vector<Diagnostic> ValidateSpecWithoutUpstream(const spec::PatchSpec& spec) {
  std::vector<Diagnostic> out;
  for (const auto& block : spec.import_adds)
    CheckParses(block.code, block.origin, "added import", out);
  for (const auto& block : spec.blocks) CheckParses(block.code, block.origin, "block", out);
  for (const auto& patch : spec.patches) {
    CheckBody(patch.body,
              std::string("body of ") + spec::PatchKindKey(patch.kind) + " " + patch.target, out);
    for (const auto& edit : patch.edits) {
      if (edit.code.empty()) continue;  // delete
      CheckParses(edit.code, edit.code_origin,
                  std::string("code of ") + spec::PatchKindKey(patch.kind) + " " + patch.target +
                      " " + spec::EditOpKey(edit.op),
                  out);
    }
  }
  for (const auto& helper : spec.helpers) CheckBody(helper.body, "helper", out);

  std::map<std::string, const spec::Slot*> by_name;
  for (const auto& slot : spec.slots) {
    auto [it, inserted] = by_name.emplace(slot.name, &slot);
    if (!inserted && (it->second->op != slot.op || it->second->variant != slot.variant)) {
      out.push_back(ErrorAt(slot.loc,
                            "slot '" + slot.name + "' is declared again with op '" + slot.op +
                                "' variant '" + slot.variant + "'",
                            "it was declared with op '" + it->second->op + "' variant '" +
                                it->second->variant + "' at line " +
                                std::to_string(it->second->loc.line)));
    }
    for (const auto& guard : slot.guards) {
      CheckParses(guard.call, guard.call_origin, "guard call", out);
      if (slot.scope == spec::Slot::Scope::kInstance && guard.in.find('.') == std::string::npos) {
        out.push_back(
            ErrorAt(guard.in_loc,
                    "slot '" + slot.name + "' has scope: instance, so it can only guard methods",
                    "write the target as Class.method, or use scope: module"));
      }
    }
  }
  SortDiagnostics(out);
  return out;
}

}  // namespace patchgen::cli
