// config_slot: an implementation chosen from the model config when the model is built
// (docs/spec-format.md, "Config slots"). The patch sets `self.<name> = ConfigSlot(...)` in the
// class's `__init__`, right after its `super().__init__(...)` call (else at the end), bound from
// the `config` parameter; the runtime (opslot.ConfigSlot) checks the value against `values`.
#include <algorithm>

#include "base/text_util.h"
#include "base/unicode_nfkc.h"
#include "parser/tree_queries.h"
#include "rewriter/fingerprint.h"
#include "rewriter/patch_planners.h"

namespace patchgen::rewriter {
namespace {

using parser::Definition;
using parser::PyModule;
using spec::Patch;

bool IsIdentChar(char c) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         static_cast<unsigned char>(c) >= 0x80;
}

/// Whether `init` has a parameter named `config` (plain, typed or with a default).
bool HasConfigParameter(const PyModule& up, const Definition& init) {
  std::vector<std::string> names = parser::ParameterNames(up, init);
  return std::find(names.begin(), names.end(), "config") != names.end();
}

/// The 1-based upstream line where `init` assigns `self.<name>` (`=` or an annotation), or 0.
/// Names as Python reads them: a body that is not ASCII is searched in its NFKC form (which keeps
/// every newline), so `self.ｋernel = ...` sets `kernel`.
uint32_t AssignsSelfAttribute(const PyModule& up, const Definition& init, const std::string& name) {
  std::string key;
  std::string_view body = IdentifierKeyView(up.Text(init.body), key);
  std::string needle = "self." + name;
  for (size_t at = body.find(needle); at != std::string_view::npos;
       at = body.find(needle, at + 1)) {
    size_t end = at + needle.size();
    bool before_ok = at == 0 || !(IsIdentChar(body[at - 1]) || body[at - 1] == '.');
    if (!before_ok || (end < body.size() && IsIdentChar(body[end]))) continue;
    size_t next = body.find_first_not_of(" \t", end);
    if (next == std::string_view::npos) continue;
    bool assigns = (body[next] == '=' && (next + 1 >= body.size() || body[next + 1] != '=')) ||
                   body[next] == ':';
    if (assigns) {
      auto newlines =
          std::count(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(at), '\n');
      return up.lines().LineOf(init.body.start) + 1 + static_cast<uint32_t>(newlines);
    }
  }
  return 0;
}

/// The generated statement: `self.<name> = ConfigSlot("<Class>.<name>", "<attribute>", (...),
/// default="...").bind_from(config, owner=self)`: `owner=self` names the module whose slots a
/// saved ops choice must be followed by (opslot.ConfigSlot.bind_from), so the runtime does not
/// read it from the caller's frame.
std::string ConfigSlotStatement(const Patch& p) {
  const spec::ConfigChoice& c = p.choice;
  std::string values;
  for (const spec::LocatedName& v : c.values) {
    values += (values.empty() ? "\"" : ", \"") + v.name + "\"";
  }
  if (c.values.size() == 1) values += ",";
  std::string out = "self." + LastComponent(p.target) + " = ConfigSlot(\"" + p.target + "\", \"" +
                    c.attribute + "\", (" + values + ")";
  if (c.default_value) out += ", default=\"" + c.default_value->name + "\"";
  return out + ").bind_from(config, owner=self)";
}

/// The `__init__` the slot is set in, or nullptr with an error (no class, no __init__, no
/// `config` parameter, the name already taken upstream).
const Definition* SlotInit(PatchContext& ctx, const Patch& p) {
  const PyModule& up = ctx.up;
  const Definition* cls = FindClass(ctx, Owner(p.target), p.target_loc);
  if (!cls) return nullptr;
  std::string name = LastComponent(p.target);
  std::string attr = "config." + p.choice.attribute;
  if (const Definition* taken = up.Find(p.target)) {
    ctx.Error(p.target_loc,
              "'" + name + "' is already defined in class '" + cls->qualname + "' (line " +
                  std::to_string(taken->line) + ")",
              "a config slot is an attribute of the instance; choose a name the class does not "
              "define");
    return nullptr;
  }
  const Definition* init = up.Find(cls->qualname + ".__init__");
  if (!init) {
    ctx.Error(p.target_loc,
              "class '" + cls->qualname + "' has no __init__ to set config slot '" + name + "' in",
              "a config slot is set in __init__ from its `config` parameter; declare it on a "
              "class whose __init__ takes the config");
    return nullptr;
  }
  if (!HasConfigParameter(up, *init)) {
    ctx.Error(p.target_loc, init->qualname + " has no `config` parameter to read " + attr + " from",
              "declare the config slot on a class whose __init__ takes the model config as "
              "`config`");
    return nullptr;
  }
  if (uint32_t line = AssignsSelfAttribute(up, *init, name)) {
    ctx.Error(
        p.target_loc,
        init->qualname + " already sets self." + name + " (line " + std::to_string(line) + ")",
        "the config slot would replace upstream's attribute; choose another name");
    return nullptr;
  }
  return init;
}

/// Inserts `e` into `edits` before the first insertion at the same offset, so that a config
/// slot is set before the statements another patch (`modify_init`) adds at that place, which
/// may read it.
void InsertFirstAtOffset(std::vector<TextEdit>& edits, TextEdit e) {
  auto same = std::find_if(edits.begin(), edits.end(), [&](const TextEdit& o) {
    return o.range.empty() && o.range.start == e.range.start;
  });
  edits.insert(same, std::move(e));
}

}  // namespace

std::optional<InitEnd> InitEndInsertion(PatchContext& ctx, const Patch& p, const Definition& init,
                                        const std::string& what) {
  const PyModule& up = ctx.up;
  std::vector<TSNode> returns =
      parser::OwnScopeNodes(parser::BodyBlock(up, init), {"return_statement"});
  TSNode last = parser::LastStatement(up, init);
  bool trailing = !returns.empty() && ts_node_eq(returns.back(), last);
  if (trailing) returns.pop_back();
  if (!returns.empty()) {
    uint32_t line = up.lines().LineOf(ts_node_start_byte(returns.front())) + 1;
    ctx.Error(p.loc,
              init.qualname + " returns early (line " + std::to_string(line) + "): what " + what +
                  " adds at its end would not run on that path",
              "place them after super().__init__(...) (`after: super_init`) or change __init__ "
              "with an edit_body whose anchors say where");
    return std::nullopt;
  }
  if (trailing) return InitEnd{LineStartOf(up.source(), ts_node_start_byte(last)), true};
  return InitEnd{LineEndOf(up.source(), init.body.end), false};
}

void PlanConfigSlot(PatchContext& ctx, const Patch& p, NameMap& /*patch_map*/,
                    const std::string& what) {
  const Definition* init = SlotInit(ctx, p);
  if (!init) return;
  const std::string& src = ctx.up.source();
  std::string indent(init->body_indent, ' ');
  std::string text = Marker(p, indent) + "\n" + indent + ConfigSlotStatement(p);
  if (init->inline_body) {
    // `def __init__(self, config): super().__init__()` -> the inline body moves to its own line.
    std::string moved = "\n" + indent + std::string(ctx.up.Text(init->body)) + "\n";
    ctx.st.out.edits.push_back(TextEdit{{init->header.end, LineEndOf(src, init->body.end)},
                                        moved + text,
                                        p.loc,
                                        what,
                                        std::nullopt});
  } else if (std::optional<ByteRange> super_init = parser::SuperInitStatement(ctx.up, *init)) {
    uint32_t at = LineEndOf(src, super_init->end);
    InsertFirstAtOffset(ctx.st.out.edits,
                        TextEdit{{at, at}, "\n" + text, p.loc, what, std::nullopt});
  } else if (std::optional<InitEnd> end = InitEndInsertion(ctx, p, *init, what)) {
    // In front of a trailing `return`, else after the last statement.
    std::string t = end->before_line ? text + "\n" : "\n" + text;
    InsertFirstAtOffset(ctx.st.out.edits,
                        TextEdit{{end->offset, end->offset}, t, p.loc, what, std::nullopt});
  }
  ctx.st.config_slots = true;
}

std::optional<std::string> ConfigSlotAbsent(const PyModule& up, const Patch& p) {
  const Definition* cls = up.Find(Owner(p.target));
  if (!cls || cls->kind != Definition::Kind::kClass || !up.Find(Owner(p.target) + ".__init__")) {
    return "optional: no class '" + Owner(p.target) + "' with an __init__ upstream";
  }
  return std::nullopt;
}

void PinConfigSlot(PatchContext& ctx, const Patch& p, const std::string& key) {
  const Definition* init = ctx.up.Find(Owner(p.target) + ".__init__");
  if (!init) return;
  ctx.st.contract.push_back(MakePin(ctx.up, key, "signature", spec::PatchKindKey(p.kind),
                                    init->qualname, p.loc,
                                    {{init->definition.start, init->header.end}}, {}));
}

std::string WithConfigSlotImport(const std::string& declarations, const std::string& runtime,
                                 bool config_slots) {
  if (!config_slots) return declarations;
  std::string op_slot = "from " + runtime + " import OpSlot\n";
  if (declarations.starts_with(op_slot)) {
    return "from " + runtime + " import ConfigSlot, OpSlot\n" + declarations.substr(op_slot.size());
  }
  return "from " + runtime + " import ConfigSlot\n" + declarations;
}

}  // namespace patchgen::rewriter
