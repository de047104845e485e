"""The fs tier's I/O side: its threads, what they run, and the system calls of one block file.

Everything here runs on the tier's I/O threads, except :class:`BlockIO`'s methods, which the
scheduler calls to hand work over and take outcomes back. Nothing here reads or writes the
tier's index or counters: a thread gets an :class:`IOContext` (the directory descriptors, the
block geometry, durability, authentication, the CPU buffer rows) and reports an
:class:`Outcome` per share of a job (per key: done, failed with why, not tried), which the
scheduler applies in ``get_finished``.

**Threads** (:class:`Lanes`): one FIFO queue per thread. One hash of the key picks its shard
directory and its thread (:func:`.layout.key_hash`), so every store and delete of a key runs
on one thread in the order the scheduler issued it, without a lock: an evicted block's delete
runs before a later store of the same key, so the delete can never remove the new file. A
load has no such order to keep, and its blocks go to whichever thread is free
(:class:`LoadWork`). A job's keys spread over the threads, so one large job uses all of them;
each thread's part is a share. A share that raises still reports
(``fail``), so every job reports exactly once whatever a thread does. An idle thread creates
empty files ahead of stores, one per step, checking its queue again after each.

**System calls**: every name is opened relative to a directory descriptor :class:`.layout.
RootDir` opened and checked, with ``O_NOFOLLOW``: a symlink planted later in place of a block
file or a directory cannot redirect a write outside the root. A store writes a block under a
temporary name in ``tmp/`` and renames it into its shard only once complete (and, with
``durable``, synced), so a block file is either absent or whole; a process killed mid-write
leaves only a temporary file, removed at the next start.

**Spare files** (:class:`SparePool`): creating a file costs more than writing a block into it
(0.1 to 1 ms against ~0.2 ms for 256 KiB on the development VM's ext4, see
``benchmarks/fs_tier.py``). So an evicted block's file is renamed into ``tmp/`` instead of
deleted (up to :attr:`SparePool.limit`), and idle threads create empty files ahead of stores
(up to ``precreate_files``, never more than the capacity has room for); a store overwrites a
spare instead of creating a file, so a full tier rarely creates or deletes one. The pool is
shared by the threads: the deque's ends are thread-safe, and each spare is taken once.

**Speed** (docs/architecture.md, "Speed and where it is allowed"): copy-free, a store writes
the header and the CPU buffer row with one ``pwritev`` straight from the row, a load reads the
header and the row with one ``preadv`` straight into the row (the ``spare`` byte of a load
detects a file longer than a block without a ``stat``: a regular file reads short only at its
end); a load opens its file with ``O_NOATIME`` (no inode write for the access time, which
``relatime`` does on the first read after a write: every promotion of a block cascaded since
it was last read); a load's blocks go to whichever thread is free (:class:`LoadWork`), not
to a fixed split. Benchmark: ``benchmarks/fs_tier.py`` (the tier against raw
``preadv``/``write`` of the same rows and against vLLM's fs tier, same run); reference: the
crash and corruption tests (``tests/fs_tier``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from kv_offload.block_auth import BlockAuth
from kv_offload.tiering import JobDirection

from . import layout
from .layout import RootDir, key_name

__all__ = [
    "PRECREATE_FILES",
    "SPARE_FILES",
    "BlockIO",
    "Outcome",
    "create_spare",
    "read_block",
    "recycle_block",
    "remove_block",
    "sync_dir",
    "write_block",
]

logger = logging.getLogger("kv_offload.fs_tier")

#: A share's items: (key, CPU slot, shard); an eviction's slot is unused.
Items = list[tuple[bytes, int, int]]


# -- the system calls of one block file ------------------------------------------------------

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# macOS has no fdatasync; fsync is the same guarantee there, and more.
_datasync = getattr(os, "fdatasync", os.fsync)
_REUSE_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Loads do not write the block file's inode: under ``relatime`` (the usual mount option) the
#: first read after a write updates the access time, a journalled inode write per load on
#: ext4. Linux only, and only for a file this process owns (else ``EPERM``: read without).
_NOATIME = getattr(os, "O_NOATIME", 0)


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    """``pwritev`` until every byte is written (a short write happens, e.g. on a full disk,
    before the error that follows it)."""
    offset = 0
    while buffers:
        written = os.pwritev(fd, buffers, offset)
        if written == 0:  # pragma: no cover - regular files never write 0 bytes without error
            raise OSError("pwritev wrote nothing")
        offset += written
        while buffers and written >= len(buffers[0]):
            written -= len(buffers[0])
            buffers.pop(0)
        if buffers and written:
            buffers[0] = buffers[0][written:]


def write_block(
    tmp_fd: int,
    shard_fd: int,
    name: str,
    header: list[memoryview],
    row: memoryview,
    durable: bool,
    spare: tuple[str, int] | None = None,
) -> None:
    """Write ``header`` (buffers) + ``row`` as block file ``name`` of the shard, atomically.

    ``spare`` (name in ``tmp/``, size) is an evicted block's file to overwrite instead of
    creating a new one: on ext4 a new file's first write costs ~10x an overwrite (measured
    by ``benchmarks/fs_tier.py``, "cold" against "steady" stores). It is as invisible as a
    new temporary file until the rename. A spare that is no longer there (a scan of a
    reopened ``root_dir`` removed it, or a user did) costs nothing but the new file.
    """
    size = sum(len(part) for part in header) + len(row)
    fd = -1
    if spare is not None:
        tmp_name = spare[0]
        try:
            fd = os.open(tmp_name, _REUSE_FLAGS, dir_fd=tmp_fd)
        except FileNotFoundError:
            spare = None
    if spare is None:
        tmp_name = name + ".tmp"
        fd = os.open(tmp_name, _WRITE_FLAGS, 0o600, dir_fd=tmp_fd)
    try:
        try:
            _write_all(fd, [*header, row])
            if spare is not None and spare[1] > size:
                os.ftruncate(fd, size)
            if durable:
                _datasync(fd)
        finally:
            os.close(fd)
        os.rename(tmp_name, name, src_dir_fd=tmp_fd, dst_dir_fd=shard_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name, dir_fd=tmp_fd)
        raise


def create_spare(tmp_fd: int, name: str) -> None:
    """An empty file ``tmp/name`` for a later store to fill (see ``write_block``'s
    ``spare``): creating a file is most of the cost of storing a block in a new one."""
    os.close(os.open(name, _WRITE_FLAGS, 0o600, dir_fd=tmp_fd))


def recycle_block(shard_fd: int, name: str, tmp_fd: int, spare_name: str) -> bool:
    """Move an evicted block file out of its shard, to ``tmp/spare_name`` for reuse;
    ``False`` if it was already gone."""
    try:
        os.rename(name, spare_name, src_dir_fd=shard_fd, dst_dir_fd=tmp_fd)
    except FileNotFoundError:
        return False
    return True


def _open_to_read(shard_fd: int, name: str) -> int:
    if _NOATIME:
        try:
            return os.open(name, _READ_FLAGS | _NOATIME, dir_fd=shard_fd)
        except PermissionError:  # a file of another owner (a root_dir copied in as root)
            pass
    return os.open(name, _READ_FLAGS, dir_fd=shard_fd)


def read_block(
    shard_fd: int, name: str, head: memoryview, row: memoryview, spare: memoryview
) -> int:
    """Read block file ``name`` into ``head`` then ``row`` (then ``spare``, for a file too
    long); the number of bytes read."""
    fd = _open_to_read(shard_fd, name)
    try:
        buffers = [head, row, spare]
        block_file = len(head) + len(row)
        total = 0
        while buffers:
            got = os.preadv(fd, buffers, total)
            if got == 0:
                break
            total += got
            if total == block_file:
                # A short read of a regular file ends at its end: the file is one block
                # long, the spare byte stays empty (one system call, not a second for EOF).
                break
            while buffers and got >= len(buffers[0]):
                got -= len(buffers[0])
                buffers.pop(0)
            if buffers and got:
                buffers[0] = buffers[0][got:]
        return total
    finally:
        os.close(fd)


def remove_block(shard_fd: int, name: str) -> bool:
    """Delete block file ``name``; ``False`` if it was already gone."""
    try:
        os.unlink(name, dir_fd=shard_fd)
    except FileNotFoundError:
        return False
    return True


def sync_dir(dir_fd: int) -> None:
    """Make the renames into a directory durable."""
    os.fsync(dir_fd)


# -- spare files ------------------------------------------------------------------------------

#: Evicted block files kept for reuse at most (the rest are deleted).
SPARE_FILES = 256
#: Empty files the I/O threads create ahead of stores while idle, at most: a burst of stores
#: into a tier with room fills files made while it was idle; a sustained stream beyond them
#: pays the creation again.
PRECREATE_FILES = 256

#: A spare: its name in ``tmp/`` and the bytes it holds (0 for an empty file).
Spare = tuple[str, int]


class SparePool:
    """The spare files of one tier, in its ``tmp/`` directory."""

    def __init__(self, tier: str, precreate_files: int) -> None:
        self.tier = tier
        self.precreate_files = precreate_files
        self._spares: deque[Spare] = deque()
        self._ids = itertools.count()
        self._precreate_lock = threading.Lock()
        self._precreating = precreate_files > 0
        #: spares kept at most: :data:`SPARE_FILES`, fewer on a disk the capacity nearly
        #: fills (their room is not in the capacity; see :meth:`BlockIO.limit_spares`)
        self.limit = SPARE_FILES
        self.precreated = 0

    def __len__(self) -> int:
        return len(self._spares)

    def take(self) -> Spare | None:
        """A spare for a store to overwrite, or ``None`` (the store creates its file)."""
        try:
            return self._spares.popleft()
        except IndexError:
            return None

    def recycle(self, shard_fd: int, name: str, tmp_fd: int, file_size: int) -> bool:
        """An evicted block's file: kept as a spare while the pool has room, else deleted;
        whether a file was there to remove (``OSError`` when the OS refuses)."""
        if len(self._spares) < self.limit:
            spare = f"spare-{next(self._ids)}"
            if not recycle_block(shard_fd, name, tmp_fd, spare):
                return False
            self._spares.append((spare, file_size))
            return True
        return remove_block(shard_fd, name)

    def precreate(self, tmp_fd: int, room: Callable[[], int], closed: Callable[[], bool]) -> bool:
        """Idle work of an I/O thread: create one empty spare if the pool is short of
        ``precreate_files`` and of ``room()`` (blocks the capacity still has room for; an
        estimate read without a lock is enough: a spare costs an inode and no data);
        ``False`` when there is nothing to do. A failure (a full disk, ...) stops it for good."""
        with self._precreate_lock:
            spares = self._spares
            if closed() or not self._precreating or len(spares) >= self.precreate_files:
                return False
            if len(spares) >= room():
                return False
            name = f"spare-{next(self._ids)}"
            try:
                create_spare(tmp_fd, name)
            except OSError as exc:
                self._precreating = False
                logger.info("tier %r: no more files created ahead of stores: %s", self.tier, exc)
                return False
            spares.append((name, 0))
            self.precreated += 1
            return True

    def resume(self) -> None:
        """Create files ahead again (a new ``tmp/``: the failure that stopped it is past)."""
        self._precreating = self.precreate_files > 0

    def forget(self) -> None:
        """Their directory is gone: forget every spare and create none until :meth:`resume`
        (one created meanwhile would be listed after the scan of the new directory removed
        it, or be left in it unlisted)."""
        with self._precreate_lock:
            self._precreating = False
            self._spares.clear()

    def drop_all(self, tmp_fd: int) -> None:
        """Delete every spare (a full disk: their space is wanted for blocks; shutdown)."""
        spares = self._spares
        while True:
            try:
                name, _ = spares.popleft()  # an I/O thread may take one too: each once
            except IndexError:
                return
            with contextlib.suppress(OSError):
                remove_block(tmp_fd, name)


# -- what a thread runs: one share of a job ---------------------------------------------------


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
                header = layout.pack_header(key, block_size, layout.checksum(row))
            else:
                header = layout.pack_signed_header(key, block_size, row, auth)
            spare = spares.take()
            try:
                write_block(
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
                    sync_dir(root.shard_fds[shard])
            except OSError as exc:
                kind, message = os_reason(exc)
                outcome.error = (kind, f"syncing the block directory: {message}")
        return outcome


class LoadWork:
    """A load job's blocks, taken one at a time by a share on each of several threads.

    A load keeps no order with the other operations on its keys, so unlike stores and deletes
    (on their key's thread) its blocks go to whichever thread is free: each of them is stored
    (a block joins the index only once its store job reported, so that store, and any delete
    queued before it on the key's thread, has run), none is evicted while it loads, and a
    store of a stored key writes nothing. A job then ends when its last block is read, not
    when the thread with the most of a fixed split has read them (with 128 blocks on 4
    threads, a split by hash gives the busiest thread ~20% more than a quarter; a thread that
    loses its core for a while gets fewer).
    """

    def __init__(self, items: Items, shares: int) -> None:
        self._items = items
        self._taken = 0
        self._shares = shares
        self._lock = threading.Lock()

    def take(self) -> tuple[bytes, int, int] | None:
        """The next block nobody took (key, CPU slot, shard), or ``None``."""
        with self._lock:
            if self._taken == len(self._items):
                return None
            item = self._items[self._taken]
            self._taken += 1
            return item

    def end(self) -> list[bytes]:
        """A share stops (the blocks ran out, one failed, it raised): the keys nobody will
        try, for the last share to stop to report (none while another share still takes)."""
        with self._lock:
            self._shares -= 1
            if self._shares:
                return []
            rest = self._items[self._taken :]
            self._taken = len(self._items)
        return [key for key, _, _ in rest]


class LoadShare:
    """One thread's part of a load: blocks taken from the job's :class:`LoadWork` until
    they run out or one fails (a failing disk is not hammered: each thread stops at its
    first failure)."""

    direction = JobDirection.LOAD

    def __init__(self, io: IOContext, job_id: int, work: LoadWork) -> None:
        self.io = io
        self.work = work
        self.outcome = Outcome(job_id, self.direction)
        self._current: bytes | None = None

    def __call__(self) -> Outcome:
        io = self.io
        block_size = io.block_size
        auth = io.auth
        outcome = self.outcome
        done = outcome.done
        spare = memoryview(bytearray(1))
        head = bytearray(layout.HEADER_SPACE)
        head_view = memoryview(head)
        cpu = io.cpu
        shard_fds = io.root.shard_fds
        verify = layout.verify
        take = self.work.take
        while (item := take()) is not None:
            key, slot, shard = item
            self._current = key
            row: memoryview = cpu[slot].data
            shard_fd = shard_fds[shard]
            name = key.hex()  # key_name
            problem: tuple[str, str] | None
            try:
                nread = read_block(shard_fd, name, head_view, row, spare)
            except FileNotFoundError:
                problem = ("missing", "the block file is gone")
            except OSError as exc:
                problem = os_reason(exc)
            else:
                problem = verify(head, key, block_size, nread, row, auth)
            if problem is not None:
                # Drop the file: a block that cannot be read back (or verified) is worth
                # nothing; the root has one owner (a lock), no other reader could use it.
                with contextlib.suppress(OSError):
                    remove_block(shard_fd, name)
                outcome.failed.append((key, *problem))
                break
            done.append(key)
        self._current = None
        outcome.untried.extend(self.work.end())
        return outcome

    def fail(self, exc: BaseException) -> Outcome:
        """The keys done before ``exc`` stay done; the one that raised failed."""
        logger.error(
            "tier %r: I/O thread raised on a load (the job fails, the tier keeps serving)",
            self.io.tier,
            exc_info=exc,
        )
        outcome = self.outcome
        if self._current is not None:
            outcome.failed.append(
                (self._current, "internal", f"internal error: {type(exc).__name__}: {exc}")
            )
            outcome.untried.extend(self.work.end())
        return outcome


class EvictShare:
    """Evicted blocks' files: kept as spares while the pool has room, else deleted. Counts
    the files it removed or recycled in ``removed[lane]`` (that slot is its thread's alone;
    a file already gone, or one the OS refused to remove, is left to startup recovery)."""

    def __init__(self, io: IOContext, items: Items, removed: list[int], lane: int) -> None:
        self.io = io
        self.items = items
        self.removed = removed
        self.lane = lane

    def __call__(self) -> None:
        io = self.io
        root = io.root
        file_size = layout.file_size(io.block_size)
        removed = 0
        for key, _, shard in self.items:
            try:
                if io.spares.recycle(root.shard_fds[shard], key_name(key), root.tmp_fd, file_size):
                    removed += 1
            except OSError:
                continue
        self.removed[self.lane] += removed

    def fail(self, exc: BaseException) -> None:
        logger.error("tier %r: removing evicted blocks raised", self.io.tier, exc_info=exc)


# -- the threads ------------------------------------------------------------------------------

#: What a thread runs: a share (its outcome, ``None`` for an eviction) and what it reports
#: if the share raises.
Task = Callable[[], "Outcome | None"]
ErrorResult = Callable[[BaseException], "Outcome | None"]
Idle = Callable[[], bool]


class Lanes:
    """``count`` daemon threads, each draining its own queue; outcomes go to ``done``.

    ``idle`` (optional) is background work a thread does when its queue is empty, one small
    step per call, checking the queue again after each (a task waits at most one step): it
    returns ``True`` while there is more to do.
    """

    def __init__(self, count: int, name: str, idle: Idle | None = None) -> None:
        self.done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._idle = idle
        self._queues: list[queue.SimpleQueue[tuple[Task, ErrorResult] | None]] = []
        self._threads: list[threading.Thread] = []
        for index in range(count):
            q: queue.SimpleQueue[tuple[Task, ErrorResult] | None] = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._run, args=(q,), name=f"kv-offload-{name}-io-{index}", daemon=True
            )
            self._queues.append(q)
            self._threads.append(thread)
            thread.start()

    def __len__(self) -> int:
        return len(self._queues)

    def submit(self, lane: int, task: Task, on_error: ErrorResult) -> None:
        self._queues[lane].put((task, on_error))

    def _run(self, tasks: queue.SimpleQueue[tuple[Task, ErrorResult] | None]) -> None:
        done = self.done
        idle = self._idle
        while True:
            try:
                item = tasks.get_nowait()
            except queue.Empty:
                if idle is not None:
                    try:
                        if idle():
                            continue
                    except BaseException:  # background work only: stop doing it, keep serving
                        logger.exception("fs tier I/O thread: idle work raised; stopped")
                        idle = None
                item = tasks.get()
            if item is None:
                return
            task, on_error = item
            try:
                result = task()
            except BaseException as exc:  # report, whatever it was, and keep serving
                try:
                    result = on_error(exc)
                except BaseException:  # pragma: no cover - on_error only builds a record
                    logger.exception("fs tier I/O thread: error handler raised")
                    continue
            if result is not None:
                done.put(result)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the queued tasks, then stop the threads."""
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join(timeout)
        self._queues = []
        self._threads = []


# -- what the scheduler holds -----------------------------------------------------------------


class BlockIO:
    """The I/O side of one tier, as its scheduler sees it: hand a job's blocks over
    (:meth:`submit`, :meth:`evict`), take the outcomes back (:meth:`finished`), and the
    spare files' and deleted files' figures. ``room`` (blocks the capacity still has room
    for) is read by idle threads, without a lock: an estimate is enough, a spare file costs
    an inode and no data."""

    def __init__(
        self,
        tier: str,
        threads: int,
        root: RootDir,
        block_size: int,
        durable: bool,
        auth: BlockAuth | None,
        cpu: npt.NDArray[np.uint8],
        precreate_files: int,
        room: Callable[[], int],
    ) -> None:
        self._spares = SparePool(tier, precreate_files)
        self._context = IOContext(tier, root, block_size, durable, auth, cpu, self._spares)
        self._room = room
        self._closed = False
        #: evicted files removed or recycled, per thread (each slot written by its thread)
        self._removed = [0] * threads
        self._next_load_lane = 0
        self._lanes = Lanes(threads, tier, self._precreate)

    @property
    def root(self) -> RootDir:
        """The directory new jobs are submitted against."""
        return self._context.root

    def set_root(self, root: RootDir) -> None:
        """A ``root_dir`` that came back: new jobs use it (queued ones keep the old one), and
        creating files ahead resumes (it failed while ``tmp/`` was gone)."""
        self._context = IOContext(
            self._context.tier,
            root,
            self._context.block_size,
            self._context.durable,
            self._context.auth,
            self._context.cpu,
            self._spares,
        )
        self._spares.forget()  # any listed were in the old ``tmp/``, which the scan emptied
        self._spares.resume()

    def _split(self, items: list[tuple[bytes, int]]) -> dict[int, Items]:
        """``(key, CPU slot)`` items grouped by thread, each with its shard (one hash of the
        key picks both, :func:`.layout.key_hash`)."""
        lanes = len(self._removed)
        shards = layout.NUM_SHARDS
        parts: dict[int, Items] = {}
        for key, slot in items:
            h = layout.key_hash(key)
            parts.setdefault((h // shards) % lanes, []).append((key, slot, h % shards))
        return parts

    def submit(self, job_id: int, direction: JobDirection, items: list[tuple[bytes, int]]) -> int:
        """Write (``STORE``) or read (``LOAD``) ``items`` (key, CPU slot) on the threads; the
        number of shares, each reporting one :class:`Outcome` of ``job_id``. A store's blocks
        go to their keys' threads; a load's to whichever is free (:class:`LoadWork`)."""
        if direction is JobDirection.STORE:
            parts = self._split(items)
            for lane, part in parts.items():
                task = StoreShare(self._context, job_id, part)
                self._lanes.submit(lane, task, task.fail)
            return len(parts)
        lanes = len(self._removed)
        shares = min(lanes, len(items))
        shard = layout.shard_of
        work = LoadWork([(key, slot, shard(key)) for key, slot in items], shares)
        first = self._next_load_lane
        self._next_load_lane = (first + shares) % lanes  # single-block loads take turns
        for n in range(shares):
            share = LoadShare(self._context, job_id, work)
            self._lanes.submit((first + n) % lanes, share, share.fail)
        return shares

    def evict(self, keys: list[bytes]) -> None:
        """Remove (or recycle as spares) evicted blocks' files; nothing reports."""
        for lane, part in self._split([(key, 0) for key in keys]).items():
            task = EvictShare(self._context, part, self._removed, lane)
            self._lanes.submit(lane, task, task.fail)

    def finished(self) -> list[Outcome]:
        """The shares' outcomes reported since the last call."""
        done = self._lanes.done
        outcomes = []
        while not done.empty():
            outcomes.append(done.get_nowait())
        return outcomes

    @property
    def removed_files(self) -> int:
        """Evicted files removed or recycled so far."""
        return sum(self._removed)

    @property
    def spare_files(self) -> int:
        return len(self._spares)

    @property
    def precreated_files(self) -> int:
        return self._spares.precreated

    def limit_spares(self, headroom: int | None) -> None:
        """Keep spare files within half of ``headroom`` (block files the disk holds beyond
        the capacity; ``None``: not measured), the other half is for files in flight."""
        self._spares.limit = SPARE_FILES if headroom is None else min(SPARE_FILES, headroom // 2)

    def drop_spares(self) -> None:
        """Delete every spare file (a full disk: their space is wanted for blocks)."""
        self._spares.drop_all(self.root.tmp_fd)

    def forget_spares(self) -> None:
        """Forget every spare file (their directory is gone; a scan removes any left)."""
        self._spares.forget()

    def _precreate(self) -> bool:
        """Idle work of a thread: one empty spare file ahead of stores, if the capacity has
        room for the blocks it would hold (:meth:`SparePool.precreate`)."""
        return self._spares.precreate(self.root.tmp_fd, self._room, lambda: self._closed)

    def close(self) -> None:
        """Finish the queued I/O (deletes included), stop the threads, delete the spares."""
        self._closed = True
        self._lanes.close()
        self._spares.drop_all(self.root.tmp_fd)
