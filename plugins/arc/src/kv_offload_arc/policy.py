"""The ARC policy: its layout, insertion (adapting ``p``), touches, removal and eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from itertools import groupby, islice
from operator import itemgetter, or_

from kv_offload import OffloadKey, ReqContext
from kv_offload.policies import BlockStatus, CachePolicy, KeyQueue

from . import replace
from .ghosts import GhostList

__all__ = ["ARCCachePolicy"]

_key = itemgetter(0)
_block = itemgetter(1)

_Victims = list[tuple[OffloadKey, BlockStatus]]
_Split = tuple[list[OffloadKey], list[BlockStatus]]


class ARCCachePolicy(CachePolicy):
    """Adaptive Replacement Cache: balances recency and frequency by learning from its misses.

    Layout, chosen for the manager's hot paths and for bytes per block:

    * ``_resident`` is one plain dict over T1 and T2 and ``get`` is its bound C ``get``: the
      manager calls ``get`` for every key of every request, and one probe of a dict holding
      resident blocks only is the cheapest answer, and can never return a ghost;
    * T1's order is a key queue (:mod:`kv_offload.policies.key_queue`): most stored blocks are
      first sightings that enter T1 and later leave from its front, so an append and a
      ``popleft`` are all they cost, and T1 membership needs no table of its own (resident
      and not in T2);
    * T2 is an ``OrderedDict`` of key -> block because every hit moves a key to its MRU end,
      which ``move_to_end`` does in C without leaving a tombstone;
    * B1 and B2 are :class:`~kv_offload_arc.ghosts.GhostList`\\ s.

    As the manager guarantees, inserted keys are distinct and not resident.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._resident: dict[OffloadKey, BlockStatus] = {}
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._t1: KeyQueue[OffloadKey] = KeyQueue(self._resident, unless=self._t2)
        self._b1 = GhostList()
        self._b2 = GhostList()
        self._p = 0.0

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._resident.get(key)

    def fast_get(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._resident.get  # never rebound: cleared and mutated in place

    # -- introspection (snapshots, least recently used first) ------------------------------

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
    def b1(self) -> list[OffloadKey]:
        return list(self._b1)

    @property
    def b2(self) -> list[OffloadKey]:
        return list(self._b2)

    def __len__(self) -> int:
        """Resident blocks (T1 and T2), ghosts excluded."""
        return len(self._resident)

    # -- insertion ------------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """ARC's miss cases for each key in order, except REPLACE (the manager ran ``evict``).

        The common batch is all first sightings: it goes to T1's back in bulk. Otherwise the
        batch goes in runs of ghost hits and of first sightings, because a ghost that an earlier
        key of the batch pushed out of the history is a plain miss by its turn. A run goes in
        bulk: trimming after a run of first sightings is the same as trimming after each
        (nothing in between looks at the ghosts), and a run of ghost hits needs no trimming at
        all (B1/B2 -> T2 changes neither bound).
        """
        b1 = self._b1.keys
        b2 = self._b2.keys
        if (not b1 or b1.isdisjoint(keys)) and (not b2 or b2.isdisjoint(keys)):
            self._first_sightings(keys, blocks)
            return
        # Trimming only ever drops ghosts, so a key that is no ghost now is a first sighting
        # whenever its turn comes; a ghost is checked again when its run comes up.
        start = 0
        ghosts = list(map(or_, map(b1.__contains__, keys), map(b2.__contains__, keys)))
        for ghost, run in groupby(ghosts):
            stop = start + sum(1 for _ in run)
            if ghost:
                self._ghost_run(keys[start:stop], blocks[start:stop])
            else:
                self._first_sightings(keys[start:stop], blocks[start:stop])
            start = stop

    def _ghost_run(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Keys that were ghosts when the batch arrived: the leading ones still ghosts are hits
        in bulk; one an earlier key pushed out of the history is a first sighting."""
        b1 = self._b1.keys
        b2 = self._b2.keys
        while keys:
            still = list(map(or_, map(b1.__contains__, keys), map(b2.__contains__, keys)))
            cut = still.index(False) if False in still else len(keys)
            if cut:
                self._ghost_hits(keys[:cut], blocks[:cut])
            if cut == len(keys):
                return
            self._first_sightings(keys[cut : cut + 1], blocks[cut : cut + 1])
            keys = keys[cut + 1 :]
            blocks = blocks[cut + 1 :]

    def _first_sightings(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Case IV: new keys join T1's MRU end; then the ghosts are trimmed to their bounds."""
        self._resident.update(zip(keys, blocks))
        self._t1.extend(keys)
        self._trim_ghosts()

    def _ghost_hits(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Cases II and III for a run of ghost keys: adapt p per key, then move them to T2."""
        in_b2 = list(map(self._b2.keys.__contains__, keys))
        b1_size = len(self._b1.keys)
        b2_size = len(self._b2.keys)
        p = self._p
        c = float(self.cache_capacity)
        for hit_b2 in in_b2:
            if hit_b2:
                # T2 lost this block too early: give frequency more room, and faster when
                # B2 is the smaller list (its hits are then the stronger evidence).
                p = max(0.0, p - max(1.0, b1_size / b2_size))
                b2_size -= 1
            else:  # and symmetrically, T1 lost it too early: more room for recency
                p = min(c, p + max(1.0, b2_size / b1_size))
                b1_size -= 1
        self._p = p
        self._resident.update(zip(keys, blocks))
        self._t2.update(zip(keys, blocks))
        if b1_size != len(self._b1.keys):
            self._b1.discard_many([key for key, hit in zip(keys, in_b2) if not hit])
        if b2_size != len(self._b2.keys):
            self._b2.discard_many([key for key, hit in zip(keys, in_b2) if hit])

    def _trim_ghosts(self) -> None:
        """Keep |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c, dropping the oldest ghosts.

        The bounds are what make ARC's history a fixed 2c keys: without them the ghosts of a
        scan would pile up forever and a ghost hit would say nothing about *recent* misses.
        """
        c = self.cache_capacity
        resident = len(self._resident)
        b1 = self._b1
        excess1 = resident - len(self._t2) + len(b1.keys) - c
        if excess1 > 0:
            b1.trim(excess1)
        b2 = self._b2
        excess = resident + len(b1.keys) + len(b2.keys) - 2 * c
        if excess > 0:
            from_b2 = min(excess, len(b2.keys))
            b2.trim(from_b2)
            b1.trim(excess - from_b2)

    # -- removal and recency --------------------------------------------------------------

    def remove(self, key: OffloadKey) -> None:
        # A failed store was never used: remembering it as a ghost would later adapt p on
        # the strength of a block nobody read.
        if self._resident.pop(key, None) is not None and self._t2.pop(key, None) is None:
            self._t1.forget(key)  # it was in T1

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        get = self._resident.get
        t2 = self._t2
        move_to_end = t2.move_to_end
        promoted: list[OffloadKey] = []
        key_list = keys if type(keys) is list else list(keys)
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(key_list):
            if key in t2:
                move_to_end(key)
            else:
                block = get(key)
                if block is not None:  # a second use: the block is now frequent
                    t2[key] = block
                    promoted.append(key)
        if promoted:
            self._t1.forget_many(promoted)

    # -- eviction: peek, check, then commit -----------------------------------------------

    def evict(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        answer = self.evict_split(n, protected)
        return None if answer is None else list(zip(*answer))

    def evict_split(self, n: int, protected: set[OffloadKey]) -> _Split | None:
        if n <= 0:
            return [], []
        resident = self._resident
        t2 = self._t2
        len2 = len(t2)
        if n > len(resident):
            return None
        from1, from2 = replace.split(n, len(resident) - len2, len2, self._p)
        # The common case: the oldest blocks of each list are idle and unprotected, checked
        # with C-level maps instead of a Python step per block.
        keys1 = self._t1.peek_front(from1)
        blocks1 = list(map(resident.__getitem__, keys1))
        keys2: list[OffloadKey] = []
        blocks2: list[BlockStatus] = []
        if from2:  # about one eviction in ten on the bundled trace
            keys2 = list(islice(t2, from2))
            blocks2 = list(map(t2.__getitem__, keys2))
        if (
            not BlockStatus.any_in_use(blocks1 + blocks2 if from2 else blocks1)
            and protected.isdisjoint(keys1)
            and protected.isdisjoint(keys2)
        ):
            self._t1.drop_front(from1)
            for _ in range(from2):
                t2.popitem(False)
            return self._commit(keys1, blocks1, keys2, blocks2)
        chosen = replace.scan(n, from1, self._t1, resident, t2, protected)
        if chosen is None:
            return None
        picked1, picked2 = chosen
        keys1 = list(map(_key, picked1))
        keys2 = list(map(_key, picked2))
        for key in keys2:
            del t2[key]
        victims = self._commit(keys1, list(map(_block, picked1)), keys2, list(map(_block, picked2)))
        self._t1.forget_many(keys1)  # after they left _resident, which says who is live
        return victims

    def _commit(
        self,
        keys1: list[OffloadKey],
        blocks1: list[BlockStatus],
        keys2: list[OffloadKey],
        blocks2: list[BlockStatus],
    ) -> _Split:
        """The chosen victims, already out of T1's order and T2, leave ``_resident`` and
        become ghosts of the list they left."""
        resident = self._resident
        for key in keys1:
            del resident[key]
        for key in keys2:
            del resident[key]
        if keys1:
            self._b1.add_many(keys1)
        if not keys2:
            return keys1, blocks1
        self._b2.add_many(keys2)
        return keys1 + keys2, blocks1 + blocks2

    def clear(self) -> None:
        self._resident.clear()
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b2.clear()
        self._p = 0.0
