"""Session-aware eviction stated plainly: the oracle
:class:`~kv_offload_sae.SessionAwareCachePolicy` is tested against.

Same contract and same decisions as the shipped policy, one rule per line: sessions are plain
records in one dict, and every eviction sorts them, where the shipped policy keeps two heaps
with lazy deletion. The predecessor of a stored block comes from the same
:class:`~kv_offload_sae.sessions.TrailBook`. It is not an entry point; register it to run it
through a manager::

    CachePolicyFactory.register_cache_policy(
        "sae-reference", "kv_offload_sae.reference", "ReferenceSessionAwarePolicy"
    )
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from math import inf

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy

from .policy import OVERDUE, TYPICAL_GAP_WEIGHT
from .sessions import TrailBook

__all__ = ["ReferenceSessionAwarePolicy", "SessionRecord"]


@dataclass(eq=False)
class SessionRecord:
    sid: int
    chain: list[OffloadKey]
    parent: int | None
    base: int
    last: int
    expect: float
    gap: float | None = None
    branches: int = 0
    ended: bool = field(default=False)


class ReferenceSessionAwarePolicy(CachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.blocks: dict[OffloadKey, BlockStatus] = {}
        self.session_of: dict[OffloadKey, int] = {}
        self.sessions: dict[int, SessionRecord] = {}  # every session ever made, ended too
        self.typical_gap = 0.0
        self.trails = TrailBook()
        self.ghosts: dict[OffloadKey, tuple[int, float | None]] = {}  # oldest first
        self.stored = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.blocks.get(key)

    def live(self) -> list[SessionRecord]:
        return [s for s in self.sessions.values() if not s.ended]

    def chains(self) -> list[list[OffloadKey]]:
        return [list(s.chain) for s in sorted(self.live(), key=lambda s: s.sid)]

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self.trails.access(keys, req_context)

    def on_store_miss(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self.trails.store_miss(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.trails.finish(req_context)

    def new_session(
        self, chain: list[OffloadKey], parent: int | None, base: int, last: int, expect: float
    ) -> SessionRecord:
        sid = len(self.sessions) + 1
        record = SessionRecord(sid, chain, parent, base, last, expect)
        self.sessions[sid] = record
        for key in chain:
            self.session_of[key] = sid
        return record

    def used(self, sid: int | None, now: int) -> None:
        """The session and every live session above it, until one already used now."""
        while sid is not None:
            s = self.sessions[sid]
            if s.ended or s.last == now:
                return
            sample = now - s.last
            s.gap = sample if s.gap is None else (s.gap + sample) / 2
            self.typical_gap += TYPICAL_GAP_WEIGHT * (sample - self.typical_gap)
            s.last = now
            s.expect = s.gap
            sid = s.parent

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        if not keys:
            return
        now = self.trails.now()
        self.stored += len(keys)
        for key, block, before in zip(keys, blocks, self.trails.predecessors(keys)):
            self.blocks[key] = block
            ghost = self.ghosts.pop(key, None)
            owner = None if before is None else self.session_of.get(before)
            if owner is None or before is None:
                new = self.new_session([key], None, 0, now, self.typical_gap)
                if ghost is not None:
                    new.last, new.gap = ghost
                    self.used(new.sid, now)
                continue
            s = self.sessions[owner]
            if s.chain[-1] == before and s.branches == 0:
                s.chain.append(key)
                self.session_of[key] = owner
                self.used(owner, now)
                continue
            if s.chain[-1] != before:  # split s after `before`: its head is the parent
                cut = s.chain.index(before) + 1
                head = self.new_session(s.chain[:cut], s.parent, s.base, s.last, s.expect)
                head.gap = s.gap
                head.branches = 1
                s.chain = s.chain[cut:]
                s.parent = head.sid
                s.base += cut
                s = head
            new = self.new_session([key], s.sid, s.base + len(s.chain), now, self.typical_gap)
            s.branches += 1
            if ghost is not None:
                new.last, new.gap = ghost
                self.used(new.sid, now)
            else:
                self.used(s.sid, now)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        now = self.trails.now()
        for key in keys:
            if key in self.session_of:
                self.used(self.session_of[key], now)

    def remove(self, key: OffloadKey) -> None:
        if self.blocks.pop(key, None) is None:
            return
        s = self.sessions[self.session_of.pop(key)]
        s.chain.remove(key)
        if not s.chain:
            self.end(s)

    def end(self, s: SessionRecord) -> None:
        s.ended = True
        if s.parent is not None:
            self.sessions[s.parent].branches -= 1

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if n <= 0:
            return []
        now = self.trails.requests
        live = self.live()
        leaves = [s for s in live if s.branches == 0]
        overdue = [s for s in leaves if s.last + OVERDUE * s.expect < now]
        order = sorted(overdue, key=lambda s: (s.last + OVERDUE * s.expect, -s.base, s.sid))
        horizon = now + self.cache_capacity * now / self.stored if self.stored else inf
        beyond = [s for s in leaves if s.last + s.expect > horizon]
        order += sorted(beyond, key=lambda s: (-(s.last + s.expect), -s.base, s.sid))
        order += sorted(leaves, key=lambda s: (s.last, -s.base, s.sid))
        order += sorted(live, key=lambda s: (s.last, -s.base, s.sid))
        chosen: list[OffloadKey] = []
        for s in order:
            for key in reversed(s.chain):
                if len(chosen) == n:
                    break
                if key not in chosen and self.blocks[key].ref_cnt == 0 and key not in protected:
                    chosen.append(key)
        if len(chosen) < n:
            return None
        victims = [(key, self.blocks.pop(key)) for key in chosen]
        for key in chosen:
            s = self.sessions[self.session_of.pop(key)]
            self.ghosts[key] = (s.last, s.gap)  # what an evicted block remembers
            s.chain.remove(key)
            if not s.chain:
                self.end(s)
        while len(self.ghosts) > self.cache_capacity:
            del self.ghosts[next(iter(self.ghosts))]
        return victims

    def clear(self) -> None:
        self.blocks.clear()
        self.session_of.clear()
        self.sessions.clear()
        self.typical_gap = 0.0
        self.trails.clear()
        self.ghosts.clear()
        self.stored = 0
