"""The reuse-aware policy stated plainly: the oracle the shipped
:class:`~kv_offload_reuse.ReuseCachePolicy` is tested against step by step.

Lists for T1 and T2, a dict for the eviction memory, every eviction kept in a list: O(n) per
step, one rule per line, no speed tricks. It is not an entry point; register it to run it
through a manager::

    CachePolicyFactory.register_cache_policy(
        "reuse-reference", "kv_offload_reuse.reference", "ReferenceReusePolicy"
    )
"""

from __future__ import annotations

from collections.abc import Iterable

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy

from .memory import SLOTS_PER_BLOCK, WINDOW, slot_of

__all__ = ["ReferenceReusePolicy"]

_EPOCHS = 64  # epoch numbers wrap at 64; the memory keeps the last WINDOW capacities


class ReferenceReusePolicy(CachePolicy):
    """The same algorithm, written for clarity: lists, a dict for the table, no numpy.

    It has no miniatures (REPLACE always uses ARC's ``p``): the shipped policy matches it
    step by step while its miniatures are off (capacities under ``16 x`` the sample rate).
    """

    def __init__(self, c: int) -> None:
        super().__init__(c)
        self.c = c
        self.size = SLOTS_PER_BLOCK * c
        self.epoch_blocks = max(1, WINDOW * c // 64)
        self.clear()

    def clear(self) -> None:
        self.t1: list[tuple[OffloadKey, BlockStatus]] = []
        self.t2: list[tuple[OffloadKey, BlockStatus]] = []
        self.table: dict[int, tuple[int, int, int]] = {}  # slot -> (fingerprint, epoch, list)
        self.evictions: list[tuple[int, int]] = []  # (epoch, list) of remembered evictions
        self.every: list[tuple[int, int]] = []  # ... and of every eviction in the window
        self.epoch = 0
        self.count = 0
        self.p = self.c / 2

    def get(self, key: OffloadKey) -> BlockStatus | None:
        for listed in (self.t1, self.t2):
            for other, block in listed:
                if other == key:
                    return block
        return None

    def remove(self, key: OffloadKey) -> None:
        self.t1 = [(o, b) for o, b in self.t1 if o != key]
        self.t2 = [(o, b) for o, b in self.t2 if o != key]

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Classified as the batch arrives: keys up to the deepest remembered one are
        reuses (a key implies its prefix); then each remembered key is consumed in order."""
        for key in keys:
            self.remove(key)
        records = []
        for key in keys:
            slot, fingerprint = slot_of(key, self.size)
            record = self.table.get(slot)
            records.append(
                (slot, record) if record is not None and record[0] == fingerprint else None
            )
        deepest = max((i + 1 for i, r in enumerate(records) if r is not None), default=0)
        for found in records:
            if found is not None:
                self.consume(*found)
        for i, (key, block) in enumerate(zip(keys, blocks)):
            (self.t2 if i < deepest else self.t1).append((key, block))
        for _ in keys:
            self.count += 1
            if self.count == self.epoch_blocks:
                self.count = 0
                self.epoch = (self.epoch + 1) % _EPOCHS
                if self.epoch % 8 == 0:
                    doomed = range(self.epoch, self.epoch + 8)
                    self.table = {s: r for s, r in self.table.items() if r[1] not in doomed}
                    self.evictions = [(e, o) for e, o in self.evictions if e not in doomed]
                    self.every = [(e, o) for e, o in self.every if e not in doomed]

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def consume(self, slot: int, record: tuple[int, int, int]) -> None:
        del self.table[slot]
        _, left, origin = record
        b1, b2 = self.ghost_sizes()
        span = (self.epoch - left) % 64
        since = sum(1 for e, o in self.every if o == origin and (e - left) % 64 <= span)
        if since <= (b1 if origin == 1 else b2):
            if origin == 1:
                self.p = min(self.c, self.p + max(1.0, b2 / max(b1, 1)))
            else:
                self.p = max(0.0, self.p - max(1.0, b1 / max(b2, 1)))
        self.evictions.remove((left, origin))

    def ghost_sizes(self) -> tuple[int, int]:
        b1 = min(max(0, self.c - len(self.t1)), sum(1 for _, o in self.evictions if o == 1))
        return b1, min(self.c - b1, sum(1 for _, o in self.evictions if o == 2))

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        for key in reversed(list(keys)):
            for listed in (self.t1, self.t2):
                for i, (other, block) in enumerate(listed):
                    if other == key:
                        del listed[i]
                        self.t2.append((key, block))
                        break
                else:
                    continue
                break

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []

        def idle(listed: list[tuple[OffloadKey, BlockStatus]]) -> list[int]:
            return [i for i, (o, b) in enumerate(listed) if b.ref_cnt == 0 and o not in protected]

        cand1, cand2 = idle(self.t1), idle(self.t2)
        if len(cand1) + len(cand2) < n or n > len(self.t1) + len(self.t2):
            return None
        want1 = min(n, max(0, -int(-(len(self.t1) - self.p) // 1)))
        take1 = cand1[:want1]
        take2 = cand2[: n - len(take1)]
        take1 = cand1[: n - len(take2)]
        victims = []
        for origin, listed, taken in ((1, self.t1, take1), (2, self.t2, take2)):
            for i in taken:
                key, block = listed[i]
                victims.append((key, block))
                slot, fingerprint = slot_of(key, self.size)
                self.table[slot] = (fingerprint, self.epoch, origin)
                self.evictions.append((self.epoch, origin))
                self.every.append((self.epoch, origin))
            for i in reversed(taken):
                del listed[i]
        return victims

    def state(self) -> tuple[object, ...]:
        return self.p, [o for o, _ in self.t1], [o for o, _ in self.t2]
