"""LRU stated plainly on one ``OrderedDict``: the oracle :class:`~kv_offload_lru.LRUCachePolicy`
is tested against, and a baseline for benchmarks; :class:`ReferencePrefixLRUCachePolicy` is
the same for :class:`~kv_offload_lru.PrefixLRUCachePolicy`.

Same contract and same decisions as the shipped policy, one rule per line, no speed tricks.
It is not an entry point; register it to run it through a manager::

    CachePolicyFactory.register_cache_policy(
        "lru-reference", "kv_offload_lru.reference", "ReferenceLRUCachePolicy"
    )
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kv_offload import BlockStatus, CachePolicy, OffloadKey, ReqContext

from . import prefix

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


class ReferencePrefixLRUCachePolicy(ReferenceLRUCachePolicy):
    """``requests`` holds, per open request, every key it asked for, as often as asked, the
    request that asked least recently first; at its end they are touched, each once, so the
    first one ends most recent."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.requests: dict[str, list[OffloadKey]] = {}

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        if not keys:
            return
        req_id = req_context.req_id
        self.requests[req_id] = self.requests.pop(req_id, []) + keys
        limit = max(4 * self.cache_capacity, prefix.MIN_RECORDED_KEYS)
        if self.recorded() > limit:  # this request's duplicates go first
            self.requests[req_id] = list(dict.fromkeys(self.requests[req_id]))
        # Then the requests silent the longest lose their record while a bound is exceeded.
        while len(self.requests) > 1 and (
            self.recorded() > limit or len(self.requests) > prefix.MAX_OPEN_REQUESTS
        ):
            del self.requests[next(iter(self.requests))]
        if self.recorded() > limit:  # the one request left is over it: keep its head
            self.requests[req_id] = self.requests[req_id][:limit]

    def recorded(self) -> int:
        return sum(map(len, self.requests.values()))

    def on_request_finished(self, req_context: ReqContext) -> None:
        asked = self.requests.pop(req_context.req_id, [])
        self.touch(list(dict.fromkeys(asked)), req_context)

    def clear(self) -> None:
        super().clear()
        self.requests.clear()
