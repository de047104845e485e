"""A snapshot of a manager's counters and occupancy."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["OffloadingStats"]


@dataclass(frozen=True)
class OffloadingStats:
    """Cumulative counters since construction (or ``reset_cache``) plus current occupancy.

    ``hits``, ``misses`` and ``pending`` partition ``lookups``. ``usage`` is the fraction of
    slots holding a block that cannot be evicted right now (pending or pinned), vLLM's gauge;
    ``occupancy`` is the fraction holding any block.
    """

    capacity: int
    lookups: int
    hits: int
    misses: int
    pending: int
    stored_blocks: int
    loaded_blocks: int
    failed_stores: int
    rejected_stores: int
    evictions: int
    resident_blocks: int
    free_blocks: int
    pending_blocks: int
    pinned_blocks: int
    evictable_blocks: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def usage(self) -> float:
        return (self.pending_blocks + self.pinned_blocks) / self.capacity

    @property
    def occupancy(self) -> float:
        return self.resident_blocks / self.capacity

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(hit_ratio=self.hit_ratio, usage=self.usage, occupancy=self.occupancy)
        return data
