// The index of a PyModule (imports, top-level statements, definitions), built by one walk over its
// tree (py_indexer.cc) on the tree queries of tree_queries.h. Internal to src/parser:
// PyModule::Parse calls IndexModule.
#pragma once

#include "parser/py_module.h"

namespace patchgen::parser {

/// Fills `m`'s index from its parsed tree (which has no ERROR or MISSING node).
void IndexModule(PyModule& m);

}  // namespace patchgen::parser
