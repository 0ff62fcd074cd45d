// Keeps schemas/patch-spec.schema.json in step with the loader: the keys, required keys and
// enumerated values at every level must be the loader's, and example specs must be accepted or
// rejected by both. JSON is YAML, so each example is fed as-is to the loader and, through a small
// validator for the keywords the schema uses, to the schema.
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

const json& Schema() {
  static const json schema = [] {
    std::ifstream in(std::string(PATCHGEN_SOURCE_DIR) + "/schemas/patch-spec.schema.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
  }();
  return schema;
}

// The object schema of a level: the root for the spec, `$defs/<name>` otherwise.
const json& LevelSchema(KeyLevel level) {
  return level == KeyLevel::kSpec ? Schema() : Schema().at("$defs").at(KeyLevelName(level));
}

std::set<std::string> Set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

std::vector<std::string> Strings(const json& array) {
  std::vector<std::string> out;
  for (const json& v : array) out.push_back(v.get<std::string>());
  return out;
}

TEST_CASE("schema keys match the loader's at every level", "[spec]") {
  for (KeyLevel level : AllKeyLevels()) {
    INFO("level " << KeyLevelName(level));
    const json& s = LevelSchema(level);
    CHECK(s.at("additionalProperties") == false);
    std::set<std::string> props;
    for (const auto& [key, value] : s.at("properties").items()) props.insert(key);
    CHECK(props == Set(KnownKeys(level)));
    // The spec's required keys apply when it has no `extends` (a parent may leave them to
    // children).
    const json& required = level == KeyLevel::kSpec ? s.at("else").at("required")
                           : s.contains("required") ? s.at("required")
                                                    : json::array();
    CHECK(Set(Strings(required)) == Set(RequiredKeys(level)));
  }
}

TEST_CASE("schema enums and patch kinds match the loader's", "[spec]") {
  const json& defs = Schema().at("$defs");
  CHECK(Strings(defs.at("slot").at("properties").at("scope").at("enum")) == ScopeValues());
  CHECK(Strings(defs.at("patch").at("properties").at("after").at("enum")) == InitAfterValues());
  std::vector<std::string> kinds;
  for (const json& branch : defs.at("patch").at("oneOf"))
    kinds.push_back(branch.at("required").at(0));
  CHECK(kinds == PatchKindKeys());
  CHECK(Schema().at("properties").at("version").at("enum") == json::array({1}));
}

// A validator for the JSON Schema keywords patch-spec.schema.json uses (patterns and
// propertyNames are left to the loader's own checks).
bool Valid(const json& schema, const json& v);

bool TypeIs(const std::string& type, const json& v) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer();
  return false;
}

bool Valid(const json& schema, const json& v) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    std::string ref = schema.at("$ref");
    const std::string prefix = "#/$defs/";
    if (!Valid(Schema().at("$defs").at(ref.substr(prefix.size())), v)) return false;
  }
  if (schema.contains("type") && !TypeIs(schema.at("type"), v)) return false;
  if (schema.contains("enum")) {
    bool found = false;
    for (const json& e : schema.at("enum")) found = found || e == v;
    if (!found) return false;
  }
  if (schema.contains("minLength") && v.is_string() &&
      v.get<std::string>().size() < schema.at("minLength").get<size_t>()) {
    return false;
  }
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      if (schema.contains("properties") && schema.at("properties").contains(key)) {
        if (!Valid(schema.at("properties").at(key), value)) return false;
      } else if (schema.contains("additionalProperties") &&
                 !Valid(schema.at("additionalProperties"), value)) {
        return false;
      }
    }
    if (schema.contains("required")) {
      for (const json& k : schema.at("required")) {
        if (!v.contains(k.get<std::string>())) return false;
      }
    }
    if (schema.contains("dependentRequired")) {
      for (const auto& [key, needs] : schema.at("dependentRequired").items()) {
        if (!v.contains(key)) continue;
        for (const json& k : needs) {
          if (!v.contains(k.get<std::string>())) return false;
        }
      }
    }
  }
  if (v.is_array() && schema.contains("items")) {
    for (const json& item : v) {
      if (!Valid(schema.at("items"), item)) return false;
    }
  }
  if (schema.contains("oneOf")) {
    int n = 0;
    for (const json& s : schema.at("oneOf")) n += Valid(s, v) ? 1 : 0;
    if (n != 1) return false;
  }
  if (schema.contains("anyOf")) {
    bool any = false;
    for (const json& s : schema.at("anyOf")) any = any || Valid(s, v);
    if (!any) return false;
  }
  if (schema.contains("not") && Valid(schema.at("not"), v)) return false;
  if (schema.contains("if")) {
    const char* branch = Valid(schema.at("if"), v) ? "then" : "else";
    if (schema.contains(branch) && !Valid(schema.at(branch), v)) return false;
  }
  return true;
}

struct Example {
  bool valid;
  std::string json_text;
};

const char* kHead = R"("upstream": "transformers.models.qwen3.modeling_qwen3", "output": "out.py")";

std::string WithHead(const std::string& rest) {
  return std::string("{") + kHead + ", " + rest + "}";
}

TEST_CASE("example specs are accepted or rejected by both the loader and the schema", "[spec]") {
  std::vector<Example> examples = {
      {true, std::string("{") + kHead + "}"},
      {true, WithHead(R"("version": 1, "description": "d", "runtime": "opslot",
        "name_map": {"Qwen3": "Qwen3Moe"},
        "imports": {"add": ["import os"], "drop": ["use_kernel_func_from_hub"]},
        "slots": [{"name": "rms", "op": "rms_norm", "variant": "standard", "scope": "instance",
                   "guards": [{"in": "A.forward", "call": "rms[0]"},
                              {"in": "f", "at": "y = g(", "through": "return y", "call": "y = rms[0]"}]}],
        "patches": [
          {"replace_class": "A", "from": "m.B", "description": "d"},
          {"replace_function": "f", "code": "def f(): pass", "name_map": {"X": "Y"}},
          {"override_method": "A.f", "code": "def f(self): pass"},
          {"add_method": "A.g", "code": "def g(self): pass"},
          {"modify_init": "C", "after": "super_init", "code": "self.x = 1"},
          {"edit_body": "A.h", "description": "d", "edits": [
            {"insert_before": "x = 1", "code": "y = 2"}, {"insert_after": "x = 1", "code": "y = 2"},
            {"replace": "z = ", "through": "return z", "code": "return 0"},
            {"delete": "w = "}, {"wrap": "v = ", "code": "with m:\n    ..."}]},
          {"config_slot": "A.kernel", "description": "d", "attribute": "a_kernel",
           "values": ["eager", "fused_2"], "default": "eager"},
          {"config_slot": "C.kernel", "attribute": "c_kernel", "values": ["x"]}],
        "helpers": [{"after": "A", "name": "_h", "code": "def _h(): pass"}],
        "blocks": ["X = 1"], "exclude": ["B"])")},
      {false, R"({"upstream": "m.a"})"},
      {false, WithHead(R"("upstrem": "m.a")")},
      {false, WithHead(R"("version": 2)")},
      {false, WithHead(R"("imports": {"ad": ["import os"]})")},
      {false, WithHead(R"("imports": {"drop": "x"})")},
      {false,
       WithHead(R"("patches": [{"override_method": "A.f", "replace_class": "B", "code": "x"}])")},
      {false, WithHead(R"("patches": [{"description": "no kind", "code": "x"}])")},
      {false, WithHead(R"("patches": [{"override_method": "A.f", "from": "m.f"}])")},
      {false, WithHead(R"("patches": [{"modify_init": "A", "from": "m.f"}])")},
      {false, WithHead(R"("patches": [{"replace_class": "A", "after": "end", "code": "x"}])")},
      {false, WithHead(R"("patches": [{"modify_init": "A", "after": "start", "code": "x"}])")},
      {false, WithHead(R"("patches": [{"replace_function": "f", "code": "x", "from": "m.f"}])")},
      {false, WithHead(R"("patches": [{"replace_function": "f"}])")},
      {false,
       WithHead(
           R"("patches": [{"replace_function": "f", "symbol": "g", "code": "def f(): pass"}])")},
      {false, WithHead(R"("patches": [{"edit_body": "A.f"}])")},
      {false,
       WithHead(R"("patches": [{"edit_body": "A.f", "code": "x", "edits": [{"delete": "x"}]}])")},
      {false,
       WithHead(
           R"("patches": [{"override_method": "A.f", "code": "x", "edits": [{"delete": "x"}]}])")},
      {false, WithHead(R"("patches": [{"edit_body": "A.f", "edits": [{"code": "x"}]}])")},
      {false,
       WithHead(
           R"("patches": [{"edit_body": "A.f", "edits": [{"delete": "x", "replace": "y", "code": "z"}]}])")},
      {false,
       WithHead(
           R"("patches": [{"edit_body": "A.f", "edits": [{"insert_after": "x", "through": "y", "code": "z"}]}])")},
      {false,
       WithHead(R"("patches": [{"edit_body": "A.f", "edits": [{"delete": "x", "code": "z"}]}])")},
      {false, WithHead(R"("patches": [{"edit_body": "A.f", "edits": [{"replace": "x"}]}])")},
      {false,
       WithHead(
           R"("patches": [{"edit_body": "A.f", "edits": [{"wrap": "x", "code": "y", "at": "z"}]}])")},
      {false, WithHead(R"("patches": [{"config_slot": "A.k", "attribute": "a"}])")},
      {false, WithHead(R"("patches": [{"config_slot": "A.k", "values": ["x"]}])")},
      {false,
       WithHead(
           R"("patches": [{"config_slot": "A.k", "attribute": "a", "values": ["x"], "code": "y"}])")},
      {false,
       WithHead(
           R"("patches": [{"config_slot": "A.k", "attribute": "a", "values": ["x"], "after": "end"}])")},
      {false,
       WithHead(R"("patches": [{"override_method": "A.f", "code": "x", "attribute": "a"}])")},
      {false, WithHead(R"("patches": [{"modify_init": "A", "code": "x", "default": "a"}])")},
      {false, WithHead(R"("slots": [{"name": "s", "op": "o"}])")},
      {false,
       WithHead(R"("slots": [{"name": "s", "op": "o", "variant": "v", "scope": "global"}])")},
      {false, WithHead(R"("slots": [{"name": "s", "op": "o", "variant": "v",
                                     "guards": [{"in": "f", "through": "x", "call": "s[0]"}]}])")},
      {false,
       WithHead(R"("slots": [{"name": "s", "op": "o", "variant": "v", "guards": [{"in": "f"}]}])")},
      {false, WithHead(R"("helpers": [{"before": "A", "code": "def h(): pass"}])")},
      {false, WithHead(R"("helpers": [{"name": "h"}])")},
      {false, WithHead(R"("exclude": "A")")},
      {false, WithHead(R"("remove": ["A"])")},
  };
  for (const Example& e : examples) {
    INFO(e.json_text);
    CHECK(Valid(Schema(), json::parse(e.json_text)) == e.valid);
    CHECK(LoadSpecFromString("example.yaml", e.json_text).ok() == e.valid);
  }
}

}  // namespace
}  // namespace patchgen::spec
