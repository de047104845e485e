"""Least-recently-used eviction for kv-offload (entry point ``kv_offload.policies: lru``).

The recency order is a queue of keys with lazy deletion, not an ``OrderedDict``. Once eviction
churn has resized it, an ``OrderedDict`` costs 120 to 195 bytes per block (a linked node per
key and a node table as large as the hash table); a plain dict and a queue of key references
cost 75 to 130, which is what keeps a CPU tier of millions of blocks cheap to track.

Touching a block appends its key again instead of moving it: the key's older entry becomes
stale and is dropped when it reaches the front. ``_stale`` counts the stale entries of each key
that has any, so a key's live entry is its last one. Inserts and evictions, the bulk of the
work, never create stale entries and run as whole-batch C calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat, starmap
from operator import attrgetter

from kv_offload import BlockStatus, CachePolicy, OffloadKey, ReqContext

__all__ = ["LRUCachePolicy"]

_ref_cnt = attrgetter("ref_cnt")
_NO_ARGS = ()
# Drains an iterator at C speed, for maps run only for their side effects.
_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend
#: The queue is rebuilt when its stale entries pass an eighth of the resident blocks plus this
#: slack: often enough to keep ``_stale`` small, rarely enough to cost O(1) per touch.
_COMPACT_SLACK = 256

_Victims = list[tuple[OffloadKey, BlockStatus]]


class LRUCachePolicy(CachePolicy):
    """Evicts the least recently stored or touched idle block.

    * ``_blocks``: key -> status of every resident block; ``fast_get`` is its bound C ``get``, so
      the manager's per-key lookups never enter a Python frame.
    * ``_order``: keys, oldest first, one entry per insert or touch.
    * ``_stale[key]``: how many of the key's entries are stale (absent means none); every
      entry of a key that is no longer resident is stale.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._order: deque[OffloadKey] = deque()
        self._stale: dict[OffloadKey, int] = {}

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._blocks.get  # never rebound: cleared and mutated in place

    def __len__(self) -> int:
        return len(self._blocks)

    # -- insertion and recency --------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.remove(key)
        self._blocks[key] = block
        self._order.append(key)

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Add absent keys (the manager's guarantee) as the most recent, in order."""
        self._blocks.update(zip(keys, blocks))
        self._order.extend(keys)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        resident = self._blocks
        stale = self._stale
        order = self._order
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(list(keys)):
            if key in resident:
                stale[key] = stale.get(key, 0) + 1
                order.append(key)
        if len(order) - len(resident) > (len(resident) >> 3) + _COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Rebuild the queue from the live entries only, in the same order, in C."""
        resident = self._blocks
        newest_first = dict.fromkeys(reversed(self._order))  # each key at its last entry
        self._order = deque(filter(resident.__contains__, reversed(newest_first)))
        self._stale.clear()

    # -- removal ----------------------------------------------------------------------------

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is not None:
            stale = self._stale
            stale[key] = stale.get(key, 0) + 1  # its live entry goes stale too

    def evict(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        if n <= 0:
            return []
        resident = self._blocks
        if n > len(resident):
            return None
        order = self._order
        # Fast path, the common case: the n oldest entries are live, idle and unprotected.
        # Whole-batch C calls check and take them without a Python step per block.
        front = list(starmap(order.popleft, repeat(_NO_ARGS, n)))
        if self._stale and not self._stale.keys().isdisjoint(front):
            front = self._drop_stale(front, n)
        blocks = list(map(resident.__getitem__, front))
        if not any(map(_ref_cnt, blocks)) and protected.isdisjoint(front):
            _consume(map(resident.pop, front))
            return list(zip(front, blocks))
        order.extendleft(reversed(front))
        return self._evict_scanning(n, protected)

    def _drop_stale(self, popped: list[OffloadKey], n: int) -> list[OffloadKey]:
        """The ``n`` oldest live entries, from ``popped`` and as many more as it takes; the
        stale entries met on the way are dropped for good."""
        order = self._order
        stale = self._stale
        live: list[OffloadKey] = []
        while True:
            for key in popped:
                count = stale.get(key)
                if count is None:
                    live.append(key)
                elif count == 1:
                    del stale[key]
                else:
                    stale[key] = count - 1
            missing = n - len(live)
            if not missing:
                return live
            popped = list(starmap(order.popleft, repeat(_NO_ARGS, min(missing, len(order)))))
            if not popped:  # pragma: no cover - every resident key has a live entry
                raise RuntimeError("LRU queue lost track of a resident block")

    def _evict_scanning(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        """Oldest first, dropping stale entries and skipping busy or protected blocks; all or
        nothing. The skipped blocks keep their place at the front."""
        order = self._order
        stale = self._stale
        resident = self._blocks
        live: list[OffloadKey] = []  # live entries popped, in order: restored on failure
        skipped: list[OffloadKey] = []  # busy or protected: they go back to the front
        victims: _Victims = []
        while order:
            key = order.popleft()
            count = stale.get(key)
            if count:  # a stale entry: dropped for good
                if count == 1:
                    del stale[key]
                else:
                    stale[key] = count - 1
                continue
            live.append(key)
            block = resident[key]
            if block.ref_cnt == 0 and key not in protected:
                victims.append((key, block))
                if len(victims) == n:
                    break
            else:
                skipped.append(key)
        else:
            order.extendleft(reversed(live))
            return None
        order.extendleft(reversed(skipped))
        for key, _ in victims:
            del resident[key]
        return victims

    def clear(self) -> None:
        self._blocks.clear()
        self._order.clear()
        self._stale.clear()
