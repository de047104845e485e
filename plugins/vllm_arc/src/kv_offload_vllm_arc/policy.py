"""The policy: vLLM 0.33's ARC variant on kv-offload's policy interface."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy, RequestAccessLog

__all__ = ["VLLMARCCachePolicy"]

_Entries = Iterator[tuple[OffloadKey, BlockStatus]]


class VLLMARCCachePolicy(CachePolicy):
    """ARC as vLLM 0.33's ``arc`` runs it (see the package docstring for how it differs from
    the textbook ``arc``).

    * ``_resident``: key -> block over T1 and T2 (``fast_get`` is its ``get``: one probe, never
      a ghost);
    * ``_t1`` / ``_t2``: key -> block, least recently used first;
    * ``_b1`` / ``_b2``: ghost keys, least recently evicted (or re-missed) first;
    * ``_target``: the adaptive target size of T1, a float between 0 and the capacity;
    * ``_requests``: the per-request records vLLM's manager keeps (which keys a request asked
      for, head to tail; which it only inserted; which it reused).
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._resident: dict[OffloadKey, BlockStatus] = {}
        self._t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._target = 0.0
        self._requests = RequestAccessLog(self._resident.get)

    # -- introspection (snapshots, least recent first) -------------------------------------

    @property
    def target(self) -> float:
        """The adaptive target size of T1."""
        return self._target

    @property
    def t1(self) -> list[OffloadKey]:
        return list(self._t1)

    @property
    def t2(self) -> list[OffloadKey]:
        return list(self._t2)

    @property
    def b1(self) -> list[OffloadKey]:
        return list(self._b1)

    @property
    def b2(self) -> list[OffloadKey]:
        return list(self._b2)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._resident.get(key)

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._resident.get  # never rebound: cleared and mutated in place

    def __len__(self) -> int:
        return len(self._resident)

    # -- adaptation ---------------------------------------------------------------------------

    def _ghost_hit(self, key: OffloadKey) -> None:
        """A ghost asked for again: grow T1's target on a B1 ghost, shrink it on a B2 ghost
        (by the other list's size over this one's, at least 1), and make it the newest ghost.
        The ghost stays until the key is stored again."""
        b1, b2 = self._b1, self._b2
        if key in b1:
            step = max(1, len(b2) / len(b1))
            self._target = min(self._target + step, self.cache_capacity)
            b1.move_to_end(key)
        elif key in b2:
            step = max(1, len(b1) / len(b2))
            self._target = max(self._target - step, 0)
            b2.move_to_end(key)

    # -- the policy interface -------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """New blocks enter T1 as its newest; a stored key stops being a ghost."""
        self._requests.settle()
        for key, block in zip(keys, blocks):
            self._resident[key] = block
            self._t1[key] = block
            self._b1.pop(key, None)
            self._b2.pop(key, None)
        self._requests.inserted(keys)

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self._requests.access(keys, req_context)

    def on_store_miss(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        """A request's first miss of a ghost key adapts the target (a key that misses again in
        a later store of the same request does not count twice)."""
        for key in reversed(self._requests.store_miss(keys, req_context)):
            self._ghost_hit(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """An explicit touch is a use: a ready T1 block moves to T2, a T2 block to T2's newest
        end, a block still being stored to T1's newest end, a ghost adapts the target."""
        self._requests.settle()
        t1, t2 = self._t1, self._t2
        for key in reversed(keys if type(keys) is list else list(keys)):
            block = t1.pop(key, None)
            if block is not None:
                if block.ref_cnt < 0:
                    t1[key] = block
                else:
                    t2[key] = block
            elif key in t2:
                t2.move_to_end(key)
            else:
                self._ghost_hit(key)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request's one access, tail first so its head ends the newest: a block it only
        inserted moves to the newest end of the list it is in (a store is not a second use);
        a block it reused moves to T2's newest end; nothing else moves."""
        finished = self._requests.finish(req_context)
        if finished is None:
            return
        t1, t2 = self._t1, self._t2
        inserted, reused = finished.insertion_only, finished.reused
        for key in reversed(finished.keys):
            if key in inserted:
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    t2.move_to_end(key)
            elif key in reused:
                block = t1.pop(key, None)
                if block is not None:
                    t2[key] = block
                elif key in t2:
                    t2.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        """A failed store: the block goes, leaving no ghost."""
        self._requests.settle()
        if self._resident.pop(key, None) is not None and self._t1.pop(key, None) is None:
            del self._t2[key]

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """``n`` idle, unprotected victims, or ``None`` and no change.

        Each victim comes from T1 while T1 (less the victims taken from it so far) is at least
        its target, else from T2, else from T1 after all; each list is walked once, oldest
        first, skipping busy and protected blocks. Victims become their list's newest ghosts,
        and each ghost list is then cut to the capacity, oldest first.
        """
        self._requests.settle()
        if n <= 0:
            return []

        def idle(entries: _Entries) -> tuple[OffloadKey, BlockStatus] | None:
            for key, block in entries:
                if block.ref_cnt == 0 and key not in protected:
                    return key, block
            return None

        t1_walk: _Entries = iter(self._t1.items())
        t2_walk: _Entries = iter(self._t2.items())
        t1_size = len(self._t1)
        target = int(self._target)
        chosen: list[tuple[OffloadKey, BlockStatus, bool]] = []
        for _ in range(n):
            found = idle(t1_walk) if t1_size >= target else None
            from_t1 = found is not None
            if found is None:
                found = idle(t2_walk)
            if found is None:
                found = idle(t1_walk)
                from_t1 = True
                if found is None:
                    return None
            if from_t1:
                t1_size -= 1
            chosen.append((found[0], found[1], from_t1))

        victims = []
        for key, block, from_t1 in chosen:
            del self._resident[key]
            if from_t1:
                del self._t1[key]
                self._b1[key] = None
            else:
                del self._t2[key]
                self._b2[key] = None
            victims.append((key, block))
        for ghosts in (self._b1, self._b2):
            for _ in range(len(ghosts) - self.cache_capacity):
                ghosts.popitem(last=False)
        return victims

    def clear(self) -> None:
        self._resident.clear()
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b2.clear()
        self._target = 0.0
        self._requests.clear()
