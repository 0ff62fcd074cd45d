"""The names of private module copies (copies.py): `<module>__opslot__<impl>-<impl>-...` for the
copies build_model makes (named after the binding of their module-level slots, in slot-name order),
`<module>__opslot_copyN` for `load_private_copy`'s. Made, parsed, and traced back to the original
module here; strings only, nothing is imported."""

from __future__ import annotations

import re
from typing import Dict, List, Optional

COPY_MARK = "__opslot__"
_IMPL_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def original_name(name: str) -> str:
    """The module a copy was made from (the name itself for other modules)."""
    base = name.split(COPY_MARK)[0]
    return re.sub(r"__opslot_copy\d+$", "", base)


def is_copy(name: str) -> bool:
    """Whether `name` is the name of a private copy (build_model's or load_private_copy's)."""
    return COPY_MARK in name or re.search(r"__opslot_copy\d+$", name) is not None


def named_binding(name: str) -> Optional[List[str]]:
    """The impls a copy's name says its module-level slots run (in slot-name order), or None when
    `name` is not the name of a copy made by build_model."""
    base, mark, tail = name.rpartition(COPY_MARK)
    if not mark or not base or not tail or "__" in tail:
        return None
    return tail.split("-")


def copy_name(module_name: str, impls: Dict[str, str]) -> Optional[str]:
    """The name of the copy of the module `module_name` whose module-level slots run `impls` ({slot name: impl}),
    None when an impl name cannot be spelt in it (then the copy gets a numbered, unpicklable name)."""
    values = [impls[name] for name in sorted(impls)]
    if not values or not all(_IMPL_NAME.match(v) and "__" not in v for v in values):
        return None
    return f"{original_name(module_name)}{COPY_MARK}{'-'.join(values)}"
