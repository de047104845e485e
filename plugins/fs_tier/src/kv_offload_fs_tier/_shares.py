"""What the I/O threads run: one thread's share of a store, a load, or an eviction.

A share gets an :class:`IOContext`, everything its system calls need and nothing of the
tier's index or counters, and reports an :class:`Outcome` (per key: done, failed with why,
not tried) that the scheduler applies in ``get_finished``. A share that raises still reports
(``fail``), so every job reports exactly once whatever a thread does.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from kv_offload.block_auth import BlockAuth
from kv_offload.tiering import JobDirection

from . import _format, _io
from ._layout import RootDir, key_name
from ._spares import SparePool

__all__ = ["EvictShare", "IOContext", "Items", "LoadShare", "Outcome", "StoreShare", "os_reason"]

logger = logging.getLogger("kv_offload.fs_tier")

#: A share's items: (key, CPU slot, shard); an eviction's slot is unused.
Items = list[tuple[bytes, int, int]]


def os_reason(exc: OSError) -> tuple[str, str]:
    """An ``OSError`` as (kind, message): the kind is its errno name (``ENOSPC``, ``EIO``)."""
    code = errno.errorcode.get(exc.errno or 0, "OSError")
    return code, f"{code}: {exc.strerror or exc}"


@dataclass(frozen=True)
class IOContext:
    """What the I/O threads need: the directory a job was submitted against (a ``root_dir``
    that comes back after being removed is a new one; jobs queued before keep the old), the
    block geometry, durability, authentication, the CPU buffer rows, the spare files."""

    tier: str
    root: RootDir
    block_size: int
    durable: bool
    auth: BlockAuth | None
    cpu: npt.NDArray[np.uint8]
    spares: SparePool

    def row(self, slot: int) -> memoryview:
        view: memoryview = self.cpu[slot].data
        return view


@dataclass
class Outcome:
    """One I/O thread's share of a job: keys done, keys failed with why, keys not tried."""

    job_id: int
    direction: JobDirection
    done: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str, str]] = field(default_factory=list)  # key, kind, message
    untried: list[bytes] = field(default_factory=list)
    #: a failure of the share as a whole (kind, message), e.g. a directory fsync
    error: tuple[str, str] | None = None


class _Share:
    """One I/O thread's share of a job. ``fail`` is the result when the share raises."""

    direction = JobDirection.STORE

    def __init__(self, io: IOContext, job_id: int, items: Items) -> None:
        self.io = io
        self.items = items
        self.outcome = Outcome(job_id, self.direction)
        self._next = 0

    def __call__(self) -> Outcome:  # pragma: no cover - overridden
        raise NotImplementedError

    def fail(self, exc: BaseException) -> Outcome:
        """The keys done before ``exc`` stay done; the one that raised failed; the rest were
        not tried."""
        logger.error(
            "tier %r: I/O thread raised on a %s (the job fails, the tier keeps serving)",
            self.io.tier,
            self.direction.value,
            exc_info=exc,
        )
        outcome = self.outcome
        if self._next < len(self.items):
            key = self.items[self._next][0]
            outcome.failed.append((key, "internal", f"internal error: {type(exc).__name__}: {exc}"))
            outcome.untried.extend(k for k, _, _ in self.items[self._next + 1 :])
        return outcome


class StoreShare(_Share):
    direction = JobDirection.STORE

    def __call__(self) -> Outcome:
        io = self.io
        root = io.root
        block_size = io.block_size
        durable = io.durable
        auth = io.auth
        outcome = self.outcome
        synced: set[int] = set()
        spares = io.spares
        for position, (key, slot, shard) in enumerate(self.items):
            self._next = position
            row = io.row(slot)
            if auth is None:
                header = _format.pack_header(key, block_size, _format.checksum(row))
            else:
                header = _format.pack_signed_header(key, block_size, row, auth)
            spare = spares.take()
            try:
                _io.write_block(
                    root.tmp_fd, root.shard_fds[shard], key_name(key), header, row, durable, spare
                )
            except OSError as exc:
                kind, message = os_reason(exc)
                outcome.failed.append((key, kind, message))
                # A full or failing disk fails the rest the same way: do not hammer it.
                outcome.untried.extend(k for k, _, _ in self.items[position + 1 :])
                break
            outcome.done.append(key)
            synced.add(shard)
        self._next = len(self.items)
        if durable:
            try:
                for shard in synced:
                    _io.sync_dir(root.shard_fds[shard])
            except OSError as exc:
                kind, message = os_reason(exc)
                outcome.error = (kind, f"syncing the block directory: {message}")
        return outcome


class LoadShare(_Share):
    direction = JobDirection.LOAD

    def __call__(self) -> Outcome:
        io = self.io
        root = io.root
        block_size = io.block_size
        auth = io.auth
        outcome = self.outcome
        spare = bytearray(1)
        head = bytearray(_format.HEADER_SPACE)
        for position, (key, slot, shard) in enumerate(self.items):
            self._next = position
            row = io.row(slot)
            shard_fd = root.shard_fds[shard]
            name = key_name(key)
            problem: tuple[str, str] | None
            try:
                nread = _io.read_block(shard_fd, name, head, row, spare)
            except FileNotFoundError:
                problem = ("missing", "the block file is gone")
            except OSError as exc:
                problem = os_reason(exc)
            else:
                problem = _format.verify(head, key, block_size, nread, row, auth)
            if problem is not None:
                # Drop the file: a block that cannot be read back (or verified) is worth
                # nothing; the root has one owner (a lock), no other reader could use it.
                with contextlib.suppress(OSError):
                    _io.remove_block(shard_fd, name)
                outcome.failed.append((key, *problem))
                outcome.untried.extend(k for k, _, _ in self.items[position + 1 :])
                break
            outcome.done.append(key)
        self._next = len(self.items)
        return outcome


class EvictShare:
    """Evicted blocks' files: kept as spares while the pool has room, else deleted."""

    def __init__(self, io: IOContext, items: Items) -> None:
        self.io = io
        self.items = items

    def __call__(self) -> int:
        """How many of the files were removed or recycled (a file already gone, or one the
        OS refused to remove, is left to startup recovery, which scans the shards)."""
        io = self.io
        root = io.root
        file_size = _format.file_size(io.block_size)
        removed = 0
        for key, _, shard in self.items:
            try:
                if io.spares.recycle(root.shard_fds[shard], key_name(key), root.tmp_fd, file_size):
                    removed += 1
            except OSError:
                continue
        return removed

    def fail(self, exc: BaseException) -> int:
        logger.error("tier %r: removing evicted blocks raised", self.io.tier, exc_info=exc)
        return 0
