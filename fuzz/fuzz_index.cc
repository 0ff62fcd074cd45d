// Fuzz target: the Python index (PyModule::Parse, `patchgen index` text and JSON) on any bytes.
// Property: a module or one located kUpstream error; for a module, every range of the index lies in
// the source and nests as documented in py_module.h, and the `--json` printer gives valid JSON.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "base/unicode_nfkc.h"
#include "fuzz_common.h"
#include "parser/index_printer.h"
#include "parser/py_module.h"
#include "parser/tree_queries.h"

using patchgen::ByteRange;
using patchgen::fuzz::Fail;
using patchgen::parser::Definition;
using patchgen::parser::PyModule;

namespace {

void CheckRange(const PyModule& m, ByteRange r, const char* what, const std::string& name) {
  if (r.start > r.end || r.end > m.source().size()) {
    Fail(std::string(what) + " of '" + name + "' out of the source: [" + std::to_string(r.start) +
         ", " + std::to_string(r.end) + ") in " + std::to_string(m.source().size()) + " bytes");
  }
}

void CheckInside(ByteRange outer, ByteRange inner, const char* what, const std::string& name) {
  if (inner.empty() || outer.Contains(inner)) return;
  Fail(std::string(what) + " of '" + name + "' is not inside its definition");
}

void CheckIndex(const PyModule& m) {
  const auto& defs = m.definitions();
  for (size_t i = 0; i < defs.size(); ++i) {
    const Definition& d = defs[i];
    for (auto [r, what] : {std::pair{d.whole, "whole"},
                           {d.definition, "definition"},
                           {d.decorators, "decorators"},
                           {d.comments, "comments"},
                           {d.header, "header"},
                           {d.name_range, "name"},
                           {d.parameters, "parameters"},
                           {d.body, "body"}}) {
      CheckRange(m, r, what, d.qualname);
    }
    CheckInside(d.whole, d.definition, "definition", d.qualname);
    CheckInside(d.definition, d.header, "header", d.qualname);
    CheckInside(d.definition, d.body, "body", d.qualname);
    CheckInside(d.header, d.name_range, "name", d.qualname);
    // The index keeps names as Python compares them (NFKC); the range keeps upstream's bytes.
    if (patchgen::IdentifierKey(m.Text(d.name_range)) != d.name)
      Fail("name range does not hold the name", d.qualname);
    if (d.docstring) CheckInside(d.body, *d.docstring, "docstring", d.qualname);
    if (m.Find(d.qualname) == nullptr) Fail("Find() misses a definition", d.qualname);
    for (const Definition* r : m.Redefinitions(d)) {
      if (r == &d || r->qualname != d.qualname || r->parent != d.parent) {
        Fail("Redefinitions() returned a definition of another scope", d.qualname);
      }
    }
    for (int c : d.children) {
      if (c < 0 || static_cast<size_t>(c) >= defs.size() || defs[c].parent != static_cast<int>(i)) {
        Fail("child/parent links disagree", d.qualname);
      }
      CheckInside(d.body, defs[c].definition, "nested definition", defs[c].qualname);
    }
  }
  for (const auto& imp : m.imports()) CheckRange(m, imp.stmt, "import", imp.module_name);
  if (auto tab = patchgen::parser::FirstTabIndentation(m)) {
    CheckRange(m, *tab, "tab indentation", "");
    if (m.Text(*tab).find('\t') == std::string_view::npos) Fail("tab indentation without a tab");
  }
  for (const auto& s : m.top_level()) CheckRange(m, s.range, "top-level statement", "");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string source(reinterpret_cast<const char*>(data), size);
  auto parsed = PyModule::Parse("fuzz/modeling_fuzz.py", std::move(source));
  if (!parsed.ok()) {
    patchgen::fuzz::CheckDiagnostics(parsed.errors());
    if (parsed.errors().front().kind != patchgen::ErrorKind::kUpstream) {
      Fail("a module that does not parse is not reported as an upstream error");
    }
    return 0;
  }
  const PyModule& m = *parsed.value();
  CheckIndex(m);
  (void)patchgen::parser::FormatIndexText(m);
  std::string json;
  try {
    json = patchgen::parser::FormatIndexJson(m);
  } catch (const std::exception& e) {
    Fail(std::string("FormatIndexJson threw: ") + e.what());
  }
  if (!nlohmann::json::accept(json)) Fail("FormatIndexJson printed invalid JSON", json);
  return 0;
}
