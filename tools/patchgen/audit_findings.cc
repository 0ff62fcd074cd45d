// What `patchgen audit` reports about one spec (audit_findings.h).
#include "audit_findings.h"

#include <absl/strings/str_join.h>

#include <algorithm>
#include <set>

#include "audit.h"
#include "rewriter/fingerprint.h"

namespace patchgen::cli {

std::string AuditView::Where(const rewriter::ContractPin& c) const {
  return SourceLoc::AtLine(up_shown, c.first_line).PathLineSpan(c.last_line) + " (" + version + ")";
}

const rewriter::ContractPin* AuditView::OldPin(const std::string& key) const {
  if (!old) return nullptr;
  for (const auto& c : old->contract) {
    if (c.key == key) return &c;
  }
  return nullptr;
}

std::vector<std::string> AuditView::SignatureDetails(const rewriter::ContractPin& c) const {
  std::vector<std::string> out;
  if (!old_module || !rec.parsed || !rec.parsed->module) return out;
  const parser::PyModule& om = *old_module->second;
  const parser::PyModule& nm = *rec.parsed->module;
  std::vector<std::string> names = {c.qualname};
  if (c.key.starts_with("modify_init ")) names.push_back(c.qualname + ".__init__");
  for (const std::string& q : names) {
    const parser::Definition* od = om.Find(q);
    const parser::Definition* nd = nm.Find(q);
    if (!od || !nd) continue;
    for (std::string& l : SignatureChanges(ParametersOf(om, *od), ParametersOf(nm, *nd),
                                           DecoratorsOf(om, *od), DecoratorsOf(nm, *nd))) {
      out.push_back(q + ": " + l);
    }
  }
  return out;
}

namespace {

/// Kind of a generation error, from its message.
std::string ErrorFindingKind(const Diagnostic& d) {
  const std::string& m = d.message;
  if (m.starts_with("no statement in ")) return "anchor gone";
  if (m.starts_with("no method ") || m.starts_with("no class or function ") ||
      m.starts_with("no top-level ") || m.starts_with("no nested function ") ||
      m.starts_with("no class ")) {
    return "target missing";
  }
  if (m.find("already exists") != std::string::npos) return "target added upstream";
  if (m.find("undefined name") != std::string::npos) return "name undefined";
  if (m.find("imports.drop") != std::string::npos || m.find("import") != std::string::npos) {
    return "import gone";
  }
  if (m.find("upstream module") != std::string::npos) return "module missing";
  return "error";
}

std::string RegionFindingKind(const rewriter::ContractPin& c) {
  const std::string& region = c.region;
  if (region == "function") return "body changed under a guard";
  if (region == "statements") {
    return c.key.starts_with("edit_body ") ? "edited statements changed"
                                           : "guarded statements changed";
  }
  if (region == "absent") return "added method now defined upstream";
  return "signature changed";
}

std::string Loc(const SourceLoc& l) { return l.line ? l.PathLineCol() : l.path; }

std::string Joined(const std::vector<std::string>& versions) {
  return absl::StrJoin(versions, ", ");
}

// 1. What no longer generates: missing targets, anchors, names, imports.
void AddErrorFindings(const AuditView& v, std::vector<Finding>& out) {
  for (const Diagnostic& d : v.errors) {
    Finding f{ErrorFindingKind(d), "", d.loc, v.up_shown, d.message, {}, true};
    for (const Note& n : d.notes) f.details.push_back(FormatNote(n));
    if (!d.help.empty()) f.details.push_back("help: " + d.help);
    out.push_back(std::move(f));
  }
}

// 2a. Contracts against the pins (as generation compared them). Returns the keys reported.
std::set<std::string> AddPinFindings(const AuditView& v, std::vector<Finding>& out) {
  std::set<std::string> reported;
  for (const PinFinding& pf : v.rec.gen.pin_findings) {
    const rewriter::ContractPin& c = *pf.pin;
    reported.insert(c.key);
    if (pf.kind == PinFinding::Kind::kUnpinned) {
      out.push_back({"unpinned",
                     c.key,
                     c.loc,
                     v.Where(c),
                     "no pin for this entry in " + v.pins_shown,
                     {},
                     true});
      continue;
    }
    if (pf.kind == PinFinding::Kind::kDamaged) {
      out.push_back({"damaged pin",
                     c.key,
                     pf.pinned->loc.line ? pf.pinned->loc : c.loc,
                     v.Where(c),
                     "the pinned sha256 is not the fingerprint of the text it records (verified "
                     "with " +
                         Joined(pf.pinned->versions) + "); upstream still has that text",
                     {},
                     true});
      continue;
    }
    Finding f{RegionFindingKind(c),
              c.key,
              c.loc,
              v.Where(c),
              "differs from the pin (verified with " + Joined(pf.pinned->versions) + ")",
              v.SignatureDetails(c),
              true};
    for (std::string& l : TextDiffLines(pf.pinned->text, c.text)) f.details.push_back("  " + l);
    out.push_back(std::move(f));
  }
  return reported;
}

// A spec that no longer generates has no contract: its entries are looked up in the new
// upstream by name instead, so that a broken anchor does not hide a changed body.
std::vector<rewriter::ContractPin> Refound(const AuditView& v) {
  std::vector<rewriter::ContractPin> refound;
  const SpecRecord& rec = v.rec;
  if (v.errors.empty() || !rec.parsed || !rec.parsed->module) return refound;
  std::set<std::string> keys;
  if (v.old) {
    for (const rewriter::ContractPin& c : v.old->contract) {
      if (auto now = rewriter::RefingerprintContract(c, *rec.parsed->module)) {
        keys.insert(c.key);
        refound.push_back(std::move(*now));
      }
    }
  }
  // Without the old upstream (or for entries it does not have), the pins name the targets.
  if (!rec.gen.pins) return refound;
  for (const PinEntry& e : rec.gen.pins->entries) {
    if (keys.count(e.key) || e.target.empty() || e.verified.empty()) continue;
    rewriter::ContractPin c;
    c.key = e.key;
    c.region = e.region;
    c.expects = e.expects;
    c.qualname = e.target;
    c.loc = SourceLoc::InFile(rec.file.shown);
    if (auto now = rewriter::RefingerprintContract(c, *rec.parsed->module))
      refound.push_back(std::move(*now));
  }
  return refound;
}

// A fingerprint a person verified (in the pin file) needs no attention.
bool Verified(const SpecRecord& rec, const rewriter::ContractPin& c) {
  const PinEntry* e = rec.gen.pins ? rec.gen.pins->Find(c.key) : nullptr;
  if (!e) return false;
  bool verified = false;
  for (const PinRecord& r : e->verified) verified |= r.sha256 == c.sha256;
  return verified;
}

// 2b. Contracts not reported against the pins: against the old upstream, else (found by name
// through the pins, the spec does not generate) against the newest verified fingerprint.
void AddContractFindings(const AuditView& v, const std::set<std::string>& reported,
                         const std::vector<rewriter::ContractPin>& current,
                         std::vector<Finding>& out) {
  for (const rewriter::ContractPin& c : current) {
    if (reported.count(c.key) || Verified(v.rec, c)) continue;
    if (const rewriter::ContractPin* o = v.OldPin(c.key)) {
      if (o->sha256 == c.sha256) continue;
      Finding f{RegionFindingKind(c),
                c.key,
                c.loc,
                v.Where(c),
                "differs from " + v.old_module->first.version,
                v.SignatureDetails(c),
                true};
      for (std::string& l : TextDiffLines(o->text, c.text)) f.details.push_back("  " + l);
      out.push_back(std::move(f));
    } else if (const PinEntry* e = v.rec.gen.pins ? v.rec.gen.pins->Find(c.key) : nullptr) {
      // Differs from every verified fingerprint (checked above); show the newest.
      const PinRecord& newest = e->verified.back();
      Finding f{RegionFindingKind(c),
                c.key,
                c.loc,
                v.Where(c),
                "differs from the pin (verified with " + Joined(newest.versions) + ")",
                {},
                true};
      for (std::string& l : TextDiffLines(newest.text, c.text)) f.details.push_back("  " + l);
      out.push_back(std::move(f));
    }
  }
}

// A spec without a pin file; 3. entries the old upstream applied that the new one leaves out;
// conditional entries skipped.
void AddEntryFindings(const AuditView& v, std::vector<Finding>& out) {
  const SpecRecord& rec = v.rec;
  if (!rec.gen.pins && v.errors.empty()) {
    out.push_back({"unpinned",
                   "",
                   SourceLoc::InFile(rec.file.shown),
                   "",
                   "the spec has no pin file; run `patchgen pin " + rec.file.shown + "`",
                   {},
                   false});
  }
  if (v.old && v.errors.empty()) {
    for (const rewriter::ContractPin& c : v.old->contract) {
      bool now = false;
      for (const auto& n : rec.gen.contract) now |= n.key == c.key;
      if (now) continue;
      out.push_back({"entry no longer applies",
                     c.key,
                     c.loc,
                     "",
                     "applied to " + v.old_module->first.version + ", not to " + v.version,
                     {},
                     false});
    }
  }
  for (const rewriter::SkippedEntry& sk : rec.gen.skipped_entries) {
    out.push_back({"skipped", sk.kind + " " + sk.target, sk.loc, "", sk.why, {}, false});
  }
}

// 4. Imports the spec adds from the upstream package that the new upstream lacks.
void AddImportFindings(const AuditView& v, std::vector<Finding>& out) {
  const SpecRecord& rec = v.rec;
  if (!rec.spec() || !rec.found()) return;
  fs::path root = rec.upstream.lookup.file.file;
  std::string rel = rec.upstream.lookup.file.rel_path;
  for (size_t n = std::count(rel.begin(), rel.end(), '/') + 1; n > 0; --n)
    root = root.parent_path();
  for (const spec::Block& b : rec.spec()->import_adds) {
    for (std::string& m : MissingImportedNames(b.code, rec.spec()->upstream, root)) {
      out.push_back({"import gone", "imports.add", b.loc, "", m, {}, true});
    }
  }
}

}  // namespace

std::vector<Finding> FindingsOf(const AuditView& v) {
  std::vector<Finding> findings;
  AddErrorFindings(v, findings);
  std::set<std::string> reported = AddPinFindings(v, findings);
  std::vector<rewriter::ContractPin> refound = Refound(v);
  AddContractFindings(v, reported, v.errors.empty() ? v.rec.gen.contract : refound, findings);
  AddEntryFindings(v, findings);
  AddImportFindings(v, findings);
  std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
    return std::tie(a.spec_loc.path, a.spec_loc.line) < std::tie(b.spec_loc.path, b.spec_loc.line);
  });
  return findings;
}

nlohmann::json ReportFindings(const std::vector<Finding>& findings, std::string& text) {
  nlohmann::json fj = nlohmann::json::array();
  for (const Finding& f : findings) {
    fj.push_back({{"kind", f.kind},
                  {"entry", f.entry},
                  {"spec", f.spec_loc.path},
                  {"line", f.spec_loc.line},
                  {"upstream", f.upstream},
                  {"message", f.message},
                  {"details", f.details},
                  {"attention", f.attention}});
    text += std::string("  ") + (f.attention ? "! " : "- ") + f.kind + ": " +
            (f.entry.empty() ? "" : f.entry + " ") + "(" + Loc(f.spec_loc) + ")\n";
    if (!f.upstream.empty()) text += "      upstream: " + f.upstream + "\n";
    text += "      " + f.message + "\n";
    for (const std::string& d : f.details) text += "      " + d + "\n";
  }
  return fj;
}

}  // namespace patchgen::cli
