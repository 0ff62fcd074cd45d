#include "rewriter/generate.h"
// Stub: implemented by the rewriter work.
