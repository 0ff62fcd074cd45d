#include "spec/spec_reader.h"

#include <algorithm>
#include <filesystem>

#include "base/file_util.h"
#include "base/text_util.h"
#include "base/unicode_nfkc.h"
#include "spec/python_names.h"

namespace patchgen::spec {
namespace {

namespace fs = std::filesystem;
using Kind = RawNode::Kind;

}  // namespace

std::string JoinRelative(const std::string& spec_path, const std::string& rel) {
  fs::path joined = fs::path(spec_path).parent_path() / fs::path(rel);
  std::string out = joined.lexically_normal().generic_string();
  return out.empty() ? "." : out;
}

// Cropped (LocOf keeps only what an excerpt shows): every located entry of a spec keeps its
// location, and a spec may hold thousands of them on one line.
SourceLoc SpecReader::LocAt(ByteRange r) { return LocOf(path_, *text_, lines_, r); }

void SpecReader::Error(const RawNode& at, std::string msg, std::string help) {
  diags_.push_back(ErrorAt(Loc(at), std::move(msg), std::move(help)));
}

void SpecReader::ErrorWithNote(const RawNode& at, std::string msg, const SourceLoc& first,
                               std::string note, std::string help) {
  Diagnostic d = ErrorAt(Loc(at), std::move(msg), std::move(help));
  d.notes.push_back(Note::At(first, std::move(note)));
  diags_.push_back(std::move(d));
}

// Checks the keys of mapping `m` at `level`: non-scalar, unknown and duplicate keys are errors.
// Returns key -> (key node, value node) for the known keys (first occurrence).
SpecReader::KeyMap SpecReader::Keys(const RawNode& m, KeyLevel level) {
  KeyMap out;
  const std::vector<std::string>& known = KnownKeys(level);
  for (const auto& [key, value] : m.entries) {
    if (key.kind != Kind::kScalar) {
      Error(key, std::string("expected a key, found ") + DescribeKind(key));
      continue;
    }
    if (std::find(known.begin(), known.end(), key.scalar) == known.end()) {
      std::string help = WithDidYouMean(
          key.scalar, known, "valid keys in " + Article(level) + ": " + JoinNames(known, 100));
      Error(key, "unknown key '" + key.scalar + "' in " + Article(level), help);
      continue;
    }
    auto [it, inserted] = out.emplace(key.scalar, std::make_pair(&key, &value));
    if (!inserted) {
      ErrorWithNote(key, "duplicate key '" + key.scalar + "'", Loc(*it->second.first),
                    "first given here");
    }
  }
  return out;
}

std::string SpecReader::Article(KeyLevel level) {
  switch (level) {
    case KeyLevel::kSpec:
      return "the spec";
    case KeyLevel::kImports:
      return "imports";
    case KeyLevel::kEdit:
      return "an edit";
    default:
      return std::string("a ") + KeyLevelName(level);
  }
}

std::optional<std::string> SpecReader::String(const RawNode& n, std::string_view what) {
  if (n.kind == Kind::kScalar) return n.scalar;
  Error(n, std::string("expected a string, found ") + DescribeKind(n),
        std::string("'") + std::string(what) + "' takes a string");
  return std::nullopt;
}

// A one-line string (descriptions).
std::optional<std::string> SpecReader::OneLine(const RawNode& n, std::string_view what) {
  auto s = String(n, what);
  if (!s) return s;
  while (!s->empty() && s->back() == '\n') s->pop_back();
  if (s->find('\n') != std::string::npos) {
    Error(n, "'" + std::string(what) + "' must be one line", "write a single line of text");
    return std::nullopt;
  }
  return s;
}

std::optional<std::string> SpecReader::Identifier(const RawNode& n, std::string_view what,
                                                  bool as_python) {
  auto s = String(n, what);
  if (s && !IsIdentifier(*s)) {
    Error(n, "'" + *s + "' is not a Python identifier",
          std::string("'") + std::string(what) + "' takes a name like `rms_norm_slot`");
    return std::nullopt;
  }
  if (s && as_python) NormalizeIdentifier(*s);
  return s;
}

std::optional<std::string> SpecReader::Dotted(const RawNode& n, std::string_view what,
                                              std::string_view example) {
  auto s = String(n, what);
  if (s && !IsDotted(*s)) {
    Error(n, "'" + *s + "' is not a dotted Python name",
          std::string("'") + std::string(what) + "' takes a name like `" + std::string(example) +
              "`");
    return std::nullopt;
  }
  if (s) NormalizeIdentifier(*s);
  return s;
}

// An op or variant name (docs/ops.md): letters, digits and `_`, as it is written into the
// generated `OpSlot("op", "variant")` string literal.
std::optional<std::string> SpecReader::OpName(const RawNode& n, std::string_view what,
                                              std::string_view example) {
  auto s = String(n, what);
  if (!s) return s;
  bool ok = !s->empty();
  for (char c : *s) {
    ok = ok &&
         (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'));
  }
  if (!ok) {
    Error(n, "'" + *s + "' is not a valid " + std::string(what) + " name",
          "`" + std::string(what) + "` takes a name of letters, digits and `_`, like `" +
              std::string(example) + "` (docs/ops.md)");
    return std::nullopt;
  }
  return s;
}

const std::vector<RawNode>* SpecReader::Sequence(const RawNode& n, std::string_view what) {
  if (n.kind == Kind::kSequence) return &n.items;
  Error(n, std::string("expected a sequence, found ") + DescribeKind(n),
        std::string("'") + std::string(what) + "' takes a list (`- item` lines or `[a, b]`)");
  return nullptr;
}

bool SpecReader::Mapping(const RawNode& n, std::string_view what) {
  if (n.kind == Kind::kMapping) return true;
  Error(n, std::string("expected a mapping, found ") + DescribeKind(n),
        std::string("'") + std::string(what) + "' takes a mapping (`key: value` lines)");
  return false;
}

// Code text with its origin: literal blocks start on the line after the `|`, at the block's
// indentation; one-line scalars start at the value (after the quote).
std::optional<std::pair<std::string, TextOrigin>> SpecReader::Code(const RawNode& n,
                                                                   std::string_view what) {
  auto s = String(n, what);
  if (!s) return std::nullopt;
  if (n.style == RawNode::Style::kFolded) {
    Error(n, "'" + std::string(what) + "' must not be a folded block (`>`)",
          "use a literal block (`|`) so that line breaks are kept");
    return std::nullopt;
  }
  if (s->find_first_not_of(" \t\n") == std::string::npos) {
    Error(n, "'" + std::string(what) + "' is empty");
    return std::nullopt;
  }
  TextOrigin origin;
  origin.path = path_;
  origin.file_text = text_;
  uint32_t line0 = lines_.LineOf(n.range.start);
  if (n.style == RawNode::Style::kLiteral) {
    origin.first_line = line0 + 2;
    // The block's indentation: the first non-blank line's, less the spaces the text keeps in
    // front of it (more than none only with an indentation indicator such as `|4`).
    size_t kept = 0;
    for (std::string_view l : SplitLines(*s)) {
      size_t k = l.find_first_not_of(' ');
      if (k == std::string_view::npos) continue;
      kept = k;
      break;
    }
    for (uint32_t l = line0 + 1; l < lines_.line_count(); ++l) {
      std::string_view t = lines_.LineText(l);
      size_t indent = t.find_first_not_of(' ');
      if (indent == std::string_view::npos) continue;
      origin.col_offset = static_cast<uint32_t>(indent >= kept ? indent - kept : 0);
      break;
    }
  } else {
    if (n.style == RawNode::Style::kPlain) {
      std::string_view rest = std::string_view(*text_).substr(n.range.start);
      if (rest.substr(0, s->size()) != *s) {
        Error(n, "'" + std::string(what) + "' spans several lines but is not a literal block",
              "write it as a literal block: `" + std::string(what) + ": |` and the code below");
        return std::nullopt;
      }
    }
    origin.first_line = line0 + 1;
    origin.col_offset =
        lines_.At(n.range.start).col - 1 + (n.style == RawNode::Style::kQuoted ? 1 : 0);
  }
  return std::make_pair(std::move(*s), std::move(origin));
}

std::vector<NameMapEntry> SpecReader::NameMap(const RawNode& n) {
  std::vector<NameMapEntry> out;
  if (!Mapping(n, "name_map")) return out;
  std::map<std::string, const RawNode*> seen;
  for (const auto& [key, value] : n.entries) {
    // `Family*: NewFamily*` is a prefix rule; both sides then end in `*`.
    bool prefix = key.kind == Kind::kScalar && key.scalar.size() > 1 && key.scalar.back() == '*';
    std::optional<std::string> from, to;
    if (prefix) {
      if (IsIdentifier(std::string_view(key.scalar).substr(0, key.scalar.size() - 1))) {
        from = IdentifierKey(std::string_view(key.scalar).substr(0, key.scalar.size() - 1));
      } else {
        Error(key, "'" + key.scalar + "' is not a Python identifier followed by '*'",
              "a prefix rule looks like `Qwen3_5*: Qwen3_5Moe*`");
      }
      auto v = String(value, "name_map");
      if (v && v->size() > 1 && v->back() == '*' &&
          IsIdentifier(std::string_view(*v).substr(0, v->size() - 1))) {
        to = IdentifierKey(std::string_view(*v).substr(0, v->size() - 1));
      } else if (v) {
        Error(value,
              "'" + key.scalar + "' is a prefix rule, so its value must be a prefix too, like `" +
                  (from ? *from : std::string("Qwen3_5")) + "Moe*`",
              "`A*: B*` renames every identifier that starts with A to start with B");
      }
    } else {
      from = Identifier(key, "name_map");
      to = Identifier(value, "name_map");
    }
    if (!from || !to) continue;
    NameMapEntry e{*from, *to, Loc(key)};
    e.prefix = prefix;
    // Two keys that are one name for Python (`ﬁnd`, `find`) are one key.
    auto [it, inserted] = seen.emplace(e.Key(), &key);
    if (!inserted) {
      ErrorWithNote(key, "duplicate key '" + key.scalar + "'", Loc(*it->second),
                    "first given here");
      continue;
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<LocatedName> SpecReader::Names(const RawNode& n, std::string_view what, bool dotted) {
  std::vector<LocatedName> out;
  const auto* items = Sequence(n, what);
  if (!items) return out;
  std::map<std::string, const RawNode*> seen;
  for (const RawNode& item : *items) {
    auto name = dotted ? Dotted(item, what, "Qwen3MLP") : Identifier(item, what);
    if (!name) continue;
    auto [it, inserted] = seen.emplace(*name, &item);
    if (!inserted) {
      ErrorWithNote(item, "'" + *name + "' is listed twice in '" + std::string(what) + "'",
                    Loc(*it->second), "first listed here");
      continue;
    }
    out.push_back(LocatedName{*name, Loc(item)});
  }
  return out;
}

std::vector<Block> SpecReader::Blocks(const RawNode& n, std::string_view what) {
  std::vector<Block> out;
  const auto* items = Sequence(n, what);
  if (!items) return out;
  for (const RawNode& item : *items) {
    auto code = Code(item, what);
    if (!code) continue;
    out.push_back(Block{std::move(code->first), std::move(code->second), Loc(item)});
  }
  return out;
}

const RawNode* SpecReader::ValueOf(const KeyMap& keys, const char* k) {
  auto it = keys.find(k);
  return it == keys.end() ? nullptr : it->second.second;
}

const RawNode* SpecReader::KeyNodeOf(const KeyMap& keys, const char* k) {
  auto it = keys.find(k);
  return it == keys.end() ? nullptr : it->second.first;
}

// A body from `code`, `file`+`symbol` or `from` (the latter only when `allow_from`).
Body SpecReader::BodyOf(const RawNode& entry, const KeyMap& keys, bool allow_from,
                        const std::string& kind_for_from) {
  const RawNode* code = ValueOf(keys, "code");
  const RawNode* file = ValueOf(keys, "file");
  const RawNode* symbol = ValueOf(keys, "symbol");
  const RawNode* from = ValueOf(keys, "from");
  bool from_refused = from && !allow_from;
  if (from_refused) {
    Error(*KeyNodeOf(keys, "from"), "'from' is not allowed on " + kind_for_from,
          "'from' (an external import) replaces a class or a function; give `code` or "
          "`file` + `symbol`");
    from = nullptr;
  }
  if (!OneBodySource(keys, code, file, from, allow_from)) return {};
  if (symbol && !file) {
    Error(*KeyNodeOf(keys, "symbol"), "'symbol' needs 'file'",
          "add `file:` naming the patch file that defines it");
  }
  if (code) return CodeBody(*code);
  if (file) return FileBody(*file, *KeyNodeOf(keys, "file"), symbol);
  if (from) return FromBody(*from);
  if (!from_refused) {
    Error(entry.entries.front().first,
          "no body: give `code`, `file` + `symbol`" + std::string(allow_from ? " or `from`" : ""));
  }
  return {};
}

// At most one of `code`, `file`, `from` (a refused `from` is passed as nullptr).
bool SpecReader::OneBodySource(const KeyMap& keys, const RawNode* code, const RawNode* file,
                               const RawNode* from, bool allow_from) {
  std::vector<std::pair<const char*, const RawNode*>> sources;
  if (code) sources.emplace_back("code", KeyNodeOf(keys, "code"));
  if (file) sources.emplace_back("file", KeyNodeOf(keys, "file"));
  if (from) sources.emplace_back("from", KeyNodeOf(keys, "from"));
  if (sources.size() <= 1) return true;
  Error(
      *sources[1].second,
      std::string("more than one body: '") + sources[0].first + "' and '" + sources[1].first + "'",
      "give exactly one of `code`, `file` + `symbol`" + std::string(allow_from ? ", `from`" : ""));
  return false;
}

Body SpecReader::CodeBody(const RawNode& code) {
  Body body;
  auto c = Code(code, "code");
  if (!c) return body;
  body.source = Body::Source::kCode;
  body.text = std::move(c->first);
  body.origin = std::move(c->second);
  body.loc = Loc(code);
  return body;
}

// `file` + `symbol`: the patch file, read now (relative to the spec's folder).
Body SpecReader::FileBody(const RawNode& file, const RawNode& file_key, const RawNode* symbol) {
  Body body;
  auto rel = String(file, "file");
  if (!symbol) {
    Error(file_key, "'file' needs 'symbol'", "add `symbol:` naming the def or class in the file");
  }
  auto sym = symbol ? Identifier(*symbol, "symbol") : std::nullopt;
  if (!rel) return body;
  std::string printed = JoinRelative(path_, *rel);
  std::string err;
  std::optional<std::string> content = ReadFile(printed, &err, kMaxSpecFileBytes);
  if (!content) {
    Error(file, "cannot read patch file '" + printed + "': " + err,
          "'file' is relative to the spec's folder");
    return body;
  }
  if (size_t bad = FirstInvalidUtf8(*content); bad != std::string_view::npos) {
    size_t line =
        1 + static_cast<size_t>(std::count(content->begin(), content->begin() + bad, '\n'));
    Error(file,
          "patch file '" + printed + "' is not valid UTF-8 (line " + std::to_string(line) + ")",
          "its code is written into the generated module: save the file as UTF-8");
    return body;
  }
  if (!sym) return body;
  body.source = Body::Source::kFile;
  body.text = *content;
  body.origin = TextOrigin{printed, std::make_shared<const std::string>(std::move(*content)), 1, 0};
  body.file = *rel;
  body.symbol = *sym;
  body.symbol_loc = Loc(*symbol);
  body.loc = Loc(file);
  return body;
}

// `from: package.module.Name`: an import instead of code.
Body SpecReader::FromBody(const RawNode& from) {
  Body body;
  auto dotted = Dotted(from, "from", "liger_kernel.transformers.swiglu.LigerSwiGLUMLP");
  if (!dotted) return body;
  if (CountDots(*dotted) == 0) {
    Error(from, "'from' needs a module and a name, like `package.module.Name`");
    return body;
  }
  size_t dot = dotted->rfind('.');
  body.source = Body::Source::kFrom;
  body.from_module = dotted->substr(0, dot);
  body.from_name = dotted->substr(dot + 1);
  body.loc = Loc(from);
  return body;
}
}  // namespace patchgen::spec
