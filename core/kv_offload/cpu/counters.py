"""The CPU cache's cumulative counters, and the stats snapshot built from them."""

from __future__ import annotations

from bisect import bisect_left

from ..types import ALLOCATION_SIZE_BOUNDS, OffloadingStats, SizeHistogram
from .slots import SlotTable

__all__ = ["Counters"]


class Counters:
    """The CPU manager's cumulative counters (restart at zero on ``reset_cache``)."""

    __slots__ = (
        "allocation_sizes",
        "allocation_total",
        "evictions",
        "failed_stores",
        "hits",
        "loaded",
        "misses",
        "pending_lookups",
        "rejected_stores",
        "stored",
        "stores_skipped",
    )

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.pending_lookups = 0
        self.stored = 0
        self.loaded = 0
        self.failed_stores = 0
        self.rejected_stores = 0
        self.evictions = 0
        self.stores_skipped = 0
        #: prepare_store calls per allocation-size bucket (ALLOCATION_SIZE_BOUNDS, then +Inf).
        self.allocation_sizes = [0] * (len(ALLOCATION_SIZE_BOUNDS) + 1)
        self.allocation_total = 0

    def observe_allocation(self, count: int) -> None:
        """One ``prepare_store`` that asked for ``count`` slots (vLLM's allocation size)."""
        self.allocation_sizes[bisect_left(ALLOCATION_SIZE_BOUNDS, count)] += 1
        self.allocation_total += count

    def snapshot(self, capacity: int, slots: SlotTable) -> OffloadingStats:
        return OffloadingStats(
            capacity=capacity,
            lookups=self.hits + self.misses + self.pending_lookups,
            hits=self.hits,
            misses=self.misses,
            pending=self.pending_lookups,
            stored_blocks=self.stored,
            loaded_blocks=self.loaded,
            failed_stores=self.failed_stores,
            rejected_stores=self.rejected_stores,
            evictions=self.evictions,
            resident_blocks=slots.num_resident,
            free_blocks=slots.num_free,
            pending_blocks=slots.num_pending,
            pinned_blocks=slots.num_pinned,
            evictable_blocks=slots.num_evictable,
            stores_skipped=self.stores_skipped,
            allocation_sizes=SizeHistogram(
                ALLOCATION_SIZE_BOUNDS, tuple(self.allocation_sizes), self.allocation_total
            ),
        )
