"""The frequency estimate behind ``tinylfu``: a count-min sketch with aging and a doorkeeper.

As in TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission
Policy", 2017):

* a **count-min sketch** of ``depth`` rows of 4-bit-range counters (bytes capped at 15):
  an access adds one to the key's counter in every row, the estimate is the smallest of them
  (collisions only ever over-count);
* **aging**: after ``sample_size`` accesses every counter is halved (and the doorkeeper
  emptied), so the sketch follows what is popular now, not what was popular once;
* a **doorkeeper**, a Bloom filter in front of the sketch: a key's first access only sets its
  bits, so the many keys seen once never reach the counters.

Hash positions come from BLAKE2b of the key bytes (stdlib ``hashlib``), never from Python's
salted ``hash()``: the same trace gives the same decisions under any ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import hashlib

import numpy as np
from kv_offload import OffloadKey

__all__ = ["FrequencySketch"]

_MAX_COUNT = 15


class FrequencySketch:
    """Approximate access counts of keys, aged every ``sample_size`` accesses."""

    def __init__(self, width: int, sample_size: int, depth: int = 4) -> None:
        width = max(64, 1 << (width - 1).bit_length())  # a power of two: positions by mask
        self.width = width
        self.depth = depth
        self.sample_size = sample_size
        self._mask = width - 1
        self._rows = [bytearray(width) for _ in range(depth)]
        self._door = bytearray(width)
        self.samples = 0
        #: How many times the sketch has been aged (halved).
        self.resets = 0

    def _positions(self, key: OffloadKey) -> list[int]:
        digest = hashlib.blake2b(bytes(key), digest_size=4 * self.depth).digest()
        mask = self._mask
        return [
            int.from_bytes(digest[4 * row : 4 * row + 4], "little") & mask
            for row in range(self.depth)
        ]

    def increment(self, key: OffloadKey) -> None:
        """Count one access of ``key`` (its first only marks the doorkeeper)."""
        positions = self._positions(key)
        door = self._door
        if not all(door[p] for p in positions):
            for p in positions:
                door[p] = 1
        else:
            for row, p in zip(self._rows, positions):
                if row[p] < _MAX_COUNT:
                    row[p] += 1
        self.samples += 1
        if self.samples >= self.sample_size:
            self._age()

    def estimate(self, key: OffloadKey) -> int:
        """The key's estimated accesses since aging halved them (0 for a key never seen)."""
        positions = self._positions(key)
        seen = 1 if all(self._door[p] for p in positions) else 0
        return seen + min(row[p] for row, p in zip(self._rows, positions))

    def _age(self) -> None:
        for row in self._rows:
            counts = np.frombuffer(row, dtype=np.uint8)
            counts >>= 1
        self._door[:] = bytes(self.width)
        self.samples //= 2
        self.resets += 1
