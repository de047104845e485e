"""Least-recently-used eviction for kv-offload (entry point ``kv_offload.policies: lru``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import repeat
from operator import attrgetter, itemgetter

from kv_offload import BlockStatus, CachePolicy, OffloadKey, ReqContext

__all__ = ["LRUCachePolicy"]

_key = itemgetter(0)
_block = itemgetter(1)
_ref_cnt = attrgetter("ref_cnt")


class LRUCachePolicy(CachePolicy):
    """Evicts the least recently stored or touched idle block.

    One ``OrderedDict`` holds every resident block, oldest first: ``touch`` moves a key to the
    end in C, ``evict`` walks from the front. ``get`` is the dict's own bound ``get`` so the
    manager's per-key lookups never enter a Python frame.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.get = self._blocks.get  # type: ignore[method-assign,assignment]

    def get(self, key: OffloadKey) -> BlockStatus | None:  # replaced per instance in __init__
        return self._blocks.get(key)

    def __len__(self) -> int:
        return len(self._blocks)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._blocks[key] = block

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        self._blocks.update(zip(keys, blocks))

    def remove(self, key: OffloadKey) -> None:
        self._blocks.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        blocks = self._blocks
        move_to_end = blocks.move_to_end
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(list(keys)):
            if key in blocks:
                move_to_end(key)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []
        blocks = self._blocks
        if n > len(blocks):
            return None
        # Fast path, the common case: the n oldest blocks are all idle and unprotected.
        # Popping and checking them with C-level maps avoids a Python step per block.
        oldest = list(map(blocks.popitem, repeat(False, n)))
        if not any(map(_ref_cnt, map(_block, oldest))) and protected.isdisjoint(map(_key, oldest)):
            return oldest
        self._restore_front(oldest)
        return self._evict_scanning(n, protected)

    def _evict_scanning(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """Oldest first, skipping busy or protected blocks; all or nothing."""
        victims = []
        for key, block in self._blocks.items():
            if block.ref_cnt == 0 and key not in protected:
                victims.append((key, block))
                if len(victims) == n:
                    break
        else:
            return None
        blocks = self._blocks
        for key, _ in victims:
            del blocks[key]
        return victims

    def _restore_front(self, items: list[tuple[OffloadKey, BlockStatus]]) -> None:
        blocks = self._blocks
        move_to_end = blocks.move_to_end
        for key, block in reversed(items):
            blocks[key] = block
            move_to_end(key, last=False)

    def clear(self) -> None:
        self._blocks.clear()
