"""Reuse-aware eviction for kv-offload (entry point ``kv_offload.policies: reuse``).

ARC (Megiddo & Modha, FAST'03) with a long, compact memory of evicted blocks. On KV prefix
traces the reuse that LRU and ARC miss is the *first* reuse of a block, which comes back
several cache lifetimes after it was stored: by then ARC's ghost lists (bounded at one cache
of keys) have forgotten it, so it re-enters as a first sighting and is evicted again before
its next turn. This policy remembers every eviction of the last :data:`WINDOW` x capacity
stored blocks, and a block that comes back within that window is a reuse: it enters ARC's
frequency side (T2) directly. The recency/frequency split ``p`` still adapts exactly as in
ARC, from ghost hits no older than one cache of stores (ARC's own ghost horizon).

The memory is a hash table of 16-bit words, :data:`SLOTS_PER_BLOCK` per cache block (64 bytes
per block): each word holds an 8-bit fingerprint of the key, the 6-bit epoch of its eviction
(an epoch is capacity/8 stored blocks, so 64 epochs are the window) and which list it left.
A collision overwrites the older record, which then reads as "never seen" (a missed reuse, as
in plain ARC); a false match needs the same slot and fingerprint (under 1 in 256 of those).
Every 8 epochs the 8 oldest are wiped in one numpy pass, so nothing outlives the window and
memory never grows. Ghost-list sizes for ``p``'s step are the evictions counted per epoch.

The benchmark guarding this module is ``benchmarks/reuse_policy.py``; the straightforward
reference it must match step by step is ``ReferenceReuse`` in ``tests/test_reuse_policy.py``.
The research behind the design, with every variant measured, is in this distribution's
README.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import islice, repeat
from math import ceil
from operator import attrgetter, eq, itemgetter, rshift

import numpy as np
from kv_offload import BlockStatus, CachePolicy, OffloadKey, ReqContext

__all__ = ["ReuseCachePolicy", "WINDOW", "SLOTS_PER_BLOCK", "slot_of"]

#: The memory spans this many cache capacities of stored blocks.
WINDOW = 8
#: History words per cache block (2 bytes each).
SLOTS_PER_BLOCK = 32
#: ARC's ``p`` (the target size of T1) starts here, as a fraction of the capacity.
INITIAL_P = 0.5
_EPOCHS = 64  # epoch numbers wrap at 64 (6 bits); the window is 64 epochs
_FROM_T1 = 2
_FROM_T2 = 3
_MASK64 = (1 << 64) - 1

_Victims = list[tuple[OffloadKey, BlockStatus]]
_key = itemgetter(0)
_block = itemgetter(1)
_ref_cnt = attrgetter("ref_cnt")
# Drains an iterator at C speed, for maps run only for their side effects.
_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend


def slot_of(key: OffloadKey, size: int) -> tuple[int, int]:
    """The table slot and 8-bit fingerprint of a key (from its cached ``hash``)."""
    h = hash(key) & _MASK64
    return h % size, h >> 56


class ReuseCachePolicy(CachePolicy):
    """ARC whose ghosts are a bounded hash table spanning ``WINDOW`` capacities of stores.

    * ``_resident``: key -> block over T1 and T2; ``get`` is its bound C ``get``.
    * ``_t1`` / ``_t2``: ``OrderedDict`` recency lists, least recent first (T1: blocks stored
      once and not reused; T2: blocks reused, or stored again after an eviction).
    * ``_table``: the eviction memory (see the module docstring), an ``array('H')`` for fast
      per-key access with a numpy view over the same buffer for the periodic wipe.
    * ``_evicted[list][epoch]``: evictions per epoch, for ARC's ghost-list sizes.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._resident: dict[OffloadKey, BlockStatus] = {}
        self.get = self._resident.get  # type: ignore[method-assign,assignment]
        self._t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._size = SLOTS_PER_BLOCK * cache_capacity
        self._table = array("H", bytes(2 * self._size))
        self._words = np.frombuffer(self._table, dtype=np.uint16)
        self._epoch_blocks = max(1, (WINDOW * cache_capacity) // _EPOCHS)
        self.clear()

    def get(self, key: OffloadKey) -> BlockStatus | None:  # replaced per instance in __init__
        return self._resident.get(key)

    def clear(self) -> None:
        self._resident.clear()
        self._t1.clear()
        self._t2.clear()
        self._words[:] = 0
        self._epoch = 0
        self._stored_in_epoch = 0
        self._evicted = ([0] * _EPOCHS, [0] * _EPOCHS)
        self._p = self.cache_capacity * INITIAL_P

    # -- introspection ------------------------------------------------------------------------

    @property
    def p(self) -> float:
        """ARC's adaptive target for the size of T1, between 0 and ``cache_capacity``."""
        return self._p

    @property
    def t1(self) -> list[OffloadKey]:
        return list(self._t1)

    @property
    def t2(self) -> list[OffloadKey]:
        return list(self._t2)

    def __len__(self) -> int:
        return len(self._resident)

    def ghost_sizes(self) -> tuple[int, int]:
        """ARC's |B1| and |B2|: the remembered evictions from T1 and T2, within ARC's own
        bounds (|T1| + |B1| <= c, and |B1| + |B2| <= c once the cache is full)."""
        c = self.cache_capacity
        b1 = min(max(0, c - len(self._t1)), sum(self._evicted[0]))
        return b1, min(c - b1, sum(self._evicted[1]))

    def _in_arc_ghosts(self, origin: int, left: int) -> bool:
        """Whether an eviction from list ``origin`` in epoch ``left`` would still be in ARC's
        ghost list: fewer evictions from that list since then than the list may hold."""
        counts = self._evicted[origin]
        since = sum(counts[(left + i) % _EPOCHS] for i in range((self._epoch - left) % _EPOCHS + 1))
        b1, b2 = self.ghost_sizes()
        return since <= (b1 if origin == 0 else b2)

    def remembered(self, key: OffloadKey) -> tuple[int, int] | None:
        """``(list it left: 1 or 2, epochs since)`` if ``key``'s eviction is remembered."""
        slot, fingerprint = slot_of(key, self._size)
        word = self._table[slot]
        if not word or word >> 8 != fingerprint:
            return None
        return (word & 3) - 1, (self._epoch - (word >> 2 & 63)) % _EPOCHS

    # -- insertion and reuse ------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        resident = self._resident
        table = self._table
        # The common batch: no key remembered, none resident. Checked with C-level maps over
        # the whole batch, then inserted in bulk; wiping epochs on the way can only forget
        # records, so the result is the same as one key at a time.
        hashes = list(map(_MASK64.__and__, map(hash, keys)))
        words = map(table.__getitem__, map(self._size.__rmod__, hashes))
        matches = list(map(eq, map(rshift, words, repeat(8)), map(rshift, hashes, repeat(56))))
        if not any(matches) and resident.keys().isdisjoint(keys):
            before = len(resident)
            resident.update(zip(keys, blocks))
            if len(resident) == before + len(keys):  # no key repeated in the batch
                self._t1.update(zip(keys, blocks))
                self._count_stored(len(keys))
                return
            for key in keys:
                del resident[key]
        # A key is its whole prefix (prefix hashes chain): if the deepest remembered key of
        # the batch was requested before, so was every key before it, remembered or not
        # (its record lost to a collision). Those go to T2; the rest are first sightings.
        reused = len(matches) - matches[::-1].index(True) if any(matches) else 0
        for i, (key, block) in enumerate(zip(keys, blocks)):
            self._insert_one(key, block, i < reused)

    def _insert_one(self, key: OffloadKey, block: BlockStatus, reused: bool) -> None:
        table = self._table
        if key in self._resident:  # never sent by the manager; as a re-insert, a fresh start
            self.remove(key)
        h = hash(key) & _MASK64
        slot = h % self._size
        word = table[slot]
        if word and word >> 8 == h >> 56:
            # Stored before and evicted within the window: a reuse. Recent enough to be in
            # ARC's ghost lists, it also moves p towards the list that lost it.
            table[slot] = 0
            left = word >> 2 & 63
            origin = (word & 3) - _FROM_T1
            if self._in_arc_ghosts(origin, left):
                b1, b2 = self.ghost_sizes()
                if origin == 0:
                    self._p = min(self.cache_capacity, self._p + max(1.0, b2 / max(b1, 1)))
                else:
                    self._p = max(0.0, self._p - max(1.0, b1 / max(b2, 1)))
            self._evicted[origin][left] -= 1  # no longer a ghost
            reused = True
        if reused:
            self._t2[key] = block
        else:
            self._t1[key] = block
        self._resident[key] = block
        self._count_stored(1)

    def _count_stored(self, count: int) -> None:
        self._stored_in_epoch += count
        while self._stored_in_epoch >= self._epoch_blocks:
            self._stored_in_epoch -= self._epoch_blocks
            self._next_epoch()

    def _next_epoch(self) -> None:
        """Advance the clock; every 8 epochs, wipe the 8 that the next ones will reuse."""
        epoch = self._epoch = (self._epoch + 1) % _EPOCHS
        if epoch % 8 == 0:
            words = self._words
            stale = (words >> 5 & 7) == epoch // 8
            stale &= words != 0
            words[stale] = 0
            for counts in self._evicted:
                counts[epoch : epoch + 8] = [0] * 8

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        t1 = self._t1
        t2 = self._t2
        key_list = keys if type(keys) is list else list(keys)
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(key_list):
            if key in t2:
                t2.move_to_end(key)
            else:
                block = t1.pop(key, None)
                if block is not None:
                    t2[key] = block

    def remove(self, key: OffloadKey) -> None:
        # A failed store was never used: it leaves no memory of an eviction.
        if self._resident.pop(key, None) is not None and self._t1.pop(key, None) is None:
            del self._t2[key]

    # -- eviction -----------------------------------------------------------------------------

    def evict(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        """ARC's REPLACE, n times: T1's LRU while |T1| > p, else T2's; the other list when the
        preferred one has no idle, unprotected block left. All or nothing."""
        if n <= 0:
            return []
        if n > len(self._resident):
            return None
        t1 = self._t1
        t2 = self._t2
        from1 = min(n, max(0, ceil(len(t1) - self._p)))
        if n - from1 > len(t2):
            from1 = n - len(t2)
        # Fast path, the common case: the oldest blocks of each list are idle and unprotected,
        # which C-level maps check without a Python step per block.
        picked1 = list(islice(t1.items(), from1))
        picked2 = list(islice(t2.items(), n - from1))
        if not (
            any(map(_ref_cnt, map(_block, picked1)))
            or any(map(_ref_cnt, map(_block, picked2)))
            or not protected.isdisjoint(map(_key, picked1))
            or not protected.isdisjoint(map(_key, picked2))
        ):
            self._forget(picked1, t1, _FROM_T1)
            self._forget(picked2, t2, _FROM_T2)
            return picked1 + picked2
        return self._evict_scanning(n, protected, from1)

    def _evict_scanning(self, n: int, protected: set[OffloadKey], from1: int) -> _Victims | None:
        """REPLACE that steps over pinned, pending and protected blocks."""
        t1 = self._t1
        t2 = self._t2
        idle1 = ((key, b) for key, b in t1.items() if b.ref_cnt == 0 and key not in protected)
        idle2 = ((key, b) for key, b in t2.items() if b.ref_cnt == 0 and key not in protected)
        picked1 = list(islice(idle1, from1))
        picked2 = list(islice(idle2, n - len(picked1)))
        missing = n - len(picked1) - len(picked2)
        if missing:
            picked1 += islice(idle1, missing)
            if len(picked1) + len(picked2) < n:
                return None
        # The generators are abandoned here, before the lists they walk change.
        self._forget(picked1, t1, _FROM_T1)
        self._forget(picked2, t2, _FROM_T2)
        return picked1 + picked2

    def _forget(
        self, victims: _Victims, listed: OrderedDict[OffloadKey, BlockStatus], origin: int
    ) -> None:
        """Drop victims from their list and remember each eviction in the table."""
        if not victims:
            return
        keys = list(map(_key, victims))
        _consume(map(listed.__delitem__, keys))
        _consume(map(self._resident.__delitem__, keys))
        table = self._table
        size = self._size
        stamp = self._epoch << 2 | origin
        for h in map(_MASK64.__and__, map(hash, keys)):
            table[h % size] = (h >> 56) << 8 | stamp
        self._evicted[origin - _FROM_T1][self._epoch] += len(victims)
