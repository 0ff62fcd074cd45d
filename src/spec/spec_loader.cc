// LoadSpec: YAML text -> RawNode tree (positions kept) -> validated PatchSpec, then `extends`
// merged. Every check records a diagnostic and moves on, so one run reports all of a spec's
// errors; the result is an error as soon as any was recorded.
#include "spec/spec_loader.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "base/file_util.h"
#include "base/line_index.h"
#include "base/text_util.h"
#include "spec/patch_kinds.h"
#include "spec/python_names.h"
#include "spec/raw_node.h"
#include "spec/spec_keys.h"
#include "spec/spec_merge.h"
#include "spec/spec_reader.h"
#include "spec/version_condition.h"

namespace patchgen::spec {
namespace {

namespace fs = std::filesystem;
using Kind = RawNode::Kind;

// One spec file as written (before `extends` is merged), plus what only merging needs.
class FileLoader : public SpecReader {
 public:
  using SpecReader::SpecReader;

  OneSpec Load() {
    OneSpec out;
    out.spec.path = path_;
    out.spec.text = text_;
    Result<RawNode> raw = ParseRawYaml(path_, *text_);
    if (!raw.ok()) {
      for (Diagnostic& d : raw.errors()) diags_.push_back(std::move(d));
      return out;
    }
    const RawNode& root = *raw;
    if (root.kind != Kind::kMapping) {
      if (root.kind == Kind::kNull && !root.explicit_null) {
        diags_.push_back(ErrorAt(LocAt(ByteRange{0, 0}), "the spec is empty",
                                 "a spec needs at least `upstream:` and `output:`"));
      } else {
        Error(root, std::string("expected a mapping, found ") + DescribeKind(root),
              "a spec is a mapping of keys such as `upstream:` and `output:`");
      }
      return out;
    }
    out.parsed = true;
    LoadTop(root, out);
    return out;
  }

 private:
  // --- levels -------------------------------------------------------------------------------

  void LoadTop(const RawNode& root, OneSpec& out) {
    KeyMap keys = Keys(root, KeyLevel::kSpec);
    size_t before = diags_.size();
    LoadHead(keys, out);  // Sets has_extends_, which the entries below depend on.
    out.fatal_errors += diags_.size() - before;
    LoadEntries(keys, out);
  }

  // The scalars: version, upstream, output, description, runtime, extends.
  void LoadHead(const KeyMap& keys, OneSpec& out) {
    PatchSpec& spec = out.spec;
    if (const RawNode* v = ValueOf(keys, "version")) LoadVersion(*v, out);
    if (const RawNode* v = ValueOf(keys, "upstream")) {
      out.has_upstream = true;
      if (auto s = Dotted(*v, "upstream", "transformers.models.qwen3.modeling_qwen3")) {
        spec.upstream = *s;
        spec.upstream_loc = Loc(*v);
      }
    }
    if (const RawNode* v = ValueOf(keys, "output")) LoadOutput(*v, out);
    if (const RawNode* v = ValueOf(keys, "description")) {
      if (auto s = OneLine(*v, "description")) {
        spec.description = *s;
        out.has_description = true;
      }
    }
    if (const RawNode* v = ValueOf(keys, "runtime")) {
      if (auto s = Dotted(*v, "runtime", "opslot")) spec.runtime = *s;
    }
    if (const RawNode* v = ValueOf(keys, "extends")) {
      if (auto s = String(*v, "extends")) out.extends = LocatedName{*s, Loc(*v)};
      has_extends_ = true;
    }
  }

  void LoadVersion(const RawNode& v, OneSpec& out) {
    out.has_version = true;
    if (v.kind != Kind::kScalar || v.style != RawNode::Style::kPlain) {
      Error(v, std::string("expected an integer, found ") + DescribeKind(v), "write `version: 1`");
    } else if (v.scalar != "1") {
      Error(v, "unsupported spec version '" + v.scalar + "'", "this patchgen reads `version: 1`");
    }
  }

  void LoadOutput(const RawNode& v, OneSpec& out) {
    out.has_output = true;
    auto s = String(v, "output");
    if (!s) return;
    if (s->size() < 4 || s->substr(s->size() - 3) != ".py" || s->find('/') != std::string::npos ||
        s->find('\\') != std::string::npos) {
      Error(v, "'output' must be a file name ending in '.py'",
            "the folder comes from the spec's place under the specs root (or `-o`)");
      return;
    }
    out.spec.output = *s;
    out.spec.output_loc = Loc(v);
  }

  // The lists and mappings: name_map, imports, slots, patches, helpers, blocks, exclude, remove.
  void LoadEntries(const KeyMap& keys, OneSpec& out) {
    PatchSpec& spec = out.spec;
    size_t before = diags_.size();
    if (const RawNode* v = ValueOf(keys, "name_map")) spec.name_map = NameMap(*v);
    out.fatal_errors += diags_.size() - before;
    if (const RawNode* v = ValueOf(keys, "imports")) LoadImports(*v, spec);
    if (const RawNode* v = ValueOf(keys, "slots")) LoadSlots(*v, spec);
    if (const RawNode* v = ValueOf(keys, "patches")) LoadPatches(*v, spec);
    if (const RawNode* v = ValueOf(keys, "helpers")) LoadHelpers(*v, spec);
    if (const RawNode* v = ValueOf(keys, "blocks")) spec.blocks = Blocks(*v, "blocks");
    if (const RawNode* v = ValueOf(keys, "exclude")) spec.excludes = Names(*v, "exclude", false);
    if (const RawNode* v = ValueOf(keys, "remove")) {
      before = diags_.size();
      out.removes = Names(*v, "remove", true);
      if (!out.extends) {
        Error(*KeyNodeOf(keys, "remove"), "'remove' needs 'extends'",
              "'remove' drops entries inherited from the spec named by `extends`");
      }
      out.fatal_errors += diags_.size() - before;
    }
  }

  void LoadImports(const RawNode& v, PatchSpec& spec) {
    if (!Mapping(v, "imports")) return;
    KeyMap ik = Keys(v, KeyLevel::kImports);
    if (const RawNode* add = ValueOf(ik, "add")) spec.import_adds = Blocks(*add, "add");
    if (const RawNode* drop = ValueOf(ik, "drop")) spec.import_drops = Names(*drop, "drop", true);
  }

  void LoadSlots(const RawNode& n, PatchSpec& spec) {
    const auto* items = Sequence(n, "slots");
    if (!items) return;
    std::map<std::string, size_t> by_name;
    for (const RawNode& item : *items) {
      if (!Mapping(item, "slots")) continue;
      KeyMap keys = Keys(item, KeyLevel::kSlot);
      if (std::optional<Slot> slot = LoadSlot(item, keys)) {
        AddSlot(std::move(*slot), *keys.at("name").second, spec, by_name);
      }
    }
  }

  // One slot entry; nullopt when any part is invalid (reported). With `extends`, `name` and no
  // op/variant changes the inherited slot of that name (a partial slot).
  std::optional<Slot> LoadSlot(const RawNode& item, const KeyMap& keys) {
    Slot slot;
    slot.partial =
        has_extends_ && keys.count("name") && !keys.count("op") && !keys.count("variant");
    if (!slot.partial && !RequireNewSlotKeys(item, keys)) return std::nullopt;
    for (const auto& [k, kv] : keys) slot.given.push_back(k);
    auto name = Identifier(*keys.at("name").second, "name");
    std::optional<std::string> op = slot.partial ? std::optional<std::string>("")
                                                 : OpName(*keys.at("op").second, "op", "rms_norm");
    std::optional<std::string> variant =
        slot.partial ? std::optional<std::string>("")
                     : OpName(*keys.at("variant").second, "variant", "standard");
    bool ok = name && op && variant;
    if (auto it = keys.find("scope"); it != keys.end()) {
      auto scope = EnumValue(*it->second.second, "scope", ScopeValues());
      ok = ok && scope;
      if (scope) slot.scope = *scope == "instance" ? Slot::Scope::kInstance : Slot::Scope::kModule;
    }
    if (auto it = keys.find("guards"); it != keys.end()) LoadSlotGuards(*it->second.second, slot);
    if (!ok) return std::nullopt;
    slot.name = *name;
    slot.op = *op;
    slot.variant = *variant;
    slot.loc = Loc(*keys.at("name").second);
    return slot;
  }

  void LoadSlotGuards(const RawNode& n, Slot& slot) {
    const auto* guards = Sequence(n, "guards");
    if (!guards) return;
    for (const RawNode& g : *guards) {
      if (auto guard = LoadGuard(g)) slot.guards.push_back(std::move(*guard));
    }
  }

  // Adds `slot` to the spec. The same declaration again (name, op, variant, scope) joins its
  // guards to the first one's; the same name with another op/variant/scope is an error.
  void AddSlot(Slot slot, const RawNode& name_node, PatchSpec& spec,
               std::map<std::string, size_t>& by_name) {
    if (slot.partial) {
      spec.slots.push_back(std::move(slot));
      return;
    }
    auto [it, inserted] = by_name.emplace(slot.name, spec.slots.size());
    if (inserted) {
      spec.slots.push_back(std::move(slot));
      return;
    }
    Slot& first = spec.slots[it->second];
    if (first.op != slot.op || first.variant != slot.variant || first.scope != slot.scope) {
      ErrorWithNote(name_node,
                    "slot '" + slot.name + "' is declared again with a different op/variant/scope",
                    first.loc, "first declared here as " + first.op + "/" + first.variant,
                    "use another slot name, or the same op, variant and scope");
      return;
    }
    for (Guard& g : slot.guards) first.guards.push_back(std::move(g));
  }

  // `upstream_version`, `optional` and `reason` of a guard, patch or helper (the level's known
  // keys decide which are accepted). False when one is invalid (reported).
  bool LoadCondition(const std::map<std::string, std::pair<const RawNode*, const RawNode*>>& keys,
                     Condition& c) {
    bool ok = true;
    if (auto it = keys.find("upstream_version"); it != keys.end()) {
      if (auto v = String(*it->second.second, "upstream_version")) {
        if (auto why = CheckVersionCondition(*v)) {
          Error(*it->second.second, "invalid upstream_version '" + *v + "': " + *why,
                "write clauses like \">=5.23\" or \">=5.17,<5.23\"");
          ok = false;
        } else {
          c.upstream_version = *v;
          c.version_loc = Loc(*it->second.second);
        }
      } else {
        ok = false;
      }
    }
    if (auto it = keys.find("optional"); it != keys.end()) {
      const RawNode& v = *it->second.second;
      if (v.kind == Kind::kScalar && v.style == RawNode::Style::kPlain &&
          (v.scalar == "true" || v.scalar == "false")) {
        c.optional = v.scalar == "true";
        c.optional_loc = Loc(*it->second.first);
      } else {
        Error(v, "'optional' takes true or false", "write `optional: true` and a `reason:`");
        ok = false;
      }
    }
    if (auto it = keys.find("reason"); it != keys.end()) {
      if (auto r = OneLine(*it->second.second, "reason"))
        c.reason = *r;
      else
        ok = false;
    }
    if (c.optional && c.reason.empty() && keys.find("reason") == keys.end()) {
      Error(*keys.find("optional")->second.first, "'optional: true' needs a 'reason'",
            "say why the entry may be absent upstream, e.g. `reason: slice_logits_to_keep "
            "appeared in 5.23`; it is shown when the entry is skipped");
      ok = false;
    }
    return ok;
  }

  std::optional<std::string> EnumValue(const RawNode& n, std::string_view what,
                                       const std::vector<std::string>& values) {
    auto s = String(n, what);
    if (!s) return s;
    if (std::find(values.begin(), values.end(), *s) != values.end()) return s;
    std::string help;
    if (auto near = DidYouMean(*s, values)) help = "did you mean '" + *near + "'? ";
    help += "valid values: " + JoinNames(values, 100);
    Error(n, "invalid value '" + *s + "' for '" + std::string(what) + "'", help);
    return std::nullopt;
  }

  template <class Keys>
  bool RequireKeys(const RawNode& entry, const Keys& keys, KeyLevel level) {
    bool ok = true;
    for (const std::string& k : RequiredKeys(level)) {
      if (!keys.count(k)) {
        Error(entry.entries.empty() ? entry : entry.entries.front().first,
              std::string("missing key '") + k + "' in " + Article(level),
              std::string("a ") + KeyLevelName(level) +
                  " needs: " + JoinNames(RequiredKeys(level), 100));
        ok = false;
      }
    }
    return ok;
  }

  // `name`, `op` and `variant` of a new slot, with the messages of RequireKeys.
  template <class Keys>
  bool RequireNewSlotKeys(const RawNode& entry, const Keys& keys) {
    bool ok = true;
    for (const std::string& k : NewSlotKeys()) {
      if (keys.count(k)) continue;
      Error(entry.entries.empty() ? entry : entry.entries.front().first,
            "missing key '" + k + "' in a slot", "a slot needs: " + JoinNames(NewSlotKeys(), 100));
      ok = false;
    }
    return ok;
  }

  std::optional<Guard> LoadGuard(const RawNode& n) {
    if (!Mapping(n, "guards")) return std::nullopt;
    auto keys = Keys(n, KeyLevel::kGuard);
    if (!RequireKeys(n, keys, KeyLevel::kGuard)) return std::nullopt;
    Guard g;
    g.loc = Loc(n.entries.front().first);
    auto in = Dotted(*keys["in"].second, "in", "Qwen3RMSNorm.forward");
    auto call = Code(*keys["call"].second, "call");
    bool ok = in && call;
    if (auto it = keys.find("at"); it != keys.end()) {
      if (auto at = String(*it->second.second, "at")) {
        g.at = *at;
        g.at_loc = Loc(*it->second.second);
      } else {
        ok = false;
      }
    }
    if (auto it = keys.find("through"); it != keys.end()) {
      if (!g.at && keys.find("at") == keys.end()) {
        Error(*it->second.first, "'through' needs 'at'",
              "`at` names the first statement of the range, `through` the last");
        ok = false;
      } else if (auto through = String(*it->second.second, "through")) {
        g.through = *through;
        g.through_loc = Loc(*it->second.second);
      } else {
        ok = false;
      }
    }
    if (!LoadCondition(keys, g.when)) ok = false;
    if (!ok) return std::nullopt;
    g.in = *in;
    g.in_loc = Loc(*keys["in"].second);
    g.call = std::move(call->first);
    g.call_origin = std::move(call->second);
    return g;
  }

  void LoadPatches(const RawNode& n, PatchSpec& spec) {
    const auto* items = Sequence(n, "patches");
    if (!items) return;
    std::map<std::string, SourceLoc> targets;
    for (const RawNode& item : *items) {
      if (!Mapping(item, "patches")) continue;
      KeyMap keys = Keys(item, KeyLevel::kPatch);
      std::optional<KeyValue> kind_key = KindKey(item);
      if (!kind_key) continue;
      std::optional<Patch> p = LoadPatch(item, keys, *kind_key);
      if (!p) continue;
      // Entries conditioned on the upstream version may share a target (one per version range).
      auto [it, inserted] = p->when.upstream_version ? std::make_pair(targets.end(), true)
                                                     : targets.emplace(p->target, p->target_loc);
      if (!inserted) {
        ErrorWithNote(*kind_key->second, "duplicate target '" + p->target + "'", it->second,
                      "first patched here",
                      "a target can be patched once per spec; merge the two patches");
        continue;
      }
      spec.patches.push_back(std::move(*p));
    }
  }

  // The kind key of a patch entry (key node, target node): the one key that names a row of the
  // kind table. None or several are errors.
  std::optional<KeyValue> KindKey(const RawNode& item) {
    std::vector<KeyValue> kind_keys;
    for (const auto& [key, value] : item.entries) {
      if (key.kind == Kind::kScalar && FindPatchKind(key.scalar))
        kind_keys.emplace_back(&key, &value);
    }
    if (kind_keys.empty()) {
      Error(item.entries.empty() ? item : item.entries.front().first, "patch has no kind",
            "start the entry with one of: " + JoinNames(PatchKindKeys(), 100));
      return std::nullopt;
    }
    if (kind_keys.size() > 1) {
      Error(*kind_keys[1].first,
            "patch has more than one kind: '" + kind_keys[0].first->scalar + "' and '" +
                kind_keys[1].first->scalar + "'",
            "split it into one patch per kind");
      return std::nullopt;
    }
    return kind_keys[0];
  }

  // One patch entry whose kind key is `kind_key`; nullopt when any part is invalid (reported:
  // every error of the entry, not only the first).
  std::optional<Patch> LoadPatch(const RawNode& item, const KeyMap& keys, KeyValue kind_key) {
    const PatchKindInfo& info = *FindPatchKind(kind_key.first->scalar);
    Patch p;
    p.kind = info.kind;
    p.loc = Loc(*kind_key.first);
    const RawNode& target_node = *kind_key.second;
    auto target = Dotted(target_node, std::string(info.key), "Qwen3MLP.forward");
    bool ok = target.has_value();
    if (target && !TargetHasShape(target_node, info, *target)) ok = false;
    LoadPatchOptions(keys, info, p);
    if (!LoadCondition(keys, p.when)) ok = false;
    bool body_ok = info.has_choice  ? LoadChoice(keys, info, *kind_key.first, has_extends_, p)
                   : info.has_edits ? LoadPatchEdits(keys, info, *kind_key.first, p)
                                    : LoadPatchBody(item, keys, info, target, p);
    if (!body_ok || (!info.has_choice && !RefuseChoiceKeys(keys, info))) ok = false;
    for (const auto& [k, kv] : keys) p.given.push_back(k);
    if (!ok) return std::nullopt;
    p.target = *target;
    p.target_loc = Loc(target_node);
    return p;
  }

  // `description`, `after` (where the kind's row allows it) and `name_map` of a patch.
  void LoadPatchOptions(const KeyMap& keys, const PatchKindInfo& info, Patch& p) {
    if (auto it = keys.find("description"); it != keys.end()) {
      if (auto d = OneLine(*it->second.second, "description")) p.description = *d;
    }
    if (auto it = keys.find("after"); it != keys.end()) {
      if (!info.allows_after) {
        Error(
            *it->second.first, "'after' is only for " + KindsWith(&PatchKindInfo::allows_after),
            "`after: super_init` places modify_init statements right after super().__init__(...)");
      } else if (auto v = EnumValue(*it->second.second, "after", InitAfterValues())) {
        p.init_at = *v == "super_init" ? Patch::InitAt::kAfterSuperInit : Patch::InitAt::kEnd;
      }
    }
    if (auto it = keys.find("name_map"); it != keys.end()) p.name_map = NameMap(*it->second.second);
  }

  // The `edits:` of a kind whose row has them. The edits carry their own code; a body key here
  // would be ignored, so it is an error. Without `edits` in a spec with `extends`, the patch
  // changes the inherited one (resolved by the merge). False on error (reported).
  bool LoadPatchEdits(const KeyMap& keys, const PatchKindInfo& info, const RawNode& kind_node,
                      Patch& p) {
    bool ok = true;
    for (const char* k : {"code", "file", "symbol", "from"}) {
      if (auto it = keys.find(k); it != keys.end()) {
        Error(*it->second.first,
              std::string("'") + k + "' is not allowed on " + std::string(info.key),
              "each entry of `edits:` has its own `code`");
        ok = false;
      }
    }
    if (auto it = keys.find("edits"); it != keys.end())
      return LoadEdits(*it->second.second, p.edits) && ok;
    if (has_extends_) {
      p.partial = true;
      return ok;
    }
    Error(kind_node, std::string(info.key) + " needs 'edits'",
          "list the statement edits: insert_before, insert_after, replace, delete or wrap");
    return false;
  }

  // The body of a kind without `edits`: `code`, `file` + `symbol`, or `from` where the row allows
  // it. Without a body in a spec with `extends`, the patch changes the inherited one. False when
  // `edits` is given (reported); body errors are reported by BodyOf.
  bool LoadPatchBody(const RawNode& item, const KeyMap& keys, const PatchKindInfo& info,
                     const std::optional<std::string>& target, Patch& p) {
    bool ok = true;
    if (auto it = keys.find("edits"); it != keys.end()) {
      Error(*it->second.first, "'edits' is only for " + KindsWith(&PatchKindInfo::has_edits),
            "to change a few statements of " + (target ? *target : std::string("the target")) +
                " instead of replacing it, use `edit_body: " +
                (target ? *target : std::string("Class.method")) + "`");
      ok = false;
    }
    std::string kind(info.key);
    bool has_body = keys.count("code") || keys.count("file") || keys.count("symbol") ||
                    (info.allows_from && keys.count("from"));
    if (has_extends_ && !has_body) {
      p.partial = true;  // Changes the inherited entry of this target (resolved by the merge).
      if (keys.count("from"))
        BodyOf(item, keys, info.allows_from, kind);  // Reports `from` where it is not allowed.
    } else {
      size_t before = diags_.size();
      p.body = BodyOf(item, keys, info.allows_from, kind);
      ok = ok && diags_.size() == before;  // A broken body leaves the patch out.
    }
    return ok;
  }

  // Whether `target` has the shape the kind's row asks for; reports the error when not.
  bool TargetHasShape(const RawNode& target_node, const PatchKindInfo& info,
                      const std::string& target) {
    size_t dots = CountDots(target);
    std::string found = "found '" + target + "'";
    std::string help =
        std::string(info.shape_help_before) + target + std::string(info.shape_help_after);
    if (info.target == TargetShape::kTopLevel && dots > 0) {
      Error(target_node, "'" + std::string(info.key) + "' takes a top-level name, " + found, help);
      return false;
    }
    if (info.target == TargetShape::kMember && dots == 0) {
      Error(target_node,
            "'" + std::string(info.key) + "' takes `Class." + std::string(info.member) + "`, " +
                found,
            help);
      return false;
    }
    return true;
  }

  // The kinds whose row has `property` (for "'after' is only for modify_init").
  static std::string KindsWith(bool PatchKindInfo::*property) {
    std::string out;
    for (const PatchKindInfo& info : kPatchKinds) {
      if (info.*property) out += (out.empty() ? "" : ", ") + std::string(info.key);
    }
    return out;
  }

  // The `edits:` of an edit_body patch. False when any entry is invalid (reported).
  bool LoadEdits(const RawNode& n, std::vector<StatementEdit>& out) {
    const auto* items = Sequence(n, "edits");
    if (!items) return false;
    if (items->empty()) {
      Error(n, "'edits' is empty",
            "list the statement edits: insert_before, insert_after, replace, delete or wrap");
      return false;
    }
    bool all_ok = true;
    for (const RawNode& item : *items) {
      std::optional<StatementEdit> e;
      if (Mapping(item, "edits")) {
        KeyMap keys = Keys(item, KeyLevel::kEdit);
        if (std::optional<KeyValue> op_key = OpKey(item)) e = LoadEdit(keys, *op_key);
      }
      if (!e) {
        all_ok = false;
        continue;
      }
      out.push_back(std::move(*e));
    }
    return all_ok;
  }

  // The operation key of an edit entry (key node, anchor node): exactly one of EditOpKeys().
  std::optional<KeyValue> OpKey(const RawNode& item) {
    const std::vector<std::string>& ops = EditOpKeys();
    std::vector<KeyValue> op_keys;
    for (const auto& [key, value] : item.entries) {
      if (key.kind == Kind::kScalar && std::find(ops.begin(), ops.end(), key.scalar) != ops.end()) {
        op_keys.emplace_back(&key, &value);
      }
    }
    if (op_keys.empty()) {
      Error(item.entries.empty() ? item : item.entries.front().first, "edit has no operation",
            "start the entry with one of: " + JoinNames(ops, 100));
      return std::nullopt;
    }
    if (op_keys.size() > 1) {
      Error(*op_keys[1].first,
            "edit has more than one operation: '" + op_keys[0].first->scalar + "' and '" +
                op_keys[1].first->scalar + "'",
            "split it into one edit per operation");
      return std::nullopt;
    }
    return op_keys[0];
  }

  // The operation whose key is `key` (one of EditOpKeys()).
  static StatementEdit::Op OpOfKey(const std::string& key) {
    using Op = StatementEdit::Op;
    for (Op op : {Op::kInsertBefore, Op::kInsertAfter, Op::kReplace, Op::kDelete, Op::kWrap}) {
      if (key == EditOpKey(op)) return op;
    }
    return Op::kInsertBefore;  // Unreachable: OpKey only returns keys of EditOpKeys().
  }

  // One edit whose operation key is `op_key`; nullopt when any part is invalid (reported).
  std::optional<StatementEdit> LoadEdit(const KeyMap& keys, KeyValue op_key) {
    StatementEdit e;
    const std::string& op = op_key.first->scalar;
    e.op = OpOfKey(op);
    e.loc = Loc(*op_key.first);
    bool ok = LoadEditAnchor(*op_key.second, op, e);
    if (!LoadEditThrough(keys, op, e)) ok = false;
    if (!LoadEditCode(keys, *op_key.first, op, e)) ok = false;
    if (!ok) return std::nullopt;
    return e;
  }

  static bool IsInsertion(StatementEdit::Op op) {
    return op == StatementEdit::Op::kInsertBefore || op == StatementEdit::Op::kInsertAfter;
  }

  // The operation key's value: the leading text of the anchor statement.
  bool LoadEditAnchor(const RawNode& value, const std::string& op, StatementEdit& e) {
    auto at = String(value, op);
    if (!at) return false;
    if (at->find_first_not_of(" \t\n") == std::string::npos) {
      Error(value, "'" + op + "' is empty",
            "give the leading text of the statement, as written upstream after its indentation");
      return false;
    }
    e.at = *at;
    e.at_loc = Loc(value);
    return true;
  }

  // `through`: the last statement of a replace/delete/wrap range (not of an insertion).
  bool LoadEditThrough(const KeyMap& keys, const std::string& op, StatementEdit& e) {
    auto it = keys.find("through");
    if (it == keys.end()) return true;
    if (IsInsertion(e.op)) {
      Error(*it->second.first, "'through' is not allowed with '" + op + "'",
            "an insertion has one anchor statement; `through` ends the range of replace, delete "
            "and wrap");
      return false;
    }
    auto through = String(*it->second.second, "through");
    if (!through) return false;
    e.through = *through;
    e.through_loc = Loc(*it->second.second);
    return true;
  }

  // `code`: refused on delete, required on the other operations.
  bool LoadEditCode(const KeyMap& keys, const RawNode& op_node, const std::string& op,
                    StatementEdit& e) {
    auto code_it = keys.find("code");
    if (e.op == StatementEdit::Op::kDelete) {
      if (code_it == keys.end()) return true;
      Error(*code_it->second.first, "'code' is not allowed with 'delete'",
            "to put other statements in their place, use `replace`");
      return false;
    }
    if (code_it == keys.end()) {
      Error(op_node, "'" + op + "' needs 'code'",
            e.op == StatementEdit::Op::kWrap
                ? std::string("give the wrapping code with a `...` line where the statements go")
                : "give the statements to " +
                      std::string(IsInsertion(e.op) ? "insert" : "put in place of the range"));
      return false;
    }
    auto code = Code(*code_it->second.second, "code");
    if (!code) return false;
    e.code = std::move(code->first);
    e.code_origin = std::move(code->second);
    e.code_loc = Loc(*code_it->second.second);
    return true;
  }

  // A helper's name: `name:`, else the `symbol` of its file, else the first def/class of its
  // code (extends replaces and removes helpers by name). Nullopt when none (reported).
  std::optional<std::string> HelperName(const KeyMap& keys, const Body& body) {
    if (const RawNode* name_node = ValueOf(keys, "name")) return Identifier(*name_node, "name");
    if (body.source == Body::Source::kFile) return body.symbol;
    if (auto derived = FirstDefName(body.text)) return derived;
    Error(*KeyNodeOf(keys, "code"),
          "cannot tell the helper's name: its code has no top-level def or class",
          "add `name:` so that specs extending this one can replace or remove it");
    return std::nullopt;
  }

  void LoadHelpers(const RawNode& n, PatchSpec& spec) {
    const auto* items = Sequence(n, "helpers");
    if (!items) return;
    std::map<std::string, SourceLoc> names;
    for (const RawNode& item : *items) {
      if (!Mapping(item, "helpers")) continue;
      auto keys = Keys(item, KeyLevel::kHelper);
      Helper h;
      h.loc = Loc(item.entries.empty() ? item : item.entries.front().first);
      if (auto it = keys.find("after"); it != keys.end()) {
        auto after = Identifier(*it->second.second, "after");
        if (!after) continue;
        h.after = *after;
        h.after_loc = Loc(*it->second.second);
      }
      if (!LoadCondition(keys, h.when)) continue;
      size_t before = diags_.size();
      h.body = BodyOf(item, keys, false, "a helper");
      if (h.body.source == Body::Source::kNone || diags_.size() != before) continue;
      const RawNode* name_node = ValueOf(keys, "name");
      std::optional<std::string> name = HelperName(keys, h.body);
      if (!name) continue;
      h.name = *name;
      auto [it, inserted] = names.emplace(h.name, h.loc);
      if (!inserted) {
        Diagnostic d =
            ErrorAt(name_node ? Loc(*name_node) : h.body.loc, "duplicate helper '" + h.name + "'");
        d.notes.push_back(LocText(it->second) + ": note: first defined here");
        diags_.push_back(std::move(d));
        continue;
      }
      spec.helpers.push_back(std::move(h));
    }
  }

  bool has_extends_ = false;  ///< Entries without a body/op then change inherited entries.
};

// The most specs in one `extends` chain (the spec itself included).
constexpr size_t kMaxExtendsDepth = 32;

std::string Identity(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(path), ec);
  return ec ? fs::path(path).lexically_normal().generic_string() : p.generic_string();
}

// Loads `path` with its `extends` chain merged. `stack` holds the identities of the specs being
// loaded (for cycles); `diags` collects errors of every file in the chain.
std::optional<OneSpec> LoadMerged(const std::string& path, std::shared_ptr<const std::string> text,
                                  std::vector<std::string>& stack, std::vector<std::string>& shown,
                                  std::vector<Diagnostic>& diags) {
  FileLoader loader(path, std::move(text));
  OneSpec one = loader.Load();
  for (Diagnostic& d : loader.diags()) diags.push_back(std::move(d));
  if (!one.extends) return one;

  const LocatedName& ext = *one.extends;
  std::string parent_path = JoinRelative(path, ext.name);
  std::string id = Identity(parent_path);
  if (std::find(stack.begin(), stack.end(), id) != stack.end()) {
    diags.push_back(ErrorAt(ext.loc,
                            "'extends' cycle: '" + parent_path + "' is already being loaded",
                            "a spec cannot extend itself, directly or through others"));
    return std::nullopt;
  }
  if (stack.size() >= kMaxExtendsDepth) {
    std::string chain;
    for (const std::string& s : shown) chain += s + " -> ";
    chain += parent_path;
    diags.push_back(ErrorAt(ext.loc,
                            "'extends' chain is deeper than the limit of " +
                                std::to_string(kMaxExtendsDepth) + " specs",
                            "the chain: " + chain));
    return std::nullopt;
  }
  std::string err;
  std::optional<std::string> parent_text = ReadFile(parent_path, &err, kMaxSpecFileBytes);
  // A UTF-8 byte order mark is not part of the YAML (positions count from after it), as for the
  // spec named on the command line.
  if (parent_text && parent_text->starts_with("\xEF\xBB\xBF")) parent_text->erase(0, 3);
  if (!parent_text) {
    diags.push_back(ErrorAt(ext.loc, "cannot read spec '" + parent_path + "': " + err,
                            "'extends' is relative to this spec's folder"));
    return std::nullopt;
  }
  stack.push_back(id);
  shown.push_back(parent_path);
  std::optional<OneSpec> parent =
      LoadMerged(parent_path, std::make_shared<const std::string>(std::move(*parent_text)), stack,
                 shown, diags);
  stack.pop_back();
  shown.pop_back();
  if (!parent) return std::nullopt;
  size_t before = diags.size();
  size_t child_fatal = one.fatal_errors;
  Merge(*parent, std::move(one), parent_path, diags);
  parent->fatal_errors += child_fatal + (diags.size() - before);
  return parent;
}

// The spec at `path` with its `extends` chain merged (its fatal_errors counting the errors outside
// the entries), and every error of the chain in `diags`, unsorted.
std::optional<OneSpec> LoadChain(const std::string& path, std::string text,
                                 std::vector<Diagnostic>& diags) {
  std::vector<std::string> stack = {Identity(path)};
  std::vector<std::string> shown = {path};
  auto shared = std::make_shared<const std::string>(std::move(text));
  std::optional<OneSpec> spec = LoadMerged(path, shared, stack, shown, diags);
  if (spec && spec->parsed) {
    // Required keys are checked on the merged spec, so a parent may leave them to its children.
    LineIndex lines(*shared);
    for (const char* key : {"upstream", "output"}) {
      bool present = std::string(key) == "upstream" ? spec->has_upstream : spec->has_output;
      if (present) continue;
      SourceLoc loc = shared->empty() ? SourceLoc{path, 1, 1, 1, ""}
                                      : LocOf(path, *shared, lines, ByteRange{0, 0});
      diags.push_back(ErrorAt(
          loc, std::string("missing required key '") + key + "'",
          std::string(key) == "upstream"
              ? "add `upstream: <dotted module>`, e.g. transformers.models.qwen3.modeling_qwen3"
              : "add `output: <file name>.py`"));
      ++spec->fatal_errors;
    }
  }
  return spec;
}

// An error that leaves its entry in the spec: an unknown key is ignored, a duplicate key's first
// value is used.
bool KeepsEntry(const Diagnostic& d) {
  return d.message.starts_with("unknown key '") || d.message.starts_with("duplicate key '");
}

Result<PatchSpec> LoadTopLevel(const std::string& path, std::string text) {
  std::vector<Diagnostic> diags;
  std::optional<OneSpec> spec = LoadChain(path, std::move(text), diags);
  if (!diags.empty()) {
    SortDiagnostics(diags);
    return diags;
  }
  return std::move(spec->spec);
}

}  // namespace

Result<PatchSpec> LoadSpec(const std::string& path) {
  std::string err;
  std::optional<std::string> text = ReadFile(path, &err, kMaxSpecFileBytes);
  if (!text) {
    return Diagnostic{
        Severity::kError, ErrorKind::kIo, path, 0, 0, 1, "cannot read spec: " + err, "", {}, ""};
  }
  return LoadTopLevel(path, std::move(*text));
}

Result<PatchSpec> LoadSpecFromString(const std::string& path, std::string text) {
  return LoadTopLevel(path, std::move(text));
}

PartialLoad LoadSpecKeepingEntries(const std::string& path, std::string text) {
  PartialLoad out;
  std::optional<OneSpec> spec = LoadChain(path, std::move(text), out.errors);
  SortDiagnostics(out.errors);
  if (!spec || !spec->parsed || spec->fatal_errors > 0 || !spec->has_upstream ||
      !spec->has_output) {
    if (out.errors.empty() && spec) out.spec = std::move(spec->spec);
    return out;
  }
  out.entries_dropped = !std::all_of(out.errors.begin(), out.errors.end(), KeepsEntry);
  out.spec = std::move(spec->spec);
  return out;
}

}  // namespace patchgen::spec
