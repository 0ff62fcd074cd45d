#include "parser/py_module.h"
// Stub: implemented by the parser work.
