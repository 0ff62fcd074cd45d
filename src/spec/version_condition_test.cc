#include "spec/version_condition.h"

#include <catch2/catch.hpp>
#include <climits>

using patchgen::spec::CheckVersionCondition;
using patchgen::spec::ParseVersion;
using patchgen::spec::VersionMatches;

TEST_CASE("version conditions compare numerically", "[version]") {
  CHECK(VersionMatches(">=5.23", "5.23.0") == true);
  CHECK(VersionMatches(">=5.23", "5.17.0") == false);
  CHECK(VersionMatches("<5.23", "5.17.0") == true);
  CHECK(VersionMatches("<5.23", "5.9.0") == true);  // not text order
  CHECK(VersionMatches("<5.23", "5.24.0") == false);
  CHECK(VersionMatches(">=5.17,<5.23", "5.20.1") == true);
  CHECK(VersionMatches(">=5.17, <5.23", "5.23.0") == false);
  CHECK(VersionMatches("==5.23", "5.23.0") == true);
  CHECK(VersionMatches("!=5.23.0", "5.23") == false);
  CHECK(VersionMatches(">5.23", "5.23.1") == true);
  CHECK(VersionMatches("<=5.23", "5.23.0.dev0") == true);  // suffixes ignored
  CHECK(VersionMatches(">=5.24", "5.24.0rc1") == true);
}

TEST_CASE("version conditions that cannot be evaluated", "[version]") {
  CHECK_FALSE(VersionMatches(">=5.23", "unknown").has_value());
  CHECK_FALSE(VersionMatches("5.23", "5.23.0").has_value());
  CHECK(CheckVersionCondition("5.23").value().find("no comparison") != std::string::npos);
  CHECK(CheckVersionCondition(">=5.x").value().find("not a version") != std::string::npos);
  CHECK(CheckVersionCondition(">=5..1").has_value());
  CHECK(CheckVersionCondition("").has_value());
  CHECK_FALSE(CheckVersionCondition(">=5.17,<5.23").has_value());
  CHECK(ParseVersion("5.23.0") == std::vector<int>{5, 23, 0});
  CHECK(ParseVersion("unknown").empty());
  // A component too long for an int saturates (found by fuzz_spec: it overflowed).
  CHECK(ParseVersion("11111111111111111111.2") == std::vector<int>{INT_MAX, 2});
}
