// Pin files: format/read round trip, UpdatePins across versions, ComparePins findings.
#include "pins.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "audit.h"

namespace patchgen::cli {
namespace {

namespace fs = std::filesystem;

rewriter::ContractPin Pin(std::string key, std::string sha, std::string text) {
  rewriter::ContractPin p;
  p.key = std::move(key);
  p.region = "function";
  p.expects = "rms_norm/standard";
  p.sha256 = std::move(sha);
  p.text = std::move(text);
  return p;
}

TEST_CASE("pin files round-trip through FormatPins and ReadPins", "[pins]") {
  PinFile pins;
  std::vector<rewriter::ContractPin> contract = {
      Pin("guard s in F.forward at 'x = \"a\\\\b\"' through 'if y:'", std::string(64, 'a'),
          "x = \"a\\\\b\"\nif y:\n  msg = \"\"\"\nline at column 0\n\"\"\"\n  return 1"),
      Pin("add_method A.f", std::string(64, 'b'), "(absent)"),
  };
  CHECK(UpdatePins(pins, contract, "5.17.0") == 2);
  fs::path dir = fs::temp_directory_path() / ("patchgen_pins_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::path file = dir / "s.pins";
  std::ofstream(file) << FormatPins(pins, "specs/s.yaml");
  auto read = ReadPins(file, "s.pins");
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  const PinFile& back = **read;
  REQUIRE(back.entries.size() == 2);
  CHECK(back.entries[0].key == contract[0].key);
  CHECK(back.entries[0].region == "function");
  REQUIRE(back.entries[0].verified.size() == 1);
  CHECK(back.entries[0].verified[0].text == contract[0].text);
  CHECK(back.entries[0].verified[0].versions == std::vector<std::string>{"5.17.0"});
  CHECK(ComparePins(back, contract).empty());
  auto missing = ReadPins(dir / "none.pins", "none.pins");
  REQUIRE(missing.ok());
  CHECK_FALSE(missing->has_value());
  std::ofstream(file) << "pins: 3\n";
  CHECK_FALSE(ReadPins(file, "s.pins").ok());
  fs::remove_all(dir);
}

TEST_CASE("UpdatePins adds versions and fingerprints; ComparePins reports what differs", "[pins]") {
  PinFile pins;
  UpdatePins(pins, {Pin("k", std::string(64, '1'), "old")}, "5.17.0");
  // Same fingerprint in another version: the version is added, nothing new.
  CHECK(UpdatePins(pins, {Pin("k", std::string(64, '1'), "old")}, "5.9.0") == 0);
  CHECK(pins.entries[0].verified[0].versions == std::vector<std::string>{"5.9.0", "5.17.0"});
  // A changed contract is reported against the newest verified record, then accepted once pinned.
  std::vector<rewriter::ContractPin> now = {Pin("k", std::string(64, '2'), "new"),
                                            Pin("other", std::string(64, '3'), "x")};
  auto findings = ComparePins(pins, now);
  REQUIRE(findings.size() == 2);
  CHECK(findings[0].kind == PinFinding::Kind::kChanged);
  CHECK(findings[0].pinned->text == "old");
  CHECK(findings[1].kind == PinFinding::Kind::kUnpinned);
  Diagnostic d = PinDiagnostic(findings[0], "up/m.py", "5.23.0", "s.pins", "s.yaml");
  CHECK(d.help.find("re-verify that the upstream body still computes rms_norm/standard, then run "
                    "`patchgen pin s.yaml`") == 0);
  CHECK(UpdatePins(pins, now, "5.23.0") == 2);
  CHECK(ComparePins(pins, now).empty());
  CHECK(ComparePins(pins, {Pin("k", std::string(64, '1'), "old")}).empty());  // Old still valid.
}

TEST_CASE("pin files keep their comments in place; '#' inside a text block is text", "[pins]") {
  PinFile pins;
  UpdatePins(pins,
             {Pin("guard a # b", std::string(64, 'a'), "x = 1\n# a line of the text"),
              Pin("add_method A.f", std::string(64, 'b'), "(absent)")},
             "5.17.0");
  std::string text = FormatPins(pins, "s.yaml");
  const std::string entry = "  - key: \"guard a # b\"\n";
  REQUIRE(text.find(entry) != std::string::npos);
  text.replace(text.find(entry), entry.size(),
               "    # about a\n" + entry.substr(0, entry.size() - 1) + "  # why\n");
  text.replace(text.find("  - key: \"add_method"), 0, "\n# about f, at column 0\n");
  text += "          # after the last line\n";
  fs::path dir = fs::temp_directory_path() / ("patchgen_pins_comments_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "s.pins") << text;
  auto read = ReadPins(dir / "s.pins", "s.pins");
  fs::remove_all(dir);
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  PinFile back = **read;
  // The trailing line is indented like the text block: YAML reads it as text, not as a comment.
  CHECK(back.entries[1].verified[0].text == "(absent)\n# after the last line");
  CHECK(back.entries[0].verified[0].text == "x = 1\n# a line of the text");
  CHECK(back.comments.before.size() == 2);
  CHECK(back.comments.trailing.size() == 1);
  CHECK(back.comments.end.empty());
  // Entries swapped: each comment moves with its entry (indented no deeper than the line it is on).
  std::swap(back.entries[0], back.entries[1]);
  std::string out = FormatPins(back, "s.yaml");
  CHECK(out.find("  # about a\n" + entry.substr(0, entry.size() - 1) + "  # why\n") !=
        std::string::npos);
  CHECK(out.find("# about f, at column 0\n  - key: \"add_method A.f\"\n") != std::string::npos);
  CHECK(out.find("Contract pins of") == out.rfind("Contract pins of"));
  // Without comments the text is what it always was.
  CHECK(FormatPins(pins, "s.yaml") == FormatPins(PinFile{pins.entries, {}}, "s.yaml"));
}

TEST_CASE("SignatureChanges names added, removed, reordered parameters, defaults, decorators",
          "[audit]") {
  std::vector<Param> old_params = {
      {"self", "", ""}, {"x", "torch.Tensor", ""}, {"eps", "", "1e-6"}, {"device", "", "None"}};
  std::vector<Param> new_params = {
      {"self", "", ""}, {"eps", "", "1e-5"}, {"x", "torch.Tensor", ""}, {"cache", "", "None"}};
  auto changes = SignatureChanges(old_params, new_params, {"@a"}, {"@a", "@torch.no_grad()"});
  CHECK(changes == std::vector<std::string>{
                       "parameter 'device' removed",
                       "parameter 'cache' added (default None)",
                       "parameters reordered: self, x, eps -> self, eps, x",
                       "default of 'eps' changed: 1e-6 -> 1e-5",
                       "decorator added: @torch.no_grad()",
                   });
  CHECK(SignatureChanges(old_params, old_params, {}, {}).empty());
}

TEST_CASE("ParametersOf: each parameter's name, annotation and default, whitespace collapsed",
          "[audit]") {
  auto m = parser::PyModule::Parse("m.py",
                                   "def f(self, x: torch.Tensor, *args: int, eps=1e-6,\n"
                                   "      shape: tuple = (1,\n"
                                   "                      2),  # comment\n"
                                   "      /, *, k, **kw):\n"
                                   "    pass\n");
  REQUIRE(m.ok());
  std::vector<std::string> got;
  for (const Param& p : ParametersOf(**m, *(*m)->Find("f"))) {
    got.push_back(p.name + "|" + p.annotation + "|" + p.default_value);
  }
  CHECK(got == std::vector<std::string>{"self||", "x|torch.Tensor|", "*args|int|", "eps||1e-6",
                                        "shape|tuple|(1, 2)", "/||", "*||", "k||", "**kw||"});
}

}  // namespace
}  // namespace patchgen::cli
