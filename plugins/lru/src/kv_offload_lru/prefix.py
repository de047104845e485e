"""LRU with vLLM 0.33's request-scoped recency: the eviction order of vLLM's own ``lru``, step
for step, under kv-offload's manager.

Why: requests share prefixes (a system prompt, a conversation so far), and the shared part is
the head of each request's key list. A block at the head is asked for by every request that
shares any of the prefix, a block at the tail only by requests sharing all of it. Plain
:class:`~kv_offload_lru.LRUCachePolicy` counts a block as used when it is stored or hit, so a
request's freshly stored tail ends *more* recent than the hits at its head, and the head (the
part most likely to be asked for again) is evicted first once the cache fills. vLLM 0.33's
``lru`` ranks a request's blocks head last, and this policy decides exactly as it does, so a
deployment moving between the two keeps its hit ratio and its eviction order.

The model (every resident block has a rank; the idle block with the lowest rank, ties broken
by the key's bytes, is evicted first):

* a block stored or touched gets a fresh rank, newer than every rank so far (a touched
  request's first key last, so its head is the newest);
* a request with key positions on its context (:meth:`~kv_offload.ReqContext.
  set_offload_key_position`, as vLLM's scheduler records them) takes one *provisional* rank
  the first time it asks for a key, and its blocks rank inside it by position, the tail
  before the head: the blocks it stores, and the resident blocks it asks for whose rank is
  older. While the request runs, its blocks stay together at that point of the order, however
  many steps its stores take, and its head outlives its tail;
* when a request ends, every resident block it asked for gets a fresh rank, tail first, so
  its head ends the newest. The keys and their head-to-tail order are vLLM's manager's
  (:class:`~kv_offload.policies.request_access.RequestAccessLog`: each key once, blocks still
  being stored and absent keys the store did not allocate left out, sorted by position when
  every key has one).

Without positions the provisional rank never applies: a block is ranked when stored, hit (by
``touch``) and at its request's end. ``tests/vllm_bridge/test_vllm_parity.py`` drives this
policy in kv-offload's manager next to vLLM's ``lru`` in vLLM's manager and compares every
answer after every step.

Ranks are ``(major, minor)`` pairs: a fresh rank is ``(n, 0)`` for the next ``n``, a
provisional one ``(request's n, -position)``. Idle blocks sit in a min-heap of
``(major, minor, key)`` with lazy deletion: an entry whose block has left, is busy, or has
been re-ranked since is dropped when it reaches the top, and the heap is rebuilt once stale
entries outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy, RequestAccessLog

__all__ = ["PrefixLRUCachePolicy"]

_Rank = tuple[int, int]
_Entry = tuple[int, int, OffloadKey]


class PrefixLRUCachePolicy(CachePolicy):
    """vLLM 0.33's ``lru`` as a kv-offload policy (see the module docstring).

    * ``_blocks``: key -> status of every resident block (``fast_get`` is its ``get``);
    * ``_ranks``: key -> rank of every resident block;
    * ``_idle``: resident blocks with ``ref_cnt == 0`` (from ``mark_evictable`` /
      ``mark_non_evictable``), the only ones the heap must hold a live entry for;
    * ``_heap``: ``(major, minor, key)`` entries, live or stale;
    * ``_clock``: the last fresh rank handed out;
    * ``_requests``: the per-request records vLLM's manager would keep.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._ranks: dict[OffloadKey, _Rank] = {}
        self._idle: set[OffloadKey] = set()
        self._heap: list[_Entry] = []
        self._clock = 0
        self._requests = RequestAccessLog(self._blocks.get, self._asked)

    # -- lookups ------------------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._blocks.get  # never rebound: cleared and mutated in place

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def order(self) -> list[OffloadKey]:
        """Resident keys, the first to be evicted first (busy ones included; a snapshot)."""
        ranks = self._ranks
        return sorted(ranks, key=lambda key: (ranks[key], key))

    # -- ranks --------------------------------------------------------------------------------

    def _set_rank(self, key: OffloadKey, rank: _Rank) -> None:
        self._ranks[key] = rank
        if key in self._idle:
            heapq.heappush(self._heap, (rank[0], rank[1], key))

    def _refresh(self, keys: Iterable[OffloadKey]) -> None:
        """A fresh rank for each resident key, in order (the last one newest)."""
        ranks, idle, heap, clock = self._ranks, self._idle, self._heap, self._clock
        for key in keys:
            if key in ranks:
                clock += 1
                ranks[key] = (clock, 0)
                if key in idle:
                    heapq.heappush(heap, (clock, 0, key))
        self._clock = clock
        self._compact()

    def _request_rank(self, req_context: ReqContext) -> int:
        record = self._requests.record_of(req_context)
        if record.rank is None:
            self._clock += 1
            record.rank = self._clock
        return record.rank

    def _asked(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        """A request asked for ``keys`` for the first time: positioned resident ones move up
        to its provisional rank (never down)."""
        major = self._request_rank(req_context)
        position = req_context.get_offload_key_position
        ranks = self._ranks
        for key in keys:
            found = position(key)
            if found is None or key not in ranks:
                continue
            rank = (major, -found)
            if ranks[key] < rank:
                self._set_rank(key, rank)
        self._compact()

    def _compact(self) -> None:
        """Rebuild the heap from the idle blocks once stale entries outnumber live ones."""
        if len(self._heap) > max(64, 2 * len(self._idle)):
            ranks = self._ranks
            self._heap = [(*ranks[key], key) for key in self._idle]
            heapq.heapify(self._heap)

    # -- the policy interface -------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Stored blocks rank fresh, or provisionally when their request has their positions
        (the context is the one of the ``on_store_miss`` just before, as in the manager)."""
        requests = self._requests
        requests.settle()
        context = requests.store_context
        for key, block in zip(keys, blocks):
            self._blocks[key] = block
            found = None if context is None else context.get_offload_key_position(key)
            if context is None or found is None:
                self._clock += 1
                rank = (self._clock, 0)
            else:
                rank = (self._request_rank(context), -found)
            self._ranks[key] = rank
            if block.ref_cnt == 0:  # a manager inserts pending blocks; a put-back may not
                self._idle.add(key)
                heapq.heappush(self._heap, (rank[0], rank[1], key))
        requests.inserted(keys)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        self._requests.settle()
        self._refresh(reversed(keys if type(keys) is list else list(keys)))

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self._requests.access(keys, req_context)

    def on_store_miss(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self._requests.store_miss(keys, req_context)  # a miss ranks nothing (absent keys)

    def on_request_finished(self, req_context: ReqContext) -> None:
        finished = self._requests.finish(req_context)
        if finished is not None:
            self._refresh(reversed(finished.keys))

    def mark_evictable(self, key: OffloadKey) -> None:
        self._requests.settle()
        idle, heap = self._idle, self._heap
        idle.add(key)
        major, minor = self._ranks[key]
        heapq.heappush(heap, (major, minor, key))
        if len(heap) > 64 and len(heap) > 2 * len(idle):
            self._compact()

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._requests.settle()
        self._idle.discard(key)

    def remove(self, key: OffloadKey) -> None:
        self._requests.settle()
        if self._blocks.pop(key, None) is not None:
            del self._ranks[key]
            self._idle.discard(key)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        answer = self.evict_split(n, protected)
        return None if answer is None else list(zip(*answer))

    def evict_split(
        self, n: int, protected: set[OffloadKey]
    ) -> tuple[list[OffloadKey], list[BlockStatus]] | None:
        """The ``n`` idle, unprotected blocks of lowest rank, or ``None`` and no change."""
        self._requests.settle()
        if n <= 0:
            return [], []
        heap, ranks, idle = self._heap, self._ranks, self._idle
        chosen: list[_Entry] = []
        chosen_keys: set[OffloadKey] = set()
        skipped: list[_Entry] = []
        while heap and len(chosen) < n:
            entry = heapq.heappop(heap)
            major, minor, key = entry
            if key not in idle or ranks[key] != (major, minor) or key in chosen_keys:
                continue  # stale, or a second live entry of a key (re-marked evictable)
            if key in protected:
                skipped.append(entry)
            else:
                chosen.append(entry)
                chosen_keys.add(key)
        for entry in skipped:
            heapq.heappush(heap, entry)
        if len(chosen) < n:
            for entry in chosen:
                heapq.heappush(heap, entry)
            return None
        keys = [key for _, _, key in chosen]
        blocks = self._blocks
        victims = [blocks.pop(key) for key in keys]
        for key in keys:
            idle.remove(key)
            del ranks[key]
        self._compact()
        return keys, victims

    def clear(self) -> None:
        self._blocks.clear()
        self._ranks.clear()
        self._idle.clear()
        self._heap.clear()
        self._clock = 0
        self._requests.clear()
