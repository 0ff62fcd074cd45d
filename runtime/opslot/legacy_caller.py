"""The one frame lookup left in opslot: which module is constructing a model, for the calls of
generated files that do not say it.

`OpSlot(op, variant).bind_from(config)` and `ConfigSlot(...).bind_from(config)`, as patchgen writes
them in a generated `__init__`, refuse a config whose `ops_implementation` the module-level slots of
the module being constructed do not follow (opslot.saved_choice). The call does not say which
module that is, so `bind_from` reads it here, from its caller's frame. With `owner=self`
(`bind_from(config, owner=self)`) it is said explicitly, by the class of the object being
constructed, and nothing comes here. This module goes once patchgen writes `owner=self` in the
lines it generates (src/rewriter/guards.cc, src/rewriter/stage_config_slot.cc) and the generated
files are regenerated.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional


def caller_namespace() -> Optional[Dict[str, Any]]:
    """The module globals of the function that called the caller of this function (for
    `bind_from`: the generated `__init__` calling it), or None when the stack is not that deep."""
    try:
        return sys._getframe(2).f_globals
    except ValueError:
        return None
