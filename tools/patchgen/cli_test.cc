#include "cli.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "exit_status.h"
#include "files.h"
#include "options.h"
#include "pipeline.h"
#include "project_config.h"
#include "run_result.h"
#include "source_lookup.h"

namespace patchgen::cli {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/patchgen_cli_test_XXXXXX";
    path = fs::path(mkdtemp(tmpl)).lexically_normal();
  }
  ~TempDir() { fs::remove_all(path); }
  void Write(const std::string& rel, const std::string& text) const {
    fs::create_directories((path / rel).parent_path());
    std::ofstream(path / rel, std::ios::binary) << text;
  }
};

TEST_CASE("DiffNameFor replaces .py by .diff") {
  CHECK(DiffNameFor("patched_modeling_x.py") == "patched_modeling_x.diff");
  CHECK(DiffNameFor("out.txt") == "out.txt.diff");
}

TEST_CASE("DisplayPath is relative to the base when possible") {
  CHECK(DisplayPath("/a/b/c.py", "/a") == "b/c.py");
  CHECK(DisplayPath("/x/c.py", "/a/b") == "../../x/c.py");
  CHECK(DisplayPath("b/./c.py", "/a") == "b/c.py");
}

TEST_CASE("WriteIfChanged writes atomically and leaves identical files alone") {
  TempDir dir;
  std::string error;
  fs::path file = dir.path / "sub" / "out.py";
  CHECK(WriteIfChanged(file, "x = 1\n", &error) == WriteOutcome::kWritten);
  auto mtime = fs::last_write_time(file);
  CHECK(WriteIfChanged(file, "x = 1\n", &error) == WriteOutcome::kUnchanged);
  CHECK(fs::last_write_time(file) == mtime);
  CHECK(WriteIfChanged(file, "x = 2\n", &error) == WriteOutcome::kWritten);
  CHECK(ReadFile(file) == std::optional<std::string>("x = 2\n"));
  CHECK(std::distance(fs::directory_iterator(file.parent_path()), fs::directory_iterator()) == 1);
}

TEST_CASE("Project config: pyproject.toml with [tool.patchgen], walking up") {
  TempDir dir;
  dir.Write("pyproject.toml",
            "[tool.patchgen]\nspecs = \"s\"\noutput = \"o\"\nsource_roots = [\"up\", \"/abs\"]\n"
            "python = \"bin/py\"\nruntime = \"veomni.ops\"\n");
  dir.Write("deep/er/pyproject.toml", "[project]\nname = 'x'\n");  // no table: skipped
  auto cfg = FindProjectConfig(dir.path / "deep" / "er");
  REQUIRE(cfg.ok());
  CHECK(cfg->root == dir.path);
  CHECK(cfg->specs == dir.path / "s");
  CHECK(cfg->output == dir.path / "o");
  CHECK(cfg->source_roots == std::vector<fs::path>{dir.path / "up", "/abs"});
  CHECK(cfg->python == (dir.path / "bin/py").string());
  CHECK(cfg->runtime == "veomni.ops");
}

TEST_CASE("Project config: patchgen.toml top-level keys and defaults") {
  TempDir dir;
  dir.Write("patchgen.toml", "python = \"python3.11\"\n");
  auto cfg = FindProjectConfig(dir.path);
  REQUIRE(cfg.ok());
  CHECK(cfg->specs == dir.path / "specs");
  CHECK(cfg->output == dir.path / "generated");
  CHECK(cfg->source_roots.empty());
  CHECK(cfg->python == "python3.11");
  CHECK(cfg->runtime == "opslot");
}

TEST_CASE("Project config: unknown keys are errors with a suggestion") {
  TempDir dir;
  dir.Write("patchgen.toml", "spec = \"x\"\n");
  auto cfg = LoadProjectConfig(dir.path / "patchgen.toml", dir.path);
  REQUIRE(!cfg.ok());
  REQUIRE(cfg.errors().size() == 1);
  CHECK(FormatDiagnostic(cfg.errors()[0]) ==
        "patchgen.toml:1:1: error: unknown key 'spec' in patchgen.toml\n"
        "    1 | spec = \"x\"\n"
        "      | ^~~~\n"
        "help: did you mean 'specs'? known keys: specs, output, source_roots, python, runtime\n");
}

TEST_CASE("Version helpers") {
  CHECK(VersionFromInit("import os\n__version__ = \"5.17.0\"\n") ==
        std::optional<std::string>("5.17.0"));
  CHECK(VersionFromInit("__version__='1.2'\n") == std::optional<std::string>("1.2"));
  CHECK(!VersionFromInit("version = '1'\n"));
  CHECK(VersionFromMetadata("Metadata-Version: 2.1\nName: x\nVersion: 2.0.1\n\nVersion: 9\n") ==
        std::optional<std::string>("2.0.1"));
  CHECK(!VersionFromMetadata("Name: x\n\nVersion: 9\n"));
}

TEST_CASE("SourceLookup finds modules in root order and reports every place looked") {
  TempDir dir;
  // Python's rules (issue #28): the regular package in `two` wins over the namespace portion
  // `one/pkg` (no __init__.py) before it.
  dir.Write("one/pkg/mod.py", "x = 0\n");
  dir.Write("two/pkg/__init__.py", "__version__ = \"2\"\n");
  dir.Write("two/pkg/mod.py", "x = 1\n");
  dir.Write("two/pkg/sub/__init__.py", "");
  SourceLookup lookup({{dir.path / "one", "first"}, {dir.path / "two", "second"}},
                      "/nonexistent/python", dir.path);
  auto found = lookup.Find("pkg.mod");
  REQUIRE(found.status == LookupResult::Status::kFound);
  CHECK(found.file.rel_path == "pkg/mod.py");
  CHECK(found.file.version == "2");
  CHECK(!lookup.asked_interpreter());
  CHECK(lookup.Find("pkg.sub").file.rel_path == "pkg/sub/__init__.py");
  auto missing = lookup.Find("pkg.nope");
  CHECK(missing.status == LookupResult::Status::kModuleMissing);
  CHECK(lookup.asked_interpreter());
  CHECK(missing.looked ==
        std::vector<std::string>{"one/pkg/nope.py (first)", "two/pkg/nope.py (second)",
                                 "sys.path: could not ask '/nonexistent/python' for sys.path"});
  CHECK(lookup.Find("other.mod").status == LookupResult::Status::kPackageMissing);
  CHECK(SourceLookup::SplitPathList("a::/b:", "/cwd") == std::vector<fs::path>{"/cwd/a", "/b"});
}

TEST_CASE("Job statuses print as docs/cli.md lists them; the flags select one mode") {
  std::vector<std::pair<JobStatus, std::string>> names = {
      {JobStatus::kWritten, "written"},
      {JobStatus::kUnchanged, "unchanged"},
      {JobStatus::kWouldWrite, "would write"},
      {JobStatus::kUpToDate, "up to date"},
      {JobStatus::kStale, "stale"},
      {JobStatus::kFixed, "fixed"},
      {JobStatus::kMissing, "missing"},
      {JobStatus::kUpstreamNotFound, "upstream not found"},
      {JobStatus::kValid, "valid"},
      {JobStatus::kInvalid, "invalid"},
      {JobStatus::kError, "error"},
      {JobStatus::kPinned, "pinned"},
      {JobStatus::kNeedsAttention, "needs attention"},
      {JobStatus::kOk, "ok"},
  };
  for (const auto& [status, name] : names) CHECK(StatusName(status) == name);
  CHECK(std::string(StatusName(JobStatus::kPending)).empty());
  Options o;
  CHECK(o.mode() == Mode::kGenerate);
  o.check = true;
  CHECK(o.mode() == Mode::kCheck);
  o = Options{};
  o.list = true;
  CHECK(o.mode() == Mode::kList);
  o = Options{};
  o.validate = true;
  CHECK(o.mode() == Mode::kValidate);
  o = Options{};
  o.pin = true;
  CHECK(o.mode() == Mode::kPin);
  o = Options{};
  o.audit = true;
  CHECK(o.mode() == Mode::kAudit);
  CHECK(ExitCodeOf(ErrorKind::kIo) == kExitIo);
  CHECK(static_cast<int>(kExitInternal) == 70);
}

}  // namespace
}  // namespace patchgen::cli
