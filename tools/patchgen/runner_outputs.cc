// Checks the Runner makes before anything is written (runner.h): no output overwrites an input or
// another spec's output, and --check's configured source roots exist.
#include <sys/stat.h>

#include "runner.h"

namespace patchgen::cli {

std::string FileIdentity(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0)
    return "#" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return (ec ? p.lexically_normal() : c).generic_string();
}

// What the run reads, by file identity: the specs, their parents, patch files, pin files and
// upstream files ("the upstream file 'x'").
std::map<std::string, std::string> Runner::InputFiles() const {
  std::map<std::string, std::string> inputs;
  auto add_input = [&](const fs::path& p, std::string what) {
    std::error_code ec;
    if (fs::exists(p, ec)) inputs.emplace(FileIdentity(p), std::move(what));
  };
  auto abs = [&](const std::string& shown) { return Unshow(shown); };
  auto add_body = [&](const spec::Body& b) {
    if (b.source == spec::Body::Source::kFile) {
      add_input(abs(b.origin.path), "the patch file '" + Show(abs(b.origin.path)) + "'");
    }
  };
  for (const Job& job : jobs_) {
    add_input(job.spec_abs, "the spec '" + job.spec_shown + "'");
    add_input(PinsPathFor(job.spec_abs), "the pin file '" + Show(PinsPathFor(job.spec_abs)) + "'");
    if (!job.spec) continue;
    for (const std::string& parent : job.spec->extends_chain) {
      add_input(abs(parent), "the spec '" + Show(abs(parent)) + "'");
    }
    for (const spec::Patch& p : job.spec->patches) add_body(p.body);
    for (const spec::Helper& h : job.spec->helpers) add_body(h.body);
    if (job.lookup.status == LookupResult::Status::kFound) {
      add_input(job.lookup.file.file, "the upstream file '" + Show(job.lookup.file.file) + "'");
    }
  }
  return inputs;
}

namespace {

// The error on `at` for an output `shown` that the spec of `with` writes too.
Diagnostic ClashError(const Job& at, const Job& with, const std::string& shown) {
  Diagnostic d =
      ErrorAt(at.spec->output_loc,
              "output '" + shown + "' is also written by the spec '" + with.spec_shown + "'",
              "two specs cannot write one file; give one of them another `output:` name");
  d.notes.push_back(Note::At(with.spec->output_loc, "its output is set here"));
  return d;
}

}  // namespace

// Never lose a file: an output that is one of the run's inputs (a spec, a parent spec, a patch
// file, a pin file, an upstream file) or that two specs would both write fails those specs
// before anything is written.
void Runner::CheckOutputs() {
  const std::map<std::string, std::string> inputs = InputFiles();
  std::map<std::string, size_t> writer;  // output identity -> index of the first job writing it
  std::vector<std::vector<Diagnostic>> errors(jobs_.size());
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const Job& job = jobs_[i];
    if (!job.spec || job.skipped || !job.errors.empty() || job.out_py.empty()) continue;
    std::vector<fs::path> outs = {job.out_py};
    std::error_code ec;
    if (opts_.diff || (opts_.check && fs::is_regular_file(job.out_diff, ec)))
      outs.push_back(job.out_diff);
    for (const fs::path& out : outs) {
      std::string id = FileIdentity(out);
      if (auto in = inputs.find(id); in != inputs.end()) {
        errors[i].push_back(ErrorAt(
            job.spec->output_loc, "output '" + Show(out) + "' would overwrite " + in->second,
            "patchgen never writes over its inputs; choose another `output:` "
            "name or output folder"));
        continue;
      }
      auto [it, inserted] = writer.emplace(id, i);
      if (inserted) continue;
      const Job& other = jobs_[it->second];
      if (FileIdentity(other.spec_abs) == FileIdentity(job.spec_abs))
        continue;  // one spec named twice
      errors[i].push_back(ClashError(job, other, Show(out)));
      errors[it->second].push_back(ClashError(other, job, Show(out)));
    }
  }
  for (size_t i = 0; i < jobs_.size(); ++i) Fail(jobs_[i], std::move(errors[i]));
}

// --check: a configured source root that does not exist would skip every spec whose package
// lives there (an empty gate that passes); it is an error instead.
bool Runner::CheckSourceRoots() {
  bool ok = true;
  std::string config_shown = config_.file ? Show(*config_.file) : std::string("config");
  std::optional<std::string> text = config_.file ? ReadFile(*config_.file) : std::nullopt;
  for (const fs::path& root : config_.source_roots) {
    std::error_code ec;
    if (fs::is_directory(root, ec)) continue;
    std::string written = DisplayPath(root, config_.root);
    SourceLoc loc = SourceLoc::InFile(config_shown);
    if (text) {  // point at the value in the config file when it is written there as given
      size_t at = std::string::npos, key = text->find("source_roots");
      for (char q : {'"', '\''}) {
        if (key != std::string::npos)
          at = std::min(at, text->find(std::string(1, q) + written + q, key));
      }
      if (at != std::string::npos) {
        LineIndex lines(*text);
        loc = LocOf(
            config_shown, *text, lines,
            ByteRange{static_cast<uint32_t>(at), static_cast<uint32_t>(at + written.size() + 2)});
      }
    }
    Diagnostic d =
        ErrorAt(loc, "source root '" + Show(root) + "' does not exist",
                "--check would skip every spec whose upstream package lives there; create it "
                "(e.g. `make upstream`) or remove it from `source_roots`");
    PrintDiagnostics({d});
    ok = false;
  }
  return ok;
}

}  // namespace patchgen::cli
