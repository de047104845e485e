"""Reference hit ratios for a trace: Belady's offline eviction and an infinite cache.

Both follow the replay's access model (:mod:`kv_offload.replay`): per request, lookups in
prefix order until the first miss; the hits are loaded and touched; the request's other
blocks are stored, evicting as needed. As in the manager, the blocks being stored are
protected from their own request's eviction, and a store that cannot find room for all of its
blocks is rejected whole.

Belady evicts the resident block whose next request comes last; with the next-use index
(the position of every key's next occurrence, computed in one backward pass) and a heap
keyed by it, a replay is O(n log n) in the trace's block count. Keys never requested again
go first, in any order (they can never hit). A block's next use is its next occurrence in
the trace: under the prefix model that occurrence is only looked up if every block before it
hits, so this is the classical offline policy on this access model, a bound no online policy
is expected to reach, not a proven optimum. The brute-force reference that guards this
implementation lives in ``tests/test_bounds.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["BoundResult", "belady", "infinite", "gap_share"]


@dataclass(frozen=True)
class BoundResult:
    """Hit blocks of a reference policy over all blocks of the trace."""

    name: str
    capacity: int | None
    hit_blocks: int
    blocks: int
    evictions: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0


def _dense(requests: Sequence[Sequence[Hashable]]) -> tuple[list[int], list[int]]:
    """The trace as one flat list of small integer ids, plus each request's start offset."""
    ids: dict[Hashable, int] = {}
    flat: list[int] = []
    starts: list[int] = []
    for keys in requests:
        starts.append(len(flat))
        flat.extend(ids.setdefault(key, len(ids)) for key in keys)
    starts.append(len(flat))
    return flat, starts


def _next_use(flat: list[int]) -> list[int]:
    """For every position, the position of the same key's next occurrence; a key never seen
    again gets ``len(flat) + id``, later than any real position and unique per key."""
    never = len(flat)
    last: dict[int, int] = {}
    nxt = [0] * len(flat)
    for pos in range(len(flat) - 1, -1, -1):
        kid = flat[pos]
        nxt[pos] = last.get(kid, never + kid)
        last[kid] = pos
    return nxt


def belady(requests: Sequence[Sequence[Hashable]], capacity: int) -> BoundResult:
    """Replay with Belady's eviction: the victim is the block whose next use comes last."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ConfigError(f"belady: capacity must be a positive int, got {capacity!r}")
    flat, starts = _dense(requests)
    nxt = _next_use(flat)
    # kid -> its next use; the heap holds (-next use, kid), stale entries dropped on pop.
    resident: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    push = heapq.heappush
    pop = heapq.heappop
    hits = evictions = 0
    for r in range(len(starts) - 1):
        start, stop = starts[r], starts[r + 1]
        pos = start
        while pos < stop and flat[pos] in resident:
            pos += 1
        hits += pos - start
        # Every key of the request moves on to its next use, hit or not.
        to_store: list[int] = []
        for p in range(start, stop):
            kid = flat[p]
            if kid in resident:
                resident[kid] = nxt[p]
                push(heap, (-nxt[p], kid))
            elif p >= pos:
                to_store.append(p)
        shortfall = len(resident) + len(to_store) - capacity
        if shortfall > 0:
            protected = set(flat[pos:stop])
            busy = sum(kid in resident for kid in protected)  # iterate the small side
            if shortfall > len(resident) - busy:
                continue  # rejected whole, as the manager does
            skipped: list[tuple[int, int]] = []
            while shortfall:
                entry = pop(heap)
                kid = entry[1]
                if resident.get(kid) != -entry[0]:
                    continue  # stale: the key moved on or left
                if kid in protected:
                    skipped.append(entry)
                    continue
                del resident[kid]
                shortfall -= 1
                evictions += 1
            for entry in skipped:
                push(heap, entry)
        for p in to_store:
            resident[flat[p]] = nxt[p]
            push(heap, (-nxt[p], flat[p]))
        if len(heap) > 4 * capacity + 64:  # drop stale entries: the heap stays O(capacity)
            heap = [(-use, kid) for kid, use in resident.items()]
            heapq.heapify(heap)
    return BoundResult("belady", capacity, hits, len(flat), evictions)


def infinite(requests: Sequence[Sequence[Hashable]]) -> BoundResult:
    """Replay with a cache that never evicts: every block ever stored stays."""
    seen: set[Hashable] = set()
    hits = blocks = 0
    for keys in requests:
        for key in keys:
            if key not in seen:
                break
            hits += 1
        seen.update(keys)
        blocks += len(keys)
    return BoundResult("infinite", None, hits, blocks)


def gap_share(hit_ratio: float, lru: float, optimum: float) -> float | None:
    """How much of the LRU-to-optimum gap a policy closes (0: LRU, 1: optimum), or ``None``
    when there is no gap to close."""
    gap = optimum - lru
    if gap <= 1e-12:
        return None
    return (hit_ratio - lru) / gap
