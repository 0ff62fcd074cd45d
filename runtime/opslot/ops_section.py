"""Finding the ops section in what a user wrote: a training config (`model.ops_implementation`), an
`ops_implementation:` section, or a bare mapping of fields. An ops section or ops field anywhere
else (`train.ops_implementation`, `model.ops_implmentation`, an ops field under `model:`) is an
error naming each place, never ignored."""

from __future__ import annotations

import difflib
from typing import Any, Iterable, List, Mapping, Optional, Set

from .config_attributes import config_attribute_note
from .ops import CONFIG_FIELDS
from .suggestions import did_you_mean

#: The key of the ops section (under `model:` in a training config).
SECTION = "ops_implementation"


def is_section_key(key: Any) -> bool:
    """`ops_implementation`, or a close misspelling of it (`ops_implmentation`, `Ops_Implementations`;
    not another `*_implementation` key such as `attn_implementation`)."""
    if not isinstance(key, str) or not key.lower().startswith("op"):
        return False
    return bool(difflib.get_close_matches(key.lower(), [SECTION], n=1, cutoff=0.8))


def _looks_like_ops_key(key: str) -> bool:
    return key in CONFIG_FIELDS or key.endswith("_implementation")


def _misplaced_fields(mapping: Mapping[str, Any], where: str, allowed: Iterable[str]) -> List[str]:
    """Keys of one level of a training config that look like ops fields (outside the ops section)."""
    allowed = set(allowed)
    problems = []
    for key in mapping:
        if not isinstance(key, str) or key in allowed or is_section_key(key) or not _looks_like_ops_key(key):
            continue
        path = f"{where}.{key}" if where else key
        note = config_attribute_note(key)
        if key in CONFIG_FIELDS:
            problems.append(f"{path!r}: ops fields go under 'model.{SECTION}' (model.{SECTION}.{key})")
        elif note:
            problems.append(f"{path!r}: {note}")
        else:
            problems.append(
                f"{path!r}: not an ops field{did_you_mean(key, CONFIG_FIELDS)}; ops fields go under 'model.{SECTION}'"
            )
    return problems


def _misplaced_sections(value: Any, path: str, allowed: str, seen: Set[int]) -> List[str]:
    """Paths in `value` (mappings and lists, walked whole) of every ops section (the key
    `ops_implementation` or a close misspelling) other than the one at `allowed`."""
    if isinstance(value, Mapping):
        items = [(f"{path}.{k}" if path else str(k), k, v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}[{i}]", None, v) for i, v in enumerate(value)]
    else:
        return []
    if id(value) in seen:  # YAML aliases may share (or nest) a node
        return []
    seen.add(id(value))
    found = []
    for sub, key, child in items:
        if sub == allowed:
            continue
        if is_section_key(key):
            found.append(sub)
        found += _misplaced_sections(child, sub, allowed, seen)
    return found


def _check_placement(data: Mapping[str, Any], model: Optional[Mapping[str, Any]], allowed: str) -> None:
    """Refuse ops settings anywhere in a training config but its section at `allowed`: an ops
    section at any depth (`train.ops_implementation`, `model.model.ops_implementation`, ...), ops
    fields directly at the top or under `model:`. One ValueError lists every place found."""
    problems = [
        f"{path!r}: the ops section is 'model.{SECTION}'" for path in _misplaced_sections(data, "", allowed, set())
    ]
    problems += _misplaced_fields(data, "", allowed={"model", SECTION})
    if model is not None:
        problems += _misplaced_fields(model, "model", allowed={SECTION})
    if problems:
        raise ValueError("misplaced ops settings in the training config: " + "; ".join(problems))


def _section(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{path} must be a mapping of <op>_implementation fields, got {type(value).__name__}")
    return value


def ops_section(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ops mapping inside `data`: a training config (`model:` present; its section is
    `model.ops_implementation`), an `ops_implementation:` section, or `data` itself (a bare mapping
    of fields). An ops section anywhere else in `data`, at any depth, is an error (`_check_placement`)."""
    if "model" in data:
        model = data["model"]
        if model is None:
            model = {}
        if not isinstance(model, Mapping):
            raise TypeError(
                f"'model' (the model section of a training config) must be a mapping, got {type(model).__name__}"
            )
        _check_placement(data, model, allowed=f"model.{SECTION}")
        return _section(model.get(SECTION), f"model.{SECTION}")
    if SECTION in data:
        _check_placement(data, None, allowed=SECTION)
        return _section(data[SECTION], SECTION)
    nested = [path for path in _misplaced_sections(data, "", "", set()) if path not in data]
    if nested:  # e.g. a training config without `model:` whose section sits under `train:`
        raise ValueError(
            "misplaced ops settings in the training config: "
            + "; ".join(f"{path!r}: the ops section is 'model.{SECTION}'" for path in nested)
        )
    return data  # its own keys are checked as fields (unknown ones: did-you-mean)
