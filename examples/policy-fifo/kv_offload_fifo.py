"""First-in, first-out eviction: a kv-offload policy plugin in one module."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy

__all__ = ["FIFOCachePolicy"]


class FIFOCachePolicy(CachePolicy):
    """Evicts the idle block that was stored first; reusing a block does not refresh it."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}  # insertion order is age order

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._blocks[key] = block

    def remove(self, key: OffloadKey) -> None:
        self._blocks.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        pass  # FIFO ignores reuse

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        # Oldest first, skipping pinned (ref_cnt != 0) and protected blocks; all or nothing.
        idle = (
            (key, block)
            for key, block in self._blocks.items()
            if block.ref_cnt == 0 and key not in protected
        )
        victims = list(islice(idle, n))
        if len(victims) < n:
            return None
        for key, _ in victims:
            del self._blocks[key]
        return victims

    def clear(self) -> None:
        self._blocks.clear()
