"""The LRU policy on a dict of resident blocks and a lazy-deletion key queue.

Touching a block re-queues its key instead of moving it: the key's older entry becomes a
tombstone, dropped when it reaches the front (or when the queue is rebuilt). Inserts and the
common eviction, the bulk of the work, never create tombstones and run as whole-batch C calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy, KeyQueue, split_pairs

__all__ = ["LRUCachePolicy"]

_Victims = list[tuple[OffloadKey, BlockStatus]]
_Split = tuple[list[OffloadKey], list[BlockStatus]]


class LRUCachePolicy(CachePolicy):
    """Evicts the least recently stored or touched idle block.

    * ``_blocks``: key -> status of every resident block; ``get`` is its bound C ``get``, so
      the manager's per-key lookups never enter a Python frame;
    * ``_queue``: resident keys, least recent first (plus tombstones).

    As the manager guarantees, inserted keys are distinct and not resident.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._queue: KeyQueue[OffloadKey] = KeyQueue(self._blocks)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._blocks.get  # never rebound: cleared and mutated in place

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def order(self) -> list[OffloadKey]:
        """Resident keys, least recent first (a snapshot)."""
        return list(self._queue)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Add absent, distinct keys as the most recent, in order."""
        self._blocks.update(zip(keys, blocks))
        self._queue.extend(keys)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        self._queue.requeue(reversed(keys if type(keys) is list else list(keys)))

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is not None:
            self._queue.forget(key)

    def evict(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        answer = self.evict_split(n, protected)
        return None if answer is None else list(zip(*answer))

    def evict_split(self, n: int, protected: set[OffloadKey]) -> _Split | None:
        """The ``n`` least recent idle, unprotected blocks, or ``None``: peek, check, commit."""
        if n <= 0:
            return [], []
        resident = self._blocks
        if n > len(resident):
            return None
        queue = self._queue
        # The common case: the n oldest are idle and unprotected; checked with C-level maps.
        front = queue.peek_front(n)
        blocks = list(map(resident.__getitem__, front))
        if not BlockStatus.any_in_use(blocks) and protected.isdisjoint(front):
            queue.drop_front(n)
            for key in front:
                del resident[key]
            return front, blocks
        return self._evict_scanning(n, protected)

    def _evict_scanning(self, n: int, protected: set[OffloadKey]) -> _Split | None:
        """Oldest first, stepping over busy or protected blocks, which keep their place."""
        resident = self._blocks
        idle = (
            (key, block)
            for key in self._queue
            if (block := resident[key]).ref_cnt == 0 and key not in protected
        )
        victims = list(islice(idle, n))
        if len(victims) < n:
            return None
        # The generator is abandoned here, before anything it iterates over changes.
        keys, blocks = split_pairs(victims)
        for key in keys:
            del resident[key]
        self._queue.forget_many(keys)  # after they left _blocks, which says who is live
        return keys, blocks

    def clear(self) -> None:
        self._blocks.clear()
        self._queue.clear()
