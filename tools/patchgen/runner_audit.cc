// `patchgen audit` (runner.h): what a new upstream changes for every spec, against the pins and an
// optional old upstream; writes nothing.
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
    return c.key.starts_with("edit_body ") ? "edited statements changed" : "guarded statements changed";
  }
  if (region == "absent") return "added method now defined upstream";
  return "signature changed";
}

std::string Loc(const SourceLoc& l) {
  return l.path + (l.line ? ":" + std::to_string(l.line) + ":" + std::to_string(l.col) : "");
}

}  // namespace

int Runner::Audit() {
  // The old upstream (optional): every spec generated against it too, for the contract and the
  // definitions to compare with.
  std::map<size_t, rewriter::GenerateResult> old_results;
  std::map<size_t, std::pair<UpstreamFile, parser::PyModule*>> old_modules;
  std::map<fs::path, std::unique_ptr<parser::PyModule>> old_parsed;
  if (!opts_.old_roots.empty()) {
    std::vector<SourceRoot> roots;
    for (const auto& r : opts_.old_roots) {
      fs::path p(r);
      roots.push_back({(p.is_absolute() ? p : cwd_ / p).lexically_normal(), "--source-root-old"});
    }
    SourceLookup lookup(std::move(roots), config_.python, cwd_);
    for (size_t i = 0; i < jobs_.size(); ++i) {
      Job& job = jobs_[i];
      if (!job.spec) continue;
      LookupResult found = lookup.Find(job.spec->upstream);
      if (found.status != LookupResult::Status::kFound) continue;
      auto& slot = old_parsed[found.file.file];
      if (!slot) {
        auto text = ReadFile(found.file.file);
        if (!text) continue;
        auto parsed = parser::PyModule::Parse(Show(found.file.file), std::move(*text));
        if (!parsed.ok()) continue;
        slot = std::move(parsed.value());
      }
      old_modules[i] = {found.file, slot.get()};
      rewriter::GenerateOptions options;
      options.upstream_path = found.file.rel_path;
      options.upstream_version = found.file.version;
      options.default_runtime = config_.runtime;
      auto result = rewriter::Generate(*job.spec, *slot, options);
      if (result.ok()) old_results[i] = std::move(result.value());
    }
  }

  int code = kExitOk;
  size_t attention = 0, clean = 0, skipped = 0;
  nlohmann::json report = nlohmann::json::array();
  std::string text;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    Job& job = jobs_[i];
    std::vector<Finding> findings;
    std::string version = job.lookup.file.version;
    std::string up_shown = job.spec && job.lookup.status == LookupResult::Status::kFound
                               ? Show(job.lookup.file.file)
                               : std::string();
    auto where = [&](const rewriter::ContractPin& c) {
      std::string w = up_shown;
      if (c.first_line) {
        w += ":" + std::to_string(c.first_line);
        if (c.last_line > c.first_line) w += "-" + std::to_string(c.last_line);
      }
      return w + " (" + version + ")";
    };
    if (job.skipped) {
      ++skipped;
      job.status = "upstream not found";
      report.push_back(JobJson(job));
      text += job.spec_shown + ": skipped (upstream package '" + TopPackage(job.spec->upstream) +
              "' not found)\n";
      continue;
    }
    if (!job.spec) {
      code = std::max(code, WorstExit(job.errors));
      PrintDiagnostics(job.errors);
    }
    // 1. What no longer generates: missing targets, anchors, names, imports.
    for (const Diagnostic& d : job.errors) {
      Finding f{ErrorFindingKind(d), "", SourceLoc{d.path, d.line, d.col, 1, {}}, up_shown,
                d.message, d.notes, true};
      if (!d.help.empty()) f.details.push_back("help: " + d.help);
      findings.push_back(std::move(f));
    }
    // 2. Contracts: against the pins, else against the old upstream.
    const rewriter::GenerateResult* old = old_results.count(i) ? &old_results[i] : nullptr;
    auto old_pin = [&](const std::string& key) -> const rewriter::ContractPin* {
      if (!old) return nullptr;
      for (const auto& c : old->contract) {
        if (c.key == key) return &c;
      }
      return nullptr;
    };
    auto signature_details = [&](const rewriter::ContractPin& c) {
      std::vector<std::string> out;
      if (!old_modules.count(i) || !job.upstream || !job.upstream->module) return out;
      const parser::PyModule& om = *old_modules[i].second;
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
    };
    std::set<std::string> reported;
    for (const PinFinding& pf : job.pin_findings) {
      const rewriter::ContractPin& c = *pf.pin;
      reported.insert(c.key);
      if (pf.kind == PinFinding::Kind::kUnpinned) {
        findings.push_back({"unpinned", c.key, c.loc, where(c),
                            "no pin for this entry in " + Show(PinsPathFor(job.spec_abs)),
                            {}, true});
        continue;
      }
      Finding f{RegionFindingKind(c), c.key, c.loc, where(c),
                "differs from the pin (verified with " + [&] {
                  std::string v;
                  for (const auto& x : pf.pinned->versions) v += (v.empty() ? "" : ", ") + x;
                  return v;
                }() + ")",
                signature_details(c), true};
      for (std::string& l : TextDiffLines(pf.pinned->text, c.text)) f.details.push_back("  " + l);
      findings.push_back(std::move(f));
    }
    // A spec that no longer generates has no contract: its entries are looked up in the new
    // upstream by name instead, so that a broken anchor does not hide a changed body.
    std::vector<rewriter::ContractPin> refound;
    if (!job.errors.empty() && job.upstream && job.upstream->module) {
      std::set<std::string> keys;
      if (old) {
        for (const rewriter::ContractPin& c : old->contract) {
          if (auto now = rewriter::RefingerprintContract(c, *job.upstream->module)) {
            keys.insert(c.key);
            refound.push_back(std::move(*now));
          }
        }
      }
      // Without the old upstream (or for entries it does not have), the pins name the targets.
      if (job.pins) {
        for (const PinEntry& e : job.pins->entries) {
          if (keys.count(e.key) || e.target.empty() || e.verified.empty()) continue;
          rewriter::ContractPin c;
          c.key = e.key;
          c.region = e.region;
          c.expects = e.expects;
          c.qualname = e.target;
          c.loc = SourceLoc{job.spec_shown, 0, 0, 1, {}};
          if (auto now = rewriter::RefingerprintContract(c, *job.upstream->module)) {
            refound.push_back(std::move(*now));
          }
        }
      }
    }
    const std::vector<rewriter::ContractPin>& current = job.errors.empty() ? job.contract : refound;
    for (const rewriter::ContractPin& c : current) {
      if (reported.count(c.key)) continue;
      // A fingerprint a person verified (in the pin file) needs no attention.
      if (const PinEntry* e = job.pins ? job.pins->Find(c.key) : nullptr) {
        bool verified = false;
        for (const PinRecord& r : e->verified) verified |= r.sha256 == c.sha256;
        if (verified) continue;
      }
      const rewriter::ContractPin* o = old_pin(c.key);
      if (o) {
        if (o->sha256 == c.sha256) continue;
        Finding f{RegionFindingKind(c), c.key, c.loc, where(c),
                  "differs from " + old_modules[i].first.version, signature_details(c), true};
        for (std::string& l : TextDiffLines(o->text, c.text)) f.details.push_back("  " + l);
        findings.push_back(std::move(f));
      } else if (const PinEntry* e = job.pins ? job.pins->Find(c.key) : nullptr) {
        // Found by name through the pins (the spec does not generate): differs from every
        // verified fingerprint (checked above); show the newest.
        const PinRecord& newest = e->verified.back();
        std::string versions;
        for (const auto& x : newest.versions) versions += (versions.empty() ? "" : ", ") + x;
        Finding f{RegionFindingKind(c), c.key, c.loc, where(c),
                  "differs from the pin (verified with " + versions + ")", {}, true};
        for (std::string& l : TextDiffLines(newest.text, c.text)) f.details.push_back("  " + l);
        findings.push_back(std::move(f));
      }
    }
    if (!job.pins && job.errors.empty()) {
      findings.push_back({"unpinned", "", SourceLoc{job.spec_shown, 0, 0, 1, {}}, "",
                          "the spec has no pin file; run `patchgen pin " + job.spec_shown + "`",
                          {}, false});
    }
    // 3. Entries the old upstream applied that the new one leaves out.
    if (old && job.errors.empty()) {
      for (const rewriter::ContractPin& c : old->contract) {
        bool now = false;
        for (const auto& n : job.contract) now |= n.key == c.key;
        if (!now) {
          findings.push_back({"entry no longer applies", c.key, c.loc, "",
                              "applied to " + old_modules[i].first.version + ", not to " + version,
                              {}, false});
        }
      }
    }
    for (const rewriter::SkippedEntry& sk : job.skipped_entries) {
      findings.push_back({"skipped", sk.kind + " " + sk.target, sk.loc, "", sk.why, {}, false});
    }
    // 4. Imports the spec adds from the upstream package that the new upstream lacks.
    if (job.spec && job.lookup.status == LookupResult::Status::kFound) {
      fs::path root = job.lookup.file.file;
      std::string rel = job.lookup.file.rel_path;
      for (size_t n = std::count(rel.begin(), rel.end(), '/') + 1; n > 0; --n) root = root.parent_path();
      for (const spec::Block& b : job.spec->import_adds) {
        for (std::string& m : MissingImportedNames(b.code, job.spec->upstream, root)) {
          findings.push_back({"import gone", "imports.add", b.loc, "", m, {}, true});
        }
      }
    }
    std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
      return std::tie(a.spec_loc.path, a.spec_loc.line) < std::tie(b.spec_loc.path, b.spec_loc.line);
    });
    size_t need = std::count_if(findings.begin(), findings.end(),
                                [](const Finding& f) { return f.attention; });
    need ? ++attention : ++clean;
    job.status = need ? "needs attention" : "ok";
    nlohmann::json j = JobJson(job);
    j["status"] = job.status;
    j["upstream_old_version"] =
        old_modules.count(i) ? nlohmann::json(old_modules[i].first.version) : nlohmann::json(nullptr);
    nlohmann::json fj = nlohmann::json::array();
    text += job.spec_shown + " (" + (job.spec ? job.spec->upstream : std::string("?")) + " " +
            (old_modules.count(i) ? old_modules[i].first.version + " -> " : std::string()) +
            version + "): " + job.status + "\n";
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
    j["findings"] = fj;
    report.push_back(j);
  }
  if (attention) code = std::max(code, kExitDrift);
  if (opts_.json) {
    std::cout << JsonText(nlohmann::json{{"specs", report}, {"exit_code", code}}) << "\n";
  } else {
    std::cout << text << "audit: " << jobs_.size() << " specs: " << attention
              << " need attention, " << clean << " ok, " << skipped << " skipped\n";
  }
  return code;
}

}  // namespace patchgen::cli
