"""``cache_policy_module_path`` of bridged policies: ``kvo_<name>`` is kv-offload's ``<name>``.

vLLM resolves an out-of-tree policy as ``getattr(import_module(module_path), eviction_policy)``;
this module answers every ``kvo_``-prefixed attribute with the adapter class of the kv-offload
policy behind the prefix (see :mod:`kv_offload_vllm.policy_adapter`).
"""

from __future__ import annotations

from typing import Any

from ._common import PREFIX, split_name
from .policy_adapter import policy_adapter

__all__: list[str] = []


def __getattr__(attribute: str) -> Any:
    name = split_name(attribute)
    if name is None:
        raise AttributeError(
            f"module {__name__!r} has no attribute {attribute!r}; bridged policies are named "
            f"{PREFIX}<kv-offload policy name>, e.g. {PREFIX}lru"
        )
    return policy_adapter(name)
