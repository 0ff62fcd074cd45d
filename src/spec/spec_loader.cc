// LoadSpec: YAML text -> RawNode tree (positions kept) -> validated PatchSpec (FileLoader,
// file_loader.h, one file at a time), then the `extends` chain loaded and merged (spec_merge.h).
// Every check records a diagnostic and moves on, so one run reports all of a spec's errors; the
// result is an error as soon as any was recorded.
#include "spec/spec_loader.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "base/file_util.h"
#include "base/line_index.h"
#include "spec/file_loader.h"
#include "spec/spec_merge.h"

namespace patchgen::spec {
namespace {

namespace fs = std::filesystem;

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
      SourceLoc loc = LocOf(path, *shared, lines, ByteRange{0, 0});
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
    return ErrorAt(SourceLoc::InFile(path), "cannot read spec: " + err, {}, ErrorKind::kIo);
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
