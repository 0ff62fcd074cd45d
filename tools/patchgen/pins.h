// Contract pins (docs/cli.md, "Contract pins"): per spec, a reviewed file that records the
// fingerprint of the upstream code every guard and patch relies on (rewriter::ContractPin), for
// each upstream version it was verified against. `patchgen pin` writes it; generation and
// --check compare the current upstream with it and fail, naming the spec line, the upstream
// place and a diff of the normalised upstream text, when a contract changed.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/diagnostic.h"
#include "rewriter/result_types.h"

namespace patchgen::cli {

/// One fingerprint a person verified, and the upstream versions it was seen in.
struct PinRecord {
  std::string sha256;
  std::vector<std::string> versions;
  std::string text;  ///< Normalised upstream text (no trailing newline).
  SourceLoc loc;     ///< Its sha256 in the pin file (ReadPins; unknown for a new record).
};

struct PinEntry {
  std::string key;      ///< rewriter::ContractPin::key
  std::string region;   ///< rewriter::ContractPin::region
  std::string target;   ///< rewriter::ContractPin::qualname (lets audit find it by name)
  std::string expects;  ///< rewriter::ContractPin::expects
  std::vector<PinRecord> verified;  ///< Oldest first.
};

/// The comments a person wrote in a pin file, kept when `patchgen pin` rewrites it. A comment
/// line belongs to the line after it and an end-of-line comment to its line, each named by what
/// that line is (an entry by its key, a verified record by its sha256, a field of either), so
/// that they stay in place when entries move or records are added.
struct PinComments {
  std::map<std::string, std::vector<std::string>> before;  ///< Line -> comment lines before it.
  std::map<std::string, std::string> trailing;  ///< Line -> its end-of-line comment ("  # x").
  std::vector<std::string> end;                 ///< Comment lines after the last line.
};

struct PinFile {
  std::vector<PinEntry> entries;
  PinComments comments;
  const PinEntry* Find(const std::string& key) const;
};

/// `specs/x/y.yaml` -> `specs/x/y.pins` (a YAML file; not `*.yaml`, so that spec discovery and
/// `specs/*/*.yaml` globs never take it for a spec).
std::filesystem::path PinsPathFor(const std::filesystem::path& spec);

/// Reads a pin file; nullopt (no error) when it does not exist. `shown` is the path as printed.
Result<std::optional<PinFile>> ReadPins(const std::filesystem::path& path,
                                        const std::string& shown);

/// The file's text, entries in their order, with the comments `pins` was read with in place (a
/// comment whose line is gone goes to the end: none is lost).
std::string FormatPins(const PinFile& pins, const std::string& spec_shown);

/// Adds the current contract, seen in upstream `version`, to `pins`: a fingerprint already
/// recorded gets the version added, a new one is appended. Entries of keys not in `contract` are
/// kept (they may belong to entries of other upstream versions). Returns the number of new
/// fingerprints.
size_t UpdatePins(PinFile& pins, const std::vector<rewriter::ContractPin>& contract,
                  const std::string& version);

/// What checking one contract entry against the pins found.
struct PinFinding {
  /// kDamaged: no verified sha256 matches, but a verified record holds exactly the upstream
  /// text: its sha256 is not the fingerprint of that text (a damaged or hand-edited pin file),
  /// upstream did not change.
  enum class Kind { kChanged, kUnpinned, kDamaged };
  Kind kind = Kind::kChanged;
  const rewriter::ContractPin* pin = nullptr;
  const PinRecord* pinned = nullptr;  ///< kChanged: the newest verified record; kDamaged: its own.
};

std::vector<PinFinding> ComparePins(const PinFile& pins,
                                    const std::vector<rewriter::ContractPin>& contract);

/// The error for a finding: at the spec entry, naming the upstream place, with a diff of the
/// pinned and current normalised text and what to do.
Diagnostic PinDiagnostic(const PinFinding& f, const std::string& upstream_path,
                         const std::string& version, const std::string& pins_shown,
                         const std::string& spec_shown);

/// "- pinned / + now" lines of a small diff between two normalised texts.
std::vector<std::string> TextDiffLines(const std::string& before, const std::string& after);

}  // namespace patchgen::cli
