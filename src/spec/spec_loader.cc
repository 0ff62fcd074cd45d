#include "spec/spec_loader.h"
// Stub: implemented by the spec work.
