// `patchgen audit` (runner.h): what a new upstream changes for every spec, against the pins and an
// optional old upstream; writes nothing.
#include "rewriter/fingerprint.h"
#include "runner.h"

namespace patchgen::cli {

namespace {

/// One thing `audit` reports about a spec.
struct Finding {
  std::string kind;      ///< "target missing", "body changed under a guard", ...
  std::string entry;     ///< The spec entry (contract key or kind + target), "" for the spec.
  SourceLoc spec_loc;    ///< Where in the spec.
  std::string upstream;  ///< Upstream place (path:line[-line] (version)), "" when none.
  std::string message;
  std::vector<std::string> details;  ///< Signature changes, diff lines, notes.
  bool attention = true;             ///< False for information (skipped entries).
};

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

/// One spec's view for the audit: its job, what the old upstream gave for it (when given), and the
/// strings its findings name.
struct AuditView {
  const Job& job;
  const rewriter::GenerateResult* old = nullptr;  ///< Generated against the old upstream.
  const std::pair<UpstreamFile, parser::PyModule*>* old_module =
      nullptr;             ///< The old upstream file.
  std::string up_shown;    ///< The new upstream file as shown, "" when not found.
  std::string version;     ///< The new upstream's version.
  std::string pins_shown;  ///< The spec's pin file as shown.

  /// "path:first-last (version)" of a contract entry in the new upstream.
  std::string Where(const rewriter::ContractPin& c) const {
    return SourceLoc::AtLine(up_shown, c.first_line).PathLineSpan(c.last_line) + " (" + version +
           ")";
  }

  /// The old upstream's contract entry with `key`, if any.
  const rewriter::ContractPin* OldPin(const std::string& key) const {
    if (!old) return nullptr;
    for (const auto& c : old->contract) {
      if (c.key == key) return &c;
    }
    return nullptr;
  }

  /// Signature and decorator changes of the entry's target (and its __init__ for modify_init)
  /// between the old and the new upstream.
  std::vector<std::string> SignatureDetails(const rewriter::ContractPin& c) const {
    std::vector<std::string> out;
    if (!old_module || !job.upstream || !job.upstream->module) return out;
    const parser::PyModule& om = *old_module->second;
    const parser::PyModule& nm = *job.upstream->module;
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
};

std::string Joined(const std::vector<std::string>& versions) {
  std::string v;
  for (const auto& x : versions) v += (v.empty() ? "" : ", ") + x;
  return v;
}

// 1. What no longer generates: missing targets, anchors, names, imports.
void AddErrorFindings(const AuditView& v, std::vector<Finding>& out) {
  for (const Diagnostic& d : v.job.errors) {
    Finding f{ErrorFindingKind(d), "", d.loc, v.up_shown, d.message, {}, true};
    for (const Note& n : d.notes) f.details.push_back(FormatNote(n));
    if (!d.help.empty()) f.details.push_back("help: " + d.help);
    out.push_back(std::move(f));
  }
}

// 2a. Contracts against the pins (as generation compared them). Returns the keys reported.
std::set<std::string> AddPinFindings(const AuditView& v, std::vector<Finding>& out) {
  std::set<std::string> reported;
  for (const PinFinding& pf : v.job.pin_findings) {
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
  const Job& job = v.job;
  if (job.errors.empty() || !job.upstream || !job.upstream->module) return refound;
  std::set<std::string> keys;
  if (v.old) {
    for (const rewriter::ContractPin& c : v.old->contract) {
      if (auto now = rewriter::RefingerprintContract(c, *job.upstream->module)) {
        keys.insert(c.key);
        refound.push_back(std::move(*now));
      }
    }
  }
  // Without the old upstream (or for entries it does not have), the pins name the targets.
  if (!job.pins) return refound;
  for (const PinEntry& e : job.pins->entries) {
    if (keys.count(e.key) || e.target.empty() || e.verified.empty()) continue;
    rewriter::ContractPin c;
    c.key = e.key;
    c.region = e.region;
    c.expects = e.expects;
    c.qualname = e.target;
    c.loc = SourceLoc::InFile(job.spec_shown);
    if (auto now = rewriter::RefingerprintContract(c, *job.upstream->module))
      refound.push_back(std::move(*now));
  }
  return refound;
}

// A fingerprint a person verified (in the pin file) needs no attention.
bool Verified(const Job& job, const rewriter::ContractPin& c) {
  const PinEntry* e = job.pins ? job.pins->Find(c.key) : nullptr;
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
    if (reported.count(c.key) || Verified(v.job, c)) continue;
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
    } else if (const PinEntry* e = v.job.pins ? v.job.pins->Find(c.key) : nullptr) {
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
  const Job& job = v.job;
  if (!job.pins && job.errors.empty()) {
    out.push_back({"unpinned",
                   "",
                   SourceLoc::InFile(job.spec_shown),
                   "",
                   "the spec has no pin file; run `patchgen pin " + job.spec_shown + "`",
                   {},
                   false});
  }
  if (v.old && job.errors.empty()) {
    for (const rewriter::ContractPin& c : v.old->contract) {
      bool now = false;
      for (const auto& n : job.contract) now |= n.key == c.key;
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
  for (const rewriter::SkippedEntry& sk : job.skipped_entries) {
    out.push_back({"skipped", sk.kind + " " + sk.target, sk.loc, "", sk.why, {}, false});
  }
}

// 4. Imports the spec adds from the upstream package that the new upstream lacks.
void AddImportFindings(const AuditView& v, std::vector<Finding>& out) {
  const Job& job = v.job;
  if (!job.spec || job.lookup.status != LookupResult::Status::kFound) return;
  fs::path root = job.lookup.file.file;
  std::string rel = job.lookup.file.rel_path;
  for (size_t n = std::count(rel.begin(), rel.end(), '/') + 1; n > 0; --n)
    root = root.parent_path();
  for (const spec::Block& b : job.spec->import_adds) {
    for (std::string& m : MissingImportedNames(b.code, job.spec->upstream, root)) {
      out.push_back({"import gone", "imports.add", b.loc, "", m, {}, true});
    }
  }
}

std::vector<Finding> FindingsOf(const AuditView& v) {
  std::vector<Finding> findings;
  AddErrorFindings(v, findings);
  std::set<std::string> reported = AddPinFindings(v, findings);
  std::vector<rewriter::ContractPin> refound = Refound(v);
  AddContractFindings(v, reported, v.job.errors.empty() ? v.job.contract : refound, findings);
  AddEntryFindings(v, findings);
  AddImportFindings(v, findings);
  std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
    return std::tie(a.spec_loc.path, a.spec_loc.line) < std::tie(b.spec_loc.path, b.spec_loc.line);
  });
  return findings;
}

// The findings as the JSON report's list and appended to the text report.
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

}  // namespace

// The old upstream (optional): every spec generated against it too, for the contract and the
// definitions to compare with.
OldUpstreams Runner::LoadOldUpstreams() const {
  OldUpstreams olds;
  if (opts_.old_roots.empty()) return olds;
  std::vector<SourceRoot> roots;
  for (const auto& r : opts_.old_roots) {
    fs::path p(r);
    roots.push_back({(p.is_absolute() ? p : cwd_ / p).lexically_normal(), "--source-root-old"});
  }
  SourceLookup lookup(std::move(roots), config_.python, cwd_, shown_base_);
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const Job& job = jobs_[i];
    if (!job.spec) continue;
    LookupResult found = lookup.Find(job.spec->upstream);
    if (found.status != LookupResult::Status::kFound) continue;
    auto& slot = olds.parsed[found.file.file];
    if (!slot) {
      auto text = ReadFile(found.file.file);
      if (!text) continue;
      auto parsed = parser::PyModule::Parse(Show(found.file.file), std::move(*text));
      if (!parsed.ok()) continue;
      slot = std::move(parsed.value());
    }
    olds.modules[i] = {found.file, slot.get()};
    rewriter::GenerateOptions options;
    options.upstream_path = found.file.rel_path;
    options.upstream_version = found.file.version;
    options.default_runtime = config_.runtime;
    auto result = rewriter::Generate(*job.spec, *slot, options);
    if (result.ok()) olds.results[i] = std::move(result.value());
  }
  return olds;
}

int Runner::Audit() {
  OldUpstreams olds = LoadOldUpstreams();
  AuditTally t;
  for (size_t i = 0; i < jobs_.size(); ++i) AuditJob(i, olds, t);
  if (t.attention) t.code = std::max<int>(t.code, kExitDrift);
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", t.report}, {"exit_code", t.code}}) << "\n";
  } else {
    std::cout << t.text << "audit: " << jobs_.size() << " specs: " << t.attention
              << " need attention, " << t.clean << " ok, " << t.skipped << " skipped\n";
  }
  return t.code;
}

// One spec of the audit: its findings, status, JSON entry and text.
void Runner::AuditJob(size_t i, const OldUpstreams& olds, AuditTally& t) {
  Job& job = jobs_[i];
  if (job.skipped) {
    ++t.skipped;
    job.status = JobStatus::kUpstreamNotFound;
    t.report.push_back(JobJson(job));
    t.text += job.spec_shown + ": skipped (upstream package '" + TopPackage(job.spec->upstream) +
              "' not found)\n";
    return;
  }
  if (!job.spec) {
    t.code = std::max(t.code, WorstExit(job.errors));
    PrintDiagnostics(job.errors);
  }
  auto old = olds.results.find(i);
  auto old_module = olds.modules.find(i);
  AuditView v{job,
              old != olds.results.end() ? &old->second : nullptr,
              old_module != olds.modules.end() ? &old_module->second : nullptr,
              job.spec && job.lookup.status == LookupResult::Status::kFound
                  ? Show(job.lookup.file.file)
                  : std::string(),
              job.lookup.file.version,
              Show(PinsPathFor(job.spec_abs))};
  std::vector<Finding> findings = FindingsOf(v);
  size_t need =
      std::count_if(findings.begin(), findings.end(), [](const Finding& f) { return f.attention; });
  need ? ++t.attention : ++t.clean;
  job.status = need ? JobStatus::kNeedsAttention : JobStatus::kOk;
  nlohmann::json j = JobJson(job);
  j["upstream_old_version"] =
      v.old_module ? nlohmann::json(v.old_module->first.version) : nlohmann::json(nullptr);
  t.text += job.spec_shown + " (" + (job.spec ? job.spec->upstream : std::string("?")) + " " +
            (v.old_module ? v.old_module->first.version + " -> " : std::string()) + v.version +
            "): " + StatusName(job.status) + "\n";
  j["findings"] = ReportFindings(findings, t.text);
  t.report.push_back(j);
}

}  // namespace patchgen::cli
