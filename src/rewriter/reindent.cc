#include "rewriter/reindent.h"
