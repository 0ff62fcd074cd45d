// The kind table (patch_kinds.h) against the PatchKind enum and the JSON Schema: every enum value
// has exactly one row, every row's key is a kind of the schema and back, and the schema's per-kind
// rules (target shape, refused keys) are the row's.
#include "spec/patch_kinds.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "spec/spec_keys.h"
#include "spec/spec_loader.h"

namespace patchgen::spec {
namespace {

using nlohmann::json;

const json& PatchSchema() {
  static const json schema = [] {
    std::ifstream in(std::string(PATCHGEN_SOURCE_DIR) + "/schemas/patch-spec.schema.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str()).at("$defs").at("patch");
  }();
  return schema;
}

// Every value of PatchKind. The switch has no default, so -Wswitch (an error under -Werror) stops
// the build when a value is added to the enum and not here.
std::vector<PatchKind> AllPatchKinds() {
  auto listed = [](PatchKind k) {
    switch (k) {
      case PatchKind::kReplaceClass:
      case PatchKind::kReplaceFunction:
      case PatchKind::kOverrideMethod:
      case PatchKind::kAddMethod:
      case PatchKind::kModifyInit:
      case PatchKind::kEditBody:
      case PatchKind::kConfigSlot:
        return true;
    }
    return false;
  };
  std::vector<PatchKind> out;
  for (int i = 0; i < 64; ++i) {
    if (listed(static_cast<PatchKind>(i))) out.push_back(static_cast<PatchKind>(i));
  }
  return out;
}

TEST_CASE("every PatchKind has exactly one row, found by its key", "[spec]") {
  std::vector<PatchKind> kinds = AllPatchKinds();
  CHECK(kinds.size() == std::size(kPatchKinds));
  for (PatchKind k : kinds) {
    int rows = 0;
    for (const PatchKindInfo& info : kPatchKinds) rows += info.kind == k ? 1 : 0;
    CHECK(rows == 1);
    const PatchKindInfo& info = InfoOf(k);
    CHECK(info.kind == k);
    REQUIRE(FindPatchKind(info.key) == &info);
    CHECK(std::string(PatchKindKey(k)) == info.key);
  }
  CHECK(FindPatchKind("replace_method") == nullptr);
  CHECK(FindPatchKind("") == nullptr);
}

TEST_CASE("the loader's kind keys derive from the table", "[spec]") {
  std::vector<std::string> keys;
  for (const PatchKindInfo& info : kPatchKinds) keys.emplace_back(info.key);
  CHECK(PatchKindKeys() == keys);
  const std::vector<std::string>& known = KnownKeys(KeyLevel::kPatch);
  REQUIRE(known.size() > keys.size());
  CHECK(std::vector<std::string>(known.begin(), known.begin() + static_cast<long>(keys.size())) ==
        keys);
  // Each kind-specific key the table can refuse is a key of the patch level.
  for (const PatchKindInfo& info : kPatchKinds) {
    for (const std::string& k : KeysRefusedBy(info)) {
      CHECK(std::find(known.begin(), known.end(), k) != known.end());
    }
  }
}

TEST_CASE("the schema's kinds are the table's, with the table's target shapes", "[spec]") {
  std::vector<std::string> schema_kinds;
  for (const json& branch : PatchSchema().at("oneOf"))
    schema_kinds.push_back(branch.at("required").at(0));
  CHECK(schema_kinds == PatchKindKeys());
  for (const PatchKindInfo& info : kPatchKinds) {
    INFO(info.key);
    const json& target = PatchSchema().at("properties").at(std::string(info.key));
    switch (info.target) {
      case TargetShape::kTopLevel:
        CHECK(target.at("$ref") == "#/$defs/identifier");
        CHECK(!target.contains("pattern"));
        break;
      case TargetShape::kMember:
        CHECK(target.at("$ref") == "#/$defs/dotted_name");
        CHECK(target.at("pattern") == "\\.");
        break;
      case TargetShape::kAny:
        CHECK(target.at("$ref") == "#/$defs/dotted_name");
        CHECK(!target.contains("pattern"));
        break;
    }
  }
}

TEST_CASE("the schema refuses on each kind the keys its row refuses", "[spec]") {
  for (const json& branch : PatchSchema().at("oneOf")) {
    std::string key = branch.at("required").at(0);
    INFO(key);
    const PatchKindInfo* info = FindPatchKind(key);
    REQUIRE(info);
    std::set<std::string> refused;
    for (const json& alt : branch.at("not").at("anyOf")) refused.insert(alt.at("required").at(0));
    std::vector<std::string> by_row = KeysRefusedBy(*info);
    CHECK(refused == std::set<std::string>(by_row.begin(), by_row.end()));
  }
}

TEST_CASE("the loader applies each row's target shape and refused keys", "[spec]") {
  for (const PatchKindInfo& info : kPatchKinds) {
    std::string key(info.key);
    INFO(key);
    std::string body = info.has_edits    ? R"("edits": [{"delete": "x = 1"}])"
                       : info.has_choice ? R"("attribute": "a", "values": ["x"])"
                                         : R"("code": "x = 1")";
    auto load = [&](const std::string& target, const std::string& extra) {
      return LoadSpecFromString(
          "k.yaml", R"({"upstream": "m.a", "output": "o.py", "patches": [{")" + key + R"(": ")" +
                        target + R"(", )" + body + extra + "}]}");
    };
    CHECK(load("A.f", "").ok() == (info.target != TargetShape::kTopLevel));
    CHECK(load("f", "").ok() == (info.target != TargetShape::kMember));
    std::string ok_target = info.target == TargetShape::kTopLevel ? "f" : "A.f";
    for (const std::string& refused : KeysRefusedBy(info)) {
      if (refused == "code" || refused == "edits") continue;  // The other body form.
      std::string value = refused == "after"  ? R"("end")"
                          : refused == "from" ? R"("m.B")"
                                              : R"("x")";
      CHECK_FALSE(load(ok_target, R"(, ")" + refused + R"(": )" + value).ok());
    }
    if (info.allows_after) CHECK(load(ok_target, R"(, "after": "end")").ok());
  }
}

TEST_CASE("wrong target shapes: the message and the row's help", "[spec]") {
  auto errors = [](const std::string& yaml) {
    auto r = LoadSpecFromString("k.yaml", yaml);
    REQUIRE_FALSE(r.ok());
    REQUIRE(r.errors().size() == 1);
    return r.errors()[0].message + " | " + r.errors()[0].help;
  };
  const std::string head = "upstream: m.a\noutput: o.py\npatches:\n";
  CHECK(errors(head + "  - replace_class: A.B\n    code: x\n") ==
        "'replace_class' takes a top-level name, found 'A.B' | to change a method, use "
        "`override_method: A.B`");
  CHECK(errors(head + "  - override_method: f\n    code: x\n") ==
        "'override_method' takes `Class.method`, found 'f' | to replace a top-level function, use "
        "`replace_function: f`");
  CHECK(errors(head + "  - add_method: A\n    code: x\n") ==
        "'add_method' takes `Class.method`, found 'A' | name the class and the new method, like "
        "`A.forward`");
  CHECK(errors(head + "  - replace_function: f\n    after: end\n    code: x\n") ==
        "'after' is only for modify_init | `after: super_init` places modify_init statements right "
        "after super().__init__(...)");
  CHECK(
      errors(head + "  - override_method: A.f\n    code: x\n    edits: []\n") ==
      "'edits' is only for edit_body | to change a few statements of A.f instead of replacing it, "
      "use `edit_body: A.f`");
}

}  // namespace
}  // namespace patchgen::spec
