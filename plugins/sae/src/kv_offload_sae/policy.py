"""Session-aware eviction: resident blocks grouped into sessions by prefix sharing, the worst
session evicted first, its tail first.

Why: LRU and ARC treat blocks as independent, but a prefix cache hits a leading run of a
request's blocks, so a conversation's blocks are worth something only as a chain. LRU ranks a
request's freshly stored tail newer than the hits it continues, so the first blocks of an idle
conversation go before its last ones and leave them worthless. vLLM PR #50422 (Session-Aware
Eviction) groups a request's blocks into a session and evicts the worst session first, tail
first, so shared prefixes outlive their suffixes; this policy follows that design, with the
sessions inferred from the keys alone (a trace or an engine request carries no session id).

The model:

* a *session* is a chain of resident blocks, head to tail, each block the continuation of the
  one before (:mod:`.sessions` names a stored block's predecessor from its request's key
  order). A stored block whose predecessor is a session's tail extends that session; one
  whose predecessor is absent (or who has none) starts a new session;
* where requests share a prefix and then part (two conversations under one system prompt,
  a conversation edited at some turn) sessions form a tree: a block continuing a session's
  tail that already has a branch, or a block in the middle of a session, starts a new session
  under it, and a session continued from its middle is first split there into its head (the
  shared part, the parent) and its rest (a branch). Every block is in exactly one session;
* the clock counts requests. A session stored into or touched, with every session above it
  (a shared prefix is used whenever a branch is), was *used* now; the time since its
  previous use is a sample of its *gap*, the requests between its uses (its own average over
  its uses, the trace's typical gap for a session used once so far). Its score is its
  predicted next use, last use plus gap;
* the worst session is, in this order: an *overdue* one, idle for more than :data:`OVERDUE`
  times its gap (a conversation that has most likely ended), the longest overdue first; a
  session expected back later than the *horizon*, the requests it takes to store a cache's
  worth of blocks (it would not survive until then in LRU order either), the furthest
  first, as Belady's optimum evicts the block needed last: under a working set larger than
  the cache, LRU evicts exactly the sessions about to return, this keeps them; then the
  least recently used. Only sessions with no branch (the leaves) are taken, deeper first on
  a tie, so branches go before the prefixes they hang from; eviction takes the worst
  session's blocks from its tail towards its head, stepping over busy and protected blocks,
  then the next worst session's, until it has ``n``. Only when the leaves cannot give ``n``
  are the other sessions taken, least recently used first;
* an evicted block is remembered (its session's last use and gap, at most as many blocks as
  the cache holds, oldest forgotten first): a session that starts with a remembered block
  is the session that was evicted, coming back, and keeps what it had learnt, so gaps are
  learnt from misses too, not only from hits.

Sessions sit in three min-heaps, by deadline (last use plus :data:`OVERDUE` gaps), by
predicted next use (furthest first) and by last use, with lazy deletion: an entry whose
session has been used or split since, or has no blocks left, is dropped when it reaches the
top, and the heaps are rebuilt once they hold twice as many entries as sessions.
:mod:`.reference` states the same rules by sorting every session at every eviction; the
tests hold the two to the same decisions step by step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from math import inf

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy

from .sessions import TrailBook

__all__ = ["OVERDUE", "TYPICAL_GAP_WEIGHT", "Session", "SessionAwareCachePolicy"]

_Entry = tuple[float, int, int, "Session"]
_Split = tuple[list[OffloadKey], list[BlockStatus]]

#: A session idle for more than this many of its gaps is taken as ended.
OVERDUE = 2.0
#: The weight of a new sample in the trace's typical gap (an exponential average).
TYPICAL_GAP_WEIGHT = 0.125
#: Heap entries allowed beyond twice the live sessions before the heaps are rebuilt.
_HEAP_SLACK = 64


class Session:
    """A chain of resident blocks, head to tail.

    ``parent``: the session this one branches from (``None`` for a root); ``branches``: how
    many sessions branch from this one's tail and still have blocks; ``base``: how many
    blocks precede the head in the prompt as far as the tree knows (0 for a root);
    ``last``: the request that last used it; ``gap``: its average gap between uses (``None``
    before its second use); ``expect``: the gap its predictions use; ``sid``: creation order.
    """

    __slots__ = ("base", "branches", "chain", "expect", "gap", "last", "parent", "sid")

    def __init__(
        self,
        chain: list[OffloadKey],
        parent: Session | None,
        base: int,
        last: int,
        expect: float,
        sid: int,
    ) -> None:
        self.chain = chain
        self.parent = parent
        self.branches = 0
        self.base = base
        self.last = last
        self.gap: float | None = None
        self.expect = expect
        self.sid = sid

    def deadline(self) -> _Entry:
        """When it becomes overdue (earliest first)."""
        return (self.last + OVERDUE * self.expect, -self.base, self.sid, self)

    def next_use(self) -> _Entry:
        """Its predicted next use, negated (furthest first)."""
        return (-(self.last + self.expect), -self.base, self.sid, self)

    def recency(self) -> _Entry:
        """Its last use (least recent first)."""
        return (self.last, -self.base, self.sid, self)


class SessionAwareCachePolicy(CachePolicy):
    """Session-aware eviction (see the module docstring).

    * ``_blocks``: key -> status of every resident block (``fast_get`` is its ``get``);
    * ``_session_of``: key -> the session holding it; ``_sessions``: id -> every session
      with blocks;
    * ``_by_deadline``, ``_by_next_use``: the sessions' heaps, with stale entries;
    * ``_typical_gap``: the trace's typical gap; ``_trails``: each request's key order and
      the request clock.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._session_of: dict[OffloadKey, Session] = {}
        self._sessions: dict[int, Session] = {}
        self._by_deadline: list[_Entry] = []
        self._by_next_use: list[_Entry] = []
        self._by_recency: list[_Entry] = []
        self._stored = 0
        self._typical_gap = 0.0
        self._sids = 0
        self._trails = TrailBook()
        self._ghosts: dict[OffloadKey, tuple[int, float | None]] = {}

    # -- lookups ------------------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._blocks.get  # never rebound: cleared and mutated in place

    def __len__(self) -> int:
        return len(self._blocks)

    def sessions(self) -> list[list[OffloadKey]]:
        """Every session's chain, head to tail, oldest session first (a snapshot)."""
        return [list(s.chain) for s in self._sessions.values()]

    # -- the request's callbacks --------------------------------------------------------------

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self._trails.access(keys, req_context)

    def on_store_miss(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self._trails.store_miss(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._trails.finish(req_context)

    # -- stores and uses ----------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Add absent, distinct keys, each to the session of its predecessor (see the module
        docstring), all used now."""
        if not keys:
            return
        now = self._trails.now()
        predecessors = self._trails.predecessors(keys)
        self._stored += len(keys)
        self._blocks.update(zip(keys, blocks))
        for key, before in zip(keys, predecessors):
            self._used(self._attach(key, before, now), now)
        self._compact_if_sparse()

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        now = self._trails.now()
        session_of = self._session_of
        for key in keys:
            session = session_of.get(key)
            if session is not None and session.last != now:
                self._used(session, now)
        self._compact_if_sparse()

    def _attach(self, key: OffloadKey, before: OffloadKey | None, now: int) -> Session | None:
        """Put ``key`` in the session its predecessor ``before`` is in, or in a new one;
        returns the session that was used (a new session is born used now, the sessions
        above it are not yet; one that starts with an evicted block takes that block's
        last use and gap, and learns the gap since)."""
        ghost = self._ghosts.pop(key, None)
        parent = None if before is None else self._session_of.get(before)
        if parent is not None and parent.chain[-1] == before and not parent.branches:
            parent.chain.append(key)  # the conversation goes on
            self._session_of[key] = parent
            return parent
        if parent is None or before is None:
            session = self._new_session([key], None, 0, now)
        else:
            if parent.chain[-1] != before:
                parent = self._split(parent, before)
            session = self._new_session([key], parent, parent.base + len(parent.chain), now)
            parent.branches += 1
        self._session_of[key] = session
        if ghost is None:
            return parent
        # The block was evicted: the session it was in returns, and so does what it taught.
        session.last, session.gap = ghost
        return session

    def _new_session(
        self, chain: list[OffloadKey], parent: Session | None, base: int, now: int
    ) -> Session:
        self._sids += 1
        session = Session(chain, parent, base, now, self._typical_gap, self._sids)
        self._sessions[session.sid] = session
        self._push(session)
        return session

    def _split(self, session: Session, last: OffloadKey) -> Session:
        """Cut ``session`` after ``last``: the head becomes a new session, the parent of the
        rest (which keeps its branches); returns the head."""
        cut = session.chain.index(last) + 1
        self._sids += 1
        head = Session(
            session.chain[:cut], session.parent, session.base, session.last, session.expect,
            self._sids,
        )  # fmt: skip
        head.gap = session.gap
        head.branches = 1
        self._sessions[head.sid] = head
        session.chain = session.chain[cut:]
        session.parent = head
        session.base += cut
        self._push(head)
        self._push(session)  # its old entries are stale (another base)
        session_of = self._session_of
        for key in head.chain:
            session_of[key] = head
        return head

    def _used(self, session: Session | None, now: int) -> None:
        """``session`` and every session above it were used now: each learns the gap since
        its previous use."""
        weight = TYPICAL_GAP_WEIGHT
        while session is not None and session.chain and session.last != now:
            sample = now - session.last
            session.gap = sample if session.gap is None else (session.gap + sample) / 2
            self._typical_gap += weight * (sample - self._typical_gap)
            session.last = now
            session.expect = session.gap
            self._push(session)
            session = session.parent

    def _push(self, session: Session) -> None:
        heapq.heappush(self._by_deadline, session.deadline())
        heapq.heappush(self._by_next_use, session.next_use())
        heapq.heappush(self._by_recency, session.recency())

    def _compact_if_sparse(self) -> None:
        # Each heap drops its stale entries only when it is read, and evictions read the
        # deadline heap most: every heap's length counts, or the others would grow unbounded.
        longest = max(len(self._by_deadline), len(self._by_next_use), len(self._by_recency))
        if longest > 2 * len(self._sessions) + _HEAP_SLACK:
            live = self._sessions.values()
            self._by_deadline = [s.deadline() for s in live]
            self._by_next_use = [s.next_use() for s in live]
            self._by_recency = [s.recency() for s in live]
            heapq.heapify(self._by_deadline)
            heapq.heapify(self._by_next_use)
            heapq.heapify(self._by_recency)

    # -- removal and eviction -----------------------------------------------------------------

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is None:
            return
        session = self._session_of.pop(key)
        session.chain.remove(key)
        if not session.chain:
            self._ended(session)

    def _ended(self, session: Session) -> None:
        """``session`` has no blocks left."""
        del self._sessions[session.sid]
        if session.parent is not None:
            session.parent.branches -= 1

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        answer = self.evict_split(n, protected)
        return None if answer is None else list(zip(*answer))

    def evict_split(self, n: int, protected: set[OffloadKey]) -> _Split | None:
        """``n`` idle, unprotected blocks of the worst sessions, tail first, or ``None``.

        The heaps' top entries are taken off while victims are chosen and put back whatever
        the answer (only stale entries are dropped), so a ``None`` changes nothing."""
        if n <= 0:
            return [], []
        blocks = self._blocks
        if n > len(blocks):
            return None
        now = self._trails.requests
        chosen: list[OffloadKey] = []
        picked: set[OffloadKey] = set()
        order: list[Session] = []

        def take(session: Session) -> None:
            before = len(chosen)
            for key in reversed(session.chain):
                if key not in picked and blocks[key].ref_cnt == 0 and key not in protected:
                    chosen.append(key)
                    picked.add(key)
                    if len(chosen) == n:
                        break
            if len(chosen) > before:
                order.append(session)

        popped_deadline = self._pop_worst(
            self._by_deadline, Session.deadline, take, lambda e: e[0] < now, n, chosen
        )
        # Requests it takes to store a cache's worth of blocks: a session expected back later
        # than that would not survive until then in LRU order either.
        horizon = now + self.cache_capacity * now / self._stored if self._stored else inf
        popped_next = self._pop_worst(
            self._by_next_use, Session.next_use, take, lambda e: -e[0] > horizon, n, chosen
        )
        popped_recency = self._pop_worst(
            self._by_recency, Session.recency, take, lambda e: True, n, chosen
        )
        popped = (popped_deadline, popped_next, popped_recency)
        if len(chosen) < n:
            rest = sorted(self._sessions.values(), key=lambda s: s.recency()[:3])
            for session in rest:
                take(session)
                if len(chosen) == n:
                    break
        if len(chosen) < n:
            self._restore(*popped)
            return None
        statuses = [blocks.pop(key) for key in chosen]
        session_of = self._session_of
        for session in dict.fromkeys(order):
            chain = session.chain
            session.chain = [key for key in chain if key not in picked]
            if not session.chain:
                self._ended(session)
        ghosts = self._ghosts
        for key in chosen:
            session = session_of.pop(key)
            ghosts[key] = (session.last, session.gap)
        while len(ghosts) > self.cache_capacity:
            del ghosts[next(iter(ghosts))]
        self._restore(*popped)
        return chosen, statuses

    @staticmethod
    def _pop_worst(
        heap: list[_Entry],
        entry_of: Callable[[Session], _Entry],
        take: Callable[[Session], None],
        eligible: Callable[[_Entry], bool],
        n: int,
        chosen: list[OffloadKey],
    ) -> list[_Entry]:
        """Offer the leaves to ``take`` in the heap's order while ``eligible`` and victims are
        missing; returns the valid entries taken off (stale ones are dropped)."""
        popped: list[_Entry] = []
        while len(chosen) < n and heap:
            entry = heap[0]
            session = entry[3]
            if not session.chain or entry[:3] != entry_of(session)[:3]:
                heapq.heappop(heap)  # stale: used or split since, or no blocks left
                continue
            if not eligible(entry):
                break
            popped.append(heapq.heappop(heap))
            if not session.branches:
                take(session)
        return popped

    def _restore(self, *popped: list[_Entry]) -> None:
        heaps = (self._by_deadline, self._by_next_use, self._by_recency)
        for heap, entries in zip(heaps, popped):
            for entry in entries:
                if entry[3].chain:
                    heapq.heappush(heap, entry)

    def clear(self) -> None:
        self._blocks.clear()
        self._session_of.clear()
        self._sessions.clear()
        self._by_deadline.clear()
        self._by_next_use.clear()
        self._by_recency.clear()
        self._stored = 0
        self._typical_gap = 0.0
        self._sids = 0
        self._trails.clear()
        self._ghosts.clear()
