"""The fs tier's index: which blocks it holds, least recently used first, and its capacity.

Scheduler thread only (no lock). Every block costs the same: 1 when the capacity is in blocks,
the size of its file (header included) when it is in bytes. So the index keeps keys, not a
cost per key, and ``used`` is a count times that cost. Blocks being written are counted
against the capacity from the moment their store is submitted (``reserve``), and blocks being
read are never evicted, so the index never holds more than the capacity and a load never
loses its file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

__all__ = ["DISK_MARGIN_BLOCKS", "BlockIndex"]

#: Block files a disk-bound capacity leaves free at least (a twentieth of the disk on all but
#: the smallest disks): a store writes its file before the evicted block it replaces leaves.
DISK_MARGIN_BLOCKS = 4


class BlockIndex:
    """Stored blocks (LRU order), stores in flight, loads in flight, the capacity."""

    def __init__(self, capacity: int, cost: int) -> None:
        #: In the capacity's unit (blocks, or bytes); bound by the disk (:meth:`fit_to_disk`).
        self.capacity = capacity
        #: What one block costs of the capacity.
        self.cost = cost
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._storing: set[bytes] = set()
        self._loading: dict[bytes, int] = {}  # key -> loads in flight
        #: what the disk holds for the tier (capacity unit), as last measured (``None``: not
        #: measured); the capacity is bound to it once ``disk_bound``
        self.disk: int | None = None
        self.disk_bound = False

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def __iter__(self) -> Iterator[bytes]:
        """The stored keys, least recently used first."""
        return iter(self._blocks)

    @property
    def used(self) -> int:
        return len(self._blocks) * self.cost

    @property
    def reserved(self) -> int:
        """What the stores in flight hold of the capacity."""
        return len(self._storing) * self.cost

    @property
    def num_storing(self) -> int:
        return len(self._storing)

    def storing(self, key: bytes) -> bool:
        return key in self._storing

    def room(self) -> int:
        """Blocks that still fit besides the stored and reserved ones."""
        return (self.capacity - self.used - self.reserved) // self.cost

    def touch(self, key: bytes) -> bool:
        """Make ``key`` the most recently used, if stored."""
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return True
        return False

    def to_store(self, items: Iterable[tuple[bytes, int]]) -> tuple[list[tuple[bytes, int]], int]:
        """A store's ``(key, CPU slot)`` items: those to write (not stored, not being stored,
        each key once), and how many were stored already (they become the most recent). A
        block stored or being stored has these bytes: its key names them."""
        new: list[tuple[bytes, int]] = []
        seen: set[bytes] = set()
        stored = 0
        for key, slot in items:
            if self.touch(key):
                stored += 1
            elif key not in self._storing and key not in seen:
                seen.add(key)
                new.append((key, slot))
        return new, stored

    def add(self, keys: Iterable[bytes]) -> None:
        """Blocks found on disk (at start, or when ``root_dir`` comes back)."""
        for key in keys:
            self._blocks[key] = None

    def make_room(self, blocks: int) -> list[bytes] | None:
        """Evict least recently used blocks that no load is reading until ``blocks`` more fit
        (the victims, taken out of the index; their files are the caller's to delete), or
        ``None`` and no change if they cannot."""
        over = self.used + self.reserved + blocks * self.cost - self.capacity
        if over <= 0:
            return []
        wanted = -(-over // self.cost)
        loading = self._loading
        victims: list[bytes] = []
        for key in self._blocks:
            if key not in loading:
                victims.append(key)
                if len(victims) == wanted:
                    break
        if len(victims) < wanted:
            return None
        for key in victims:
            del self._blocks[key]
        return victims

    def reserve(self, keys: Iterable[bytes]) -> None:
        """Stores of ``keys`` were submitted: they hold room until they land or fail."""
        self._storing.update(keys)

    def store_ended(self, key: bytes, landed: bool) -> None:
        """A store of ``key`` ended; a landed block joins the index as the most recent."""
        self._storing.remove(key)
        if landed:
            self._blocks[key] = None

    def loads_started(self, keys: Iterable[bytes]) -> None:
        loading = self._loading
        for key in keys:
            self._blocks.move_to_end(key)
            loading[key] = loading.get(key, 0) + 1

    def load_ended(self, key: bytes) -> None:
        left = self._loading[key] - 1
        if left:
            self._loading[key] = left
        else:
            del self._loading[key]

    def drop(self, key: bytes) -> bool:
        """Forget a block whose file is bad; whether it was stored."""
        return self._blocks.pop(key, False) is None

    def fit_to_disk(self, free: int | None, full: bool) -> bool:
        """Bound the capacity by the disk: what the tier holds (stored and being written)
        plus the ``free`` block files that still fit, less a twentieth (at least
        :data:`DISK_MARGIN_BLOCKS`: room for files in flight and spare files), at least one
        block; whether that shrank it.

        At start (``full`` false) a disk that cannot hold the capacity bounds it. When a store
        finds the disk full: a bound capacity shrinks again only if the disk now holds less
        than it (another program took more than the twentieth), never for files in flight;
        an unbound one is bound to the disk, or, if the disk reports room for the capacity
        that it could not write (``free`` unknown, or a filesystem whose free space is not
        what it can write), to what the tier held."""
        cost = self.cost
        held = self.used + self.reserved
        measured = None if free is None else held + free * cost
        if not full:
            if measured is None:
                return False
            disk = measured
        elif self.disk_bound:
            if measured is None or measured >= self.capacity:
                return False
            disk = measured
        elif measured is None or measured - measured // 20 >= self.capacity:
            disk = held
        else:
            disk = measured
        self.disk = disk
        fits = max(cost, disk - max(disk // 20, DISK_MARGIN_BLOCKS * cost))
        if fits >= self.capacity:
            return False
        self.capacity = fits
        self.disk_bound = True
        return True

    def disk_headroom(self) -> int | None:
        """Block files the disk holds beyond the capacity, as last measured (``None``: not
        measured): the room spare files may take."""
        if self.disk is None:
            return None
        return max(0, self.disk - self.capacity) // self.cost

    def clear(self) -> int:
        """Forget every stored block (their directory is gone); how many there were."""
        gone = len(self._blocks)
        self._blocks.clear()
        return gone
