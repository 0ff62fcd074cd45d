#include "rewriter/guards.h"
