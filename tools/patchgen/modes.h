// The modes of patchgen: each a function of the run (RunContext) and of the spec records the
// pipeline made (pipeline.h), returning what it made of every spec, what it prints and its --json
// report (RunResult). The exit status is decided from that in one place (exit_status.h). Only
// generate, --check --fix and pin write, and only here.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pipeline.h"
#include "run_result.h"

namespace patchgen::cli {

/// Writes each generated spec's .py (and .diff) when its bytes change (--dry-run: only says what
/// it would write), and its check stamp (mode_generate.cc).
RunResult GenerateMode(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// --check: each generated spec against its files on disk, what drifted shown (--fix: written),
/// then the orphaned outputs (mode_check.cc, orphans.cc). `fresh`: every spec is up to date by
/// its check stamp and nothing was loaded (QuickCheck).
RunResult CheckMode(const RunContext& ctx, const std::vector<SpecRecord>& specs, bool fresh);

/// --list: every spec, its upstream, output and status against the files on disk (mode_list.cc).
RunResult ListMode(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// --validate: every loaded spec checked without its upstream module (mode_validate.cc).
RunResult ValidateMode(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// `pin`: each generated spec's contract recorded in its pin file (mode_pin.cc).
RunResult PinMode(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// `audit`: what the new upstream changes for every spec, against the pins and an optional old
/// upstream; writes nothing (mode_audit.cc).
RunResult AuditMode(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// `index`: what patchgen's parser sees in each file, parsed on worker threads and printed in
/// argument order (mode_index.cc).
RunResult IndexMode(const Options& opts);

// ----- check stamps (check_stamps.cc; the format: stamp_file.h) -------------------------------

/// Everything about the run, besides a spec's own files, that generation depends on: the version
/// and the very binary, the project config, -o and the source roots given. "" when the binary
/// cannot be identified: no stamp is then written or trusted. `may_write`: the binary's hash may
/// be cached (generation; --check stays read-only).
std::string StampKey(const RunContext& ctx, bool may_write);

/// After generation wrote a spec (or found its files unchanged): its stamp; after a failure, or
/// when anything about it is not certain, none (an old one is removed). Silent: it is a cache.
void WriteStamp(const RunContext& ctx, const SpecRecord& rec, const SpecOutcome& outcome,
                const std::string& key);

/// --check without parsing: when every spec has a stamp that still matches the run, its files and
/// its upstream, each spec's output paths from its stamp; nullopt when any one does not (then
/// every spec takes the full path).
std::optional<std::vector<OutputPaths>> QuickCheck(const RunContext& ctx,
                                                   const std::vector<SpecRecord>& specs);

// ----- orphaned outputs (orphans.cc) ------------------------------------------------------------

/// What --check made of the orphaned outputs: their paths, those --fix kept, what it prints, and
/// the errors of those it could not remove.
struct OrphansFound {
  std::vector<std::string> found;  ///< As shown.
  std::vector<std::string> kept;   ///< --fix: left on disk.
  size_t left = 0;                 ///< Reported, or kept by --fix: drift.
  std::vector<Diagnostic> errors;
  Printout printed;
};

/// Files under the output root that carry patchgen's header but that no spec produces (their spec
/// was deleted, renamed or given another `output:`), reported, or removed with --fix when patchgen
/// wrote exactly their bytes in this project. Only when every spec was discovered and known.
OrphansFound CheckOrphans(const RunContext& ctx, const std::vector<SpecRecord>& specs, bool fresh);

/// Records that generation or --fix wrote `bytes` at `path` (or found them there): what lets --fix
/// remove it once it is orphaned (output_record.h).
void RecordWritten(const RunContext& ctx, const fs::path& path, const std::string& bytes);

}  // namespace patchgen::cli
