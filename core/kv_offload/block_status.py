"""The status of one resident block: its CPU slot and how many transfers use it.

A :class:`BlockStatus` *is* its slot id (an ``int`` subclass), and its reference count lives in
a per-manager table indexed by that id (8 bytes a slot). This keeps a resident block's status
at one 48-byte object (an int and its GC header) instead of a record with a separate ``int``
(about 90 bytes), which matters for a CPU tier of millions of blocks (guarded by
``benchmarks/memory.py``; the ``ref_cnt`` getter is the table's own C ``__getitem__``, guarded
by ``benchmarks/replay.py``). ``ref_cnt`` keeps vLLM's meaning, so policies written against
vLLM's ``BlockStatus`` port unchanged:

* ``-1``: a store or promotion is in flight; not readable, never evictable;
* ``0``: readable and evictable;
* ``n > 0``: readable and pinned by ``n`` in-flight loads or tier jobs; not evictable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

__all__ = ["BlockStatus", "RefCountTable", "bind_block_status"]

PENDING_REF_CNT = -1


class RefCountTable(Protocol):
    def __getitem__(self, block_id: int, /) -> int: ...

    def __setitem__(self, block_id: int, value: int, /) -> None: ...


class _StandaloneRefCounts(dict[int, int]):
    """Table for statuses built outside a manager (policy unit tests): new slots start pending."""

    def __missing__(self, block_id: int) -> int:
        return PENDING_REF_CNT


class BlockStatus(int):
    """Offloading status of one block; ``int(status)`` and ``status.block_id`` are its slot.

    Constructing one does not touch the ref-count table: whoever hands out a slot sets its
    count (the manager's slot table marks new slots pending). Outside a manager a status
    reads a standalone table in which every slot starts pending.
    """

    __slots__ = ()
    _ref_counts: ClassVar[RefCountTable] = _StandaloneRefCounts()

    @property
    def block_id(self) -> int:
        return int(self)

    @property
    def ref_cnt(self) -> int:
        """-1 while pending, 0 when idle, n while pinned by n transfers."""
        return self._ref_counts[self]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        self._ref_counts[self] = value

    @property
    def is_ready(self) -> bool:
        """Whether the block can be read (no store or promotion in flight)."""
        return self._ref_counts[self] >= 0

    @staticmethod
    def any_in_use(blocks: Sequence[BlockStatus]) -> bool:
        """Whether any of ``blocks`` is pending or pinned (its ``ref_cnt`` is not 0).

        The same answer as ``any(block.ref_cnt for block in blocks)``, read straight from the
        manager's ref-count table in one C-level pass: a policy checks its eviction candidates
        with it, and the ``ref_cnt`` property costs about twice as much per block.
        """
        return bool(blocks) and any(map(type(blocks[0])._ref_counts.__getitem__, blocks))

    def __repr__(self) -> str:
        return f"BlockStatus(block_id={int(self)}, ref_cnt={self.ref_cnt})"


def bind_block_status(ref_counts: list[int]) -> type[BlockStatus]:
    """A ``BlockStatus`` subclass whose instances read and write ``ref_counts``.

    Each manager binds its own table, so two managers never share counts. The ``ref_cnt``
    getter is the list's own C ``__getitem__``: policies read it for every eviction
    candidate, and this way no Python frame is entered.
    """

    def set_ref_cnt(status: BlockStatus, value: int) -> None:
        ref_counts[status] = value

    namespace = {
        "__slots__": (),
        "_ref_counts": ref_counts,
        "ref_cnt": property(ref_counts.__getitem__, set_ref_cnt, doc=BlockStatus.ref_cnt.__doc__),
    }
    return type("BlockStatus", (BlockStatus,), namespace)
