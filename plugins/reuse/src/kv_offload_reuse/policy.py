"""The reuse-aware policy itself (the algorithm is described in :mod:`kv_offload_reuse`).

Speed tricks (C-level ``map``/``compress`` over a batch) are guarded by
``benchmarks/reuse_policy.py`` and by :mod:`kv_offload_reuse.reference`, which the tests hold
this module to step by step. The eviction memory is :mod:`kv_offload_reuse.memory`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from itertools import chain, compress, filterfalse, islice, repeat
from math import ceil
from operator import eq, itemgetter, not_, rshift

from kv_offload import ConfigError, OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy
from xxhash import xxh3_64_intdigest as stable_hash

from .duel import Miniature, sample_rate, sampled
from .memory import FROM_T1, FROM_T2, SLOTS_PER_BLOCK, WINDOW, EvictionMemory, slot_of
from .safety import MARGIN, RESUME, LRUShadow

__all__ = ["ReuseCachePolicy", "WINDOW", "SLOTS_PER_BLOCK", "MODES", "slot_of"]

#: ARC's ``p`` (the target size of T1) starts here, as a fraction of the capacity.
INITIAL_P = 0.5

_Victims = list[tuple[OffloadKey, BlockStatus]]
_key = itemgetter(0)
_block = itemgetter(1)
# Drains an iterator at C speed, for maps run only for their side effects.
#: The ways REPLACE can split the cache, one miniature each (see ``ReuseCachePolicy.mode``).
ADAPTIVE = "adaptive"
FREQUENCY = "frequency"
RECENCY = "recency"
GHOSTS = "ghosts"
MODES = (ADAPTIVE, FREQUENCY, RECENCY, GHOSTS)
_EMPTY: frozenset[OffloadKey] = frozenset()
_MAX_OPEN_REQUESTS = 4096  # sampled keys kept for requests not finished yet
_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend


def _score(mini: Miniature) -> float:
    return mini.score


class ReuseCachePolicy(CachePolicy):
    """ARC whose ghosts are a bounded hash table spanning ``WINDOW`` capacities of stores.

    * ``_resident``: key -> block over T1 and T2; ``fast_get`` returns its bound C ``get``.
    * ``_t1`` / ``_t2``: ``OrderedDict`` recency lists, least recent first (T1: blocks stored
      once and not reused; T2: blocks reused, or stored again after an eviction).
    * ``memory``: the eviction memory (:class:`~kv_offload_reuse.memory.EvictionMemory`).
    """

    #: The modes the miniatures duel between, one miniature each. Plain recency is not one of
    #: them: the safety net follows an exact LRU where recency wins, and a recency miniature
    #: made the cache switch modes mid-trace where it cost hits (README, research log: v9).
    DUELLED: tuple[str, ...] = (ADAPTIVE, FREQUENCY, GHOSTS)

    def __init__(
        self,
        cache_capacity: int,
        *,
        miniatures: bool = True,
        mode: str = ADAPTIVE,
        safety: bool = True,
    ) -> None:
        super().__init__(cache_capacity)
        self._with_miniatures = miniatures
        self._shadow = LRUShadow(cache_capacity) if safety else None
        if mode not in MODES:
            raise ConfigError(f"ReuseCachePolicy: mode must be one of {MODES}, got {mode!r}")
        self._initial_mode = mode
        self._resident: dict[OffloadKey, BlockStatus] = {}
        self._t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self.memory = EvictionMemory(cache_capacity)
        self.clear()

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._resident.get(key)

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._resident.get  # never rebound: cleared and mutated in place

    def clear(self) -> None:
        self._resident.clear()
        self._t1.clear()
        self._t2.clear()
        self.memory.clear()
        self._p = self.cache_capacity * INITIAL_P
        # The split REPLACE uses: ARC's p, or 0 while the miniature with p pinned there leads.
        self._mode = self._initial_mode
        self._sampled: dict[str, list[OffloadKey]] = {}
        self._miniatures: list[Miniature] = []
        rate = sample_rate(self.cache_capacity)
        size = self.cache_capacity // rate
        if self._with_miniatures and size >= 16:
            self._rate = rate
            self._miniatures = [
                Miniature(
                    ReuseCachePolicy(size, miniatures=False, mode=mode, safety=False),
                    size,
                    WINDOW * size,
                )
                for mode in self.DUELLED
            ]
        self._vouched: set[OffloadKey] | frozenset[OffloadKey] = _EMPTY
        # The safety net (:mod:`kv_offload_reuse.safety`): each open request's keys, the hits
        # of the cache and of its LRU shadow, the blocks requested, whether the cache follows
        # the shadow, and the resident keys the shadow does not hold (evicted first then).
        self._requested: dict[str, list[OffloadKey]] = {}
        self._hits = 0
        self._lru_hits = 0
        self._blocks = 0
        self._following_lru = False
        self._stale: dict[OffloadKey, None] = {}
        if self._shadow is not None:
            self._shadow.clear()

    # -- introspection ------------------------------------------------------------------------

    @property
    def p(self) -> float:
        """ARC's adaptive target for the size of T1, between 0 and ``cache_capacity``."""
        return self._p

    @property
    def t1(self) -> list[OffloadKey]:
        return list(self._t1)

    @property
    def t2(self) -> list[OffloadKey]:
        return list(self._t2)

    @property
    def following_lru(self) -> bool:
        """Whether eviction follows the LRU shadow now (the safety net is engaged)."""
        return self._following_lru

    @property
    def deficit(self) -> int:
        """The LRU shadow's hits less this cache's, over the requests finished so far."""
        return self._lru_hits - self._hits

    def __len__(self) -> int:
        return len(self._resident)

    def ghost_sizes(self) -> tuple[int, int]:
        """ARC's |B1| and |B2| (:meth:`EvictionMemory.ghost_sizes`)."""
        return self.memory.ghost_sizes(len(self._t1))

    def remembered(self, key: OffloadKey) -> tuple[int, int] | None:
        """``(list it left: 1 or 2, epochs since)`` if ``key``'s eviction is remembered."""
        return self.memory.remembered(key)

    # -- insertion and reuse ------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Store a request's batch, classified as it stands when the batch arrives.

        A key is its whole prefix (prefix hashes chain), so if the deepest remembered key of
        the batch was requested before, so was every key before it, remembered or not (a
        record lost to a collision): those go to T2, with the keys ``on_request_access``
        vouched for; the rest are first sightings in T1. Each remembered key is then
        consumed in order, moving ``p`` if it was still one of ARC's ghosts.
        """
        resident = self._resident
        memory = self.memory
        table = memory.table
        if len(set(keys)) != len(keys):  # never sent by the manager: one key at a time
            for key, block in zip(keys, blocks):
                self.insert_many([key], [block])
            return
        if not resident.keys().isdisjoint(keys):  # re-inserts (never sent by the manager)
            for key in keys:
                self.remove(key)
        hashes = list(map(stable_hash, keys))
        slots = list(map(memory.size.__rmod__, hashes))
        words = list(map(table.__getitem__, slots))
        # A word is 0 when empty; a record's word never is (its list bits are 2 or 3). The
        # C-level check first: no word holds the key's fingerprint (an empty word only
        # seems to when the fingerprint is 0; the exact check below then rules it out).
        vouched = self._vouched
        fingerprints = map(rshift, hashes, repeat(56))
        if not vouched and not any(map(eq, map(rshift, words, repeat(8)), fingerprints)):
            self._t1.update(zip(keys, blocks))  # the common batch: all first sightings
            resident.update(zip(keys, blocks))
            memory.count_stored(len(keys))
            return
        matches = [word != 0 and word >> 8 == h >> 56 for word, h in zip(words, hashes)]
        if True not in matches and not vouched:
            self._t1.update(zip(keys, blocks))
        else:
            found = list(compress(range(len(keys)), matches))
            ghosts = [self._consume_record(slots[i], words[i]) for i in found]
            mode = self._mode
            if mode == RECENCY:
                reused = [False] * len(keys)
            elif mode == GHOSTS:  # ARC's rule: only its own ghosts are reuses (with a prefix)
                deepest = max(compress(found, ghosts), default=-1) + 1
                reused = [i < deepest for i in range(len(keys))]
            else:
                deepest = found[-1] + 1 if found else 0
                reused = [i < deepest or key in vouched for i, key in enumerate(keys)]
            pairs = list(zip(keys, blocks))
            self._t2.update(compress(pairs, reused))
            self._t1.update(compress(pairs, map(not_, reused)))
            self._vouched = _EMPTY
        resident.update(zip(keys, blocks))
        self.memory.count_stored(len(keys))

    def _consume_record(self, slot: int, word: int) -> bool:
        """A remembered eviction came back; if it was still one of ARC's ghosts, move p
        towards the list that lost it (ARC's cases II and III) and say so."""
        origin, sizes = self.memory.consume(slot, word, len(self._t1))
        if sizes is not None:
            b1, b2 = sizes
            if origin == 0:
                self._p = min(self.cache_capacity, self._p + max(1.0, b2 / max(b1, 1)))
            else:
                self._p = max(0.0, self._p - max(1.0, b1 / max(b2, 1)))
            return True
        return False

    def on_request_access(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        """Keys before a resident one in a request's prefix were requested before (the
        resident key was stored with its prefix): note them for the store that follows, so
        they are reuses even when both the cache and the memory have lost them."""
        if self._shadow is not None:
            requested = self._requested
            requested.setdefault(req_context.req_id, []).extend(keys)
            if len(requested) > _MAX_OPEN_REQUESTS:  # requests that never finished
                del requested[next(iter(requested))]
        if self._miniatures:
            sampled_keys = sampled(keys, self._rate)
            if sampled_keys:
                pending = self._sampled
                pending.setdefault(req_context.req_id, []).extend(sampled_keys)
                if len(pending) > _MAX_OPEN_REQUESTS:  # requests that never finished
                    del pending[next(iter(pending))]
        present = list(map(self._resident.__contains__, keys))
        if True in present:
            deepest = len(present) - present[::-1].index(True)
            self._vouched = set(compress(keys[:deepest], map(not_, present)))
        else:
            self._vouched = _EMPTY

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Replay the request's sampled keys through the miniatures; follow the leader.
        Replay the whole request through the LRU shadow and keep the deficit in budget."""
        keys = self._sampled.pop(req_context.req_id, None)
        if keys:
            for mini in self._miniatures:
                mini.request(keys, req_context)
            best = max(self._miniatures, key=_score)  # the miniatures are in DUELLED order
            duelled = self.DUELLED
            mode = self._mode
            current = self._miniatures[duelled.index(mode)].score if mode in duelled else -1.0
            if best.score > current:
                self._mode = duelled[self._miniatures.index(best)]
        if self._shadow is not None:
            self._check_against_lru(self._shadow, req_context)

    def _check_against_lru(self, shadow: LRUShadow, req_context: ReqContext) -> None:
        """The safety net's step (:mod:`kv_offload_reuse.safety`): replay the request in the
        shadow, note which resident keys it no longer holds, and switch between following
        the shadow and the policy's own decisions on the budget."""
        requested = self._requested.pop(req_context.req_id, None)
        if not requested:
            return
        keys = list(dict.fromkeys(requested))  # a key reported twice was asked for once
        hits, evicted = shadow.request(keys)
        self._lru_hits += hits
        self._blocks += len(keys)
        budget = MARGIN * self._blocks - (self._lru_hits - self._hits)
        if not self._following_lru:
            if budget < 0:
                # R - S, least recent first; kept up to date only while the cache follows.
                self._following_lru = True
                held = shadow.order.__contains__
                self._stale = dict.fromkeys(filterfalse(held, chain(self._t1, self._t2)))
            return
        if budget >= RESUME * self.cache_capacity and self._mode != RECENCY:
            self._following_lru = False
            self._stale = {}
            return
        stale = self._stale
        if stale:
            _consume(map(stale.pop, keys, repeat(None)))
        if evicted:
            resident = self._resident
            stale.update(dict.fromkeys(compress(evicted, map(resident.__contains__, evicted))))

    @property
    def mode(self) -> str:
        """How the cache decides now: ``"adaptive"`` (ARC's p), ``"frequency"`` (p = 0: T1
        only cycles first sightings), ``"recency"`` (one LRU list) or ``"ghosts"`` (ARC's p,
        and only evictions still within ARC's ghost bounds are reuses, as in plain ARC: the
        long memory's older records no longer send blocks to T2, so T2 stays a protected set
        where every block is reused again, as on long agent sessions)."""
        return self._mode

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        t1 = self._t1
        t2 = self._t2
        key_list = keys if type(keys) is list else list(keys)
        self._hits += len(key_list)
        if self._mode == RECENCY:  # T1 is the one LRU list; T2 only drains
            for key in reversed(key_list):
                block = t1.pop(key, None)
                if block is None:  # not ``or``: a BlockStatus is an int, and slot 0 is falsy
                    block = t2.pop(key, None)
                if block is not None:
                    t1[key] = block
            return
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(key_list):
            if key in t2:
                t2.move_to_end(key)
            else:
                block = t1.pop(key, None)
                if block is not None:
                    t2[key] = block

    def remove(self, key: OffloadKey) -> None:
        # A failed store was never used: it leaves no memory of an eviction.
        if self._resident.pop(key, None) is not None and self._t1.pop(key, None) is None:
            del self._t2[key]
        self._stale.pop(key, None)

    # -- eviction -----------------------------------------------------------------------------

    def evict(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        """ARC's REPLACE, n times: T1's LRU while |T1| > p, else T2's; the other list when the
        preferred one has no idle, unprotected block left. All or nothing."""
        if n <= 0:
            return []
        if n > len(self._resident):
            return None
        if self._following_lru and self._shadow is not None:
            return self._evict_following(n, protected, self._shadow)
        t1 = self._t1
        t2 = self._t2
        mode = self._mode
        if mode == FREQUENCY:
            p = 0.0
        elif mode == RECENCY:
            p = float(self.cache_capacity)
        else:  # adaptive and ghosts: ARC's p
            p = self._p
        from1 = min(n, max(0, ceil(len(t1) - p)))
        if n - from1 > len(t2):
            from1 = n - len(t2)
        # Fast path, the common case: the oldest blocks of each list are idle and unprotected,
        # which C-level maps check without a Python step per block.
        picked1 = list(islice(t1.items(), from1))
        picked2 = list(islice(t2.items(), n - from1))
        picked = picked1 + picked2
        if not BlockStatus.any_in_use(list(map(_block, picked))) and protected.isdisjoint(
            map(_key, picked)
        ):
            self._forget(picked1, t1, FROM_T1)
            self._forget(picked2, t2, FROM_T2)
            return picked
        return self._evict_scanning(n, protected, from1)

    def _evict_scanning(self, n: int, protected: set[OffloadKey], from1: int) -> _Victims | None:
        """REPLACE that steps over pinned, pending and protected blocks."""
        t1 = self._t1
        t2 = self._t2
        idle1 = ((key, b) for key, b in t1.items() if b.ref_cnt == 0 and key not in protected)
        idle2 = ((key, b) for key, b in t2.items() if b.ref_cnt == 0 and key not in protected)
        picked1 = list(islice(idle1, from1))
        picked2 = list(islice(idle2, n - len(picked1)))
        missing = n - len(picked1) - len(picked2)
        if missing:
            picked1 += islice(idle1, missing)
            if len(picked1) + len(picked2) < n:
                return None
        # The generators are abandoned here, before the lists they walk change.
        self._forget(picked1, t1, FROM_T1)
        self._forget(picked2, t2, FROM_T2)
        return picked1 + picked2

    def _evict_following(
        self, n: int, protected: set[OffloadKey], shadow: LRUShadow
    ) -> _Victims | None:
        """The safety net's REPLACE: resident blocks the LRU shadow no longer holds first,
        then the shadow's least recent; blocks neither knows (stored by a request not finished
        yet) last, T1's before T2's. All or nothing."""
        resident = self._resident
        # Fast path, the common case: the first n candidates (the stale keys, then the
        # resident keys in the shadow's order: the two never share a key) are idle and
        # unprotected, which C-level maps check without a Python step per block.
        front = list(islice(chain(self._stale, filter(resident.__contains__, shadow.order)), n))
        if len(front) == n:
            blocks = list(map(resident.__getitem__, front))
            if not BlockStatus.any_in_use(blocks) and protected.isdisjoint(front):
                return self._forget_picked(list(zip(front, blocks)))
        picked: dict[OffloadKey, BlockStatus] = {}

        def take(candidates: Iterable[OffloadKey]) -> bool:
            for key in candidates:
                block = resident.get(key)
                if (
                    block is not None
                    and block.ref_cnt == 0
                    and key not in protected
                    and key not in picked
                ):
                    picked[key] = block
                    if len(picked) == n:
                        return True
            return False

        if not (take(self._stale) or take(shadow.order) or take(self._t1) or take(self._t2)):
            return None
        return self._forget_picked(list(picked.items()))

    def _forget_picked(self, victims: _Victims) -> _Victims:
        """:meth:`_forget` for victims from either list; returns them."""
        t1 = self._t1
        in_t1 = list(map(t1.__contains__, map(_key, victims)))
        self._forget(list(compress(victims, in_t1)), t1, FROM_T1)
        self._forget(list(compress(victims, map(not_, in_t1))), self._t2, FROM_T2)
        return victims

    def _forget(
        self, victims: _Victims, listed: OrderedDict[OffloadKey, BlockStatus], origin: int
    ) -> None:
        """Drop victims from their list and remember each eviction in the table."""
        if not victims:
            return
        keys = list(map(_key, victims))
        _consume(map(listed.__delitem__, keys))
        _consume(map(self._resident.__delitem__, keys))
        if self._stale:
            _consume(map(self._stale.pop, keys, repeat(None)))
        self.memory.remember(keys, origin)
