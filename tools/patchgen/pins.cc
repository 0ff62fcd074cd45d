#include "pins.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "base/file_util.h"
#include "base/text_util.h"
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
  std::string help;  ///< Empty: regenerate the file.
};

/// A key of mapping `m` (`what`: "a pin", "a verified record", "the file") that is none of
/// `known`, with did-you-mean: a misspelt key would otherwise be ignored.
std::optional<PinFileError> UnknownKey(const RawNode& m, const std::vector<std::string>& known,
                                       const std::string& what) {
  for (const auto& [k, v] : m.entries) {
    if (k.kind == RawNode::Kind::kScalar &&
        std::find(known.begin(), known.end(), k.scalar) != known.end()) {
      continue;
    }
    std::string names;
    for (const std::string& n : known) names += (names.empty() ? "'" : ", '") + n + "'";
    return PinFileError{&k, "unknown key '" + k.scalar + "' in " + what,
                        WithDidYouMean(k.scalar, known, "the keys of " + what + " are " + names)};
  }
  return std::nullopt;
}

bool IsSha256Hex(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// One `verified` record: sha256, text, versions.
std::optional<PinFileError> ReadPinRecord(const RawNode& v, PinRecord& r) {
  const RawNode* sha = v.kind == RawNode::Kind::kMapping ? Get(v, "sha256") : nullptr;
  if (!sha || sha->kind != RawNode::Kind::kScalar) {
    return PinFileError{&v, "each verified record needs 'sha256'", {}};
  }
  if (auto wrong = UnknownKey(v, {"versions", "sha256", "text"}, "a verified record")) return wrong;
  if (!IsSha256Hex(sha->scalar)) {
    return PinFileError{
        sha,
        "damaged pin file: sha256 '" + sha->scalar + "' is not 64 lowercase hexadecimal digits",
        "restore the file from version control, or delete this record and run "
        "`patchgen pin` after checking the upstream code"};
  }
  r.sha256 = sha->scalar;
  if (const RawNode* t = Get(v, "text")) r.text = StripTrailingNewlines(t->scalar);
  if (const RawNode* vs = Get(v, "versions")) {
    for (const RawNode& x : vs->items) r.versions.push_back(x.scalar);
  }
  return std::nullopt;
}

/// Where a node of the pin file is (a diagnostic's location).
using LocateFn = std::function<SourceLoc(const RawNode&)>;

// One entry of `pins`: key, region, target, expects and its verified records.
std::optional<PinFileError> ReadPinEntry(const RawNode& item, const LocateFn& locate, PinEntry& e) {
  const RawNode* key = item.kind == RawNode::Kind::kMapping ? Get(item, "key") : nullptr;
  const RawNode* verified = item.kind == RawNode::Kind::kMapping ? Get(item, "verified") : nullptr;
  if (!key || key->kind != RawNode::Kind::kScalar || !verified ||
      verified->kind != RawNode::Kind::kSequence) {
    return PinFileError{&item, "each pin needs 'key' and a 'verified' sequence", {}};
  }
  if (auto wrong = UnknownKey(item, {"key", "region", "target", "expects", "verified"}, "a pin"))
    return wrong;
  e.key = key->scalar;
  if (const RawNode* region = Get(item, "region")) e.region = region->scalar;
  if (const RawNode* target = Get(item, "target")) e.target = target->scalar;
  if (const RawNode* expects = Get(item, "expects")) e.expects = expects->scalar;
  for (const RawNode& v : verified->items) {
    PinRecord r;
    if (auto wrong = ReadPinRecord(v, r)) return wrong;
    r.loc = locate(*Get(v, "sha256"));
    e.verified.push_back(std::move(r));
  }
  return std::nullopt;
}

}  // namespace

namespace {

// ---- Comments: read with the file, written back by FormatPins (PinComments) ----

constexpr std::string_view kHeaderStart = "# Contract pins of ";
constexpr std::string_view kHeaderEnd = ": the upstream code each guard and patch relies on, as";
constexpr std::string_view kHeader2 =
    "# verified by a person, per upstream version. Written by `patchgen pin`, checked by every";
constexpr std::string_view kHeader3 =
    "# generation and --check (docs/cli.md, \"Contract pins\"). Review changes like code.";

// Names of the lines of a pin file: what a line is, wherever it is.
std::string EntryAnchor(const std::string& key) { return "entry\x1f" + key; }
std::string RecordAnchor(const std::string& key, const std::string& sha) {
  return "record\x1f" + key + "\x1f" + sha;
}
std::string FieldAnchor(const std::string& owner, const std::string& field) {
  return owner + "\x1f." + field;
}

// The anchors of one pin entry's nodes, by byte offset (the first one at an offset wins: an entry
// or a record rather than its first key).
void AddEntryAnchors(const RawNode& item, std::map<uint32_t, std::string>& at) {
  const RawNode* key = item.kind == RawNode::Kind::kMapping ? Get(item, "key") : nullptr;
  if (!key) return;
  const std::string entry = EntryAnchor(key->scalar);
  at.emplace(item.range.start, entry);
  for (const auto& [k, v] : item.entries) {
    at.emplace(k.range.start, FieldAnchor(entry, k.scalar));
    if (k.scalar != "verified") continue;
    for (const RawNode& rec : v.items) {
      const RawNode* sha = rec.kind == RawNode::Kind::kMapping ? Get(rec, "sha256") : nullptr;
      if (!sha) continue;
      const std::string record = RecordAnchor(key->scalar, sha->scalar);
      at.emplace(rec.range.start, record);
      for (const auto& [rk, rv] : rec.entries)
        at.emplace(rk.range.start, FieldAnchor(record, rk.scalar));
    }
  }
}

std::map<uint32_t, std::string> AnchorsOf(const RawNode& root) {
  std::map<uint32_t, std::string> at;
  for (const auto& [k, v] : root.entries) {
    at.emplace(k.range.start, "top\x1f" + k.scalar);
    if (k.scalar != "pins") continue;
    for (const RawNode& item : v.items) AddEntryAnchors(item, at);
  }
  return at;
}

// Where an end-of-line comment starts on `line` (the blanks before its '#'), or npos: a '#' after
// a blank, outside a quoted scalar (a quote opens one only where a scalar starts).
size_t TrailingCommentAt(std::string_view line) {
  char quote = 0;
  char prev = ' ';  // the last character that is not a blank
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      if (quote == '"' && c == '\\')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if ((c == '"' || c == '\'') &&
               std::string_view(" :-[{,").find(prev) != std::string_view::npos) {
      quote = c;
    } else if (c == '#' && i > 0 && (line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.find_last_not_of(" \t", i - 1) + 1;
    }
    if (c != ' ' && c != '\t') prev = c;
  }
  return std::string_view::npos;
}

// Whether `line` (without its comment) opens a block scalar: its value is `|` or `>`, with
// optional chomping and indentation indicators.
bool OpensBlockScalar(std::string_view line) {
  line = line.substr(0, std::min(line.size(), TrailingCommentAt(line)));
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
  size_t colon = line.rfind(": ");
  size_t first = line.find_first_not_of(' ');
  std::string_view value = colon != std::string_view::npos ? line.substr(colon + 2)
                           : first != std::string_view::npos && line.substr(first).starts_with("- ")
                               ? line.substr(first + 2)
                               : std::string_view();
  value = value.substr(std::min(value.size(), value.find_first_not_of(' ')));
  return !value.empty() && (value[0] == '|' || value[0] == '>') &&
         value.find_first_not_of("-+0123456789", 1) == std::string_view::npos;
}

// The lines of a block scalar (YAML: blank, or indented at least as its first line, which is
// indented more than the line that opened it).
struct BlockScalar {
  int parent = -1;   ///< Indentation of the line that opened it; -1: none open.
  int content = -1;  ///< Indentation of its content, once seen.

  bool Holds(std::string_view line) {
    if (parent < 0) return false;
    size_t first = line.find_first_not_of(' ');
    if (first == std::string_view::npos) return true;
    int indent = static_cast<int>(first);
    if (content < 0 && indent > parent) content = indent;
    if (content >= 0 && indent >= content) return true;
    parent = content = -1;
    return false;
  }
};

bool IsGeneratedHeaderLine(std::string_view line) {
  return (line.starts_with(kHeaderStart) && line.ends_with(kHeaderEnd)) || line == kHeader2 ||
         line == kHeader3;
}

// The anchor of the node that starts first on the line [begin, end), or "" when none does.
std::string AnchorOn(const std::map<uint32_t, std::string>& anchors, size_t begin, size_t end) {
  auto it = anchors.lower_bound(static_cast<uint32_t>(begin));
  return it != anchors.end() && it->first < end ? it->second : std::string();
}

// Reads a pin file's comments line by line (ReadPinComments).
class CommentReader {
 public:
  explicit CommentReader(const RawNode& root) : anchors_(AnchorsOf(root)) {}

  // The line [begin, end) of the text, without its line break.
  void Take(std::string_view line, size_t begin, size_t end) {
    size_t first = line.find_first_not_of(' ');
    if (block_.Holds(line) || first == std::string_view::npos) return;
    if (line[first] == '#') {
      if (!(top_ && IsGeneratedHeaderLine(line))) pending_.emplace_back(line);
      return;
    }
    top_ = false;
    std::string anchor = AnchorOn(anchors_, begin, end);
    for (std::string& p : pending_) c_.before[anchor].push_back(std::move(p));
    pending_.clear();
    if (size_t at = TrailingCommentAt(line); at != std::string_view::npos) {
      // A comment on a line patchgen does not write (anchor "") goes with the loose ones.
      if (anchor.empty()) c_.before[""].emplace_back(line.substr(at));
      if (!anchor.empty()) c_.trailing[anchor] = std::string(line.substr(at));
    }
    if (OpensBlockScalar(line)) block_.parent = static_cast<int>(first);
  }

  PinComments Finish() {
    c_.end = std::move(pending_);
    return std::move(c_);
  }

 private:
  const std::map<uint32_t, std::string> anchors_;
  PinComments c_;
  std::vector<std::string> pending_;  ///< Comment lines not yet followed by a line.
  BlockScalar block_;
  bool top_ = true;  ///< Before the first line that is not a comment (the header's place).
};

// The comments of a pin file's `text` (parsed as `root`), each tied to its line; the header
// FormatPins writes is not a comment of the file.
PinComments ReadPinComments(const std::string& text, const RawNode& root) {
  CommentReader reader(root);
  for (size_t begin = 0; begin < text.size();) {
    size_t end = std::min(text.find('\n', begin), text.size());
    std::string_view line(text.data() + begin, end - begin);
    if (line.ends_with('\r')) line.remove_suffix(1);
    reader.Take(line, begin, end);
    begin = end + 1;
  }
  return reader.Finish();
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
  auto bad = [&](const PinFileError& e) {
    const RawNode& n = *e.node;
    return MakeDiagnostic(shown, *text, lines,
                          {n.range.start, std::max(n.range.end, n.range.start + 1)},
                          "invalid pin file: " + e.message,
                          e.help.empty() ? "pin files are written by `patchgen pin`; regenerate "
                                           "it rather than editing by hand"
                                         : e.help);
  };
  LocateFn locate = [&](const RawNode& n) { return LocOf(shown, *text, lines, n.range); };
  PinFile out;
  const RawNode& root = *raw;
  if (root.kind != RawNode::Kind::kMapping) return bad({&root, "expected a mapping", {}});
  if (auto wrong = UnknownKey(root, {"pins"}, "the file")) return bad(*wrong);
  const RawNode* pins = Get(root, "pins");
  if (!pins) return std::optional<PinFile>(std::move(out));
  if (pins->kind != RawNode::Kind::kSequence) return bad({pins, "'pins' must be a sequence", {}});
  for (const RawNode& item : pins->items) {
    PinEntry e;
    if (auto wrong = ReadPinEntry(item, locate, e)) return bad(*wrong);
    out.entries.push_back(std::move(e));
  }
  out.comments = ReadPinComments(*text, root);
  return std::optional<PinFile>(std::move(out));
}

namespace {

// A comment line indented at most `indent` columns (deeper, it could be read as part of a block
// scalar before it).
std::string Indented(const std::string& comment, size_t indent) {
  size_t first = comment.find_first_not_of(" \t");
  if (first == std::string::npos || first <= indent) return comment;
  return std::string(indent, ' ') + comment.substr(first);
}

// Writes a pin file line by line, each line with the comments that belong to it.
class PinWriter {
 public:
  explicit PinWriter(const PinComments& comments) : comments_(comments) {}

  void Raw(std::string_view line) {
    out_ += line;
    out_ += '\n';
  }

  void Line(const std::string& anchor, const std::string& line) {
    size_t indent = line.find_first_not_of(' ');
    if (auto it = comments_.before.find(anchor); it != comments_.before.end()) {
      for (const std::string& c : it->second) Raw(Indented(c, indent));
    }
    used_.insert(anchor);
    out_ += line;
    if (auto it = comments_.trailing.find(anchor); it != comments_.trailing.end())
      out_ += it->second;
    out_ += '\n';
  }

  // The text; comments whose line is no longer written go last, so that none is lost.
  std::string Finish() {
    for (const auto& [anchor, lines] : comments_.before) {
      if (used_.count(anchor)) continue;
      for (const std::string& c : lines) Raw(Indented(c, 0));
    }
    for (const auto& [anchor, tail] : comments_.trailing) {
      if (!used_.count(anchor)) Raw(Indented(tail, 0));
    }
    for (const std::string& c : comments_.end) Raw(Indented(c, 0));
    return std::move(out_);
  }

 private:
  const PinComments& comments_;
  std::set<std::string> used_;
  std::string out_;
};

// One verified record of the entry `key`.
void WriteRecord(PinWriter& w, const std::string& key, const PinRecord& r) {
  const std::string record = RecordAnchor(key, r.sha256);
  std::string versions;
  for (size_t i = 0; i < r.versions.size(); ++i) versions += (i ? ", " : "") + Quote(r.versions[i]);
  w.Line(record, "      - versions: [" + versions + "]");
  w.Line(FieldAnchor(record, "sha256"), "        sha256: " + r.sha256);
  w.Line(FieldAnchor(record, "text"), "        text: |");
  std::string text = r.text.empty() ? "(empty)" : r.text;
  for (size_t pos = 0; pos <= text.size();) {
    size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line(text.data() + pos, end - pos);
    w.Raw(line.empty() ? "" : "          " + std::string(line));
    pos = end + 1;
  }
}

}  // namespace

std::string FormatPins(const PinFile& pins, const std::string& spec_shown) {
  PinWriter w(pins.comments);
  w.Raw(std::string(kHeaderStart) + spec_shown + std::string(kHeaderEnd));
  w.Raw(kHeader2);
  w.Raw(kHeader3);
  w.Line("top\x1fpins", "pins:");
  for (const PinEntry& e : pins.entries) {
    const std::string entry = EntryAnchor(e.key);
    w.Line(entry, "  - key: " + Quote(e.key));
    w.Line(FieldAnchor(entry, "region"), "    region: " + e.region);
    if (!e.target.empty()) w.Line(FieldAnchor(entry, "target"), "    target: " + Quote(e.target));
    if (!e.expects.empty())
      w.Line(FieldAnchor(entry, "expects"), "    expects: " + Quote(e.expects));
    w.Line(FieldAnchor(entry, "verified"), "    verified:");
    for (const PinRecord& r : e.verified) WriteRecord(w, e.key, r);
  }
  return w.Finish();
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
  entry.verified.push_back({c.sha256, {version}, c.text, {}});
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
    const PinRecord* same_text = nullptr;
    for (const PinRecord& r : e->verified) {
      ok |= r.sha256 == c.sha256;
      if (VersionLess(Newest(*newest), Newest(r))) newest = &r;
      if (!same_text && r.text == c.text) same_text = &r;
    }
    if (ok) continue;
    if (same_text) {
      out.push_back({PinFinding::Kind::kDamaged, &c, same_text});
    } else {
      out.push_back({PinFinding::Kind::kChanged, &c, newest});
    }
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

// A verified record whose sha256 is not the fingerprint of the text it records, which is the
// upstream text now: the pin file is damaged (or was edited, or written by a patchgen that
// fingerprints differently), not upstream.
Diagnostic DamagedPinDiagnostic(const PinFinding& f, const std::string& where,
                                const std::string& versions, const std::string& spec_shown) {
  const rewriter::ContractPin& c = *f.pin;
  SourceLoc at = f.pinned->loc.line ? f.pinned->loc : c.loc;
  Diagnostic d = ErrorAt(
      at,
      "damaged pin file: the sha256 of '" + c.key + "' (verified with " +
          (versions.empty() ? "no version" : versions) +
          ") is not the fingerprint of the text it records, and upstream still has that text",
      "restore the pin file from version control; if it is right, delete this record, check the "
      "upstream code and run `patchgen pin " +
          spec_shown + "` (with the same --source-root)");
  d.notes.push_back(Note::At(c.loc, "the entry it pins"));
  d.notes.push_back(Note::Text("upstream " + where + " has fingerprint " + c.sha256));
  return d;
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
  if (f.kind == PinFinding::Kind::kDamaged)
    return DamagedPinDiagnostic(f, where, versions, spec_shown);
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
