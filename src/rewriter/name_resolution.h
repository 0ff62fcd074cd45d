// Name resolution for the generated module: the check ruff's F821 ("undefined name") gave the
// Python tool, restricted to code patchgen inserted.
//
// A name read inside inserted code resolves when it is bound
//   - at module level: def/class, assignment, annotated assignment, import, for/with/except
//     targets, walrus, also under top-level if/try/with/for/while, or declared `global` anywhere;
//   - in an enclosing function or lambda: parameters and every name bound in its body
//     (assignments, for/with/except targets, walrus, imports, nested def/class names,
//     `global`/`nonlocal` declarations), wherever in the body the binding is (Python's rule);
//   - in an enclosing comprehension (its `for` targets);
//   - in the class body it is used in directly (not from methods: Python's class scope rule);
//   - as a Python 3.11 builtin or module attribute (`__name__`, `__file__`, ...).
// Attribute names after `.`, keyword-argument names, and import module paths are not uses.
// Names are compared as Python compares them: NFKC when not ASCII (PEP 3131), so inserted code
// reading `ｆｏｏ` finds upstream's `foo`.
// A module-level `from x import *` makes every name resolve (nothing can be checked then).
// Not modelled: `match` capture patterns (treated as uses), `del`, names bound only by `exec`.
#pragma once

#include <tree_sitter/api.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/byte_range.h"

namespace patchgen::rewriter {

struct NameUse {
  std::string name;     ///< As Python compares it: NFKC when not ASCII (`ﬁnd` is `find`).
  uint32_t offset = 0;  ///< Byte offset of the identifier in the source.
  uint32_t end = 0;     ///< Byte offset just after it (the text as written is [offset, end)).
};

/// Identifiers read inside any of `ranges` that resolve to no binding (see the prelude).
std::vector<NameUse> FindUnresolvedNames(TSNode root, std::string_view source,
                                         const std::vector<ByteRange>& ranges);

/// True when `name` is a Python 3.11 builtin or an implicit module attribute.
bool IsBuiltinName(std::string_view name);

}  // namespace patchgen::rewriter
