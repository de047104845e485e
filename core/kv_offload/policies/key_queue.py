"""A queue of keys, oldest first, with lazy deletion: the recency order of LRU and of ARC's lists.

Fast-path module. Guarded by the reference implementations ``kv_offload_lru.reference`` and
``kv_offload_arc.reference`` (plain ``OrderedDict`` policies the tests replay random workloads
against, step by step: ``tests/policies/``), by ``tests/policies/test_key_queue.py`` (random
operations against a plain list of live keys), and by ``benchmarks/replay.py`` (throughput) and
``benchmarks/memory.py`` (bytes per resident block).

Why not an ``OrderedDict``: once eviction churn has resized it, it costs a linked node per key
and a node table as large as its hash table, 120 to 195 bytes per key; a list of key
references costs 8 to 11. The price is that removing a key from the middle (a touch in LRU, a
promotion or a ghost hit in ARC) cannot unlink it: the entry stays and becomes a *tombstone*,
counted in ``stale``. A key is only appended when it (re)joins the queue, so its tombstones
always precede its one live entry, and reading from the front tells them apart by the count
alone.

The entries live in a list read from index ``head``: taking the oldest ``n`` keys is one slice
and one addition, where a ``deque`` pops them one call at a time. The consumed prefix is cut
off once it is a quarter of the list (a ``memmove``, amortised to a few bytes per key).
Membership is the owner's business (the dict or set it already has).

One threshold rule bounds the tombstones, applied by the queue itself whenever it makes one:
it rebuilds once they pass a quarter of the live keys plus :data:`COMPACT_SLACK`, which keeps
the rebuild's linear cost constant per tombstone and small caches from rebuilding every call
(a lower threshold costs replay time in ``benchmarks/replay.py`` for little memory in
``benchmarks/memory.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from itertools import filterfalse, islice, repeat
from operator import add
from typing import Generic, Protocol, TypeVar

__all__ = ["KeyQueue", "COMPACT_SLACK"]

#: Tombstones a queue may hold beyond a quarter of its live keys before it is rebuilt.
COMPACT_SLACK = 256
#: Consumed entries kept at the list's start before they are cut off (and a quarter of it).
_CUT_SLACK = 1024

K = TypeVar("K", bound=Hashable)


class Membership(Protocol):
    """What an owner's record of live keys offers: ``len`` and ``in`` (a dict, a set)."""

    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...


class KeyQueue(Generic[K]):
    """Keys oldest first; any key leaves in O(1) by leaving a tombstone behind.

    * ``order[head:]``: every entry, live or tombstone, oldest first (``order[:head]`` were
      taken already);
    * ``stale[key]``: how many of ``key``'s entries are tombstones (absent means none);
    * ``members`` (and not in ``unless``): the owner's own record of which keys are live, read
      only when the queue rebuilds itself. The owner updates it *before* it tells the queue a
      key left (:meth:`forget`), so a rebuild never revives a key on its way out.
    """

    __slots__ = ("head", "members", "order", "stale", "unless")

    def __init__(self, members: Membership, unless: Membership | None = None) -> None:
        self.members = members
        self.unless = unless
        self.order: list[K] = []
        self.head = 0
        self.stale: dict[K, int] = {}

    def __len__(self) -> int:
        """Entries, tombstones included (the owner knows how many keys are live)."""
        return len(self.order) - self.head

    def extend(self, keys: Iterable[K]) -> None:
        """Append keys that are not in the queue (no live entry), newest last."""
        self.order.extend(keys)

    def requeue(self, keys: Iterable[K]) -> None:
        """Move the live ones of ``keys`` to the back, in order (the others are ignored): each
        one's live entry becomes a tombstone."""
        members = self.members
        stale = self.stale
        get = stale.get
        append = self.order.append
        moved = False
        for key in keys:
            if key in members:
                stale[key] = get(key, 0) + 1
                append(key)
                moved = True
        if moved:
            self._compact_if_sparse()

    def forget(self, key: K) -> None:
        """The live entry of ``key`` becomes a tombstone."""
        stale = self.stale
        stale[key] = stale.get(key, 0) + 1
        self._compact_if_sparse()

    def forget_many(self, keys: list[K]) -> None:
        """:meth:`forget` for distinct ``keys``, in one C-level pass."""
        stale = self.stale
        stale.update(zip(keys, map(add, map(stale.get, keys, repeat(0)), repeat(1))))
        self._compact_if_sparse()

    def peek_front(self, count: int) -> list[K]:
        """The ``count`` oldest live keys (the caller knows there are that many), which are
        then the queue's first ``count`` entries: :meth:`drop_front` takes them.

        Tombstones met on the way are dropped for good, but no key moves: the queue holds the
        same live keys in the same order, so a caller that only peeks has changed nothing it
        can see (peek, check, commit). The live keys are written back over the end of the
        entries they were read from, a same-length slice assignment that moves nothing else.
        """
        order = self.order
        head = self.head
        stale = self.stale
        front = order[head : head + count]
        if not stale or stale.keys().isdisjoint(front):
            return front
        # A key's tombstones precede its live entry, so from the front, each of its
        # occurrences is a tombstone while ``stale`` still counts one.
        live: list[K] = []
        append = live.append
        get = stale.get
        entries = 0
        chunk = front
        while True:
            for key in chunk:
                dead = get(key)
                if dead is None:
                    append(key)
                elif dead == 1:
                    del stale[key]
                else:
                    stale[key] = dead - 1
            entries += len(chunk)
            missing = count - len(live)
            if not missing:
                break
            start = head + entries
            chunk = order[start : start + missing]
            if not chunk:
                raise RuntimeError("key queue holds fewer live keys than its owner counts")
        start = head + entries - count
        order[start : head + entries] = live
        self.head = start
        return live

    def drop_front(self, count: int) -> None:
        """Remove the ``count`` oldest entries: the live keys :meth:`peek_front` returned."""
        head = self.head + count
        if head > _CUT_SLACK and head > len(self.order) >> 2:
            del self.order[:head]
            head = 0
        self.head = head

    def pop_front(self, count: int) -> list[K]:
        """Remove and return the ``count`` oldest live keys (the caller knows there are that
        many), dropping the tombstones met on the way."""
        live = self.peek_front(count)
        self.drop_front(count)
        return live

    def __iter__(self) -> Iterator[K]:
        """Live keys, oldest first; the queue must not change while this runs."""
        entries = islice(self.order, self.head, None)
        stale = self.stale
        if not stale:
            yield from entries
            return
        passed: dict[K, int] = {}
        for key in entries:
            dead = stale.get(key)
            if dead is not None and passed.get(key, 0) < dead:
                passed[key] = passed.get(key, 0) + 1
            else:
                yield key

    def _compact_if_sparse(self) -> None:
        """Rebuild without tombstones once there are more than ``live // 4 + COMPACT_SLACK``.

        A rebuild needs no counts: a live key's entry is its last one, and the owner's
        membership says which keys are live.
        """
        unless = self.unless
        live = len(self.members) - (len(unless) if unless is not None else 0)
        if len(self.order) - self.head - live > (live >> 2) + COMPACT_SLACK:
            del self.order[: self.head]
            latest = reversed(dict.fromkeys(reversed(self.order)))
            kept: Iterator[K] = filter(self.members.__contains__, latest)
            if unless is not None:
                kept = filterfalse(unless.__contains__, kept)
            self.order = list(kept)
            self.head = 0
            self.stale.clear()

    def clear(self) -> None:
        self.order.clear()
        self.head = 0
        self.stale.clear()
