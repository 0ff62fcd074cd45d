// Fuzz target: the whole generation, spec x upstream module (+ patch files and parent specs), as
// `patchgen SPEC` does it without the source lookup. The input is split by fuzz_common.h's
// SplitSections ("#@@ upstream", "#@@ file NAME" lines). Property: located diagnostics, or a
// generated module that tree-sitter parses without errors and that diffs against upstream. With
// PATCHGEN_FUZZ_DUMP=DIR, each generated module and its upstream are written to DIR so that
// fuzz/check_outputs.py can compile them with CPython.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "diff/unified_diff.h"
#include "fuzz_common.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"
#include "rewriter/generate.h"
#include "spec/spec_loader.h"

namespace fs = std::filesystem;
using patchgen::fuzz::Fail;

namespace {

void WriteFile(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream f(path, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  patchgen::fuzz::Sections s = patchgen::fuzz::SplitSections(input);
  fs::path dir = patchgen::fuzz::FreshScratchDir();
  for (const auto& [name, text] : s.files) WriteFile(dir / name, text);
  fs::path spec_path = dir / "spec.yaml";
  WriteFile(spec_path, s.spec);

  auto spec = patchgen::spec::LoadSpec(spec_path.string());
  if (!spec.ok()) {
    patchgen::fuzz::CheckDiagnostics(spec.errors());
    return 0;
  }
  auto module = patchgen::parser::PyModule::Parse("toypkg/models/toy/modeling_toy.py", s.upstream);
  if (!module.ok()) {
    patchgen::fuzz::CheckDiagnostics(module.errors());
    return 0;
  }
  patchgen::rewriter::GenerateOptions options;
  options.upstream_path = "toypkg/models/toy/modeling_toy.py";
  options.upstream_version = "1.0.0";
  auto result = patchgen::rewriter::Generate(*spec, *module.value(), options);
  if (!result.ok()) {
    patchgen::fuzz::CheckDiagnostics(result.errors());
    return 0;
  }
  const std::string& out = result->text;
  patchgen::parser::TreePtr tree = patchgen::parser::ParseTree(out);
  if (tree == nullptr) Fail("no tree for the generated module");
  bool bad = patchgen::parser::FirstErrorNode(ts_tree_root_node(tree.get())).has_value();
  if (bad) Fail("the generated module does not parse", out);
  (void)patchgen::diff::UnifiedDiff(s.upstream, out, "a/upstream.py", "b/" + spec->output);
  if (patchgen::fuzz::Dumping()) {
    std::string key = std::to_string(std::hash<std::string_view>{}(input));
    patchgen::fuzz::Dump(key + ".upstream.py", s.upstream);
    patchgen::fuzz::Dump(key + ".out.py", out);
  }
  return 0;
}
