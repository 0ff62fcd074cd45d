// PatchSpec: a validated patch spec (format: docs/spec-format.md). Produced by LoadSpec() in
// spec_loader.h from YAML; consumed by the rewriter. Every entry keeps the SourceLoc of the YAML
// it came from, so later layers can report errors at `spec.yaml:line:col`.
//
// Nothing here knows Python: bodies are kept as text; the rewriter parses them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"

namespace patchgen::spec {

/// Where a piece of code text came from, so that line `i` (0-based) / column `c` (1-based) of
/// `text` can be reported at `path:(first_line + i):(c + col_offset)`.
struct TextOrigin {
  std::string path;                              ///< Spec file or patch file, as printed.
  std::shared_ptr<const std::string> file_text;  ///< Whole file, for excerpts.
  uint32_t first_line = 1;  ///< 1-based line of the text's first line in `path`.
  uint32_t col_offset = 0;  ///< Columns to add (block scalar indentation).
};

/// One `old: new` identifier rename, or with `prefix` a family rule `Old*: New*` that renames
/// every identifier starting with `from` (the text without `*`) to start with `to` instead.
struct NameMapEntry {
  std::string from;
  std::string to;
  SourceLoc loc;  ///< The key.
  bool prefix = false;

  /// The key as written: "Qwen3_5MLP", or "Qwen3_5*" for a prefix rule.
  std::string Key() const { return prefix ? from + "*" : from; }
};

/// Where a body comes from.
struct Body {
  enum class Source { kNone, kCode, kFile, kFrom };
  Source source = Source::kNone;
  /// kCode: the code as written in YAML (block scalar text, with its final newline).
  /// kFile: the whole patch file; `symbol` names the def/class in it.
  std::string text;
  TextOrigin origin;     ///< For kCode: the YAML block; for kFile: the patch file (first_line 1).
  std::string file;      ///< kFile: path as written in the spec (relative to the spec's folder).
  std::string symbol;    ///< kFile: def/class name in the file.
  SourceLoc symbol_loc;  ///< kFile: the `symbol` value.
  std::string from_module;  ///< kFrom: "liger_kernel.transformers.swiglu"
  std::string from_name;    ///< kFrom: "LigerSwiGLUMLP"
  SourceLoc loc;            ///< The `code` / `file` / `from` value.
};

/// When an entry applies (docs/spec-format.md, "Entries that span upstream versions"):
/// `upstream_version: ">=5.23"` restricts it to matching upstream versions; `optional: true`
/// (with a `reason:`) skips it when its target or anchors are absent upstream. A skipped entry is
/// listed in the generated header, never silently dropped.
struct Condition {
  std::optional<std::string>
      upstream_version;  ///< Comma-separated clauses: ">=5.23", "<5.23,>=5.17".
  SourceLoc version_loc;
  bool optional = false;
  SourceLoc optional_loc;
  std::string reason;  ///< Why (required with `optional: true`); shown in the header when skipped.
};

enum class PatchKind {
  kReplaceClass,
  kReplaceFunction,
  kOverrideMethod,
  kAddMethod,
  kModifyInit,
  kEditBody,
  kConfigSlot,
};

/// The YAML key of a kind ("replace_class", ...), from the kind table (patch_kinds.h).
const char* PatchKindKey(PatchKind kind);

/// One statement-level edit of an `edit_body` patch (docs/spec-format.md, "Statement edits").
/// The operation key's value is the anchor: the leading text of one statement of the target's
/// body, located like a call-site guard's `at`.
struct StatementEdit {
  enum class Op { kInsertBefore, kInsertAfter, kReplace, kDelete, kWrap };
  Op op = Op::kInsertBefore;
  std::string at;                      ///< Leading text of the (first) anchor statement.
  SourceLoc at_loc;                    ///< The operation key's value.
  std::optional<std::string> through;  ///< replace/delete/wrap: leading text of the last statement.
  SourceLoc through_loc;
  std::string code;  ///< Statements (empty for delete); wrap: with one `...` line.
  TextOrigin code_origin;
  SourceLoc code_loc;  ///< The `code` value.
  SourceLoc loc;       ///< The operation key.
};

/// The YAML key of an edit operation ("insert_before", ...).
const char* EditOpKey(StatementEdit::Op op);

struct LocatedName {
  std::string name;
  SourceLoc loc;
};

/// What a `config_slot` patch declares (docs/spec-format.md, "Config slots"): an implementation
/// name read from `config.<attribute>` when the model is built, one of `values`, or `default`
/// when the config does not set the attribute.
struct ConfigChoice {
  std::string attribute;  ///< Attribute of the model config: "attention_kernel".
  SourceLoc attribute_loc;
  std::vector<LocatedName> values;           ///< The implementations allowed, in spec order.
  std::optional<LocatedName> default_value;  ///< One of `values`; none: the config must set it.
};

struct Patch {
  PatchKind kind = PatchKind::kReplaceClass;
  std::string target;       ///< "Qwen3MLP", "Qwen3MLP.forward", "Outer.Inner.m", "rotate_half"
  SourceLoc target_loc;     ///< The target value (after the kind key).
  std::string description;  ///< May be empty.
  Body body;
  enum class InitAt { kEnd, kAfterSuperInit };
  InitAt init_at = InitAt::kEnd;       ///< modify_init only (`after: end | super_init`).
  std::vector<NameMapEntry> name_map;  ///< Patch-level renames (added to the spec's).
  std::vector<StatementEdit> edits;    ///< edit_body only: in spec order.
  ConfigChoice choice;                 ///< config_slot only.
  Condition when;                      ///< `upstream_version` / `optional`.
  SourceLoc loc;                       ///< The entry (its kind key).
  /// In a spec with `extends`: an entry without a body (no `code`/`file`/`from`, no `edits`)
  /// changes the inherited entry of the same target instead of replacing it; `given` holds the
  /// keys it sets (description, after, name_map, optional, reason). Resolved by the merge.
  bool partial = false;
  std::vector<std::string> given;
};

struct Guard {
  std::string in;  ///< "Qwen3RMSNorm.forward", "apply_rotary_pos_emb", "A.B.m"
  SourceLoc in_loc;
  std::optional<std::string> at;  ///< Leading text of the first statement (call-site guard).
  SourceLoc at_loc;
  std::optional<std::string> through;  ///< Leading text of the last statement (optional).
  SourceLoc through_loc;
  std::string call;  ///< One or more statements (entry guard: one expression, returned).
  TextOrigin call_origin;
  Condition when;  ///< `upstream_version` / `optional`.
  SourceLoc loc;   ///< The guard entry.
};

struct Slot {
  std::string name;  ///< Python identifier of the module-level variable / attribute.
  std::string op;
  std::string variant;
  enum class Scope { kModule, kInstance };
  Scope scope = Scope::kModule;
  std::vector<Guard> guards;
  SourceLoc loc;  ///< The `name` value.
  /// In a spec with `extends`: a slot without `op`/`variant` changes the inherited slot of the
  /// same name; `given` holds the keys it sets (op, variant, scope, guards).
  bool partial = false;
  std::vector<std::string> given;
};

struct Helper {
  std::string name;  ///< Def/class name (explicit `name:` or read from the code); used by extends.
  std::optional<std::string>
      after;  ///< Top-level definition to place it after; none = after the slots.
  SourceLoc after_loc;
  Body body;       ///< kCode or kFile.
  Condition when;  ///< `upstream_version` (helpers cannot be optional).
  SourceLoc loc;
};

struct Block {
  std::string code;
  TextOrigin origin;
  SourceLoc loc;
};

struct PatchSpec {
  std::string path;                         ///< The spec file as printed (relative).
  std::shared_ptr<const std::string> text;  ///< The spec file's bytes.
  std::vector<std::string> extends_chain;   ///< Parent spec paths, nearest first (as printed).
  int version = 1;
  std::string upstream;  ///< Dotted module.
  SourceLoc upstream_loc;
  std::string output;  ///< Output file name.
  SourceLoc output_loc;
  std::string description;
  std::optional<std::string> runtime;     ///< Module providing OpSlot; none = project default.
  std::vector<NameMapEntry> name_map;     ///< Spec-level renames (apply to every body).
  std::vector<Block> import_adds;         ///< Whole import statements (`imports.add`).
  std::vector<LocatedName> import_drops;  ///< Names removed from upstream imports (`imports.drop`).
  std::vector<Slot> slots;
  std::vector<Patch> patches;
  std::vector<Helper> helpers;
  std::vector<Block> blocks;
  std::vector<LocatedName> excludes;
};

}  // namespace patchgen::spec
