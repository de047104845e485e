"""LRU stated plainly on one ``OrderedDict``: the oracle :class:`~kv_offload_lru.LRUCachePolicy`
is tested against, and a baseline for benchmarks.

Same contract and same decisions as the shipped policy, one rule per line, no speed tricks.
It is not an entry point; register it to run it through a manager::

    CachePolicyFactory.register_cache_policy(
        "lru-reference", "kv_offload_lru.reference", "ReferenceLRUCachePolicy"
    )
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kv_offload import BlockStatus, CachePolicy, OffloadKey, ReqContext

__all__ = ["ReferenceLRUCachePolicy"]


class ReferenceLRUCachePolicy(CachePolicy):
    """``blocks`` holds every resident block, least recently used first."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.blocks: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.blocks[key] = block

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(list(keys)):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        self.blocks.pop(key, None)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        idle = [(key, b) for key, b in self.blocks.items() if b.ref_cnt == 0]
        victims = [(key, b) for key, b in idle if key not in protected][:n]
        if len(victims) < n:
            return None
        for key, _ in victims:
            del self.blocks[key]
        return victims

    def clear(self) -> None:
        self.blocks.clear()
