#include "pins.h"

#include <algorithm>
#include <map>

#include "base/file_util.h"
#include "diff/unified_diff.h"
#include "files.h"
#include "spec/raw_node.h"

namespace patchgen::cli {
namespace fs = std::filesystem;

namespace {

using spec::RawNode;

const RawNode* Get(const RawNode& m, std::string_view key) {
  for (const auto& [k, v] : m.entries) {
    if (k.kind == RawNode::Kind::kScalar && k.scalar == key) return &v;
  }
  return nullptr;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string StripTrailingNewlines(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

/// Numeric order of versions ("5.9.0" < "5.17.0"), text order as a tie-break.
bool VersionLess(const std::string& a, const std::string& b) {
  auto parts = [](const std::string& v) {
    std::vector<long> out;
    size_t i = 0;
    while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) {
      out.push_back(std::stol(v.substr(i)));
      while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) ++i;
      if (i < v.size() && v[i] == '.') ++i;
    }
    return out;
  };
  auto pa = parts(a), pb = parts(b);
  if (pa != pb) return pa < pb;
  return a < b;
}

/// The newest version a record was verified in ("" when none).
std::string Newest(const PinRecord& r) {
  std::string best;
  for (const std::string& v : r.versions) {
    if (best.empty() || VersionLess(best, v)) best = v;
  }
  return best;
}

}  // namespace

const PinEntry* PinFile::Find(const std::string& key) const {
  for (const PinEntry& e : entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

fs::path PinsPathFor(const fs::path& spec) {
  fs::path p = spec;
  return p.replace_extension(".pins");
}

namespace {

/// A node of a pin file that is not what `patchgen pin` writes, and what is wrong.
struct PinFileError {
  const RawNode* node;
  std::string message;
};

// One `verified` record: sha256, text, versions.
std::optional<PinFileError> ReadPinRecord(const RawNode& v, PinRecord& r) {
  const RawNode* sha = v.kind == RawNode::Kind::kMapping ? Get(v, "sha256") : nullptr;
  if (!sha || sha->kind != RawNode::Kind::kScalar) {
    return PinFileError{&v, "each verified record needs 'sha256'"};
  }
  r.sha256 = sha->scalar;
  if (const RawNode* t = Get(v, "text")) r.text = StripTrailingNewlines(t->scalar);
  if (const RawNode* vs = Get(v, "versions")) {
    for (const RawNode& x : vs->items) r.versions.push_back(x.scalar);
  }
  return std::nullopt;
}

// One entry of `pins`: key, region, target, expects and its verified records.
std::optional<PinFileError> ReadPinEntry(const RawNode& item, PinEntry& e) {
  const RawNode* key = item.kind == RawNode::Kind::kMapping ? Get(item, "key") : nullptr;
  const RawNode* verified = item.kind == RawNode::Kind::kMapping ? Get(item, "verified") : nullptr;
  if (!key || key->kind != RawNode::Kind::kScalar || !verified ||
      verified->kind != RawNode::Kind::kSequence) {
    return PinFileError{&item, "each pin needs 'key' and a 'verified' sequence"};
  }
  e.key = key->scalar;
  if (const RawNode* region = Get(item, "region")) e.region = region->scalar;
  if (const RawNode* target = Get(item, "target")) e.target = target->scalar;
  if (const RawNode* expects = Get(item, "expects")) e.expects = expects->scalar;
  for (const RawNode& v : verified->items) {
    PinRecord r;
    if (auto wrong = ReadPinRecord(v, r)) return wrong;
    e.verified.push_back(std::move(r));
  }
  return std::nullopt;
}

}  // namespace

Result<std::optional<PinFile>> ReadPins(const fs::path& path, const std::string& shown) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<PinFile>();
  auto text = ReadFile(path);
  if (!text) {
    return ErrorAt(SourceLoc::InFile(shown), "cannot read pin file", {}, ErrorKind::kIo);
  }
  auto raw = spec::ParseRawYaml(shown, *text);
  if (!raw.ok()) return raw.errors();
  LineIndex lines(*text);
  auto bad = [&](const RawNode& n, const std::string& msg) {
    return MakeDiagnostic(shown, *text, lines,
                          {n.range.start, std::max(n.range.end, n.range.start + 1)},
                          "invalid pin file: " + msg,
                          "pin files are written by `patchgen pin`; regenerate it rather than "
                          "editing by hand");
  };
  PinFile out;
  const RawNode& root = *raw;
  if (root.kind != RawNode::Kind::kMapping) return bad(root, "expected a mapping");
  const RawNode* pins = Get(root, "pins");
  if (!pins) return std::optional<PinFile>(std::move(out));
  if (pins->kind != RawNode::Kind::kSequence) return bad(*pins, "'pins' must be a sequence");
  for (const RawNode& item : pins->items) {
    PinEntry e;
    if (auto wrong = ReadPinEntry(item, e)) return bad(*wrong->node, wrong->message);
    out.entries.push_back(std::move(e));
  }
  return std::optional<PinFile>(std::move(out));
}

std::string FormatPins(const PinFile& pins, const std::string& spec_shown) {
  std::string out =
      "# Contract pins of " + spec_shown +
      ": the upstream code each guard and patch relies on, as\n"
      "# verified by a person, per upstream version. Written by `patchgen pin`, checked by every\n"
      "# generation and --check (docs/cli.md, \"Contract pins\"). Review changes like code.\n"
      "pins:\n";
  for (const PinEntry& e : pins.entries) {
    out += "  - key: " + Quote(e.key) + "\n";
    out += "    region: " + e.region + "\n";
    if (!e.target.empty()) out += "    target: " + Quote(e.target) + "\n";
    if (!e.expects.empty()) out += "    expects: " + Quote(e.expects) + "\n";
    out += "    verified:\n";
    for (const PinRecord& r : e.verified) {
      out += "      - versions: [";
      for (size_t i = 0; i < r.versions.size(); ++i) out += (i ? ", " : "") + Quote(r.versions[i]);
      out += "]\n";
      out += "        sha256: " + r.sha256 + "\n";
      out += "        text: |\n";
      size_t pos = 0;
      std::string text = r.text.empty() ? "(empty)" : r.text;
      while (pos <= text.size()) {
        size_t end = std::min(text.find('\n', pos), text.size());
        std::string_view line(text.data() + pos, end - pos);
        out += line.empty() ? "\n" : "          " + std::string(line) + "\n";
        pos = end + 1;
      }
    }
  }
  return out;
}

namespace {

// Adds `version` to the record of entry whose fingerprint is the contract's, or a new record;
// returns 1 for a new fingerprint, else 0.
size_t AddVerified(PinEntry& entry, const rewriter::ContractPin& c, const std::string& version) {
  bool done = false;
  for (PinRecord& r : entry.verified) {
    if (r.sha256 != c.sha256) continue;
    if (std::find(r.versions.begin(), r.versions.end(), version) == r.versions.end()) {
      r.versions.push_back(version);
      std::sort(r.versions.begin(), r.versions.end(), VersionLess);
    }
    done = true;
  }
  if (done) return 0;
  entry.verified.push_back({c.sha256, {version}, c.text});
  return 1;
}

}  // namespace

size_t UpdatePins(PinFile& pins, const std::vector<rewriter::ContractPin>& contract,
                  const std::string& version) {
  size_t added = 0;
  std::vector<PinEntry> ordered;
  std::vector<bool> used(pins.entries.size(), false);
  for (const rewriter::ContractPin& c : contract) {
    PinEntry entry{c.key, c.region, c.qualname, c.expects, {}};
    for (size_t i = 0; i < pins.entries.size(); ++i) {
      if (!used[i] && pins.entries[i].key == c.key) {
        entry = pins.entries[i];
        used[i] = true;
        break;
      }
    }
    added += AddVerified(entry, c, version);
    entry.region = c.region;
    entry.target = c.qualname;
    entry.expects = c.expects;
    // Keep one entry per key even when the contract lists a key twice.
    bool merged = false;
    for (PinEntry& o : ordered) {
      if (o.key == entry.key) merged = true;
    }
    if (!merged) ordered.push_back(std::move(entry));
  }
  for (size_t i = 0; i < pins.entries.size(); ++i) {
    if (!used[i]) ordered.push_back(pins.entries[i]);
  }
  pins.entries = std::move(ordered);
  return added;
}

std::vector<PinFinding> ComparePins(const PinFile& pins,
                                    const std::vector<rewriter::ContractPin>& contract) {
  std::vector<PinFinding> out;
  for (const rewriter::ContractPin& c : contract) {
    const PinEntry* e = pins.Find(c.key);
    if (!e || e->verified.empty()) {
      out.push_back({PinFinding::Kind::kUnpinned, &c, nullptr});
      continue;
    }
    bool ok = false;
    const PinRecord* newest = &e->verified.front();
    for (const PinRecord& r : e->verified) {
      ok |= r.sha256 == c.sha256;
      if (VersionLess(Newest(*newest), Newest(r))) newest = &r;
    }
    if (!ok) out.push_back({PinFinding::Kind::kChanged, &c, newest});
  }
  return out;
}

std::vector<std::string> TextDiffLines(const std::string& before, const std::string& after) {
  std::string d = diff::UnifiedDiff(before + "\n", after + "\n", "pinned", "upstream", 2);
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < d.size()) {
    size_t end = d.find('\n', pos);
    if (end == std::string::npos) end = d.size();
    std::string line = d.substr(pos, end - pos);
    pos = end + 1;
    if (line.starts_with("--- ") || line.starts_with("+++ ")) continue;
    out.push_back(line);
  }
  return out;
}

namespace {

// What a pin of `region` covers, as a changed pin's message names it.
std::string PinSubject(const std::string& region, bool edit) {
  return region == "function"     ? "the guarded function"
         : region == "statements" ? (edit ? "the edited statements" : "the guarded statements")
         : region == "absent"     ? "the absence of the method it adds"
                                  : "the target's signature and decorators";
}

// What to re-verify when the pinned region of `c` changed.
std::string PinVerify(const rewriter::ContractPin& c, bool edit) {
  return c.region == "function" ? "re-verify that the upstream body still computes " + c.expects
         : c.region == "statements" && edit
             ? std::string("re-verify that the edit still fits the statements it anchors on")
         : c.region == "statements"
             ? "re-verify that the guarded statements still compute " + c.expects +
                   " and that the guard's `call` still passes what they use"
         : c.region == "absent"
             ? "upstream now defines it: drop the " + c.expects + " or make it an override_method"
             : "re-verify that the " + c.expects +
                   " body still fits the upstream signature and "
                   "decorators";
}

}  // namespace

Diagnostic PinDiagnostic(const PinFinding& f, const std::string& upstream_path,
                         const std::string& version, const std::string& pins_shown,
                         const std::string& spec_shown) {
  const rewriter::ContractPin& c = *f.pin;
  std::string where = SourceLoc::AtLine(upstream_path, c.first_line).PathLineSpan(c.last_line) +
                      " (" + version + ")";
  bool guard = c.key.starts_with("guard ");
  // An edit_body pin covers the statements an edit anchors on (region "statements", like a
  // call-site guard's), but there is no guard and no `call` to re-check.
  bool edit = c.key.starts_with("edit_body ");
  std::string subject = PinSubject(c.region, edit);
  std::string verify = PinVerify(c, edit);
  std::string pin_cmd = "`patchgen pin " + spec_shown + "` (with the same --source-root)";
  Diagnostic d;
  if (f.kind == PinFinding::Kind::kUnpinned) {
    d = ErrorAt(c.loc, "no contract pin for '" + c.key + "' in " + pins_shown,
                "check " + subject + " at " + where + ", then run " + pin_cmd);
    return d;
  }
  std::string versions;
  for (const std::string& v : f.pinned->versions) versions += (versions.empty() ? "" : ", ") + v;
  d = ErrorAt(c.loc,
              std::string("upstream changed ") + subject + " this " + (guard ? "guard" : "patch") +
                  " relies on: " + c.key.substr(c.key.find(' ') + 1),
              verify + ", then run " + pin_cmd);
  d.notes.push_back(Note::Text("upstream " + where + " differs from the pin in " + pins_shown +
                               " (verified with " + (versions.empty() ? "no version" : versions) +
                               ")"));
  d.notes.push_back(Note::Text("normalised upstream text, pinned (-) and now (+):"));
  for (std::string& l : TextDiffLines(f.pinned->text, c.text))
    d.notes.push_back(Note::Verbatim("  " + l));
  return d;
}

}  // namespace patchgen::cli
