"""Model-config attributes that config slots read (`ConfigSlot`, docs/runtime.md "Config slots"), so
that the ops config can tell a user who wrote one in the ops section where it belongs."""

from __future__ import annotations

from typing import Any, Dict, Optional, Set

#: Model-config attributes read by config slots: {attribute: names of the slots that read it}. Seeded
#: with the real-model specs' config slot (the MoE specs' `router_implementation`, so that it is known
#: before any generated module is imported); every ConfigSlot created adds its own.
CONFIG_ATTRIBUTES: Dict[str, Set[str]] = {"router_implementation": set()}


def config_attribute_note(key: Any) -> Optional[str]:
    """What to say of `key` when it is a model-config attribute that a config slot reads (e.g. the
    MoE specs' `router_implementation`): where it goes instead of the ops section. None otherwise."""
    if key not in CONFIG_ATTRIBUTES:
        return None
    return (
        f"{key} is a model-config attribute, not an ops field (a config slot of the generated model reads "
        f"config.{key}); set it on the model config (config.{key} = ..., or in its config.json)"
    )
