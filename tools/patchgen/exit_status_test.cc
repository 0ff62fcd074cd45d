#include "exit_status.h"

#include <catch2/catch.hpp>

namespace patchgen::cli {
namespace {

Diagnostic ErrorOf(ErrorKind kind) { return ErrorAt(SourceLoc::InFile("x.yaml"), "e", {}, kind); }

RunResult WithSpec(Mode mode, SpecOutcome spec) {
  RunResult r;
  r.mode = mode;
  r.specs.push_back(std::move(spec));
  return r;
}

TEST_CASE("ExitStatus: a stopped run exits with the code of why it stopped") {
  CHECK(ExitStatus(Stopped(Mode::kGenerate, Stop::kDone, {})) == kExitOk);
  CHECK(ExitStatus(Stopped(Mode::kCheck, Stop::kUsage, {})) == kExitUsage);
  CHECK(ExitStatus(Stopped(Mode::kList, Stop::kSpecsUnreadable, {})) == kExitIo);
  CHECK(ExitStatus(Stopped(Mode::kGenerate, Stop::kInternal, {})) == kExitInternal);
}

TEST_CASE("ExitStatus: the worst failed spec wins; drift fails --check only") {
  RunResult r = WithSpec(Mode::kGenerate, {JobStatus::kError, {ErrorOf(ErrorKind::kIo)}, true});
  r.specs.push_back({JobStatus::kError, {ErrorOf(ErrorKind::kSpec)}, true});
  r.specs.push_back({JobStatus::kWritten, {}, true});
  CHECK(ExitStatus(r) == kExitIo);
  CHECK(ExitStatus(WithSpec(Mode::kCheck, {JobStatus::kStale, {}, true})) == kExitDrift);
  CHECK(ExitStatus(WithSpec(Mode::kCheck, {JobStatus::kMissing, {}, true})) == kExitDrift);
  CHECK(ExitStatus(WithSpec(Mode::kList, {JobStatus::kStale, {}, true})) == kExitOk);
  CHECK(ExitStatus(WithSpec(Mode::kValidate,
                            {JobStatus::kInvalid, {ErrorOf(ErrorKind::kUpstream)}, true})) ==
        kExitUpstream);
  // --list reports an absent upstream without failing.
  CHECK(ExitStatus(WithSpec(Mode::kList, {JobStatus::kUpstreamNotFound, {}, true})) == kExitOk);
}

TEST_CASE("ExitStatus: audit's attention is 1, a spec that does not load its worst error") {
  CHECK(ExitStatus(WithSpec(Mode::kAudit,
                            {JobStatus::kNeedsAttention, {ErrorOf(ErrorKind::kSpec)}, true})) ==
        kExitDrift);
  CHECK(ExitStatus(WithSpec(Mode::kAudit,
                            {JobStatus::kNeedsAttention, {ErrorOf(ErrorKind::kSpec)}, false})) ==
        kExitSpec);
  CHECK(ExitStatus(WithSpec(Mode::kAudit, {JobStatus::kOk, {}, true})) == kExitOk);
}

TEST_CASE("ExitStatus: orphaned outputs left are drift, one that cannot be removed an I/O error") {
  RunResult r = WithSpec(Mode::kCheck, {JobStatus::kUpToDate, {}, true});
  CHECK(ExitStatus(r) == kExitOk);
  r.orphans_left = 2;
  CHECK(ExitStatus(r) == kExitDrift);
  r.errors.push_back(ErrorOf(ErrorKind::kIo));
  CHECK(ExitStatus(r) == kExitIo);
}

}  // namespace
}  // namespace patchgen::cli
