// The stages every run takes its specs through, each a function of the run (RunContext) and of
// what earlier stages returned, returning data:
//
//   Discover          -> the spec files (named, or every spec under the specs root)
//   LoadSpecs         -> each spec loaded, or its errors
//   FindUpstreams     -> where each spec's upstream module is; skipped or not found
//   ParseUpstreams    -> each distinct upstream file read and parsed once, shared by its specs
//   PlaceOutputs      -> where each spec's .py and .diff go
//   GenerateSpecs     -> each spec generated in memory, its contract compared with its pins
//   OutputClashes     -> outputs that would overwrite an input or another spec's output
//
// The pipeline (cli.cc) files what each stage returns into one SpecRecord per spec, a field per
// stage; the modes (modes.h) read the records and act. Nothing is written before a mode runs.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/diagnostic.h"
#include "parser/py_module.h"
#include "pins.h"
#include "rewriter/result_types.h"
#include "run_context.h"
#include "run_result.h"
#include "source_lookup.h"
#include "spec/patch_spec.h"

namespace patchgen::cli {

/// A spec file of the run (Discover).
struct SpecFile {
  fs::path abs;
  std::string shown;        ///< As printed and given to the spec loader (Show).
  bool discovered = false;  ///< Found under the specs root rather than named.
};

/// A spec file loaded (LoadSpecs).
struct LoadedSpec {
  std::optional<spec::PatchSpec> spec;  ///< Loaded without an error.
  /// Loaded with errors in some entries: the rest of it, generated only to report the errors of
  /// those entries too (all errors in one round); never written. `spec` is then empty.
  std::optional<spec::PatchSpec> partial;
  bool entries_dropped = false;  ///< `partial` lost entries to their errors.
  std::vector<Diagnostic> errors;
};

/// Where a spec's upstream module is (FindUpstreams).
struct FoundUpstream {
  LookupResult lookup;
  bool skipped = false;  ///< A discovered spec whose upstream package is on no source root.
  std::vector<Diagnostic> errors;  ///< The module was not found.
};

/// A parsed upstream file, shared by every spec that names it.
struct Upstream {
  std::string source;  ///< As read (a byte order mark included), for the .diff.
  bool crlf = false;   ///< Every line ends with CRLF: so does the generated file.
  std::unique_ptr<parser::PyModule> module;
  std::string source_sha256;  ///< Of `source` (check stamps).
  /// Of module->source() (the bytes patched, a byte order mark left out).
  std::string module_sha256;
  std::vector<Diagnostic> errors;
};

/// The upstream files of a run (ParseUpstreams): each parsed once, and the one of each spec.
struct Upstreams {
  std::map<fs::path, std::unique_ptr<Upstream>> files;
  std::vector<const Upstream*> of;  ///< By spec; nullptr when none was parsed for it.
};

/// Where a spec's files go (PlaceOutputs); empty when its spec did not load.
struct OutputPaths {
  fs::path py, diff;
};

/// A spec generated in memory (GenerateSpecs).
struct Generated {
  std::string py_text, diff_text;
  size_t patches = 0;  ///< Entries of the header's `applied:` list.
  std::string upstream_sha;
  std::vector<rewriter::ContractPin> contract;          ///< What the applied entries rely on.
  std::vector<rewriter::SkippedEntry> skipped_entries;  ///< Conditional entries left out.
  std::optional<PinFile> pins;                          ///< The spec's pin file, when it has one.
  std::vector<PinFinding> pin_findings;  ///< Contract entries that differ from the pins.
  std::vector<Diagnostic> warnings;      ///< Entries without a pin.
  std::vector<Diagnostic> errors;
};

/// One spec through the stages: a field per stage, filed by the pipeline in stage order.
struct SpecRecord {
  SpecFile file;
  LoadedSpec load;
  FoundUpstream upstream;
  const Upstream* parsed = nullptr;
  OutputPaths out;
  Generated gen;
  std::vector<Diagnostic> clashes;  ///< OutputClashes.

  /// The spec, when it loaded without an error.
  const spec::PatchSpec* spec() const { return load.spec ? &*load.spec : nullptr; }
  bool skipped() const { return upstream.skipped; }
  bool found() const { return upstream.lookup.status == LookupResult::Status::kFound; }
  /// What failed it so far, in stage order (a partly loaded spec's errors sorted with the
  /// generator's, so that one round reports all of them); empty while it can be acted on.
  std::vector<Diagnostic> Errors() const;
};

/// Files each element of `parts` (a stage's result, one per spec) into its record's `field`.
template <class T>
void Fill(std::vector<SpecRecord>& specs, std::vector<T> parts, T SpecRecord::*field) {
  for (size_t i = 0; i < specs.size() && i < parts.size(); ++i)
    specs[i].*field = std::move(parts[i]);
}

// ----- discovery (discovery.cc) --------------------------------------------------------------

/// The spec files of the run, or why it stops (no specs folder: usage; a folder that cannot be
/// walked: unreadable), with what it prints (notes on skipped parent specs, errors).
struct Discovery {
  std::vector<SpecFile> specs;
  std::optional<Stop> stop;
  Printout printed;
};
Discovery Discover(const RunContext& ctx);

/// Spec files under `root`: *.yaml and *.yml, recursively, sorted by their '/'-separated relative
/// path, parent specs without `output` (extended by another found spec) left out with a note in
/// `notes`. Nothing is skipped silently: a folder that cannot be read and a symbolic link to a
/// folder (not followed: it could lead out of the tree or into a loop) are errors in `errors`,
/// and the walk goes on with the rest. A link to a file is a spec like any other. Paths in
/// messages are relative to `shown_base`.
std::vector<fs::path> DiscoverSpecs(const fs::path& root, const fs::path& shown_base,
                                    std::vector<Diagnostic>& errors, std::string& notes);

// ----- loading and upstreams (load_specs.cc, upstreams.cc) ------------------------------------

/// Every spec file loaded (on worker threads).
std::vector<LoadedSpec> LoadSpecs(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// The upstream lookup of the run: --source-root flags, PATCHGEN_SOURCE_PATH, the config's
/// source_roots, then the interpreter's sys.path.
SourceLookup MakeSourceLookup(const RunContext& ctx);

/// Where each loaded spec's upstream module is (serial: the lookup is not thread-safe).
std::vector<FoundUpstream> FindUpstreams(const RunContext& ctx,
                                         const std::vector<SpecRecord>& specs);

/// Reads and parses each upstream file the specs need once (on worker threads, largest first).
Upstreams ParseUpstreams(const RunContext& ctx, const std::vector<SpecRecord>& specs);

// ----- generation (generate_specs.cc, generated_checks.cc) ------------------------------------

/// "<name>.diff" for "<name>.py" (otherwise ".diff" is appended).
std::string DiffNameFor(const std::string& output_name);

/// Where each spec's .py and .diff go: -o DIR, else the output root mirroring the spec's folder
/// under the specs root.
std::vector<OutputPaths> PlaceOutputs(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// Each spec generated in memory (on worker threads, largest upstream first), checked (no target
/// defined twice upstream, no bytes CPython rejects), its contract compared with its pins, and its
/// .diff made when the mode needs one.
std::vector<Generated> GenerateSpecs(const RunContext& ctx, const std::vector<SpecRecord>& specs);

/// The first thing in a generated module that CPython rejects in any source file whatever its
/// grammar: a byte sequence that is not UTF-8 (no coding cookie survives the generated header), a
/// NUL byte, or U+FEFF (a byte order mark inside the file, e.g. from a patch file saved with one).
/// Returns its byte offset and what it is.
std::optional<std::pair<uint32_t, std::string>> FirstSourceBlocker(std::string_view text);

/// Errors for entries whose upstream target (or a class around it) is defined more than once in
/// one scope (PyModule::Redefinitions: Python keeps the last definition, the splice would patch
/// the first) or rebound later in its scope. Located at the spec entry, naming every definition.
std::vector<Diagnostic> AmbiguousTargets(const std::vector<rewriter::ContractPin>& contract,
                                         const parser::PyModule& upstream,
                                         const std::string& shown);

// ----- outputs (output_clashes.cc) ------------------------------------------------------------

/// What identifies a file on disk: its device and inode when it exists (so symlinks and hard links
/// to one file compare equal), otherwise its normalised absolute path.
std::string FileIdentity(const fs::path& p);

/// Never lose a file: per spec, the errors of an output that is one of the run's inputs (a spec,
/// a parent spec, a patch file, a pin file, an upstream file) or that two specs would both write.
std::vector<std::vector<Diagnostic>> OutputClashes(const RunContext& ctx,
                                                   const std::vector<SpecRecord>& specs);

}  // namespace patchgen::cli
