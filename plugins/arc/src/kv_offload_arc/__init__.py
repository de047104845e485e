"""Adaptive Replacement Cache eviction for kv-offload (entry point ``kv_offload.policies: arc``).

ARC (Megiddo & Modha, FAST'03) splits the cache between blocks seen once recently (T1) and
blocks seen at least twice (T2), and remembers the keys it recently evicted from each (the
ghost lists B1 and B2). A miss on a ghost key means that side of the cache was too small, so
the target size ``p`` of T1 moves towards it. One-time keys only ever cycle through T1, which is
what keeps a long scan from flushing the frequently used blocks in T2.

Adapting ARC to the manager's contract changes when things happen, not what happens:

* the manager evicts *before* it inserts the keys that caused the misses, so ``evict`` applies
  ARC's REPLACE rule with the current ``p`` and ``insert``/``insert_many`` do the adaptation of
  ``p`` and the promotion of ghost keys to T2;
* REPLACE skips blocks that are pinned, pending or protected, taking the next block of the same
  list and falling back to the other list when the preferred one has none left;
* only insertions can push the ghost lists past their bounds (an eviction moves a key from T1
  to B1 or from T2 to B2, which changes neither bound), so the ghosts are trimmed there.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, KeysView
from itertools import islice, repeat
from math import ceil
from operator import attrgetter, itemgetter

from kv_offload import BlockStatus, CachePolicy, OffloadKey, ReqContext

__all__ = ["ARCCachePolicy"]

_key = itemgetter(0)
_block = itemgetter(1)
_ref_cnt = attrgetter("ref_cnt")
# Drains an iterator at C speed, for maps run only for their side effects.
_consume = deque(maxlen=0).extend

_Victims = list[tuple[OffloadKey, BlockStatus]]


class ARCCachePolicy(CachePolicy):
    """Adaptive Replacement Cache: balances recency and frequency by learning from its misses.

    Layout, chosen for the manager's hot paths:

    * ``_resident`` is one plain dict over T1 and T2, and ``get`` is its bound C ``get``: the
      manager calls ``get`` for every key of every request, and a single dict probe is the
      cheapest answer that can never return a ghost;
    * T1 and T2 are ``OrderedDict`` (LRU first) holding the blocks too, so ``evict`` can take
      its victims with ``popitem`` and check them with C-level maps, without a Python step
      per block in the common case;
    * B1 and B2 are ``OrderedDict`` of key -> ``None``: ghosts need ordered trimming and O(1)
      removal of any key, and hold no block, so an evicted slot is never referenced twice.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._resident: dict[OffloadKey, BlockStatus] = {}
        self._t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._p = 0.0
        self.get = self._resident.get  # type: ignore[method-assign]

    def get(self, key: OffloadKey) -> BlockStatus | None:  # replaced per instance in __init__
        return self._resident.get(key)

    # -- introspection (live, read-only views, least recently used first) -------------------

    @property
    def p(self) -> float:
        """ARC's adaptive target for the size of T1, between 0 and ``cache_capacity``."""
        return self._p

    @property
    def t1(self) -> KeysView[OffloadKey]:
        return self._t1.keys()

    @property
    def t2(self) -> KeysView[OffloadKey]:
        return self._t2.keys()

    @property
    def b1(self) -> KeysView[OffloadKey]:
        return self._b1.keys()

    @property
    def b2(self) -> KeysView[OffloadKey]:
        return self._b2.keys()

    def __len__(self) -> int:
        return len(self._resident)

    # -- insertion ------------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._admit(key, block)
        self._trim_ghosts()

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        b1 = self._b1
        b2 = self._b2
        # A batch without ghost keys (the common case) is all first sightings: it goes to T1
        # in bulk and leaves p alone; otherwise each key must adapt p in order.
        if (not b1 or b1.keys().isdisjoint(keys)) and (not b2 or b2.keys().isdisjoint(keys)):
            resident = self._resident
            size = len(resident)
            resident.update(zip(keys, blocks))
            t1 = self._t1
            if len(resident) != size + len(keys):
                # Some keys were already resident: their old entries must not linger in T1/T2.
                t2 = self._t2
                for key in keys:
                    t1.pop(key, None)
                    t2.pop(key, None)
            t1.update(zip(keys, blocks))
        else:
            admit = self._admit
            for key, block in zip(keys, blocks):
                admit(key, block)
        self._trim_ghosts()

    def _admit(self, key: OffloadKey, block: BlockStatus) -> None:
        """ARC's miss cases for one key, except REPLACE, which the manager ran as ``evict``."""
        resident = self._resident
        if key in resident:  # a re-insert replaces the old block rather than duplicating it
            if self._t1.pop(key, None) is None:
                self._t2.pop(key, None)
        b1 = self._b1
        b2 = self._b2
        if key in b1:
            # T1 was evicted too early: give recency more room, faster when B1 is the rarer hit.
            self._p = min(float(self.cache_capacity), self._p + max(1.0, len(b2) / len(b1)))
            del b1[key]
            self._t2[key] = block
        elif key in b2:
            self._p = max(0.0, self._p - max(1.0, len(b1) / len(b2)))
            del b2[key]
            self._t2[key] = block
        else:
            self._t1[key] = block
        resident[key] = block

    def _trim_ghosts(self) -> None:
        """Keep |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c, dropping the oldest ghosts.

        The bounds are what make ARC's history a fixed 2c keys: without them the ghosts of a
        scan would grow without limit and a ghost hit would say nothing about recent misses.
        """
        c = self.cache_capacity
        t1 = self._t1
        b1 = self._b1
        b2 = self._b2
        excess = len(t1) + len(b1) - c
        if excess > 0:
            _consume(map(b1.popitem, repeat(False, min(excess, len(b1)))))
        excess = len(t1) + len(self._t2) + len(b1) + len(b2) - 2 * c
        if excess > 0:
            from_b2 = min(excess, len(b2))
            _consume(map(b2.popitem, repeat(False, from_b2)))
            if excess > from_b2:
                _consume(map(b1.popitem, repeat(False, min(excess - from_b2, len(b1)))))

    # -- removal and recency --------------------------------------------------------------

    def remove(self, key: OffloadKey) -> None:
        # A failed store was never used: remembering it as a ghost would later adapt p on
        # the strength of a block nobody read.
        if self._resident.pop(key, None) is not None and self._t1.pop(key, None) is None:
            self._t2.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        t1 = self._t1
        t2 = self._t2
        move_to_end = t2.move_to_end
        pop_t1 = t1.pop
        key_list = keys if type(keys) is list else list(keys)
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(key_list):
            if key in t2:
                move_to_end(key)
            elif key in t1:
                t2[key] = pop_t1(key)  # a second use: the block is now frequent

    # -- eviction -------------------------------------------------------------------------

    def evict(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        if n <= 0:
            return []
        t1 = self._t1
        t2 = self._t2
        len1 = len(t1)
        len2 = len(t2)
        if n > len1 + len2:
            return None
        # REPLACE takes T1's LRU while |T1| > p, then T2's; repeated n times that is the first
        # ceil(|T1| - p) victims from T1 and the rest from T2, back to T1 if T2 runs out.
        from1 = min(n, max(0, ceil(len1 - self._p)))
        from2 = n - from1
        if from2 > len2:
            from1 = n - len2
            from2 = len2
        # Fast path, the common case: the oldest blocks of each list are idle and unprotected,
        # so popping and checking them with C-level maps avoids a Python step per block.
        oldest1 = list(map(t1.popitem, repeat(False, from1)))
        oldest2 = list(map(t2.popitem, repeat(False, from2)))
        victims = oldest1 + oldest2
        if not any(map(_ref_cnt, map(_block, victims))) and protected.isdisjoint(
            map(_key, victims)
        ):
            self._retire(oldest1, oldest2)
            return victims
        _restore_front(t1, oldest1)
        _restore_front(t2, oldest2)
        return self._evict_scanning(n, protected, from1)

    def _evict_scanning(self, n: int, protected: set[OffloadKey], from1: int) -> _Victims | None:
        """REPLACE that steps over busy or protected blocks; all or nothing."""

        def idle(blocks: OrderedDict[OffloadKey, BlockStatus]) -> Iterator[
            tuple[OffloadKey, BlockStatus]
        ]:
            return (
                (key, block)
                for key, block in blocks.items()
                if block.ref_cnt == 0 and key not in protected
            )

        t1 = self._t1
        t2 = self._t2
        idle1 = idle(t1)
        picked1 = list(islice(idle1, from1))
        picked2 = list(islice(idle(t2), n - len(picked1)))
        missing = n - len(picked1) - len(picked2)
        if missing:
            picked1.extend(islice(idle1, missing))
            if len(picked1) + len(picked2) < n:
                return None
        # The generators are abandoned before the dicts change, so no iterator sees a mutation.
        for key, _ in picked1:
            del t1[key]
        for key, _ in picked2:
            del t2[key]
        self._retire(picked1, picked2)
        return picked1 + picked2

    def _retire(self, from_t1: _Victims, from_t2: _Victims) -> None:
        """Turn victims already taken out of T1/T2 into ghosts of the list they left."""
        resident = self._resident
        if from_t1:
            _consume(map(resident.__delitem__, map(_key, from_t1)))
            self._b1.update(zip(map(_key, from_t1), repeat(None)))
        if from_t2:
            _consume(map(resident.__delitem__, map(_key, from_t2)))
            self._b2.update(zip(map(_key, from_t2), repeat(None)))

    def clear(self) -> None:
        self._resident.clear()
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b2.clear()
        self._p = 0.0


def _restore_front(
    blocks: OrderedDict[OffloadKey, BlockStatus], items: _Victims
) -> None:
    """Undo ``popitem(last=False)`` calls, restoring the original order exactly."""
    move_to_end = blocks.move_to_end
    for key, block in reversed(items):
        blocks[key] = block
        move_to_end(key, last=False)
