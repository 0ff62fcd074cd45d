#include "rewriter/edit_plan.h"
