// Typed access to a spec's YAML (RawNode) with located errors: the keys of a mapping level,
// strings, identifiers, dotted names, code with its origin, name maps, bodies. The base of the spec
// loader's FileLoader (spec_loader.cc), which adds the levels (spec, slots, patches, edits,
// helpers). Every accessor reports its own error ("expected X, found Y" with a help line) and
// returns nullopt, an empty value or false; errors are collected, not thrown.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/diagnostic.h"
#include "base/line_index.h"
#include "spec/patch_kinds.h"
#include "spec/patch_spec.h"
#include "spec/raw_node.h"
#include "spec/spec_keys.h"

namespace patchgen::spec {

/// `rel` resolved against the folder of `spec_path`, normalised, printed relative as given.
std::string JoinRelative(const std::string& spec_path, const std::string& rel);

class SpecReader {
 public:
  /// A mapping's known keys: key -> (key node, value node); a (key node, value node) pair.
  using KeyMap = std::map<std::string, std::pair<const RawNode*, const RawNode*>>;
  using KeyValue = std::pair<const RawNode*, const RawNode*>;

  SpecReader(std::string path, std::shared_ptr<const std::string> text)
      : path_(std::move(path)), text_(std::move(text)), lines_(*text_) {}

  std::vector<Diagnostic>& diags() { return diags_; }

 protected:
  // --- locations and messages -------------------------------------------------------------

  SourceLoc LocAt(ByteRange r);
  SourceLoc Loc(const RawNode& n) { return LocAt(n.range); }

  void Error(const RawNode& at, std::string msg, std::string help = {});
  void ErrorWithNote(const RawNode& at, std::string msg, const SourceLoc& first, std::string note,
                     std::string help = {});

  // --- typed access -------------------------------------------------------------------------

  // Checks the keys of mapping `m` at `level`: non-scalar, unknown and duplicate keys are errors.
  // Returns key -> (key node, value node) for the known keys (first occurrence).
  KeyMap Keys(const RawNode& m, KeyLevel level);
  static std::string Article(KeyLevel level);
  std::optional<std::string> String(const RawNode& n, std::string_view what);
  // A one-line string (descriptions).
  std::optional<std::string> OneLine(const RawNode& n, std::string_view what);
  // A name (Identifier) or a dotted name (Dotted), held as Python compares names: NFKC when it
  // is not ASCII (PEP 3131; base/unicode_nfkc.h), so a spec naming `ﬁnd` means upstream's `find`.
  // `as_python` false keeps the name as written (a name that ends up in a string literal).
  std::optional<std::string> Identifier(const RawNode& n, std::string_view what,
                                        bool as_python = true);
  std::optional<std::string> Dotted(const RawNode& n, std::string_view what,
                                    std::string_view example);
  // An op or variant name (docs/ops.md): letters, digits and `_`, as it is written into the
  // generated `OpSlot("op", "variant")` string literal.
  std::optional<std::string> OpName(const RawNode& n, std::string_view what,
                                    std::string_view example);
  const std::vector<RawNode>* Sequence(const RawNode& n, std::string_view what);
  bool Mapping(const RawNode& n, std::string_view what);
  // Code text with its origin: literal blocks start on the line after the `|`, at the block's
  // indentation; one-line scalars start at the value (after the quote).
  std::optional<std::pair<std::string, TextOrigin>> Code(const RawNode& n, std::string_view what);
  std::vector<NameMapEntry> NameMap(const RawNode& n);
  std::vector<LocatedName> Names(const RawNode& n, std::string_view what, bool dotted);
  std::vector<Block> Blocks(const RawNode& n, std::string_view what);
  // The value / key node of `k` in `keys`, or nullptr.
  static const RawNode* ValueOf(const KeyMap& keys, const char* k);
  static const RawNode* KeyNodeOf(const KeyMap& keys, const char* k);

  // --- config_slot (a kind whose row has_choice) ----------------------------------------------

  // `attribute`, `values` and `default` of a config_slot patch (a body or `edits` is an error).
  // Without any of the three, when `partial_allowed` (a spec with `extends`), the patch changes
  // the inherited one. False when anything is invalid (reported).
  bool LoadChoice(const KeyMap& keys, const PatchKindInfo& info, const RawNode& kind_node,
                  bool partial_allowed, Patch& p);
  // `attribute`, `values` and `default` on a kind whose row has no choice: each an error.
  bool RefuseChoiceKeys(const KeyMap& keys, const PatchKindInfo& info);

  // --- bodies -------------------------------------------------------------------------------

  // A body from `code`, `file`+`symbol` or `from` (the latter only when `allow_from`).
  Body BodyOf(const RawNode& entry, const KeyMap& keys, bool allow_from,
              const std::string& kind_for_from);
  // At most one of `code`, `file`, `from` (a refused `from` is passed as nullptr).
  bool OneBodySource(const KeyMap& keys, const RawNode* code, const RawNode* file,
                     const RawNode* from, bool allow_from);
  Body CodeBody(const RawNode& code);
  // `file` + `symbol`: the patch file, read now (relative to the spec's folder).
  Body FileBody(const RawNode& file, const RawNode& file_key, const RawNode* symbol);
  // `from: package.module.Name`: an import instead of code.
  Body FromBody(const RawNode& from);

 private:
  std::optional<LocatedName> ImplName(const RawNode& n, std::string_view what);
  bool LoadChoiceValues(const RawNode& n, ConfigChoice& c);
  // `default`: one of the values (checked when `values_ok`).
  bool LoadChoiceDefault(const RawNode& def, bool values_ok, ConfigChoice& c);

 protected:
  std::string path_;  ///< The spec file as printed.
  std::shared_ptr<const std::string> text_;
  LineIndex lines_;
  std::vector<Diagnostic> diags_;
};

}  // namespace patchgen::spec
