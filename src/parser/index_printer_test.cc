#include "parser/index_printer.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace patchgen::parser {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string kFixtures = std::string(PATCHGEN_SOURCE_DIR) + "/tests/fixtures/parser/";

std::unique_ptr<PyModule> ParseOk(std::string path, std::string source) {
  auto r = PyModule::Parse(std::move(path), std::move(source));
  REQUIRE(r.ok());
  return std::move(*r);
}

// Regenerate the expectation with PATCHGEN_UPDATE_GOLDEN=1 after an intended format change.
TEST_CASE("FormatIndexText matches the golden file for the toy modeling fixture", "[parser]") {
  auto m = ParseOk("toy_modeling.py", ReadFile(kFixtures + "toy_modeling.py"));
  std::string text = FormatIndexText(*m);
  std::string golden_path = kFixtures + "toy_modeling.index.txt";
  if (const char* update = std::getenv("PATCHGEN_UPDATE_GOLDEN");
      update != nullptr && *update == '1') {
    std::ofstream(golden_path, std::ios::binary) << text;
  }
  CHECK(text == ReadFile(golden_path));
}

TEST_CASE("FormatIndexText on a small module", "[parser]") {
  auto m = ParseOk("m.py",
                   "import torch.nn as nn\n"
                   "# Says hi.\n"
                   "@dec\n"
                   "class A(nn.Module): ...\n"
                   "def f():\n"
                   "    \"\"\"Doc é.\"\"\"\n"
                   "    from .x import (y as z)\n"
                   "    return 1\n");
  CHECK(
      FormatIndexText(*m) ==
      "m.py: 130 bytes, 2 imports, 3 top-level statements, 2 definitions\n"
      "imports:\n"
      "  1:1-1:22 import names=[torch.nn as nn] depth=0\n"
      "  7:5-7:28 from .x level=1 names=[y as z] parenthesized depth=1 scope=f\n"
      "top-level:\n"
      "  1:1-1:22 import nn\n"
      "  2:1-4:24 class decorated A\n"
      "  5:1-8:13 function f\n"
      "definitions:\n"
      "  class A 3:1-4:24 comments=2:1-2:11 decorators=3:1-3:5 header=4:1-4:20 body=4:21-4:24 "
      "indent=0 body_indent=4 inline empty\n"
      "  def f 5:1-8:13 header=5:1-5:9 body=6:5-8:13 docstring=6:5-6:17 indent=0 body_indent=4\n");
}

TEST_CASE("FormatIndexJson: key order, byte ranges and line:col", "[parser]") {
  std::string src = "from ..utils import *\nclass A:\n    def f(self):  # é\n        pass\n";
  auto m = ParseOk("a.py", src);
  auto j = nlohmann::ordered_json::parse(FormatIndexJson(*m));
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  CHECK(keys == std::vector<std::string>{"path", "bytes", "imports", "top_level", "definitions"});
  CHECK(j["path"] == "a.py");
  CHECK(j["bytes"] == src.size());
  const auto& imp = j["imports"][0];
  CHECK(imp["kind"] == "from");
  CHECK(imp["range"]["bytes"] == nlohmann::json::array({0, 21}));
  CHECK(imp["range"]["from"] == "1:1");
  CHECK(imp["range"]["to"] == "1:22");
  CHECK(imp["module"]["bytes"] == nlohmann::json::array({5, 12}));
  CHECK(imp["module_name"] == "utils");
  CHECK(imp["relative_level"] == 2);
  CHECK(imp["wildcard"] == true);
  CHECK(imp["names"].empty());
  REQUIRE(j["definitions"].size() == 2);
  const auto& f = j["definitions"][1];
  CHECK(f["qualname"] == "A.f");
  CHECK(f["parent"] == 0);
  CHECK(f["comments"].is_null());
  CHECK(f["decorators"].is_null());
  CHECK(f["docstring"].is_null());
  CHECK(f["header"]["from"] == "3:5");
  CHECK(f["header"]["to"] == "3:17");
  CHECK(f["body"]["bytes"] == nlohmann::json::array({src.find("pass"), src.find("pass") + 4}));
  CHECK(f["empty_body"] == true);
  CHECK(j["definitions"][0]["children"] == nlohmann::json::array({1}));
  CHECK(j["top_level"][1]["definition"] == 0);
  CHECK(j["top_level"][0]["definition"].is_null());
}

}  // namespace
}  // namespace patchgen::parser
