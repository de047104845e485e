"""Adaptive Replacement Cache eviction for kv-offload (entry point ``kv_offload.policies: arc``).

ARC (Megiddo & Modha, FAST'03) splits the cache between blocks seen once recently (T1) and
blocks seen at least twice (T2), and remembers the keys it recently evicted from each (the
ghost lists B1 and B2). A miss on a ghost key means that side of the cache was too small, so
the target size ``p`` of T1 moves towards it. One-time keys only ever cycle through T1, which is
what keeps a long scan from flushing the frequently used blocks in T2.

Adapting ARC to the manager's contract changes when things happen, not what happens:

* the manager evicts *before* it inserts the keys that caused the misses, so ``evict`` applies
  ARC's REPLACE rule with the current ``p``, and ``insert``/``insert_many`` do the adaptation
  of ``p`` and the promotion of ghost keys to T2;
* REPLACE skips blocks that are pinned, pending or protected, taking the next block of the same
  list and falling back to the other list when the preferred one has none left;
* only insertions can push the ghost lists past their bounds (an eviction moves a key from T1
  to B1 or from T2 to B2, which changes neither bound), so the ghosts are trimmed there.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Container, Iterable, Iterator
from itertools import compress, filterfalse, groupby, islice, repeat, starmap
from math import ceil
from operator import add, attrgetter, itemgetter, not_, or_

from kv_offload import BlockStatus, CachePolicy, OffloadKey, ReqContext

__all__ = ["ARCCachePolicy"]

_key = itemgetter(0)
_block = itemgetter(1)
_ref_cnt = attrgetter("ref_cnt")
# Drains an iterator at C speed, for maps run only for their side effects.
_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend
_NO_ARGS = ()
# Tombstones a queue may hold beyond a quarter of its live keys before it is rebuilt; the slack
# keeps small caches from rebuilding on every other call.
_COMPACT_SLACK = 256

_Victims = list[tuple[OffloadKey, BlockStatus]]


class _KeyQueue:
    """Keys oldest first, with O(1) removal of any key by leaving a tombstone behind.

    T1 and the ghost lists only ever grow at the back and shrink at the front, except for the
    odd key leaving from the middle (a promotion, a ghost hit, a failed store). A ``deque`` of
    keys costs 8 bytes per entry and appends/pops at C speed, a fraction of an ``OrderedDict``
    node, so the middle removals are made lazy instead: the key's entry stays in the deque and
    ``stale`` counts it. A key is only appended when it (re)joins the list, so its stale
    entries always precede its live one, and popping from the front can tell them apart by
    the count alone. Membership is the owner's business (a dict or set it already has).
    """

    __slots__ = ("order", "stale")

    def __init__(self) -> None:
        self.order: deque[OffloadKey] = deque()
        self.stale: dict[OffloadKey, int] = {}

    def forget(self, key: OffloadKey) -> None:
        """The live entry of ``key`` becomes a tombstone."""
        stale = self.stale
        stale[key] = stale.get(key, 0) + 1

    def pop_front(self, count: int) -> list[OffloadKey]:
        """Remove and return the ``count`` oldest live keys (the caller knows there are that
        many), dropping the tombstones met on the way."""
        order = self.order
        popped = list(starmap(order.popleft, repeat(_NO_ARGS, count)))
        stale = self.stale
        if not stale or stale.keys().isdisjoint(popped):
            return popped
        live = self._without_tombstones(popped)
        while len(live) < count:
            more = list(starmap(order.popleft, repeat(_NO_ARGS, count - len(live))))
            live += more if stale.keys().isdisjoint(more) else self._without_tombstones(more)
        return live

    def _without_tombstones(self, popped: list[OffloadKey]) -> list[OffloadKey]:
        """``popped`` (just taken from the front) minus its tombstones, which are forgotten."""
        stale = self.stale
        get = stale.get
        live: list[OffloadKey] = []
        append = live.append
        for key in popped:
            times = get(key)
            if times is None:
                append(key)
            elif times == 1:
                del stale[key]
            else:
                stale[key] = times - 1
        return live

    def push_front(self, keys: list[OffloadKey]) -> None:
        """Undo :meth:`pop_front` (the dropped tombstones were garbage and stay dropped)."""
        self.order.extendleft(reversed(keys))

    def __iter__(self) -> Iterator[OffloadKey]:
        """Live keys, oldest first; the queue must not change while this runs."""
        stale = self.stale
        if not stale:
            yield from self.order
            return
        skipped: dict[OffloadKey, int] = {}
        for key in self.order:
            dead = stale.get(key, 0)
            if dead and skipped.get(key, 0) < dead:
                skipped[key] = skipped.get(key, 0) + 1
            else:
                yield key

    def compact_if_sparse(
        self, live: int, members: Container[OffloadKey], unless: Container[OffloadKey] = ()
    ) -> None:
        """Rebuild without tombstones once they pass a quarter of the live keys.

        Tombstones at the front go as it is popped, but a list whose front rarely moves (T1
        while ARC evicts from T2, B2 while B1 is trimmed) would keep them, and each costs a
        ``stale`` entry, several times a deque slot. A rebuild is linear, so doing it only
        after that many new tombstones keeps its cost constant per tombstone. It needs no
        counts: a live key's entry is its last one, and the owner's membership (in
        ``members`` and not in ``unless``) says which keys are live.
        """
        order = self.order
        if len(order) - live > live // 4 + _COMPACT_SLACK:
            latest = reversed(dict.fromkeys(reversed(order)))
            kept: Iterator[OffloadKey] = filter(members.__contains__, latest)
            if unless:
                kept = filterfalse(unless.__contains__, kept)
            live_keys = list(kept)
            order.clear()
            order.extend(live_keys)
            self.stale.clear()

    def clear(self) -> None:
        self.order.clear()
        self.stale.clear()


class ARCCachePolicy(CachePolicy):
    """Adaptive Replacement Cache: balances recency and frequency by learning from its misses.

    Layout, chosen for the manager's hot paths and for bytes per block:

    * ``_resident`` is one plain dict over T1 and T2 and ``fast_get`` its bound C ``get``: the
      manager calls ``get`` for every key of every request, and one probe of a dict holding
      resident blocks only is the cheapest answer, and can never return a ghost;
    * T1's order is a :class:`_KeyQueue`: most stored blocks are first sightings that enter T1
      and later leave from its front, so an append and a ``popleft`` are all they cost, and
      T1 membership needs no table of its own (resident and not in T2);
    * T2 is an ``OrderedDict`` of key -> block because every hit moves a key to its MRU end,
      which ``move_to_end`` does in C without leaving a tombstone;
    * B1 and B2 are each a set (membership) plus a :class:`_KeyQueue` (trimming order), keys
      only. Sets take a batch of ghosts in or out with one C call (``update``,
      ``difference_update``) and let ``insert_many`` tell "all first sightings" with
      ``isdisjoint``, without a Python step per key.
    """

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._resident: dict[OffloadKey, BlockStatus] = {}
        self._t1 = _KeyQueue()
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._b1: set[OffloadKey] = set()
        self._b1_order = _KeyQueue()
        self._b2: set[OffloadKey] = set()
        self._b2_order = _KeyQueue()
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
        return list(self._b1_order)

    @property
    def b2(self) -> list[OffloadKey]:
        return list(self._b2_order)

    def __len__(self) -> int:
        """Resident blocks (T1 and T2), ghosts excluded."""
        return len(self._resident)

    # -- insertion ------------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.insert_many([key], [block])

    def insert_many(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        resident = self._resident
        b1 = self._b1
        b2 = self._b2
        # The common batch is all first sightings: it goes to T1's back in bulk and leaves p
        # alone. Only ghosts are looked for up front; a key already resident or repeated
        # (which the manager never sends) shows in the size and is repaired after the fact.
        if (not b1 or b1.isdisjoint(keys)) and (not b2 or b2.isdisjoint(keys)):
            size = len(resident)
            resident.update(zip(keys, blocks))
            if len(resident) == size + len(keys):
                self._t1.order.extend(keys)
            else:
                self._relist_reinserted(keys)
            self._trim_ghosts()
        else:
            self._insert_in_order(keys, blocks)

    def _relist_reinserted(self, keys: list[OffloadKey]) -> None:
        """After a bulk insert that re-inserted resident or repeated keys (none of them a
        ghost): list each key once, at the MRU end of T1, as one-by-one inserts would."""
        batch = set(keys)
        t2 = self._t2
        _consume(map(t2.pop, batch, repeat(None)))
        order = self._t1.order
        survivors = [key for key in self._t1 if key not in batch]
        order.clear()
        order.extend(survivors)
        self._t1.stale.clear()
        # Each key where it occurs last, which is where one-by-one inserts leave it.
        order.extend(reversed(dict.fromkeys(reversed(keys))))

    def _insert_in_order(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Insert as ARC would, one request at a time, trimming after each.

        The order matters: a ghost that an earlier key of the batch pushed out of the history
        is a plain miss by its turn, and each step of p sees the ghost list sizes of its
        moment. Runs still go in bulk: trimming after a run of first sightings is the same as
        trimming after each, since nothing in between looks at the ghosts; and a run of ghost
        hits needs no trimming at all (B1/B2 -> T2 changes neither bound).
        """
        if len(set(keys)) != len(keys):
            admit = self._admit
            trim = self._trim_ghosts
            for key, block in zip(keys, blocks):
                if admit(key, block):
                    trim()
        else:
            resident = self._resident
            # Ghost (or already resident) at the start. Trimming only ever drops ghosts, so an
            # unflagged key is a first sighting whenever its turn comes; a flagged one is
            # checked again when its run comes up.
            known = list(
                map(
                    or_,
                    map(or_, map(resident.__contains__, keys), map(self._b1.__contains__, keys)),
                    map(self._b2.__contains__, keys),
                )
            )
            for flagged, run in groupby(range(len(keys)), known.__getitem__):
                positions = list(run)
                start, stop = positions[0], positions[-1] + 1
                if flagged:
                    self._ghost_run(keys[start:stop], blocks[start:stop])
                else:
                    resident.update(zip(keys[start:stop], blocks[start:stop]))
                    self._t1.order.extend(keys[start:stop])
                    self._trim_ghosts()
        self._compact()

    def _compact(self) -> None:
        resident = self._resident
        t2 = self._t2
        self._t1.compact_if_sparse(len(resident) - len(t2), resident, t2)
        self._b1_order.compact_if_sparse(len(self._b1), self._b1)
        self._b2_order.compact_if_sparse(len(self._b2), self._b2)

    def _ghost_run(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        """Keys that were ghosts (or resident) when the batch arrived, in order."""
        b1 = self._b1
        b2 = self._b2
        while keys:
            in_b1 = list(map(b1.__contains__, keys))
            in_b2 = list(map(b2.__contains__, keys))
            still = list(map(or_, in_b1, in_b2))
            cut = still.index(False) if False in still else len(keys)
            if cut:
                self._ghost_hits(keys[:cut], blocks[:cut], in_b2[:cut])
            if cut == len(keys):
                return
            # Trimmed from the history by an earlier key of the batch, or resident already.
            if self._admit(keys[cut], blocks[cut]):
                self._trim_ghosts()
            keys = keys[cut + 1 :]
            blocks = blocks[cut + 1 :]

    def _ghost_hits(
        self, keys: list[OffloadKey], blocks: list[BlockStatus], in_b2: list[bool]
    ) -> None:
        """ARC's cases II and III for a run of ghost keys: adapt p, then move them to T2."""
        b1_size = len(self._b1)
        b2_size = len(self._b2)
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
        if b1_size != len(self._b1):
            from_b1 = list(compress(keys, map(not_, in_b2)))
            self._b1.difference_update(from_b1)
            _add_tombstones(self._b1_order.stale, from_b1)
        if b2_size != len(self._b2):
            from_b2 = list(compress(keys, in_b2))
            self._b2.difference_update(from_b2)
            _add_tombstones(self._b2_order.stale, from_b2)

    def _admit(self, key: OffloadKey, block: BlockStatus) -> bool:
        """ARC's miss cases for one key, except REPLACE, which the manager ran as ``evict``.

        Returns whether T1 grew, the only case in which the ghosts may need trimming.
        """
        if key in self._b1 or key in self._b2:
            self._ghost_hits([key], [block], [key in self._b2])
            return False
        if key in self._resident:  # resident already (never sent by the manager): replace
            self._drop_listing(key)
        self._resident[key] = block
        self._t1.order.append(key)
        return True

    def _trim_ghosts(self) -> None:
        """Keep |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c, dropping the oldest ghosts.

        The bounds are what make ARC's history a fixed 2c keys: without them the ghosts of a
        scan would pile up forever and a ghost hit would say nothing about *recent* misses.
        """
        c = self.cache_capacity
        resident = len(self._resident)
        b1 = self._b1
        excess = resident - len(self._t2) + len(b1) - c  # |T1| + |B1| - c
        if excess > 0:
            # Never more than B1 holds: only a caller inserting past the capacity without
            # evicting (the manager never does) could ask for that.
            b1.difference_update(self._b1_order.pop_front(min(excess, len(b1))))
        b2 = self._b2
        excess = resident + len(b1) + len(b2) - 2 * c
        if excess > 0:
            from_b2 = min(excess, len(b2))
            if from_b2:
                b2.difference_update(self._b2_order.pop_front(from_b2))
            if excess > from_b2:
                b1.difference_update(self._b1_order.pop_front(min(excess - from_b2, len(b1))))

    # -- removal and recency --------------------------------------------------------------

    def remove(self, key: OffloadKey) -> None:
        # A failed store was never used: remembering it as a ghost would later adapt p on
        # the strength of a block nobody read.
        if self._resident.pop(key, None) is not None:
            self._drop_listing(key)
            self._compact()

    def _drop_listing(self, key: OffloadKey) -> None:
        """Take a key out of T1 or T2 (its ``_resident`` entry is the caller's business)."""
        if self._t2.pop(key, None) is None:
            self._t1.forget(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        get = self._resident.get
        t2 = self._t2
        move_to_end = t2.move_to_end
        stale = self._t1.stale
        promoted = False
        key_list = keys if type(keys) is list else list(keys)
        # Reversed, so the first key of a request (the shared prefix) ends up most recent.
        for key in reversed(key_list):
            if key in t2:
                move_to_end(key)
            else:
                block = get(key)
                if block is not None:
                    # A second use: the block is now frequent; its T1 entry becomes a tombstone.
                    t2[key] = block
                    stale[key] = stale.get(key, 0) + 1
                    promoted = True
        if promoted:
            self._t1.compact_if_sparse(len(self._resident) - len(t2), self._resident, t2)

    # -- eviction -------------------------------------------------------------------------

    def evict(self, n: int, protected: set[OffloadKey]) -> _Victims | None:
        if n <= 0:
            return []
        resident = self._resident
        t2 = self._t2
        len2 = len(t2)
        len1 = len(resident) - len2
        if n > len1 + len2:
            return None
        # REPLACE takes T1's LRU while |T1| > p, then T2's; repeated n times that is the first
        # ceil(|T1| - p) victims from T1 and the rest from T2, back to T1 if T2 runs out.
        from1 = min(n, max(0, ceil(len1 - self._p)))
        from2 = n - from1
        if from2 > len2:
            from1 = n - len2
            from2 = len2
        # Fast path, the common case: the oldest blocks of each list are idle and unprotected,
        # so taking and checking them with C-level maps avoids a Python step per block.
        keys1 = self._t1.pop_front(from1) if from1 else []
        blocks1 = list(map(resident.pop, keys1))
        oldest2 = list(map(t2.popitem, repeat(False, from2))) if from2 else []
        if (
            not any(map(_ref_cnt, blocks1))
            and protected.isdisjoint(keys1)
            and not any(map(_ref_cnt, map(_block, oldest2)))
            and protected.isdisjoint(map(_key, oldest2))
        ):
            victims = list(zip(keys1, blocks1))
            if keys1:
                self._b1.update(keys1)
                self._b1_order.order.extend(keys1)
            if oldest2:
                victims += oldest2
                keys2 = list(map(_key, oldest2))
                _consume(map(resident.__delitem__, keys2))
                self._b2.update(keys2)
                self._b2_order.order.extend(keys2)
            return victims
        resident.update(zip(keys1, blocks1))
        self._t1.push_front(keys1)
        _restore_front(t2, oldest2)
        return self._evict_scanning(n, protected, from1)

    def _evict_scanning(self, n: int, protected: set[OffloadKey], from1: int) -> _Victims | None:
        """REPLACE that steps over busy or protected blocks; all or nothing."""
        resident = self._resident
        t2 = self._t2
        idle1 = (
            (key, block)
            for key in self._t1
            if (block := resident[key]).ref_cnt == 0 and key not in protected
        )
        picked1 = list(islice(idle1, from1))
        idle2 = (
            (key, block) for key, block in t2.items() if block.ref_cnt == 0 and key not in protected
        )
        picked2 = list(islice(idle2, n - len(picked1)))
        missing = n - len(picked1) - len(picked2)
        if missing:
            picked1 += islice(idle1, missing)
            if len(picked1) + len(picked2) < n:
                return None
        # Both generators are abandoned here, before anything they iterate over changes.
        keys1 = list(map(_key, picked1))
        keys2 = list(map(_key, picked2))
        forget = self._t1.forget
        for key in keys1:
            del resident[key]
            forget(key)
        for key in keys2:
            del resident[key]
            del t2[key]
        self._b1.update(keys1)
        self._b1_order.order.extend(keys1)
        self._b2.update(keys2)
        self._b2_order.order.extend(keys2)
        self._t1.compact_if_sparse(len(resident) - len(t2), resident, t2)
        return picked1 + picked2

    def clear(self) -> None:
        self._resident.clear()
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b1_order.clear()
        self._b2.clear()
        self._b2_order.clear()
        self._p = 0.0


def _add_tombstones(stale: dict[OffloadKey, int], keys: list[OffloadKey]) -> None:
    """Count one more tombstone for each of ``keys`` (distinct), at C speed."""
    stale.update(zip(keys, map(add, map(stale.get, keys, repeat(0)), repeat(1))))


def _restore_front(blocks: OrderedDict[OffloadKey, BlockStatus], items: _Victims) -> None:
    """Undo ``popitem(last=False)`` calls, restoring the original order exactly."""
    move_to_end = blocks.move_to_end
    for key, block in reversed(items):
        blocks[key] = block
        move_to_end(key, last=False)
