"""Write-back's staging rows: where an evicted block's bytes wait for its write-back jobs.

A write-back tier writes a block when the CPU tier evicts it, but the eviction hands the
block's slot to a new block at once. So the eviction first copies each victim's bytes into a
staging row, a row of the same KV buffer past the CPU tier's own (a tier's job reads it like
any slot), and the row is freed only when every write-back tier's job for it has ended:
never a block lost, never one served stale (:mod:`kv_offload.tiering.writes` decides what is
staged; the tiered manager waits, bounded, when no row is free).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..keys import OffloadKey

__all__ = ["StagingRows"]


class StagingRows:
    """Rows of the KV buffer past the CPU tier's own, holding evicted blocks' bytes until
    their write-back jobs end.

    A staged key has one row whatever the number of write-back tiers; the row counts its
    readers (each tier that will write it) and is freed when the last one is done.
    """

    def __init__(self, array: npt.NDArray[np.uint8], first_row: int) -> None:
        self._array = array
        self.capacity = array.shape[0] - first_row
        self._free = list(range(array.shape[0] - 1, first_row - 1, -1))
        #: key -> its staging row, for staged keys.
        self.rows: dict[OffloadKey, int] = {}
        #: row -> readers still to write it.
        self._readers: dict[int, int] = {}

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> bool:
        """Whether any row is held (a write-back may free one)."""
        return bool(self._readers)

    def take(self, victims: list[tuple[OffloadKey, int]]) -> tuple[list[OffloadKey], int]:
        """Copy each victim's bytes from its CPU slot into a free row: the keys staged now, in
        order, and how many found no free row (not staged)."""
        rows = self.rows
        staged: list[OffloadKey] = []
        sources: list[int] = []
        targets: list[int] = []
        dropped = 0
        for key, slot in victims:
            if key in rows:
                continue  # the same key (the same bytes) is staged already
            if not self._free:
                dropped += 1
                continue
            row = self._free.pop()
            rows[key] = row
            self._readers[row] = 0
            staged.append(key)
            sources.append(slot)
            targets.append(row)
        if targets:
            self._array[targets] = self._array[sources]
        return staged, dropped

    def hold(self, keys: Sequence[OffloadKey]) -> None:
        """One more reader for each key's row."""
        readers = self._readers
        rows = self.rows
        for key in keys:
            readers[rows[key]] += 1

    def rows_of(self, keys: Sequence[OffloadKey]) -> list[int]:
        rows = self.rows
        return [rows[key] for key in keys]

    def release(self, keys: Sequence[OffloadKey]) -> None:
        """One reader of each key's row is done: free rows no one reads any more."""
        for key in keys:
            row = self.rows.get(key)
            if row is None:
                continue
            left = self._readers[row] - 1
            if left > 0:
                self._readers[row] = left
            else:
                del self._readers[row], self.rows[key]
                self._free.append(row)

    def copy_out(self, key: OffloadKey, slot: int) -> None:
        """Copy a staged key's bytes into CPU ``slot``."""
        self._array[slot] = self._array[self.rows[key]]
