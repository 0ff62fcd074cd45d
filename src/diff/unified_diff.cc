#include "diff/unified_diff.h"
// Stub: implemented by the diff work.
