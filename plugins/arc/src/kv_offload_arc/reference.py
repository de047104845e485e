"""ARC stated plainly on four ``OrderedDict``\\ s: the oracle the shipped
:class:`~kv_offload_arc.ARCCachePolicy` is tested against, and a baseline for benchmarks.

The same adapted ARC as the shipped policy (see :mod:`kv_offload_arc`), one rule per line, no
speed tricks. It is not an entry point; register it to run it through a manager::

    CachePolicyFactory.register_cache_policy(
        "arc-reference", "kv_offload_arc.reference", "ReferenceARCCachePolicy"
    )
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy

__all__ = ["ReferenceARCCachePolicy"]


class ReferenceARCCachePolicy(CachePolicy):
    """``t1``/``t2`` map resident keys to blocks, ``b1``/``b2`` hold ghost keys; all oldest
    first. ``p`` is the target size of T1."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.p = 0.0
        self.t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.t1[key] if key in self.t1 else self.t2.get(key)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        c = self.cache_capacity
        if key in self.b1:  # case II: T1 lost it too early, more room for recency
            self.p = min(c, self.p + max(1.0, len(self.b2) / len(self.b1)))
            del self.b1[key]
            self.t2[key] = block
        elif key in self.b2:  # case III: T2 lost it too early, more room for frequency
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            del self.b2[key]
            self.t2[key] = block
        else:  # case IV: a first sighting
            self.t1[key] = block
        while len(self.t1) + len(self.b1) > c:
            self.b1.popitem(last=False)
        while len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * c:
            (self.b2 or self.b1).popitem(last=False)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(list(keys)):
            if key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.t1:
                self.t2[key] = self.t1.pop(key)

    def remove(self, key: OffloadKey) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """REPLACE ``n`` times over idle, unprotected blocks: T1's LRU while |T1| > p, else
        T2's, each falling back to the other list."""

        def idle(blocks: OrderedDict[OffloadKey, BlockStatus]) -> list[OffloadKey]:
            return [key for key, b in blocks.items() if b.ref_cnt == 0 and key not in protected]

        idle1, idle2 = idle(self.t1), idle(self.t2)
        taken1: list[OffloadKey] = []
        taken2: list[OffloadKey] = []
        for _ in range(n):
            prefer_t1 = len(self.t1) - len(taken1) > self.p
            if (prefer_t1 or not idle2) and idle1:
                taken1.append(idle1.pop(0))
            elif idle2:
                taken2.append(idle2.pop(0))
            else:
                return None
        victims = [(key, self.t1.pop(key)) for key in taken1]
        victims += [(key, self.t2.pop(key)) for key in taken2]
        self.b1.update(dict.fromkeys(taken1))
        self.b2.update(dict.fromkeys(taken2))
        return victims

    def clear(self) -> None:
        self.p = 0.0
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
