"""The tier's own bound: the blocks it accounts for, in LRU order, and who may delete what.

An object store never fills up, so the tier bounds itself: it accounts for at most
``capacity`` objects and deletes the least recently used ones (one batch DELETE) to make room.
It accounts for the blocks **it wrote** and, after a restart, the blocks it **found** by
listing its prefix (oldest first, by their LastModified).

The sharing rule (engines sharing a prefix do not delete each other's fresh blocks):
**a block this engine did not write in this process is deleted only if its LastModified is
older than ``shared_grace_s``**. A fresh block of another engine that this engine's LRU
reaches is dropped from its accounting, not deleted: it stays in the bucket, bounded by the
engine that wrote it (whose accounting holds it) or, after the grace, by whoever adopts it at
a restart. A block two engines both wrote is in both accountings and either may delete it:
the other one's next load of it is then a miss (its bytes are never wrong). Reads do not
refresh LastModified, so a block another engine keeps reading may go once it is older than
the grace; that engine recomputes it.

Runs in the scheduler's thread only (no lock).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection

from kv_offload import OffloadKey

__all__ = ["CapacityIndex"]


class CapacityIndex:
    def __init__(
        self, capacity: int, grace_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.capacity = capacity
        self.grace_s = grace_s
        self._clock = clock
        #: key -> LastModified of a block found by listing, or None for one written here
        self._entries: OrderedDict[OffloadKey, float | None] = OrderedDict()
        #: foreign fresh blocks dropped from the accounting (the sharing rule)
        self.dropped_foreign = 0

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def mine(self) -> int:
        """How many of the accounted blocks this engine wrote."""
        return sum(1 for m in self._entries.values() if m is None)

    def written(self, key: OffloadKey) -> None:
        """This engine stored ``key``: accounted as its own, most recently used."""
        self._entries[key] = None
        self._entries.move_to_end(key)

    def found(self, key: OffloadKey, modified: float) -> None:
        """Listing found ``key`` (call oldest first): accounted as least recently used."""
        if key not in self._entries:
            self._entries[key] = modified

    def touch(self, key: OffloadKey) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)

    def discard(self, key: OffloadKey) -> None:
        self._entries.pop(key, None)

    def make_room(self, new: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        """Room for ``new`` more blocks: the victims to delete (removed from the accounting),
        least recently used first, never a key in ``protected`` (loads or stores in flight)
        nor a fresh block of another engine (dropped from the accounting instead). ``None``
        if there is not enough room even so (nothing changed but dropped foreign blocks)."""
        need = len(self._entries) + new - self.capacity
        if need <= 0:
            return []
        if new > self.capacity:
            return None
        fresh_after = self._clock() - self.grace_s
        victims: list[OffloadKey] = []
        dropped: list[OffloadKey] = []
        for key, modified in self._entries.items():
            if len(victims) + len(dropped) >= need:
                break
            if key in protected:
                continue
            if modified is not None and modified > fresh_after:
                dropped.append(key)
            else:
                victims.append(key)
        for key in dropped:
            del self._entries[key]
        self.dropped_foreign += len(dropped)
        if len(victims) + len(dropped) < need:
            return None
        for key in victims:
            del self._entries[key]
        return victims
