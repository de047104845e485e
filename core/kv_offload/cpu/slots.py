"""The CPU cache's slot table: reference counts, the free list and allocation.

Fast-path module. Every manager call runs through these loops, once per key, so they are
written for CPython's speed: a batch's ref counts (and owners) are read with one
``operator.itemgetter`` (a C call per slot and no Python call: counts and owners together
cost 478 instructions a slot where two ``map`` passes of ``list.__getitem__`` cost 701, and
a bytecode loop more; callgrind, CPython 3.11), writes are plain
``for`` loops or whole-slice writes for fresh slots, and ``BlockStatus`` objects *are* their
slot id (see :mod:`kv_offload.block_status`). Guarded by: the reference model of
``tests/cpu/test_manager_stateful.py`` (a plain dict model of pending, ready and pinned keys
that every random flow is checked against) for correctness, and
``benchmarks/replay_instructions.py`` (callgrind), ``benchmarks/replay.py`` (throughput) and
``benchmarks/memory.py`` (bytes per resident block) for speed and size.

A slot's ref count: ``-1`` pending (a store is in flight, or the slot is free: a free slot is
never idle), ``0`` idle (readable, evictable), ``n > 0`` pinned by ``n`` readers. Which key a
block is found under is the policy's business; the table also records which key each slot
was allocated to (:attr:`SlotTable.owners`, a list written per allocation with
``operator.setitem``; a dict measured 5% of a replay's instructions, rebuilt every few
hundred stores by its deletes), the manager's own record that a policy's eviction answer is
checked against in the pass that frees the victims (:meth:`SlotTable.free_victims`). Which
calls are legal is the manager's business.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import is_, itemgetter, setitem
from typing import Any, TypeVar

from ..block_status import PENDING_REF_CNT, BlockStatus, bind_block_status

__all__ = ["SlotTable", "not_pending", "not_pinned", "not_readable", "without_block"]

K = TypeVar("K")

#: A batch's blocks, ``None`` for an absent key. Typed ``Any`` so the checked loops below index
#: the table and hand the batch back as ``list[BlockStatus]`` without a cast call per batch.
Blocks = list[Any]


# The rules of a slot's ref count (``None``: the key is not resident), one per checked change
# below. Those loops inline them (a call per block would double their cost); these predicates
# are what validation.py diagnoses a refused batch with, so each rule is written here only.


def not_readable(count: int | None) -> bool:
    """``pin`` refuses it: absent, or pending."""
    return count is None or count < 0


def not_pinned(count: int | None) -> bool:
    """``unpin`` refuses it: absent, pending, or idle."""
    return count is None or count <= 0


def not_pending(count: int | None) -> bool:
    """``finish_store`` refuses it: not a store in flight."""
    return count != PENDING_REF_CNT


def without_block(keys: list[K], blocks: Blocks) -> list[K]:
    """The keys whose block is ``None`` (not resident), in order, in C-level passes (a list
    comprehension over ``zip`` runs bytecode per key: ``prepare_store``'s largest cost)."""
    absent = blocks.count(None)
    if absent == len(keys):
        return keys[:]
    if not absent:
        return []
    return list(compress(keys, map(is_, blocks, repeat(None))))


class SlotTable:
    """``num_blocks`` slots: never-used ones are handed out first (lowest id first), then
    freed ones, the last freed first (vLLM pops its free list: its users' tests assert the
    slot ids this order gives)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        #: ref count per slot id; the list object never changes (statuses read it).
        self.refs: list[int] = [PENDING_REF_CNT] * num_blocks
        self._status_cls: type[BlockStatus] = bind_block_status(self.refs)
        #: per slot id, the key it was allocated to (``None`` for a slot that holds no block)
        self.owners: list[Any] = [None] * num_blocks
        self.free: list[BlockStatus] = []
        self.num_allocated = 0
        #: never-used slots plus freed ones (kept, not computed: prepare_store reads it)
        self.num_free = num_blocks
        self.num_evictable = 0
        self.num_pending = 0
        self.num_pinned = 0

    @property
    def num_resident(self) -> int:
        return self.num_blocks - self.num_free

    # -- questions ----------------------------------------------------------------------------

    def counts(self, blocks: Blocks) -> list[int | None]:
        """Each block's ref count, ``None`` for an absent block (for error messages)."""
        refs = self.refs
        return [None if block is None else refs[block] for block in blocks]

    # -- checked changes: each checks the whole batch first, then changes it or nothing -----

    def pin(self, blocks: Blocks) -> list[BlockStatus] | None:
        """One more reader per block, if every block is readable (else ``None``)."""
        refs = self.refs
        try:  # one itemgetter reads the counts (a None block: TypeError)
            if len(blocks) > 1:
                if min(itemgetter(*blocks)(refs)) < 0:
                    return None
            elif blocks and refs[blocks[0]] < 0:
                return None
        except (IndexError, TypeError):
            return None
        newly_pinned = 0
        for block in blocks:
            count = refs[block]
            if not count:
                newly_pinned += 1
            refs[block] = count + 1
        self.num_evictable -= newly_pinned
        self.num_pinned += newly_pinned
        return blocks

    def unpin(self, blocks: Blocks) -> list[BlockStatus] | None:
        """One reader less per block, if every block is pinned (else ``None``)."""
        refs = self.refs
        try:  # one itemgetter reads the counts (a None block: TypeError)
            if len(blocks) > 1:
                if min(itemgetter(*blocks)(refs)) <= 0:
                    return None
            elif blocks and refs[blocks[0]] <= 0:
                return None
        except (IndexError, TypeError):
            return None
        released = 0
        for block in blocks:
            count = refs[block] - 1
            if not count:
                released += 1
            refs[block] = count
        self.num_evictable += released
        self.num_pinned -= released
        return blocks

    def finish_store(self, blocks: Blocks, success: bool) -> bool:
        """If every block is pending and listed once, make them idle (``success``) or free;
        else ``False`` and no change."""
        refs = self.refs
        count = len(blocks)
        try:  # every store completes here: one itemgetter reads the counts (None: TypeError)
            if count > 1:
                counts = itemgetter(*blocks)(refs)
                if counts.count(PENDING_REF_CNT) != count or len(set(blocks)) != count:
                    return False
            elif count and refs[blocks[0]] != PENDING_REF_CNT:
                return False
        except (IndexError, TypeError):
            return False
        self.num_pending -= count
        if success:
            for block in blocks:
                refs[block] = 0
            self.num_evictable += count
        else:
            owners = self.owners
            for block in blocks:
                owners[block] = None
            self.free.extend(blocks)
            self.num_free += count
        return True

    def free_victims(self, keys: Any, blocks: Any) -> bool:
        """Free the slots of evicted ``keys`` (``blocks[i]`` is ``keys[i]``'s), if each is a
        resident, idle slot allocated to that key and none is named twice; else ``False`` and
        no change. The check runs on every eviction of a full cache, so it reads the ref
        counts and owners of all the slots with one ``itemgetter`` (a C call per slot, and
        no Python call: two thirds of the cost of two ``map`` passes) and finds repeats with a set.
        A freed slot is marked pending at once: a slot on the free list is never idle, so a
        later answer naming it again (its owner still recorded) is refused as not idle."""
        refs = self.refs
        count = len(blocks)
        try:
            if count == 1:
                block = blocks[0]
                kept = not refs[block] and self.owners[block] == keys[0]
            else:
                read = itemgetter(*blocks)
                kept = (
                    not any(read(refs))
                    and read(self.owners) == tuple(keys)
                    and len(set(blocks)) == count
                )
        except (IndexError, TypeError):
            kept = False
        if not kept:
            return False
        for block in blocks:  # pending from here on: allocate hands them out as they are
            refs[block] = PENDING_REF_CNT
        self.free.extend(blocks)
        self.num_free += count
        self.num_evictable -= count
        return True

    # -- unchecked changes (the caller checked) ---------------------------------------------

    def allocate(self, keys: list[Any]) -> list[BlockStatus]:
        """A slot per key, marked pending and recorded as the key's in :attr:`owners`:
        never-used slots first, then freed ones, last freed first. A freed slot is pending
        already (:meth:`free_victims`, or a failed store), so only its owner is written:
        one C-level ``operator.setitem`` per slot (a bound ``__setitem__`` wrapper costs half
        as much again per call)."""
        free = self.free
        owners = self.owners
        count = len(keys)
        fresh = self.num_blocks - self.num_allocated
        if fresh > count:
            fresh = count
        reused: list[BlockStatus] = []
        if fresh < count:
            cut = len(free) - (count - fresh)
            reused = free[cut:]
            del free[cut:]
            reused.reverse()  # the free list is a stack: the last freed slot comes out first
        self.num_pending += count
        self.num_free -= count
        if not fresh:  # the steady state of a full cache
            any(map(setitem, repeat(owners), reused, keys))  # setitem returns None: all run
            return reused
        start = self.num_allocated
        self.num_allocated += fresh
        self.refs[start : start + fresh] = [PENDING_REF_CNT] * fresh
        status = self._status_cls
        owners[start : start + fresh] = keys[:fresh] if reused else keys
        if reused:
            any(map(setitem, repeat(owners), reused, keys[fresh:]))
        return [status(slot) for slot in range(start, start + fresh)] + reused

    def pending_slot_of(self, key: Any) -> int | None:
        """The pending slot allocated to ``key``, if any: a pass over the table, for the
        diagnosis of a policy that lost a key it was given, never on the fast path."""
        refs, free = self.refs, set(self.free)  # a free slot is pending too, but no key's
        for slot, owner in enumerate(self.owners):
            pending = owner is not None and refs[slot] == PENDING_REF_CNT
            if pending and owner == key and slot not in free:
                return slot
        return None

    def clear(self) -> None:
        """Every slot unused again."""
        self.num_allocated = 0
        self.owners[:] = [None] * self.num_blocks
        self.free.clear()
        self.num_free = self.num_blocks
        self.num_evictable = 0
        self.num_pending = 0
        self.num_pinned = 0
