// GuardPlanner (guard_planner.h): the checks that refuse a guard whose generated code CPython
// would reject or run differently from what the spec means (docs/guards.md, "Refused targets"):
// an entry guard in a generator, an async generator or `__init__`, an entry guard whose names a
// later `global`/`nonlocal` declaration of the function declares, and a slot name that the
// guarded function (module scope) or the owner class (instance scope) already uses.
#include <string>
#include <string_view>
#include <vector>

#include "base/text_util.h"
#include "base/unicode_nfkc.h"
#include "parser/tree_queries.h"
#include "parser/ts_node.h"
#include "rewriter/guard_planner.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using spec::Guard;
using spec::Slot;

/// True when identifier `name` occurs as a whole word in `text` (both compared as Python reads
/// names: NFKC when not ASCII).
bool UsesWord(std::string_view text, std::string_view name) {
  std::string text_key, name_key;
  text = IdentifierKeyView(text, text_key);
  name = IdentifierKeyView(name, name_key);
  auto ident = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
           static_cast<unsigned char>(c) >= 0x80;
  };
  for (size_t at = text.find(name); at != std::string_view::npos; at = text.find(name, at + 1)) {
    bool before = at > 0 && ident(text[at - 1]);
    bool after = at + name.size() < text.size() && ident(text[at + name.size()]);
    if (!before && !after) return true;
  }
  return false;
}

std::string Trimmed(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\r") - b + 1));
}

}  // namespace

/// Why an entry guard cannot go into `def` (a generator, an async generator, `__init__`), or "".
std::string GuardPlanner::EntryRefusal(const Definition& def) const {
  const auto& defs = up_.definitions();
  bool method = def.parent >= 0 && defs[def.parent].kind == Definition::Kind::kClass;
  if (method && def.name == "__init__") {
    return "an entry guard's `return <call>` in __init__ returns a value, which CPython refuses "
           "at run time (TypeError: __init__() should return None)";
  }
  std::vector<TSNode> yields = parser::OwnScopeNodes(BodyBlock(up_, def), {"yield"});
  if (yields.empty()) return "";
  std::string line = std::to_string(up_.lines().LineOf(ts_node_start_byte(yields.front())) + 1);
  if (def.is_async) {
    return "'" + def.qualname + "' is an async generator (`yield` at line " + line +
           "), where CPython rejects `return <value>` (SyntaxError)";
  }
  return "'" + def.qualname + "' is a generator (`yield` at line " + line +
         "): an entry guard's `return <call>` would end the iteration and drop the kernel's "
         "result instead of returning it";
}

/// Refuses an entry guard that cannot go into `def` (EntryRefusal) or whose names a later
/// `global`/`nonlocal` declaration of `def` declares (CPython: "name used prior to global
/// declaration"). The guard goes after the leading declarations (LeadingDeclarationsEnd).
bool GuardPlanner::CheckEntry(const Slot& slot, const Guard& g, const Definition& def,
                              const PreparedCall& call) {
  if (std::string why = EntryRefusal(def); !why.empty()) {
    errors_.push_back(ErrorAt(g.in_loc,
                              "cannot put an entry guard into '" + def.qualname + "': " + why,
                              "use a call-site guard (`at`) on the statement to replace, or "
                              "guard a function that returns the result"));
    return false;
  }
  std::string used = slot.name;
  for (const std::string& l : call.lines) used += "\n" + l;
  TSNode block = BodyBlock(up_, def);
  uint32_t after = LeadingDeclarationsEnd(def);
  for (TSNode decl : parser::OwnScopeNodes(block, {"global_statement", "nonlocal_statement"})) {
    if (ts_node_start_byte(decl) < after) continue;
    for (uint32_t i = 0; i < ts_node_named_child_count(decl); ++i) {
      std::string_view name = up_.Text(parser::RangeOf(ts_node_named_child(decl, i)));
      if (!UsesWord(used, name)) continue;
      uint32_t line = up_.lines().LineOf(ts_node_start_byte(decl)) + 1;
      std::string keyword(parser::TypeOf(decl).substr(0, parser::TypeOf(decl).find('_')));
      errors_.push_back(
          ErrorAt(g.in_loc,
                  "the entry guard in '" + def.qualname + "' uses '" + std::string(name) +
                      "', which line " + std::to_string(line) + " declares `" + keyword +
                      "` later (CPython: name '" + std::string(name) + "' is used prior to " +
                      keyword + " declaration)",
                  "rename the slot, or use a call-site guard (`at`) after the declaration"));
      return false;
    }
  }
  return true;
}

/// End of the leading `global`/`nonlocal` statements of `def`'s body (after its docstring);
/// 0 when the body does not start with one.
uint32_t GuardPlanner::LeadingDeclarationsEnd(const Definition& def) const {
  uint32_t end = 0;
  for (TSNode s : parser::BlockStatements(BodyBlock(up_, def))) {
    if (def.docstring && parser::RangeOf(s) == *def.docstring) continue;
    if (!parser::Is(s, "global_statement") && !parser::Is(s, "nonlocal_statement")) break;
    end = ts_node_end_byte(s);
  }
  return end;
}

/// Refuses a slot whose name the guarded function already uses (module scope: a parameter or a
/// local would shadow the module-level slot) or whose `self.<name>` the owner class already uses
/// (instance scope: the binding would clobber it, or be clobbered).
bool GuardPlanner::CheckSlotName(const Slot& slot, const Guard& g, const Definition& def) {
  bool instance = slot.scope == Slot::Scope::kInstance;
  const Definition& where = instance ? up_.definitions()[def.parent] : def;
  TSNode node = DefNode(up_, where);
  std::vector<ByteRange> uses;
  if (instance) {
    uses = parser::AttributeReferences(node, up_.source(), "self." + slot.name);
    for (const std::string& m : up_.ChildNames(where, Definition::Kind::kFunction)) {
      if (m == slot.name) uses.push_back(up_.Find(where.qualname + "." + m)->name_range);
    }
  } else {
    uses = parser::NameReferences(parser::Field(node, "parameters"), up_.source(), slot.name);
    for (ByteRange r : parser::NameReferences(parser::Field(node, "body"), up_.source(), slot.name))
      uses.push_back(r);
  }
  if (uses.empty()) return true;
  uint32_t line = up_.lines().LineOf(uses.front().start) + 1;
  std::string what = instance ? "`self." + slot.name + "`" : "the name '" + slot.name + "'";
  errors_.push_back(ErrorAt(
      g.in_loc,
      "slot '" + slot.name + "' clashes with " + what + " that " + where.qualname +
          " already uses (line " + std::to_string(line) + ": " +
          Trimmed(up_.lines().LineText(line - 1)) + ")",
      instance ? "the binding in __init__ would clobber that attribute or be clobbered by it; "
                 "choose a slot name the class does not use"
               : "a parameter or local of that name would shadow the module-level slot in the "
                 "guard; choose a slot name the function does not use"));
  return false;
}

}  // namespace patchgen::rewriter
