"""LRU stated plainly on one ``OrderedDict``: the oracle :class:`~kv_offload_lru.LRUCachePolicy`
is tested against, and a baseline for benchmarks; :class:`ReferencePrefixLRUCachePolicy` is
the same for :class:`~kv_offload_lru.PrefixLRUCachePolicy` (ranks in a dict, sorted at every
eviction, instead of a heap with lazy deletion).

Same contract and same decisions as the shipped policy, one rule per line, no speed tricks.
It is not an entry point; register it to run it through a manager::

    CachePolicyFactory.register_cache_policy(
        "lru-reference", "kv_offload_lru.reference", "ReferenceLRUCachePolicy"
    )
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy, RequestAccessLog

__all__ = ["ReferenceLRUCachePolicy", "ReferencePrefixLRUCachePolicy"]


class ReferenceLRUCachePolicy(CachePolicy):
    """``blocks`` holds every resident block, least recently used first."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.blocks: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.blocks[key] = block

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(list(keys)):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        self.blocks.pop(key, None)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        idle = [(key, b) for key, b in self.blocks.items() if b.ref_cnt == 0]
        victims = [(key, b) for key, b in idle if key not in protected][:n]
        if len(victims) < n:
            return None
        for key, _ in victims:
            del self.blocks[key]
        return victims

    def clear(self) -> None:
        self.blocks.clear()


class ReferencePrefixLRUCachePolicy(CachePolicy):
    """``ranks`` holds every resident block's rank; eviction sorts the idle, unprotected blocks
    by ``(rank, key)`` and takes the first ``n``. Idleness is read from ``ref_cnt``, not from
    the ``mark_*`` callbacks the shipped policy keeps a set with."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.blocks: dict[OffloadKey, BlockStatus] = {}
        self.ranks: dict[OffloadKey, tuple[int, int]] = {}
        self.clock = 0
        self.requests = RequestAccessLog(self.blocks.get, self.asked)

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    def fresh(self) -> tuple[int, int]:
        self.clock += 1
        return (self.clock, 0)

    def request_rank(self, req_context: ReqContext) -> int:
        record = self.requests.record_of(req_context)
        if record.rank is None:
            record.rank = self.fresh()[0]
        return record.rank

    def asked(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        major = self.request_rank(req_context)
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is not None and key in self.ranks:
                self.ranks[key] = max(self.ranks[key], (major, -position))

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        self.requests.settle()
        context = self.requests.store_context
        for key, block in zip(keys, blocks):
            self.blocks[key] = block
            position = None if context is None else context.get_offload_key_position(key)
            if context is None or position is None:
                self.ranks[key] = self.fresh()
            else:
                self.ranks[key] = (self.request_rank(context), -position)
        self.requests.inserted(keys)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self.requests.settle()
        for key in reversed(list(keys)):
            if key in self.blocks:
                self.ranks[key] = self.fresh()

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self.requests.access(keys, req_context)

    def on_store_miss(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self.requests.store_miss(keys, req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        finished = self.requests.finish(req_context)
        if finished is not None:
            self.touch(finished.keys, req_context)

    def remove(self, key: OffloadKey) -> None:
        self.requests.settle()
        if self.blocks.pop(key, None) is not None:
            del self.ranks[key]

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        self.requests.settle()
        idle = [key for key, block in self.blocks.items() if block.ref_cnt == 0]
        order = sorted((key for key in idle if key not in protected), key=self.sort_key)
        if len(order) < n:
            return None
        victims = [(key, self.blocks.pop(key)) for key in order[: max(n, 0)]]
        for key, _ in victims:
            del self.ranks[key]
        return victims

    def sort_key(self, key: OffloadKey) -> tuple[tuple[int, int], OffloadKey]:
        return (self.ranks[key], key)

    def clear(self) -> None:
        self.blocks.clear()
        self.ranks.clear()
        self.clock = 0
        self.requests.clear()
