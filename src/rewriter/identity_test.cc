// Identity check on real upstream files: an empty spec must reproduce every
// transformers/models/*/modeling_*.py byte for byte except the header and the lines of
// relative-import statements, and the output must parse. Runs when PATCHGEN_IDENTITY_ROOT names a
// folder holding `transformers/` (e.g. the git-ignored `.upstream/`); see docs/rewriter.md.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "base/text_util.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"
#include "rewriter/generate.h"
#include "spec/spec_loader.h"

namespace patchgen::rewriter {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// "" when `rel` (e.g. "transformers/models/llama/modeling_llama.py") passes, else why not.
std::string CheckOne(const fs::path& root, const std::string& rel) {
  std::string upstream = ReadFile(root / rel);
  std::string module = rel.substr(0, rel.size() - 3);
  std::replace(module.begin(), module.end(), '/', '.');
  auto spec =
      spec::LoadSpecFromString("identity.yaml", "upstream: " + module + "\noutput: out.py\n");
  if (!spec) return "spec: " + FormatDiagnostic(spec.errors().front());
  auto up = parser::PyModule::Parse(rel, upstream);
  if (!up) return "upstream: " + FormatDiagnostic(up.errors().front());
  GenerateOptions options;
  options.upstream_path = rel;
  options.upstream_version = "identity";
  auto r = Generate(*spec, **up, options);
  if (!r) return "generate: " + FormatDiagnostic(r.errors().front());
  // Strip the header: everything through the second rule line.
  std::string rule = "# " + std::string(76, '=') + "\n";
  size_t end = r->text.find(rule, rule.size());
  if (r->text.find(rule) != 0 || end == std::string::npos) return "no header";
  std::string body = r->text.substr(end + rule.size());
  // Lines that may differ: those of relative import statements.
  std::set<uint32_t> import_lines;
  for (const parser::Import& imp : (*up)->imports()) {
    if (imp.relative_level == 0) continue;
    uint32_t a = (*up)->lines().LineOf(imp.stmt.start), b = (*up)->lines().LineOf(imp.stmt.end);
    for (uint32_t l = a; l <= b; ++l) import_lines.insert(l);
  }
  std::vector<std::string_view> want = SplitLines(upstream), got = SplitLines(body);
  if (want.size() != got.size()) return "line count differs";
  if (upstream.ends_with('\n') != body.ends_with('\n')) return "final newline differs";
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i] && !import_lines.count(static_cast<uint32_t>(i))) {
      return "line " + std::to_string(i + 1) + " differs: " + std::string(got[i]);
    }
  }
  parser::TreePtr tree = parser::ParseTree(r->text);
  bool parses = tree && !parser::FirstErrorNode(ts_tree_root_node(tree.get()));
  return parses ? "" : "output does not parse";
}

}  // namespace

TEST_CASE("Identity spec reproduces every transformers modeling file", "[identity]") {
  const char* root_env = std::getenv("PATCHGEN_IDENTITY_ROOT");
  if (!root_env) {
    WARN("PATCHGEN_IDENTITY_ROOT not set; identity check skipped");
    return;
  }
  fs::path root = root_env;
  std::vector<std::string> files;
  for (const auto& dir : fs::directory_iterator(root / "transformers" / "models")) {
    if (!dir.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(dir.path())) {
      std::string name = f.path().filename().string();
      if (name.starts_with("modeling_") && name.ends_with(".py")) {
        files.push_back(fs::relative(f.path(), root).generic_string());
      }
    }
  }
  std::sort(files.begin(), files.end());
  auto t0 = std::chrono::steady_clock::now();
  size_t failed = 0;
  for (const std::string& rel : files) {
    std::string why = CheckOne(root, rel);
    if (!why.empty()) {
      ++failed;
      UNSCOPED_INFO(rel << ": " << why);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("identity: " << files.size() << " files, " << failed << " failed, " << secs << " s");
  CHECK(failed == 0);
  CHECK(!files.empty());
}

}  // namespace patchgen::rewriter
