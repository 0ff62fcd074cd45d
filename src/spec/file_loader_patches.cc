// FileLoader (file_loader.h): patches, their kind (one row of the kind table, patch_kinds.h),
// target shape, options and body, and the statement edits of `edit_body`.
#include <algorithm>
#include <map>

#include "base/text_util.h"
#include "spec/file_loader.h"
#include "spec/python_names.h"

namespace patchgen::spec {

namespace {

// The kinds whose row has `property` (for "'after' is only for modify_init").
std::string KindsWith(bool PatchKindInfo::*property) {
  std::string out;
  for (const PatchKindInfo& info : kPatchKinds) {
    if (info.*property) out += (out.empty() ? "" : ", ") + std::string(info.key);
  }
  return out;
}

// The operation whose key is `key` (one of EditOpKeys()).
StatementEdit::Op OpOfKey(const std::string& key) {
  using Op = StatementEdit::Op;
  for (Op op : {Op::kInsertBefore, Op::kInsertAfter, Op::kReplace, Op::kDelete, Op::kWrap}) {
    if (key == EditOpKey(op)) return op;
  }
  return Op::kInsertBefore;  // Unreachable: OpKey only returns keys of EditOpKeys().
}

bool IsInsertion(StatementEdit::Op op) {
  return op == StatementEdit::Op::kInsertBefore || op == StatementEdit::Op::kInsertAfter;
}

}  // namespace

void FileLoader::LoadPatches(const RawNode& n, PatchSpec& spec) {
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
std::optional<FileLoader::KeyValue> FileLoader::KindKey(const RawNode& item) {
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
std::optional<Patch> FileLoader::LoadPatch(const RawNode& item, const KeyMap& keys,
                                           KeyValue kind_key) {
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
void FileLoader::LoadPatchOptions(const KeyMap& keys, const PatchKindInfo& info, Patch& p) {
  if (auto it = keys.find("description"); it != keys.end()) {
    if (auto d = OneLine(*it->second.second, "description")) p.description = *d;
  }
  if (auto it = keys.find("after"); it != keys.end()) {
    if (!info.allows_after) {
      Error(*it->second.first, "'after' is only for " + KindsWith(&PatchKindInfo::allows_after),
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
bool FileLoader::LoadPatchEdits(const KeyMap& keys, const PatchKindInfo& info,
                                const RawNode& kind_node, Patch& p) {
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
bool FileLoader::LoadPatchBody(const RawNode& item, const KeyMap& keys, const PatchKindInfo& info,
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
bool FileLoader::TargetHasShape(const RawNode& target_node, const PatchKindInfo& info,
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
    Error(
        target_node,
        "'" + std::string(info.key) + "' takes `Class." + std::string(info.member) + "`, " + found,
        help);
    return false;
  }
  return true;
}

// The `edits:` of an edit_body patch. False when any entry is invalid (reported).
bool FileLoader::LoadEdits(const RawNode& n, std::vector<StatementEdit>& out) {
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
std::optional<FileLoader::KeyValue> FileLoader::OpKey(const RawNode& item) {
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

// One edit whose operation key is `op_key`; nullopt when any part is invalid (reported).
std::optional<StatementEdit> FileLoader::LoadEdit(const KeyMap& keys, KeyValue op_key) {
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

// The operation key's value: the leading text of the anchor statement.
bool FileLoader::LoadEditAnchor(const RawNode& value, const std::string& op, StatementEdit& e) {
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
bool FileLoader::LoadEditThrough(const KeyMap& keys, const std::string& op, StatementEdit& e) {
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
bool FileLoader::LoadEditCode(const KeyMap& keys, const RawNode& op_node, const std::string& op,
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

}  // namespace patchgen::spec
