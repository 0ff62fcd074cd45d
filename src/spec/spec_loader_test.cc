// Tests of LoadSpec / LoadSpecFromString: every key, every error with its exact text, `extends`
// composition, patch files, and the mapping of code lines back to the spec.
#include "spec/spec_loader.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/text_util.h"
#include "spec/spec_keys.h"

namespace patchgen::spec {
namespace {

namespace fs = std::filesystem;

// All diagnostics of a failed load, formatted; "OK" when the spec loaded.
std::string Errors(const Result<PatchSpec>& r) {
  if (r.ok()) return "OK";
  std::string out;
  for (const Diagnostic& d : r.errors()) out += FormatDiagnostic(d);
  return out;
}

std::string ErrorsOf(const std::string& text) { return Errors(LoadSpecFromString("s.yaml", text)); }

// A fresh folder under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path root;
  TempDir() {
    static int counter = 0;
    root = fs::temp_directory_path() /
           ("patchgen_spec_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~TempDir() { fs::remove_all(root); }
  void Write(const std::string& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel, std::ios::binary) << text;
  }
};

// Runs the test body with the working directory at `dir`, so paths print relative.
struct ChangeDir {
  fs::path old = fs::current_path();
  explicit ChangeDir(const fs::path& dir) { fs::current_path(dir); }
  ~ChangeDir() { fs::current_path(old); }
};

const char* kMinimal = "upstream: transformers.models.qwen3.modeling_qwen3\noutput: out.py\n";

TEST_CASE("minimal spec loads with defaults", "[spec]") {
  auto r = LoadSpecFromString("specs/q/q.yaml", kMinimal);
  REQUIRE(Errors(r) == "OK");
  const PatchSpec& s = *r;
  CHECK(s.path == "specs/q/q.yaml");
  CHECK(s.version == 1);
  CHECK(s.upstream == "transformers.models.qwen3.modeling_qwen3");
  CHECK(s.upstream_loc.line == 1);
  CHECK(s.upstream_loc.col == 11);
  CHECK(s.output == "out.py");
  CHECK(s.output_loc.line == 2);
  CHECK(s.output_loc.col == 9);
  CHECK(s.description.empty());
  CHECK(!s.runtime);
  CHECK(s.extends_chain.empty());
  CHECK(s.patches.empty());
  CHECK(*s.text == kMinimal);
}

TEST_CASE("every top-level key is read", "[spec]") {
  auto r = LoadSpecFromString("s.yaml", R"(version: 1
upstream: transformers.models.qwen3.modeling_qwen3
output: patched_modeling_qwen3_gpu.py
description: Qwen3 with kernels
runtime: veomni.ops.dispatch
name_map: {Qwen3: Qwen3Moe, qwen3_rms: qwen3_moe_rms}
imports:
  add:
    - from transformers.modeling_outputs import SequenceClassifierOutputWithPast
    - import torch.distributed as dist
  drop: [use_kernel_func_from_hub, torch.nn]
blocks:
  - |
    try:
        import flash_attn
    except ImportError:
        flash_attn = None
exclude: [Qwen3ForTokenClassification, Qwen3ForQuestionAnswering]
)");
  REQUIRE(Errors(r) == "OK");
  const PatchSpec& s = *r;
  CHECK(s.description == "Qwen3 with kernels");
  CHECK(s.runtime == "veomni.ops.dispatch");
  REQUIRE(s.name_map.size() == 2);
  CHECK(s.name_map[0].from == "Qwen3");
  CHECK(s.name_map[0].to == "Qwen3Moe");
  CHECK(s.name_map[0].loc.line == 6);
  CHECK(s.name_map[0].loc.col == 12);
  CHECK(s.name_map[1].from == "qwen3_rms");
  REQUIRE(s.import_adds.size() == 2);
  CHECK(s.import_adds[0].code ==
        "from transformers.modeling_outputs import SequenceClassifierOutputWithPast");
  CHECK(s.import_adds[0].origin.first_line == 9);
  CHECK(s.import_adds[0].origin.col_offset == 6);
  CHECK(s.import_adds[1].code == "import torch.distributed as dist");
  REQUIRE(s.import_drops.size() == 2);
  CHECK(s.import_drops[0].name == "use_kernel_func_from_hub");
  CHECK(s.import_drops[1].name == "torch.nn");
  CHECK(s.import_drops[1].loc.col == 36);
  REQUIRE(s.blocks.size() == 1);
  CHECK(s.blocks[0].code ==
        "try:\n    import flash_attn\nexcept ImportError:\n    flash_attn = None\n");
  CHECK(s.blocks[0].origin.first_line == 14);
  CHECK(s.blocks[0].origin.col_offset == 4);
  CHECK(s.blocks[0].loc.line == 13);
  REQUIRE(s.excludes.size() == 2);
  CHECK(s.excludes[1].name == "Qwen3ForQuestionAnswering");
  CHECK(s.excludes[1].loc.line == 18);
  CHECK(s.excludes[1].loc.col == 40);
}

TEST_CASE("slots and guards", "[spec]") {
  auto r = LoadSpecFromString("s.yaml", std::string(kMinimal) + R"(slots:
  - name: rms_norm_slot
    op: rms_norm
    variant: standard
    guards:
      - in: Qwen3RMSNorm.forward
        call: rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
  - name: loss_slot
    op: cross_entropy_loss
    variant: causal
    scope: instance
    guards:
      - in: Qwen3ForCausalLM.forward
        at: "logits = self.lm_head("
        through: "if labels is not None:"
        call: |
          logits, loss = self.loss_slot(self, hidden_states, labels)
  - name: rms_norm_slot
    op: rms_norm
    variant: standard
    guards:
      - in: Outer.Inner.forward
        call: rms_norm_slot(x)
)");
  REQUIRE(Errors(r) == "OK");
  const PatchSpec& s = *r;
  REQUIRE(s.slots.size() == 2);
  const Slot& rms = s.slots[0];
  CHECK(rms.name == "rms_norm_slot");
  CHECK(rms.op == "rms_norm");
  CHECK(rms.variant == "standard");
  CHECK(rms.scope == Slot::Scope::kModule);
  CHECK(rms.loc.line == 4);
  // The identical second declaration's guards join the first one's.
  REQUIRE(rms.guards.size() == 2);
  CHECK(rms.guards[0].in == "Qwen3RMSNorm.forward");
  CHECK(rms.guards[0].in_loc.line == 8);
  CHECK(rms.guards[0].in_loc.col == 13);
  CHECK(!rms.guards[0].at);
  CHECK(!rms.guards[0].through);
  CHECK(rms.guards[0].call == "rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)");
  CHECK(rms.guards[0].call_origin.first_line == 9);
  CHECK(rms.guards[0].call_origin.col_offset == 14);
  CHECK(rms.guards[1].in == "Outer.Inner.forward");
  const Slot& loss = s.slots[1];
  CHECK(loss.scope == Slot::Scope::kInstance);
  REQUIRE(loss.guards.size() == 1);
  CHECK(loss.guards[0].at == "logits = self.lm_head(");
  CHECK(loss.guards[0].at_loc.line == 16);
  CHECK(loss.guards[0].at_loc.col == 13);
  CHECK(loss.guards[0].through == "if labels is not None:");
  CHECK(loss.guards[0].call == "logits, loss = self.loss_slot(self, hidden_states, labels)\n");
  CHECK(loss.guards[0].call_origin.first_line == 19);
  CHECK(loss.guards[0].call_origin.col_offset == 10);
  CHECK(loss.guards[0].loc.line == 15);
}

TEST_CASE("patch kinds and body sources", "[spec]") {
  auto r = LoadSpecFromString("s.yaml", std::string(kMinimal) + R"(patches:
  - override_method: Qwen3Attention.forward
    description: Ulysses sequence parallel
    name_map: {Qwen3: Qwen3Moe}
    code: |
      def forward(self, x):
          return x
  - add_method: Qwen3ForSequenceClassification.forward
    code: |
      def forward(self, input_ids=None):
          ...
  - modify_init: Qwen3Model
    after: super_init
    code: |
      self.sp_group = None
  - modify_init: Outer.Inner
    code: self.x = 1
  - replace_class: Qwen3MLP
    from: liger_kernel.transformers.swiglu.LigerSwiGLUMLP
  - replace_function: rotate_half
    code: 'def rotate_half(x): return -x'
)");
  REQUIRE(Errors(r) == "OK");
  const auto& ps = r->patches;
  REQUIRE(ps.size() == 6);
  CHECK(ps[0].kind == PatchKind::kOverrideMethod);
  CHECK(ps[0].target == "Qwen3Attention.forward");
  CHECK(ps[0].target_loc.line == 4);
  CHECK(ps[0].target_loc.col == 22);
  CHECK(ps[0].target_loc.length == 22);
  CHECK(ps[0].loc.col == 5);
  CHECK(ps[0].description == "Ulysses sequence parallel");
  REQUIRE(ps[0].name_map.size() == 1);
  CHECK(ps[0].name_map[0].to == "Qwen3Moe");
  CHECK(ps[0].body.source == Body::Source::kCode);
  CHECK(ps[0].body.text == "def forward(self, x):\n    return x\n");
  CHECK(ps[0].body.loc.line == 7);
  CHECK(ps[1].kind == PatchKind::kAddMethod);
  CHECK(ps[2].kind == PatchKind::kModifyInit);
  CHECK(ps[2].init_at == Patch::InitAt::kAfterSuperInit);
  CHECK(ps[2].body.text == "self.sp_group = None\n");
  CHECK(ps[3].target == "Outer.Inner");
  CHECK(ps[3].init_at == Patch::InitAt::kEnd);
  CHECK(ps[4].kind == PatchKind::kReplaceClass);
  CHECK(ps[4].body.source == Body::Source::kFrom);
  CHECK(ps[4].body.from_module == "liger_kernel.transformers.swiglu");
  CHECK(ps[4].body.from_name == "LigerSwiGLUMLP");
  CHECK(ps[4].body.loc.line == 21);
  CHECK(ps[4].body.loc.col == 11);
  CHECK(ps[5].kind == PatchKind::kReplaceFunction);
  CHECK(ps[5].body.text == "def rotate_half(x): return -x");
  CHECK(std::string(PatchKindKey(ps[5].kind)) == "replace_function");
}

// Line i / column c of a body's text is reported at (first_line + i):(c + col_offset); check it
// by finding the text at that place of the spec.
void CheckOrigin(const std::string& spec_text, const std::string& code, const TextOrigin& o) {
  std::vector<std::string_view> spec_lines = SplitLines(spec_text);
  std::vector<std::string_view> code_lines = SplitLines(code);
  for (size_t i = 0; i < code_lines.size(); ++i) {
    if (code_lines[i].empty()) continue;
    std::string_view line = spec_lines.at(o.first_line - 1 + i);
    CHECK(line.substr(o.col_offset, code_lines[i].size()) == code_lines[i]);
  }
}

TEST_CASE("code origins map body lines back to the spec", "[spec]") {
  std::string text = std::string(kMinimal) + R"(patches:
  - replace_function: f
    code: |
        # indented by 8
        def f(x):

            return x
  - replace_function: g
    code:   "def g(): pass"
  - replace_function: h
    code: import os  # comment
helpers:
  - after: f
    code: |-
      def _k():
          pass
)";
  auto r = LoadSpecFromString("s.yaml", text);
  REQUIRE(Errors(r) == "OK");
  const auto& ps = r->patches;
  CHECK(ps[0].body.origin.path == "s.yaml");
  CHECK(*ps[0].body.origin.file_text == text);
  CHECK(ps[0].body.origin.first_line == 6);
  CHECK(ps[0].body.origin.col_offset == 8);
  CheckOrigin(text, ps[0].body.text, ps[0].body.origin);
  CHECK(ps[1].body.origin.first_line == 11);
  CHECK(ps[1].body.origin.col_offset == 13);
  CheckOrigin(text, ps[1].body.text, ps[1].body.origin);
  CHECK(ps[2].body.text == "import os");
  CHECK(ps[2].body.origin.col_offset == 10);
  CheckOrigin(text, ps[2].body.text, ps[2].body.origin);
  REQUIRE(r->helpers.size() == 1);
  CHECK(r->helpers[0].body.text == "def _k():\n    pass");
  CHECK(r->helpers[0].after == "f");
  CHECK(r->helpers[0].after_loc.line == 15);
  CheckOrigin(text, r->helpers[0].body.text, r->helpers[0].body.origin);
}

TEST_CASE("helper names: explicit, from the code, from the symbol", "[spec]") {
  auto r = LoadSpecFromString("s.yaml", std::string(kMinimal) + R"(helpers:
  - code: |
      # a comment
      @torch.no_grad()
      def _gather_heads(x, group):
          return x
  - name: _CONST
    code: |
      _CONST = 3
  - code: |
      class _Buffer(object):
          pass
  - code: |
      async  def _fetch():
          pass
)");
  REQUIRE(Errors(r) == "OK");
  REQUIRE(r->helpers.size() == 4);
  CHECK(r->helpers[0].name == "_gather_heads");
  CHECK(!r->helpers[0].after);
  CHECK(r->helpers[1].name == "_CONST");
  CHECK(r->helpers[2].name == "_Buffer");
  CHECK(r->helpers[3].name == "_fetch");
}

TEST_CASE("patch files are read relative to the spec's folder", "[spec]") {
  TempDir dir;
  dir.Write("specs/qwen3/qwen3.yaml", std::string(kMinimal) + R"(patches:
  - override_method: Qwen3Attention.forward
    file: patches/attn.py
    symbol: attention_forward
  - replace_function: rotate_half
    file: ../common/rot.py
    symbol: rotate
helpers:
  - file: patches/attn.py
    symbol: _helper
)");
  dir.Write("specs/qwen3/patches/attn.py",
            "def attention_forward(self):\n    pass\n\ndef _helper():\n    pass\n");
  dir.Write("specs/common/rot.py", "def rotate(x):\n    return x\n");
  ChangeDir cd(dir.root);
  auto r = LoadSpec("specs/qwen3/qwen3.yaml");
  REQUIRE(Errors(r) == "OK");
  const Body& b = r->patches[0].body;
  CHECK(b.source == Body::Source::kFile);
  CHECK(b.file == "patches/attn.py");
  CHECK(b.symbol == "attention_forward");
  CHECK(b.symbol_loc.line == 6);
  CHECK(b.symbol_loc.col == 13);
  CHECK(b.loc.line == 5);
  CHECK(b.text == "def attention_forward(self):\n    pass\n\ndef _helper():\n    pass\n");
  CHECK(b.origin.path == "specs/qwen3/patches/attn.py");
  CHECK(*b.origin.file_text == b.text);
  CHECK(b.origin.first_line == 1);
  CHECK(b.origin.col_offset == 0);
  CHECK(r->patches[1].body.origin.path == "specs/common/rot.py");
  CHECK(r->helpers[0].name == "_helper");
}

TEST_CASE("patch file errors", "[spec]") {
  TempDir dir;
  dir.Write("specs/a.yaml", std::string(kMinimal) + R"(patches:
  - replace_function: f
    file: patches/missing.py
    symbol: f
  - replace_function: g
    file: patches/g.py
  - replace_function: h
    symbol: h
    code: |
      def h(): pass
)");
  dir.Write("specs/patches/g.py", "def g(): pass\n");
  ChangeDir cd(dir.root);
  CHECK(
      Errors(LoadSpec("specs/a.yaml")) ==
      R"(specs/a.yaml:5:11: error: cannot read patch file 'specs/patches/missing.py': No such file or directory
    5 |     file: patches/missing.py
      |           ^~~~~~~~~~~~~~~~~~
help: 'file' is relative to the spec's folder
specs/a.yaml:8:5: error: 'file' needs 'symbol'
    8 |     file: patches/g.py
      |     ^~~~
help: add `symbol:` naming the def or class in the file
specs/a.yaml:10:5: error: 'symbol' needs 'file'
   10 |     symbol: h
      |     ^~~~~~
help: add `file:` naming the patch file that defines it
)");
  dir.Write("specs/b.yaml", std::string(kMinimal) + R"(patches:
  - replace_function: f
    file: patches/f.py
    symbol: f
)");
  dir.Write("specs/patches/f.py", "def f():\n    return '\x90'\n");
  CHECK(Errors(LoadSpec("specs/b.yaml")) ==
        R"(specs/b.yaml:5:11: error: patch file 'specs/patches/f.py' is not valid UTF-8 (line 2)
    5 |     file: patches/f.py
      |           ^~~~~~~~~~~~
help: its code is written into the generated module: save the file as UTF-8
)");
  CHECK(Errors(LoadSpec("specs/nope.yaml")) ==
        "specs/nope.yaml: error: cannot read spec: No such file or directory\n");
  CHECK(LoadSpec("specs/nope.yaml").errors()[0].kind == ErrorKind::kIo);
}

TEST_CASE("YAML syntax errors", "[spec]") {
  CHECK(ErrorsOf("upstream: a.b\npatches: [1, 2\noutput: x.py\n") ==
        R"(s.yaml:3:7: error: invalid YAML: end of sequence flow not found
    3 | output: x.py
      |       ^
)");
  CHECK(ErrorsOf("upstream: a\n  output: b\n") ==
        R"(s.yaml:2:9: error: invalid YAML: illegal map value
    2 |   output: b
      |         ^
)");
}

TEST_CASE("a string that is not valid UTF-8 is refused", "[spec]") {
  // A stray byte (a fuzzed `upstream:` once reached the generated module's header this way).
  CHECK(ErrorsOf("upstream: toy\x90m.x\noutput: x.py\n") ==
        "s.yaml:1:14: error: this string is not valid UTF-8\n"
        "    1 | upstream: toy\xEF\xBF\xBDm.x\n"
        "      |              ^\n"
        "help: a spec is UTF-8 text; the names and code it holds are written into Python source\n");
  // An escape of a surrogate: yaml-cpp refuses it.
  CHECK(ErrorsOf("upstream: a.b\noutput: x.py\ndescription: \"\\ud800\"\n") ==
        "s.yaml:3:21: error: invalid YAML: invalid unicode: 55296\n"
        "    3 | description: \"\\ud800\"\n"
        "      |                     ^\n");
  CHECK(ErrorsOf("upstream: caf\xC3\xA9.m\noutput: x.py\n") == "OK");
}

TEST_CASE("top level must be a non-empty mapping", "[spec]") {
  CHECK(ErrorsOf("") ==
        "s.yaml:1:1: error: the spec is empty\n"
        "help: a spec needs at least `upstream:` and `output:`\n");
  CHECK(ErrorsOf("- a\n- b\n") == R"(s.yaml:1:1: error: expected a mapping, found a sequence
    1 | - a
      | ^
help: a spec is a mapping of keys such as `upstream:` and `output:`
)");
}

TEST_CASE("unknown keys get did-you-mean", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + "descripton: x\nfoo: 1\n") ==
        R"(s.yaml:3:1: error: unknown key 'descripton' in the spec
    3 | descripton: x
      | ^~~~~~~~~~
help: did you mean 'description'? valid keys in the spec: version, upstream, output, description, runtime, extends, name_map, imports, slots, patches, helpers, blocks, exclude, remove
s.yaml:4:1: error: unknown key 'foo' in the spec
    4 | foo: 1
      | ^~~
help: valid keys in the spec: version, upstream, output, description, runtime, extends, name_map, imports, slots, patches, helpers, blocks, exclude, remove
)");
  CHECK(ErrorsOf(std::string(kMinimal) + R"(imports:
  ad: [import os]
slots:
  - name: s
    op: o
    variant: v
    gaurds: []
patches:
  - replace_class: A
    cod: x
    from: m.A
helpers:
  - code: "def f(): pass"
    befor: A
)") == R"(s.yaml:4:3: error: unknown key 'ad' in imports
    4 |   ad: [import os]
      |   ^~
help: did you mean 'add'? valid keys in imports: add, drop
s.yaml:9:5: error: unknown key 'gaurds' in a slot
    9 |     gaurds: []
      |     ^~~~~~
help: did you mean 'guards'? valid keys in a slot: name, op, variant, scope, guards
s.yaml:12:5: error: unknown key 'cod' in a patch
   12 |     cod: x
      |     ^~~
help: did you mean 'code'? valid keys in a patch: replace_class, replace_function, override_method, add_method, modify_init, edit_body, config_slot, description, code, file, symbol, from, after, edits, attribute, values, default, name_map, upstream_version, optional, reason
s.yaml:16:5: error: unknown key 'befor' in a helper
   16 |     befor: A
      |     ^~~~~
help: valid keys in a helper: after, name, code, file, symbol, upstream_version, reason
)");
}

TEST_CASE("wrong types are reported at the value", "[spec]") {
  CHECK(ErrorsOf(R"(upstream:
output: {a: b}
description: [x]
patches: {}
exclude: A
slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: f
        call:
version: "1"
)") == R"(s.yaml:1:1: error: expected a string, found nothing
    1 | upstream:
      | ^~~~~~~~
help: 'upstream' takes a string
s.yaml:2:9: error: expected a string, found a mapping
    2 | output: {a: b}
      |         ^
help: 'output' takes a string
s.yaml:3:14: error: expected a string, found a sequence
    3 | description: [x]
      |              ^
help: 'description' takes a string
s.yaml:4:10: error: expected a sequence, found a mapping
    4 | patches: {}
      |          ^
help: 'patches' takes a list (`- item` lines or `[a, b]`)
s.yaml:5:10: error: expected a sequence, found a string
    5 | exclude: A
      |          ^
help: 'exclude' takes a list (`- item` lines or `[a, b]`)
s.yaml:12:9: error: expected a string, found nothing
   12 |         call:
      |         ^~~~
help: 'call' takes a string
s.yaml:13:10: error: expected an integer, found a string
   13 | version: "1"
      |          ^~~
help: write `version: 1`
)");
}

TEST_CASE("a block sequence where a string is expected points at the value", "[spec]") {
  CHECK(ErrorsOf(R"(upstream:
  - a
output: x.py
)") == R"(s.yaml:2:3: error: expected a string, found a sequence
    2 |   - a
      |   ^
help: 'upstream' takes a string
)");
}

TEST_CASE("empty list items and non-ASCII text are located exactly", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(exclude:
  - A
  -
description: "Qwen3 – héllo"
name_map: {Qwen3: Qwèn, é: 2x}
)") == R"(s.yaml:5:3: error: expected a string, found nothing
    5 |   -
      |   ^
help: 'exclude' takes a string
s.yaml:7:28: error: '2x' is not a Python identifier
    7 | name_map: {Qwen3: Qwèn, é: 2x}
      |                            ^~
help: 'name_map' takes a name like `rms_norm_slot`
)");
  auto r = LoadSpecFromString("s.yaml", std::string(kMinimal) + "description: \"Qwen3 – héllo\"\n");
  REQUIRE(Errors(r) == "OK");
  CHECK(r->description == "Qwen3 – héllo");
}

TEST_CASE("missing required keys", "[spec]") {
  CHECK(ErrorsOf("upstream: a.b\n") == R"(s.yaml:1:1: error: missing required key 'output'
    1 | upstream: a.b
      | ^
help: add `output: <file name>.py`
)");
  CHECK(ErrorsOf("description: d\n") == R"(s.yaml:1:1: error: missing required key 'output'
    1 | description: d
      | ^
help: add `output: <file name>.py`
s.yaml:1:1: error: missing required key 'upstream'
    1 | description: d
      | ^
help: add `upstream: <dotted module>`, e.g. transformers.models.qwen3.modeling_qwen3
)");
  CHECK(ErrorsOf(std::string(kMinimal) + R"(slots:
  - name: s
    guards:
      - in: f
)") == R"(s.yaml:4:5: error: missing key 'op' in a slot
    4 |   - name: s
      |     ^~~~
help: a slot needs: name, op, variant
s.yaml:4:5: error: missing key 'variant' in a slot
    4 |   - name: s
      |     ^~~~
help: a slot needs: name, op, variant
)");
}

TEST_CASE("scalar value checks", "[spec]") {
  CHECK(ErrorsOf(R"(version: 2
upstream: transformers/models/qwen3
output: out/x.py
description: |
  two
  lines
runtime: 3rd.party
)") == R"(s.yaml:1:10: error: unsupported spec version '2'
    1 | version: 2
      |          ^
help: this patchgen reads `version: 1`
s.yaml:2:11: error: 'transformers/models/qwen3' is not a dotted Python name
    2 | upstream: transformers/models/qwen3
      |           ^~~~~~~~~~~~~~~~~~~~~~~~~
help: 'upstream' takes a name like `transformers.models.qwen3.modeling_qwen3`
s.yaml:3:9: error: 'output' must be a file name ending in '.py'
    3 | output: out/x.py
      |         ^~~~~~~~
help: the folder comes from the spec's place under the specs root (or `-o`)
s.yaml:4:14: error: 'description' must be one line
    4 | description: |
      |              ^
help: write a single line of text
s.yaml:7:10: error: '3rd.party' is not a dotted Python name
    7 | runtime: 3rd.party
      |          ^~~~~~~~~
help: 'runtime' takes a name like `opslot`
)");
}

TEST_CASE("identifiers are checked", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(name_map: {Qwen3: class, 2x: y}
slots:
  - name: my-slot
    op: o
    variant: v
patches:
  - override_method: A..f
    code: "def f(): pass"
exclude: [A.B]
)") == R"(s.yaml:3:19: error: 'class' is not a Python identifier
    3 | name_map: {Qwen3: class, 2x: y}
      |                   ^~~~~
help: 'name_map' takes a name like `rms_norm_slot`
s.yaml:3:26: error: '2x' is not a Python identifier
    3 | name_map: {Qwen3: class, 2x: y}
      |                          ^~
help: 'name_map' takes a name like `rms_norm_slot`
s.yaml:5:11: error: 'my-slot' is not a Python identifier
    5 |   - name: my-slot
      |           ^~~~~~~
help: 'name' takes a name like `rms_norm_slot`
s.yaml:9:22: error: 'A..f' is not a dotted Python name
    9 |   - override_method: A..f
      |                      ^~~~
help: 'override_method' takes a name like `Qwen3MLP.forward`
s.yaml:11:11: error: 'A.B' is not a Python identifier
   11 | exclude: [A.B]
      |           ^~~
help: 'exclude' takes a name like `rms_norm_slot`
)");
}

TEST_CASE("patch kind conflicts", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(patches:
  - override_method: A.f
    replace_class: B
    code: "def f(): pass"
  - description: no kind
    code: "def f(): pass"
  - replace_class: A.B
    code: "class B: pass"
  - override_method: rotate_half
    code: "def rotate_half(): pass"
  - add_method: A
    code: "def A(): pass"
)") == R"(s.yaml:5:5: error: patch has more than one kind: 'override_method' and 'replace_class'
    5 |     replace_class: B
      |     ^~~~~~~~~~~~~
help: split it into one patch per kind
s.yaml:7:5: error: patch has no kind
    7 |   - description: no kind
      |     ^~~~~~~~~~~
help: start the entry with one of: replace_class, replace_function, override_method, add_method, modify_init, edit_body, config_slot
s.yaml:9:20: error: 'replace_class' takes a top-level name, found 'A.B'
    9 |   - replace_class: A.B
      |                    ^~~
help: to change a method, use `override_method: A.B`
s.yaml:11:22: error: 'override_method' takes `Class.method`, found 'rotate_half'
   11 |   - override_method: rotate_half
      |                      ^~~~~~~~~~~
help: to replace a top-level function, use `replace_function: rotate_half`
s.yaml:13:17: error: 'add_method' takes `Class.method`, found 'A'
   13 |   - add_method: A
      |                 ^
help: name the class and the new method, like `A.forward`
)");
}

TEST_CASE("body source conflicts", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(patches:
  - replace_class: A
    code: "class A: pass"
    from: m.A
  - replace_function: f
  - override_method: A.f
    from: m.f
  - modify_init: C
    from: m.init
  - replace_function: g
    from: g
  - add_method: A.g
    after: end
    code: "def g(self): pass"
  - modify_init: B
    after: start
    code: self.x = 1
)") == R"(s.yaml:6:5: error: more than one body: 'code' and 'from'
    6 |     from: m.A
      |     ^~~~
help: give exactly one of `code`, `file` + `symbol`, `from`
s.yaml:7:5: error: no body: give `code`, `file` + `symbol` or `from`
    7 |   - replace_function: f
      |     ^~~~~~~~~~~~~~~~
s.yaml:9:5: error: 'from' is not allowed on override_method
    9 |     from: m.f
      |     ^~~~
help: 'from' (an external import) replaces a class or a function; give `code` or `file` + `symbol`
s.yaml:11:5: error: 'from' is not allowed on modify_init
   11 |     from: m.init
      |     ^~~~
help: 'from' (an external import) replaces a class or a function; give `code` or `file` + `symbol`
s.yaml:13:11: error: 'from' needs a module and a name, like `package.module.Name`
   13 |     from: g
      |           ^
s.yaml:15:5: error: 'after' is only for modify_init
   15 |     after: end
      |     ^~~~~
help: `after: super_init` places modify_init statements right after super().__init__(...)
s.yaml:18:12: error: invalid value 'start' for 'after'
   18 |     after: start
      |            ^~~~~
help: valid values: end, super_init
)");
}

TEST_CASE("code must keep its line breaks", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(patches:
  - replace_function: f
    code: >
      def f():
          pass
  - replace_function: g
    code: x = 1 +
      2
  - replace_function: h
    code: "  "
)") == R"(s.yaml:5:11: error: 'code' must not be a folded block (`>`)
    5 |     code: >
      |           ^
help: use a literal block (`|`) so that line breaks are kept
s.yaml:9:11: error: 'code' spans several lines but is not a literal block
    9 |     code: x = 1 +
      |           ^~~~~~~
help: write it as a literal block: `code: |` and the code below
s.yaml:12:11: error: 'code' is empty
   12 |     code: "  "
      |           ^~~~
)");
}

TEST_CASE("guard and slot errors", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(slots:
  - name: s
    op: rms_norm
    variant: standard
    scope: instanse
    guards:
      - in: A.forward
        through: "return x"
        call: s(x)
      - call: s(x)
  - name: t
    op: rms_norm
    variant: standard
  - name: t
    op: rms_norm
    variant: offset
)") == R"(s.yaml:7:12: error: invalid value 'instanse' for 'scope'
    7 |     scope: instanse
      |            ^~~~~~~~
help: did you mean 'instance'? valid values: module, instance
s.yaml:10:9: error: 'through' needs 'at'
   10 |         through: "return x"
      |         ^~~~~~~
help: `at` names the first statement of the range, `through` the last
s.yaml:12:9: error: missing key 'in' in a guard
   12 |       - call: s(x)
      |         ^~~~
help: a guard needs: in, call
s.yaml:16:11: error: slot 't' is declared again with a different op/variant/scope
   16 |   - name: t
      |           ^
s.yaml:13:11: note: first declared here as rms_norm/standard
help: use another slot name, or the same op, variant and scope
)");
}

TEST_CASE("duplicates within one spec", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(output: y.py
patches:
  - override_method: A.f
    code: "def f(): pass"
  - add_method: A.f
    code: "def f(): pass"
helpers:
  - code: "def _h(): pass"
  - name: _h
    code: "_h = 1"
exclude: [A, B, A]
name_map: {A: B, A: C}
)") == R"(s.yaml:3:1: error: duplicate key 'output'
    3 | output: y.py
      | ^~~~~~
s.yaml:2:1: note: first given here
s.yaml:7:17: error: duplicate target 'A.f'
    7 |   - add_method: A.f
      |                 ^~~
s.yaml:5:22: note: first patched here
help: a target can be patched once per spec; merge the two patches
s.yaml:11:11: error: duplicate helper '_h'
   11 |   - name: _h
      |           ^~
s.yaml:10:5: note: first defined here
s.yaml:13:17: error: 'A' is listed twice in 'exclude'
   13 | exclude: [A, B, A]
      |                 ^
s.yaml:13:11: note: first listed here
s.yaml:14:18: error: duplicate key 'A'
   14 | name_map: {A: B, A: C}
      |                  ^
s.yaml:14:12: note: first given here
)");
}

TEST_CASE("remove needs extends", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + "remove: [A]\n") ==
        R"(s.yaml:3:1: error: 'remove' needs 'extends'
    3 | remove: [A]
      | ^~~~~~
help: 'remove' drops entries inherited from the spec named by `extends`
)");
}

// A parent spec and its child, in a temp tree; paths printed relative to it.
const char* kParent = R"(upstream: transformers.models.qwen3.modeling_qwen3
output: patched_qwen3.py
description: Qwen3
runtime: opslot
name_map: {Qwen3: Qwen3}
imports:
  add: [import os]
  drop: [use_kernel_func_from_hub]
slots:
  - name: rms_slot
    op: rms_norm
    variant: standard
  - name: rope_slot
    op: rotary_pos_emb
    variant: full
patches:
  - override_method: Qwen3MLP.forward
    file: patches/mlp.py
    symbol: mlp_forward
  - replace_function: rotate_half
    code: |
      def rotate_half(x):
          return x
  - modify_init: Qwen3Model
    code: self.sp = None
helpers:
  - code: |
      def _h1(): pass
  - code: |
      def _h2(): pass
blocks: ["X = 1"]
exclude: [Qwen3ForQuestionAnswering]
)";

TEST_CASE("extends: override, concatenate, replace in place, remove", "[spec]") {
  TempDir dir;
  dir.Write("specs/qwen3/qwen3_gpu.yaml", kParent);
  dir.Write("specs/qwen3/patches/mlp.py", "def mlp_forward(self, x):\n    return x\n");
  dir.Write("specs/qwen3_moe/qwen3_moe_gpu.yaml", R"(extends: ../qwen3/qwen3_gpu.yaml
upstream: transformers.models.qwen3_moe.modeling_qwen3_moe
output: patched_qwen3_moe.py
name_map: {Qwen3: Qwen3Moe, Foo: Bar}
imports:
  add: [import sys]
slots:
  - name: rms_slot
    op: rms_norm
    variant: offset
  - name: moe_slot
    op: moe
    variant: fused
patches:
  - override_method: Qwen3MLP.forward
    code: |
      def forward(self):
          pass
  - add_method: Qwen3MoeModel.extra
    code: |
      def extra(self): pass
helpers:
  - code: |
      def _h3(): pass
remove: [rotate_half, rope_slot, _h1]
blocks: ["Y = 2"]
exclude: [Qwen3ForQuestionAnswering, Qwen3ForTokenClassification]
)");
  ChangeDir cd(dir.root);
  auto r = LoadSpec("specs/qwen3_moe/qwen3_moe_gpu.yaml");
  REQUIRE(Errors(r) == "OK");
  const PatchSpec& s = *r;
  CHECK(s.path == "specs/qwen3_moe/qwen3_moe_gpu.yaml");
  CHECK(s.extends_chain == std::vector<std::string>{"specs/qwen3/qwen3_gpu.yaml"});
  CHECK(s.upstream == "transformers.models.qwen3_moe.modeling_qwen3_moe");
  CHECK(s.upstream_loc.path == "specs/qwen3_moe/qwen3_moe_gpu.yaml");
  CHECK(s.output == "patched_qwen3_moe.py");
  CHECK(s.description == "Qwen3");  // inherited
  CHECK(s.runtime == "opslot");
  REQUIRE(s.name_map.size() == 2);
  CHECK(s.name_map[0].from == "Qwen3");
  CHECK(s.name_map[0].to == "Qwen3Moe");
  CHECK(s.name_map[1].from == "Foo");
  REQUIRE(s.import_adds.size() == 2);
  CHECK(s.import_adds[0].code == "import os");
  CHECK(s.import_adds[1].code == "import sys");
  CHECK(s.import_drops.size() == 1);
  REQUIRE(s.slots.size() == 2);
  CHECK(s.slots[0].name == "rms_slot");
  CHECK(s.slots[0].variant == "offset");
  CHECK(s.slots[1].name == "moe_slot");
  REQUIRE(s.patches.size() == 3);
  CHECK(s.patches[0].target == "Qwen3MLP.forward");  // replaced in place
  CHECK(s.patches[0].body.source == Body::Source::kCode);
  CHECK(s.patches[0].loc.path == "specs/qwen3_moe/qwen3_moe_gpu.yaml");
  CHECK(s.patches[1].target == "Qwen3Model");
  CHECK(s.patches[1].loc.path == "specs/qwen3/qwen3_gpu.yaml");
  CHECK(s.patches[1].loc.line == 24);
  CHECK(s.patches[2].target == "Qwen3MoeModel.extra");
  REQUIRE(s.helpers.size() == 2);
  CHECK(s.helpers[0].name == "_h2");
  CHECK(s.helpers[1].name == "_h3");
  REQUIRE(s.blocks.size() == 2);
  CHECK(s.blocks[1].code == "Y = 2");
  REQUIRE(s.excludes.size() == 2);
  CHECK(s.excludes[1].name == "Qwen3ForTokenClassification");
}

TEST_CASE("extends: chains, parents without output, inherited file bodies", "[spec]") {
  TempDir dir;
  dir.Write("specs/base.yaml", R"(upstream: m.base
patches:
  - replace_function: f
    file: patches/f.py
    symbol: f
)");
  dir.Write("specs/patches/f.py", "def f(): pass\n");
  dir.Write("specs/mid/mid.yaml", "extends: ../base.yaml\ndescription: mid\n");
  dir.Write("specs/mid/leaf/leaf.yaml", "extends: ../mid.yaml\noutput: leaf.py\n");
  ChangeDir cd(dir.root);
  auto r = LoadSpec("specs/mid/leaf/leaf.yaml");
  REQUIRE(Errors(r) == "OK");
  CHECK(r->extends_chain == std::vector<std::string>{"specs/mid/mid.yaml", "specs/base.yaml"});
  CHECK(r->upstream == "m.base");
  CHECK(r->description == "mid");
  CHECK(r->output == "leaf.py");
  REQUIRE(r->patches.size() == 1);
  CHECK(r->patches[0].body.origin.path == "specs/patches/f.py");
  // The middle spec alone has no output.
  CHECK(Errors(LoadSpec("specs/mid/mid.yaml")) ==
        R"(specs/mid/mid.yaml:1:1: error: missing required key 'output'
    1 | extends: ../base.yaml
      | ^
help: add `output: <file name>.py`
)");
}

TEST_CASE("extends errors: cycles, missing parent, parent errors, remove of unknown", "[spec]") {
  TempDir dir;
  dir.Write("specs/a.yaml", "extends: b.yaml\nupstream: m.a\noutput: a.py\n");
  dir.Write("specs/b.yaml", "extends: ./a.yaml\n");
  dir.Write("specs/self.yaml", "extends: self.yaml\n");
  dir.Write("specs/orphan.yaml", "extends: ../nope/p.yaml\n");
  dir.Write("specs/bad_parent.yaml", "upstream: m.b\noutput: b.py\npatchs: []\n");
  dir.Write("specs/child.yaml", "extends: bad_parent.yaml\nremove: [x]\noutpt: c.py\n");
  dir.Write("specs/good_parent.yaml", std::string(kMinimal) + R"(slots:
  - name: rms_slot
    op: rms_norm
    variant: standard
patches:
  - replace_function: rotate_half
    code: "def rotate_half(x): return x"
)");
  dir.Write("specs/remover.yaml",
            "extends: good_parent.yaml\nremove: [rotate_hlf, rms_slot, nothing]\n");
  ChangeDir cd(dir.root);
  CHECK(Errors(LoadSpec("specs/a.yaml")) ==
        R"(specs/b.yaml:1:10: error: 'extends' cycle: 'specs/a.yaml' is already being loaded
    1 | extends: ./a.yaml
      |          ^~~~~~~~
help: a spec cannot extend itself, directly or through others
)");
  CHECK(Errors(LoadSpec("specs/self.yaml")) ==
        R"(specs/self.yaml:1:10: error: 'extends' cycle: 'specs/self.yaml' is already being loaded
    1 | extends: self.yaml
      |          ^~~~~~~~~
help: a spec cannot extend itself, directly or through others
)");
  CHECK(Errors(LoadSpec("specs/orphan.yaml")) ==
        R"(specs/orphan.yaml:1:10: error: cannot read spec 'nope/p.yaml': No such file or directory
    1 | extends: ../nope/p.yaml
      |          ^~~~~~~~~~~~~~
help: 'extends' is relative to this spec's folder
)");
  CHECK(Errors(LoadSpec("specs/child.yaml")) ==
        R"(specs/bad_parent.yaml:3:1: error: unknown key 'patchs' in the spec
    3 | patchs: []
      | ^~~~~~
help: did you mean 'patches'? valid keys in the spec: version, upstream, output, description, runtime, extends, name_map, imports, slots, patches, helpers, blocks, exclude, remove
specs/child.yaml:2:10: error: nothing named 'x' to remove in 'specs/bad_parent.yaml'
    2 | remove: [x]
      |          ^
help: the parent has no patches, slots or helpers
specs/child.yaml:3:1: error: unknown key 'outpt' in the spec
    3 | outpt: c.py
      | ^~~~~
help: did you mean 'output'? valid keys in the spec: version, upstream, output, description, runtime, extends, name_map, imports, slots, patches, helpers, blocks, exclude, remove
)");
  CHECK(
      Errors(LoadSpec("specs/remover.yaml")) ==
      R"(specs/remover.yaml:2:10: error: nothing named 'rotate_hlf' to remove in 'specs/good_parent.yaml'
    2 | remove: [rotate_hlf, rms_slot, nothing]
      |          ^~~~~~~~~~
help: did you mean 'rotate_half'? inherited patch targets, slots and helpers: rotate_half, rms_slot
specs/remover.yaml:2:32: error: nothing named 'nothing' to remove in 'specs/good_parent.yaml'
    2 | remove: [rotate_hlf, rms_slot, nothing]
      |                                ^~~~~~~
help: inherited patch targets, slots and helpers: rotate_half, rms_slot
)");
}

TEST_CASE("edit_body: edits in spec order, anchors and code kept with their places", "[spec]") {
  auto r = LoadSpecFromString("s.yaml", std::string(kMinimal) + R"(patches:
  - edit_body: A.forward
    description: two small edits
    edits:
      - insert_before: "x = 1"
        code: |
          y = 2
      - replace: "if a:"
        through: "return b"
        code: |
          return c
      - delete: "z = 3"
      - wrap: "w = 4"
        code: |
          with m:
              ...
)");
  REQUIRE(r.ok());
  const Patch& p = r->patches.at(0);
  CHECK(p.kind == PatchKind::kEditBody);
  CHECK(p.target == "A.forward");
  CHECK(p.body.source == Body::Source::kNone);
  REQUIRE(p.edits.size() == 4);
  CHECK(p.edits[0].op == StatementEdit::Op::kInsertBefore);
  CHECK(p.edits[0].at == "x = 1");
  CHECK(p.edits[0].at_loc.line == 7);
  CHECK(p.edits[0].at_loc.col == 24);
  CHECK(p.edits[0].code == "y = 2\n");
  CHECK(p.edits[0].code_origin.first_line == 9);
  CHECK(p.edits[0].code_origin.col_offset == 10);
  CHECK(p.edits[1].op == StatementEdit::Op::kReplace);
  CHECK(p.edits[1].through == std::optional<std::string>("return b"));
  CHECK(p.edits[2].op == StatementEdit::Op::kDelete);
  CHECK(p.edits[2].code.empty());
  CHECK(p.edits[3].op == StatementEdit::Op::kWrap);
  CHECK(p.edits[3].code == "with m:\n    ...\n");
  CHECK(std::string(EditOpKey(p.edits[3].op)) == "wrap");
  CHECK(std::string(PatchKindKey(p.kind)) == "edit_body");
}

TEST_CASE("edit_body: an indentation indicator keeps code columns right", "[spec]") {
  auto r = LoadSpecFromString("s.yaml", std::string(kMinimal) + R"(patches:
  - edit_body: f
    edits:
      - insert_after: "x = 1"
        code: |2
              deeper = 1
            y = 2
)");
  REQUIRE(r.ok());
  const StatementEdit& e = r->patches.at(0).edits.at(0);
  CHECK(e.code == "    deeper = 1\n  y = 2\n");
  CHECK(e.code_origin.col_offset == 10);  // The block's indentation, not the first line's.
}

TEST_CASE("edit_body: every malformed entry is reported", "[spec]") {
  CHECK(ErrorsOf(std::string(kMinimal) + R"(patches:
  - edit_body: A.f
    file: p.py
    edits: []
  - edit_body: A.g
    edits:
      - insert_before: "   "
        code: x
      - wrap: "y"
  - add_method: A.h
    code: "def h(self): pass"
    edits:
      - delete: "x"
)") == R"(s.yaml:5:5: error: 'file' is not allowed on edit_body
    5 |     file: p.py
      |     ^~~~
help: each entry of `edits:` has its own `code`
s.yaml:6:12: error: 'edits' is empty
    6 |     edits: []
      |            ^
help: list the statement edits: insert_before, insert_after, replace, delete or wrap
s.yaml:9:24: error: 'insert_before' is empty
    9 |       - insert_before: "   "
      |                        ^~~~~
help: give the leading text of the statement, as written upstream after its indentation
s.yaml:11:9: error: 'wrap' needs 'code'
   11 |       - wrap: "y"
      |         ^~~~
help: give the wrapping code with a `...` line where the statements go
s.yaml:14:5: error: 'edits' is only for edit_body
   14 |     edits:
      |     ^~~~~
help: to change a few statements of A.h instead of replacing it, use `edit_body: A.h`
)");
}

TEST_CASE("name_map prefix rules: Old*: New*", "[spec]") {
  auto r = LoadSpecFromString("s.yaml", std::string(kMinimal) + R"(name_map:
  Qwen3_5*: Qwen3_5Moe*
  Qwen3_5MLP: Qwen3_5MoeMLP
)");
  REQUIRE(r.ok());
  REQUIRE(r->name_map.size() == 2);
  CHECK(r->name_map[0].prefix);
  CHECK(r->name_map[0].from == "Qwen3_5");
  CHECK(r->name_map[0].to == "Qwen3_5Moe");
  CHECK(r->name_map[0].Key() == "Qwen3_5*");
  CHECK_FALSE(r->name_map[1].prefix);
  CHECK(r->name_map[1].Key() == "Qwen3_5MLP");
  CHECK(ErrorsOf(std::string(kMinimal) + R"(name_map:
  A*: B
  A*: C*
  x: y*
)") == R"(s.yaml:4:7: error: 'A*' is a prefix rule, so its value must be a prefix too, like `AMoe*`
    4 |   A*: B
      |       ^
help: `A*: B*` renames every identifier that starts with A to start with B
s.yaml:6:6: error: 'y*' is not a Python identifier
    6 |   x: y*
      |      ^~
help: 'name_map' takes a name like `rms_norm_slot`
)");
}

TEST_CASE("known keys and enum lists", "[spec]") {
  CHECK(KnownKeys(KeyLevel::kImports) == std::vector<std::string>{"add", "drop"});
  CHECK(KnownKeys(KeyLevel::kGuard) == std::vector<std::string>{"in", "at", "through", "call",
                                                                "upstream_version", "optional",
                                                                "reason"});
  CHECK(RequiredKeys(KeyLevel::kSpec) == std::vector<std::string>{"upstream", "output"});
  CHECK(RequiredKeys(KeyLevel::kPatch).empty());
  CHECK(ScopeValues() == std::vector<std::string>{"module", "instance"});
  CHECK(InitAfterValues() == std::vector<std::string>{"end", "super_init"});
  CHECK(PatchKindKeys().size() == 7);
  CHECK(EditOpKeys() ==
        std::vector<std::string>{"insert_before", "insert_after", "replace", "delete", "wrap"});
  CHECK(KnownKeys(KeyLevel::kEdit) == std::vector<std::string>{"insert_before", "insert_after",
                                                               "replace", "delete", "wrap",
                                                               "through", "code"});
  for (const std::string& kind : PatchKindKeys()) {
    CHECK(std::find(KnownKeys(KeyLevel::kPatch).begin(), KnownKeys(KeyLevel::kPatch).end(), kind) !=
          KnownKeys(KeyLevel::kPatch).end());
  }
}

}  // namespace
}  // namespace patchgen::spec

namespace patchgen::spec {
namespace {

TEST_CASE("upstream_version, optional and reason on guards, patches and helpers", "[spec]") {
  std::string text = std::string(kMinimal) +
                     "slots:\n"
                     "  - name: s\n"
                     "    op: rms_norm\n"
                     "    variant: standard\n"
                     "    guards:\n"
                     "      - in: A.forward\n"
                     "        upstream_version: \">=5.23\"\n"
                     "        reason: new form\n"
                     "        call: s(x)\n"
                     "      - in: B.forward\n"
                     "        optional: true\n"
                     "        reason: B appeared in 5.23\n"
                     "        call: s(x)\n"
                     "patches:\n"
                     "  - override_method: A.f\n"
                     "    upstream_version: \"<5.23\"\n"
                     "    code: \"def f(self): pass\"\n"
                     "  - override_method: A.f\n"
                     "    upstream_version: \">=5.23\"\n"
                     "    code: \"def f(self): return 1\"\n"
                     "helpers:\n"
                     "  - upstream_version: \">=5.17,<5.23\"\n"
                     "    code: \"def h(): pass\"\n";
  auto r = LoadSpecFromString("s.yaml", text);
  REQUIRE(Errors(r) == "OK");
  const PatchSpec& s = *r;
  REQUIRE(s.slots[0].guards.size() == 2);
  CHECK(s.slots[0].guards[0].when.upstream_version == ">=5.23");
  CHECK(s.slots[0].guards[0].when.reason == "new form");
  CHECK_FALSE(s.slots[0].guards[0].when.optional);
  CHECK(s.slots[0].guards[1].when.optional);
  CHECK(s.slots[0].guards[1].when.reason == "B appeared in 5.23");
  REQUIRE(s.patches.size() == 2);  // One target, two version ranges: not a duplicate.
  CHECK(s.patches[1].when.upstream_version == ">=5.23");
  CHECK(s.helpers[0].when.upstream_version == ">=5.17,<5.23");
}

TEST_CASE("invalid conditions are errors at their values", "[spec]") {
  std::string base = std::string(kMinimal) +
                     "patches:\n  - override_method: A.f\n    code: \"def f(self): pass\"\n";
  CHECK(ErrorsOf(base + "    upstream_version: \"5.23\"\n") ==
        "s.yaml:6:23: error: invalid upstream_version '5.23': clause '5.23' has no comparison (>=, "
        ">, <=, <, ==, !=)\n"
        "    6 |     upstream_version: \"5.23\"\n"
        "      |                       ^~~~~~\n"
        "help: write clauses like \">=5.23\" or \">=5.17,<5.23\"\n");
  CHECK(ErrorsOf(base + "    optional: yes please\n").find("'optional' takes true or false") !=
        std::string::npos);
  CHECK(ErrorsOf(base + "    optional: true\n").find("'optional: true' needs a 'reason'") !=
        std::string::npos);
  // Helpers cannot be optional (their placement anchor is checked anyway).
  CHECK(ErrorsOf(std::string(kMinimal) +
                 "helpers:\n  - optional: true\n    code: \"def h(): pass\"\n")
            .find("unknown key 'optional' in a helper") != std::string::npos);
}

}  // namespace
}  // namespace patchgen::spec
