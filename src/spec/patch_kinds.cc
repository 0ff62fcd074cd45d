#include "spec/patch_kinds.h"

#include <cstdlib>

namespace patchgen::spec {

const PatchKindInfo* FindPatchKind(std::string_view key) {
  for (const PatchKindInfo& info : kPatchKinds) {
    if (info.key == key) return &info;
  }
  return nullptr;
}

const PatchKindInfo& InfoOf(PatchKind kind) {
  for (const PatchKindInfo& info : kPatchKinds) {
    if (info.kind == kind) return info;
  }
  std::abort();  // A PatchKind without a row: patch_kinds_test.cc fails first.
}

std::vector<std::string> KeysRefusedBy(const PatchKindInfo& kind) {
  std::vector<std::string> out;
  if (kind.has_edits || kind.has_choice) out = {"code", "file", "symbol"};
  if (!kind.allows_from || kind.has_edits || kind.has_choice) out.push_back("from");
  if (!kind.allows_after) out.push_back("after");
  if (!kind.has_edits) out.push_back("edits");
  if (!kind.has_choice) {
    for (const char* k : {"attribute", "values", "default"}) out.push_back(k);
  }
  return out;
}

const char* PatchKindKey(PatchKind kind) { return InfoOf(kind).key.data(); }

}  // namespace patchgen::spec
