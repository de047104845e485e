"""The policy's memory of evictions: a bounded hash table, its epochs, and ARC's ghost sizes.

A hash table of 16-bit words, :data:`SLOTS_PER_BLOCK` per cache block: each word holds an
8-bit fingerprint of the key, the 6-bit epoch of its eviction (an epoch is WINDOW x capacity
/ 64 stored blocks, so 64 epochs are the window) and which list it left. Every 8 epochs the 8
oldest are wiped in one numpy pass, so nothing outlives the window and memory never grows.
Evictions are counted per epoch and list, so ARC's ghost-list sizes (for ``p``'s step) and
whether a record is still one of ARC's ghosts are known without keeping the ghosts.

Speed: the table is an ``array('H')`` for fast per-key access with a numpy view over the same
buffer for the wipe; guarded by ``benchmarks/reuse_policy.py`` and by
:mod:`kv_offload_reuse.reference`, which the tests hold the policy to step by step.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import repeat
from operator import lshift, or_, rshift

import numpy as np
from kv_offload import OffloadKey
from xxhash import xxh3_64_intdigest as stable_hash

_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend  # drains a map run for its side effects, at C speed

__all__ = ["EPOCHS", "FROM_T1", "FROM_T2", "SLOTS_PER_BLOCK", "WINDOW", "EvictionMemory", "slot_of"]

#: The memory spans this many cache capacities of stored blocks.
WINDOW = 8
#: History words per cache block (2 bytes each).
SLOTS_PER_BLOCK = 32
EPOCHS = 64  # epoch numbers wrap at 64 (6 bits); the window is 64 epochs
#: A record's list bits: the list its key was evicted from (never 0, so a record's word is not).
FROM_T1 = 2
FROM_T2 = 3


def slot_of(key: OffloadKey, size: int) -> tuple[int, int]:
    """The table slot and 8-bit fingerprint of a key, from a hash of its bytes that is the
    same in every process (Python's ``hash`` of bytes is salted per process: decisions taken
    from it made the hit ratio depend on ``PYTHONHASHSEED``)."""
    h = stable_hash(key)
    return h % size, h >> 56


class EvictionMemory:
    """The evictions of the last :data:`WINDOW` capacities of stored blocks (of a cache of
    ``capacity`` blocks), one 16-bit record each, and their counts per epoch and list."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = SLOTS_PER_BLOCK * capacity
        #: The records (0: empty); read and written by the policy's batch code too.
        self.table = array("H", bytes(2 * self.size))
        self._words = np.frombuffer(self.table, dtype=np.uint16)
        self._epoch_blocks = max(1, (WINDOW * capacity) // EPOCHS)
        self.clear()

    def clear(self) -> None:
        self._words[:] = 0
        self.epoch = 0
        self.stored_in_epoch = 0
        #: remembered evictions per list (T1, T2) and epoch, and their totals
        self.evicted = ([0] * EPOCHS, [0] * EPOCHS)
        self.ghosts = [0, 0]
        self._cumulative = [0, 0]  # every eviction since clear(), per list
        self._cumulative_at = ([0] * EPOCHS, [0] * EPOCHS)  # ... when each epoch began

    def ghost_sizes(self, t1_size: int) -> tuple[int, int]:
        """ARC's |B1| and |B2| for a T1 of ``t1_size`` blocks: the remembered evictions from
        T1 and T2, within ARC's own bounds (|T1| + |B1| <= c, and |B1| + |B2| <= c once the
        cache is full)."""
        c = self.capacity
        b1 = min(max(0, c - t1_size), self.ghosts[0])
        return b1, min(c - b1, self.ghosts[1])

    def remembered(self, key: OffloadKey) -> tuple[int, int] | None:
        """``(list it left: 1 or 2, epochs since)`` if ``key``'s eviction is remembered."""
        slot, fingerprint = slot_of(key, self.size)
        word = self.table[slot]
        if not word or word >> 8 != fingerprint:
            return None
        return (word & 3) - 1, (self.epoch - (word >> 2 & 63)) % EPOCHS

    def consume(self, slot: int, word: int, t1_size: int) -> tuple[int, tuple[int, int] | None]:
        """A remembered eviction came back: forget it. Returns the list it left (0: T1,
        1: T2) and, if it was still one of ARC's ghosts (no more evictions from that list
        since its epoch began than the list may hold), ARC's ghost sizes as they were."""
        self.table[slot] = 0
        left = word >> 2 & 63
        origin = (word & 3) - FROM_T1
        sizes = self.ghost_sizes(t1_size)
        since = self._cumulative[origin] - self._cumulative_at[origin][left]
        self.evicted[origin][left] -= 1
        self.ghosts[origin] -= 1
        return origin, sizes if since <= sizes[origin] else None

    def remember(self, keys: list[OffloadKey], origin: int) -> None:
        """Record the eviction of ``keys`` from list ``origin`` (:data:`FROM_T1` or
        :data:`FROM_T2`) in this epoch."""
        hashes = list(map(stable_hash, keys))
        stamp = self.epoch << 2 | origin
        # word = fingerprint << 8 | stamp, written at hash % size, in C-level maps (a later
        # key of the batch overwrites an earlier one in the same slot, as one at a time would)
        words = map(or_, map(lshift, map(rshift, hashes, repeat(56)), repeat(8)), repeat(stamp))
        _consume(map(self.table.__setitem__, map(self.size.__rmod__, hashes), words))
        origin -= FROM_T1
        count = len(keys)
        self.evicted[origin][self.epoch] += count
        self.ghosts[origin] += count
        self._cumulative[origin] += count

    def count_stored(self, count: int) -> None:
        """``count`` blocks were stored: the clock advances an epoch per epoch's worth."""
        self.stored_in_epoch += count
        while self.stored_in_epoch >= self._epoch_blocks:
            self.stored_in_epoch -= self._epoch_blocks
            self._next_epoch()

    def _next_epoch(self) -> None:
        """Advance the clock; every 8 epochs, wipe the 8 that the next ones will reuse."""
        epoch = self.epoch = (self.epoch + 1) % EPOCHS
        if epoch % 8 == 0:
            words = self._words
            stale = (words >> 5 & 7) == epoch // 8
            stale &= words != 0
            words[stale] = 0
            for origin, counts in enumerate(self.evicted):
                self.ghosts[origin] -= sum(counts[epoch : epoch + 8])
                counts[epoch : epoch + 8] = [0] * 8
        for origin in (0, 1):
            self._cumulative_at[origin][epoch] = self._cumulative[origin]
