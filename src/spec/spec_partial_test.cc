// LoadSpecKeepingEntries: the errors of a spec and, when they lie in entries, the rest of the spec,
// so that the generator's errors in the other entries are reported in the same run (issue #18).
#include <catch2/catch.hpp>

#include "spec/spec_loader.h"

namespace patchgen::spec {
namespace {

const std::string kHead = "upstream: m.a\noutput: o.py\n";

std::vector<std::string> Targets(const PatchSpec& s) {
  std::vector<std::string> out;
  for (const Patch& p : s.patches) out.push_back(p.target);
  return out;
}

TEST_CASE("keeping entries: a valid spec loads as LoadSpecFromString loads it", "[spec]") {
  PartialLoad r =
      LoadSpecKeepingEntries("k.yaml", kHead + "patches:\n  - modify_init: A\n    code: x = 1\n");
  CHECK(r.errors.empty());
  REQUIRE(r.spec);
  CHECK(Targets(*r.spec) == std::vector<std::string>{"A"});
  CHECK_FALSE(r.entries_dropped);
}

TEST_CASE("keeping entries: an unknown key leaves its entry in, nothing is dropped", "[spec]") {
  PartialLoad r = LoadSpecKeepingEntries(
      "k.yaml", kHead + "patches:\n  - modify_init: A\n    descripton: d\n    code: x = 1\n");
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message == "unknown key 'descripton' in a patch");
  REQUIRE(r.spec);
  CHECK(Targets(*r.spec) == std::vector<std::string>{"A"});
  CHECK_FALSE(r.entries_dropped);
}

TEST_CASE("keeping entries: entries with errors are left out, the others kept", "[spec]") {
  PartialLoad r = LoadSpecKeepingEntries("k.yaml", kHead +
                                                       "patches:\n"
                                                       "  - override_method: A.f\n"  // no body
                                                       "  - modify_init: B\n"
                                                       "    code: x = 1\n"
                                                       "  - override_method: C.f\n"
                                                       "    file: missing.py\n"
                                                       "    symbol: f\n"
                                                       "  - config_slot: D.k\n"
                                                       "    attribute: k\n"
                                                       "helpers:\n"
                                                       "  - file: missing.py\n"
                                                       "    symbol: h\n");
  CHECK(r.errors.size() == 4);
  REQUIRE(r.spec);
  CHECK(Targets(*r.spec) == std::vector<std::string>{"B"});
  CHECK(r.spec->helpers.empty());
  CHECK(r.entries_dropped);
}

TEST_CASE("keeping entries: errors outside the entries keep nothing", "[spec]") {
  auto kept = [](const std::string& yaml) {
    PartialLoad r = LoadSpecKeepingEntries("k.yaml", yaml);
    CHECK_FALSE(r.errors.empty());
    return r.spec.has_value();
  };
  const std::string patch = "patches:\n  - modify_init: A\n    code: x = 1\n";
  CHECK_FALSE(kept(kHead + "name_map:\n  A*: B\n" + patch));            // a bad name_map rule
  CHECK_FALSE(kept("upstream: m.a\n" + patch));                         // no output
  CHECK_FALSE(kept("upstream: m.a\noutput: o\n" + patch));              // a bad output
  CHECK_FALSE(kept(kHead + "version: 2\n" + patch));                    // the version
  CHECK_FALSE(kept(kHead + "remove: [A]\n" + patch));                   // remove without extends
  CHECK_FALSE(kept(kHead + "extends: no_such_parent.yaml\n" + patch));  // the chain
  CHECK_FALSE(kept("upstream: [\n"));                                   // not YAML
}

}  // namespace
}  // namespace patchgen::spec
