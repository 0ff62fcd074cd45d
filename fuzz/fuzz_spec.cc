// Fuzz target: the spec loader (YAML -> validated PatchSpec, docs/spec-format.md) on any bytes.
// Property: a PatchSpec or located diagnostics (fuzz_common.h). `file:` and `extends:` name files
// in a folder that does not exist, so they end in located "cannot read" errors.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "spec/spec_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto spec =
      patchgen::spec::LoadSpecFromString("/nonexistent/patchgen-fuzz/spec.yaml", std::move(text));
  if (!spec.ok()) patchgen::fuzz::CheckDiagnostics(spec.errors());
  return 0;
}
