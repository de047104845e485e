"""``module_path`` of bridged secondary tiers: type ``kvo_<name>`` is kv-offload's ``<name>``.

vLLM resolves an out-of-tree tier as ``getattr(import_module(module_path), type)``; this module
answers every ``kvo_``-prefixed attribute with the adapter class of the kv-offload tier behind
the prefix (see :mod:`kv_offload_vllm.tier_adapter`).
"""

from __future__ import annotations

from typing import Any

from ._common import PREFIX, split_name
from .tier_adapter import tier_adapter

__all__: list[str] = []


def __getattr__(attribute: str) -> Any:
    name = split_name(attribute)
    if name is None:
        raise AttributeError(
            f"module {__name__!r} has no attribute {attribute!r}; bridged tiers are named "
            f"{PREFIX}<kv-offload tier name>, e.g. {PREFIX}example"
        )
    return tier_adapter(name)
