#include "fuzz_common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace patchgen::fuzz {
namespace fs = std::filesystem;

void Fail(std::string_view why, std::string_view detail) {
  std::fprintf(stderr, "\n*** patchgen fuzz property violated: %.*s\n",
               static_cast<int>(why.size()), why.data());
  if (!detail.empty()) {
    size_t n = std::min<size_t>(detail.size(), 4000);
    std::fprintf(stderr, "%.*s%s\n", static_cast<int>(n), detail.data(),
                 n < detail.size() ? "\n... (cut)" : "");
  }
  std::abort();
}

void CheckDiagnostics(const std::vector<Diagnostic>& diags, bool allow_unlocated) {
  if (diags.empty()) Fail("an error result without any diagnostic");
  for (const Diagnostic& d : diags) {
    std::string text = FormatDiagnostic(d);
    if (d.kind == ErrorKind::kInternal) Fail("internal error", text);
    if (d.message.empty()) Fail("empty message", text);
    size_t lines = 1 + (d.loc.line > 0 && !d.loc.source_line.empty() ? 2 : 0) + d.notes.size() +
                   (d.help.empty() ? 0 : 1);
    if (static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) != lines) {
      Fail("a message, note or help prints on several lines", text);
    }
    for (unsigned char c : text) {
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
        Fail("a control character printed", text);
    }
    if (d.loc.path.empty()) Fail("diagnostic without a path", text);
    if (d.loc.line == 0 && !allow_unlocated) Fail("diagnostic without a line", text);
    if (d.loc.line > 0 && d.loc.col == 0) Fail("diagnostic with a line but column 0", text);
    if (text.size() > kMaxDiagnosticBytes) {
      Fail("diagnostic longer than " + std::to_string(kMaxDiagnosticBytes) + " bytes (" +
               std::to_string(text.size()) + ")",
           text);
    }
  }
}

Sections SplitSections(std::string_view data) {
  Sections out;
  std::string* current = &out.spec;
  size_t pos = 0;
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    size_t end = nl == std::string_view::npos ? data.size() : nl + 1;
    std::string_view line = data.substr(pos, end - pos);
    pos = end;
    if (line.starts_with("#@@ ")) {
      std::string_view rest = line.substr(4);
      while (!rest.empty() && (rest.back() == '\n' || rest.back() == '\r')) rest.remove_suffix(1);
      if (rest == "upstream") {
        current = &out.upstream;
        continue;
      }
      if (rest.starts_with("file ")) {
        std::string name(rest.substr(5));
        // Only plain relative names inside the scratch folder.
        bool ok = !name.empty() && name.size() < 64 && name.front() != '/' &&
                  name.find("..") == std::string::npos;
        for (char c : name) {
          ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
                      c == '-' || c == '/');
        }
        if (ok && out.files.size() < 8) {
          out.files.emplace_back(name, std::string());
          current = &out.files.back().second;
          continue;
        }
      }
    }
    current->append(line);
  }
  return out;
}

namespace {
// PATCHGEN_FUZZ_SCRATCH, else a new mkdtemp folder. Its path reaches the target's behaviour (its
// length: the spec paths in strings and diagnostics; its bytes: `extends` identities compared with
// memcmp, which libFuzzer's CMP mutations may copy into inputs), so fuzz/run_fuzz.sh
// --deterministic names one fixed folder here.
// Never destroyed: the atexit handler that removes the folder runs after static destructors.
const std::string& ScratchRoot() {
  static const std::string* root = [] {
    const char* given = std::getenv("PATCHGEN_FUZZ_SCRATCH");
    std::string* dir;
    if (given != nullptr && *given != '\0') {
      dir = new std::string(given);
      std::error_code ec;
      fs::create_directories(*dir, ec);
      if (ec) Fail("cannot create PATCHGEN_FUZZ_SCRATCH", *dir + ": " + ec.message());
    } else {
      dir = new std::string((fs::temp_directory_path() / "patchgen-fuzz-XXXXXX").string());
      if (!::mkdtemp(dir->data())) Fail("mkdtemp failed");
    }
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(ScratchRoot(), ec);
    });
    return dir;
  }();
  return *root;
}
}  // namespace

std::string FreshScratchDir() {
  std::string dir = ScratchRoot() + "/specs";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  return dir;
}

bool Dumping() {
  const char* dir = std::getenv("PATCHGEN_FUZZ_DUMP");
  return dir != nullptr && *dir != '\0';
}

void Dump(const std::string& name, std::string_view text) {
  if (!Dumping()) return;
  std::ofstream f(fs::path(std::getenv("PATCHGEN_FUZZ_DUMP")) / name, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace patchgen::fuzz
