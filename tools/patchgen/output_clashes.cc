// Never lose a file (pipeline.h): before anything is written, an output that is one of the run's
// inputs, or that two specs would both write, fails those specs.
#include <sys/stat.h>

#include "pipeline.h"

namespace patchgen::cli {

std::string FileIdentity(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0)
    return "#" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return (ec ? p.lexically_normal() : c).generic_string();
}

namespace {

/// What the run reads, by file identity: the specs, their parents, patch files, pin files and
/// upstream files ("the upstream file 'x'").
std::map<std::string, std::string> InputFiles(const RunContext& ctx,
                                              const std::vector<SpecRecord>& specs) {
  std::map<std::string, std::string> inputs;
  auto add_input = [&](const fs::path& p, std::string what) {
    std::error_code ec;
    if (fs::exists(p, ec)) inputs.emplace(FileIdentity(p), std::move(what));
  };
  auto add_body = [&](const spec::Body& b) {
    if (b.source != spec::Body::Source::kFile) return;
    fs::path abs = ctx.Unshow(b.origin.path);
    add_input(abs, "the patch file '" + ctx.Show(abs) + "'");
  };
  for (const SpecRecord& rec : specs) {
    add_input(rec.file.abs, "the spec '" + rec.file.shown + "'");
    fs::path pins = PinsPathFor(rec.file.abs);
    add_input(pins, "the pin file '" + ctx.Show(pins) + "'");
    if (!rec.spec()) continue;
    for (const std::string& parent : rec.spec()->extends_chain) {
      add_input(ctx.Unshow(parent), "the spec '" + ctx.Show(ctx.Unshow(parent)) + "'");
    }
    for (const spec::Patch& p : rec.spec()->patches) add_body(p.body);
    for (const spec::Helper& h : rec.spec()->helpers) add_body(h.body);
    const fs::path& upstream = rec.upstream.lookup.file.file;
    if (rec.found()) add_input(upstream, "the upstream file '" + ctx.Show(upstream) + "'");
  }
  return inputs;
}

/// The error on `at` for an output `shown` that the spec of `with` writes too.
Diagnostic ClashError(const SpecRecord& at, const SpecRecord& with, const std::string& shown) {
  Diagnostic d =
      ErrorAt(at.spec()->output_loc,
              "output '" + shown + "' is also written by the spec '" + with.file.shown + "'",
              "two specs cannot write one file; give one of them another `output:` name");
  d.notes.push_back(Note::At(with.spec()->output_loc, "its output is set here"));
  return d;
}

/// The outputs of a spec the run writes or compares: the .py, and the .diff with --diff (or with
/// --check when one exists).
std::vector<fs::path> OutputsOf(const RunContext& ctx, const SpecRecord& rec) {
  std::vector<fs::path> outs = {rec.out.py};
  std::error_code ec;
  if (ctx.opts.diff || (ctx.opts.check && fs::is_regular_file(rec.out.diff, ec)))
    outs.push_back(rec.out.diff);
  return outs;
}

}  // namespace

std::vector<std::vector<Diagnostic>> OutputClashes(const RunContext& ctx,
                                                   const std::vector<SpecRecord>& specs) {
  const std::map<std::string, std::string> inputs = InputFiles(ctx, specs);
  std::map<std::string, size_t> writer;  // output identity -> index of the first spec writing it
  std::vector<std::vector<Diagnostic>> errors(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const SpecRecord& rec = specs[i];
    if (!rec.spec() || rec.skipped() || !rec.Errors().empty() || rec.out.py.empty()) continue;
    for (const fs::path& out : OutputsOf(ctx, rec)) {
      std::string id = FileIdentity(out);
      if (auto in = inputs.find(id); in != inputs.end()) {
        errors[i].push_back(ErrorAt(
            rec.spec()->output_loc, "output '" + ctx.Show(out) + "' would overwrite " + in->second,
            "patchgen never writes over its inputs; choose another `output:` name or output "
            "folder"));
        continue;
      }
      auto [it, inserted] = writer.emplace(id, i);
      if (inserted) continue;
      const SpecRecord& other = specs[it->second];
      if (FileIdentity(other.file.abs) == FileIdentity(rec.file.abs))
        continue;  // one spec named twice
      errors[i].push_back(ClashError(rec, other, ctx.Show(out)));
      errors[it->second].push_back(ClashError(other, rec, ctx.Show(out)));
    }
  }
  return errors;
}

}  // namespace patchgen::cli
