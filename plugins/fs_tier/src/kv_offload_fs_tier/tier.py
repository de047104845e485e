"""The fs tier's scheduler side: :class:`FileSystemTier`, its index, its jobs, its capacity
and its counters. Every method runs on the scheduler thread and touches only memory (the
I/O is :mod:`.io`'s threads'; the disk is :mod:`.layout`'s).

**The index** (:class:`BlockIndex`): the stored blocks, least recently used first, rebuilt
from the directory at construction, so ``lookup`` is a set probe: ``True`` for a stored
block, ``None`` while a store of the key is in flight, ``False`` otherwise. Every block costs
the same of the capacity: 1 when it is in blocks, the size of its file (header included) when
it is in bytes. Blocks being written are counted against the capacity from the moment their
store is submitted (``reserve``), and blocks being read are never evicted, so the index never
holds more than the capacity and a load never loses its file.

**Jobs**: ``submit_*`` reserve room and hand the blocks to :class:`.io.BlockIO`, which splits
them by I/O thread into shares; each share reports an :class:`.io.Outcome`. ``get_finished``
applies every outcome to the index and the counters as it arrives (a load's bad blocks leave
the index at once), and the job's record (:class:`Job`) merges them: which keys landed, which
failed and the first reason. A job is reported once, when its last share is in: its stored
blocks join the index in job order. Only the keys that failed fail: a bad block never takes
its neighbours with it.

**The capacity and the disk** (:meth:`FileSystemTier._fit_to_disk`): a capacity larger than
the disk fills it, and then every store fails. So the tier measures the disk (``statvfs``) at
start and whenever a store finds it full (``ENOSPC``), and bounds the capacity by what the
disk holds for it: the blocks it has or is writing, plus the block files the free space still
takes, less 5% (:meth:`BlockIndex.fit_to_disk`). The disk is measured, not inferred from the
index: spare files of evicted blocks and files being written take room the index does not
count, and a bound taken from the index alone shrank again at every full disk (972, 841, then
768 blocks on a disk that held 1,023). Spare files are kept within half the 5%
(:meth:`.io.BlockIO.limit_spares`), the other half is for files in flight, so a disk the tier
alone fills bounds the capacity once per start, to the same figure at every start.

Invariants: every job reports exactly one :class:`JobResult`; a block is in the index only
once its file is complete; the index never holds more than the capacity; a block that fails
to load (missing, corrupted, unreadable) leaves the index and its file is removed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kv_offload import OffloadKey, ReqContext
from kv_offload.block_auth import AUTH_KINDS, AuthFailureLog
from kv_offload.tiering import (
    JobDirection,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)

from . import layout
from .config import check_arguments, check_for_block_size, validate
from .io import PRECREATE_FILES, BlockIO, Outcome
from .layout import RootDir, RootWatch, ScanResult, scan

__all__ = ["DISK_MARGIN_BLOCKS", "PRECREATE_FILES", "FileSystemTier", "FsTierStats"]

logger = logging.getLogger("kv_offload.fs_tier")

#: Block files a disk-bound capacity leaves free at least (a twentieth of the disk on all but
#: the smallest disks): a store writes its file before the evicted block it replaces leaves.
DISK_MARGIN_BLOCKS = 4


# -- the counters -----------------------------------------------------------------------------


@dataclass
class FsTierStats:
    """Counters of one fs tier since construction (``blocks`` and ``used``: now)."""

    name: str
    blocks: int = 0
    used: int = 0
    capacity: int = 0
    capacity_unit: str = "blocks"
    stores_in_flight: int = 0
    loads_in_flight: int = 0
    stored_blocks: int = 0
    already_stored_blocks: int = 0
    loaded_blocks: int = 0
    evicted_blocks: int = 0
    #: evicted block files removed from the shards (recycled for later stores or deleted)
    deleted_files: int = 0
    failed_store_jobs: int = 0
    failed_load_jobs: int = 0
    dropped_blocks: int = 0
    #: why blocks were dropped on load ("checksum", "truncated", "missing", "EIO", ...)
    drop_reasons: dict[str, int] = field(default_factory=dict)
    #: blocks that failed authentication (``auth_key_env``): unsigned, forged, swapped,
    #: signed with a secret this tier does not hold; never served (kinds in drop_reasons)
    auth_failures: int = 0
    #: failed store jobs by reason ("ENOSPC", "EACCES", "EIO", "internal", "full", ...)
    store_errors: dict[str, int] = field(default_factory=dict)
    #: empty files created ahead of stores (while the I/O threads were idle), and spare
    #: files (those and recycled evicted ones) waiting for a store now
    precreated_files: int = 0
    spare_files: int = 0
    #: times ``root_dir`` was found removed while the tier ran, and jobs failed at once
    #: while it was gone; times the disk bounded ``capacity`` (at start, or a full disk)
    root_lost: int = 0
    root_gone_jobs: int = 0
    capacity_shrinks: int = 0
    #: what the start found: blocks, leftover temporary files, files of the wrong size
    recovered_blocks: int = 0
    removed_temporary_files: int = 0
    removed_wrong_size_files: int = 0
    foreign_entries: int = 0
    startup_seconds: float = 0.0

    def job_failed(self, store: bool, kind: str) -> None:
        """A job failed: a store counted by ``kind`` in ``store_errors``, or a load."""
        if store:
            self.failed_store_jobs += 1
            _count(self.store_errors, kind)
        else:
            self.failed_load_jobs += 1

    def recovered(self, scan: ScanResult) -> None:
        """What the start found in ``root_dir``."""
        self.recovered_blocks = len(scan.keys)
        self.removed_temporary_files = scan.temporary_files
        self.removed_wrong_size_files = scan.wrong_size_files
        self.foreign_entries = scan.foreign_entries

    def snapshot(self, **now: int | str) -> FsTierStats:
        """A copy, its by-reason counters too, with the current figures ``now``."""
        copy = dataclasses.replace(self, **now)  # type: ignore[arg-type]
        copy.drop_reasons = dict(self.drop_reasons)
        copy.store_errors = dict(self.store_errors)
        return copy


def _count(counter: dict[str, int], kind: str) -> None:
    """One more ``kind`` in a by-reason counter (``drop_reasons``, ``store_errors``)."""
    counter[kind] = counter.get(kind, 0) + 1


# -- the index and the capacity ---------------------------------------------------------------


class BlockIndex:
    """Stored blocks (LRU order), stores in flight, loads in flight, the capacity."""

    def __init__(self, capacity: int, cost: int) -> None:
        #: In the capacity's unit (blocks, or bytes); bound by the disk (:meth:`fit_to_disk`).
        self.capacity = capacity
        #: What one block costs of the capacity.
        self.cost = cost
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._storing: set[bytes] = set()
        self._loading: dict[bytes, int] = {}  # key -> loads in flight
        #: what the disk holds for the tier (capacity unit), as last measured (``None``: not
        #: measured); the capacity is bound to it once ``disk_bound``
        self.disk: int | None = None
        self.disk_bound = False

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def __iter__(self) -> Iterator[bytes]:
        """The stored keys, least recently used first."""
        return iter(self._blocks)

    @property
    def used(self) -> int:
        return len(self._blocks) * self.cost

    @property
    def reserved(self) -> int:
        """What the stores in flight hold of the capacity."""
        return len(self._storing) * self.cost

    @property
    def num_storing(self) -> int:
        return len(self._storing)

    def storing(self, key: bytes) -> bool:
        return key in self._storing

    def room(self) -> int:
        """Blocks that still fit besides the stored and reserved ones."""
        return (self.capacity - self.used - self.reserved) // self.cost

    def touch(self, key: bytes) -> bool:
        """Make ``key`` the most recently used, if stored."""
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return True
        return False

    def to_store(self, items: Iterable[tuple[bytes, int]]) -> tuple[list[tuple[bytes, int]], int]:
        """A store's ``(key, CPU slot)`` items: those to write (not stored, not being stored,
        each key once), and how many were stored already (they become the most recent). A
        block stored or being stored has these bytes: its key names them."""
        new: list[tuple[bytes, int]] = []
        seen: set[bytes] = set()
        stored = 0
        for key, slot in items:
            if self.touch(key):
                stored += 1
            elif key not in self._storing and key not in seen:
                seen.add(key)
                new.append((key, slot))
        return new, stored

    def add(self, keys: Iterable[bytes]) -> None:
        """Blocks found on disk (at start, or when ``root_dir`` comes back)."""
        for key in keys:
            self._blocks[key] = None

    def make_room(self, blocks: int) -> list[bytes] | None:
        """Evict least recently used blocks that no load is reading until ``blocks`` more fit
        (the victims, taken out of the index; their files are the caller's to delete), or
        ``None`` and no change if they cannot."""
        over = self.used + self.reserved + blocks * self.cost - self.capacity
        if over <= 0:
            return []
        wanted = -(-over // self.cost)
        loading = self._loading
        victims: list[bytes] = []
        for key in self._blocks:
            if key not in loading:
                victims.append(key)
                if len(victims) == wanted:
                    break
        if len(victims) < wanted:
            return None
        for key in victims:
            del self._blocks[key]
        return victims

    def reserve(self, keys: Iterable[bytes]) -> None:
        """Stores of ``keys`` were submitted: they hold room until they land or fail."""
        self._storing.update(keys)

    def store_ended(self, key: bytes, landed: bool) -> None:
        """A store of ``key`` ended; a landed block joins the index as the most recent."""
        self._storing.remove(key)
        if landed:
            self._blocks[key] = None

    def loads_started(self, keys: Iterable[bytes]) -> None:
        loading = self._loading
        for key in keys:
            self._blocks.move_to_end(key)
            loading[key] = loading.get(key, 0) + 1

    def load_ended(self, key: bytes) -> None:
        left = self._loading[key] - 1
        if left:
            self._loading[key] = left
        else:
            del self._loading[key]

    def drop(self, key: bytes) -> bool:
        """Forget a block whose file is bad; whether it was stored."""
        return self._blocks.pop(key, False) is None

    def fit_to_disk(self, free: int | None, full: bool) -> bool:
        """Bound the capacity by the disk: what the tier holds (stored and being written)
        plus the ``free`` block files that still fit, less a twentieth (at least
        :data:`DISK_MARGIN_BLOCKS`: room for files in flight and spare files), at least one
        block; whether that shrank it.

        At start (``full`` false) a disk that cannot hold the capacity bounds it. When a store
        finds the disk full: a bound capacity shrinks again only if the disk now holds less
        than it (another program took more than the twentieth), never for files in flight;
        an unbound one is bound to the disk, or, if the disk reports room for the capacity
        that it could not write (``free`` unknown, or a filesystem whose free space is not
        what it can write), to what the tier held."""
        cost = self.cost
        held = self.used + self.reserved
        measured = None if free is None else held + free * cost
        if not full:
            if measured is None:
                return False
            disk = measured
        elif self.disk_bound:
            if measured is None or measured >= self.capacity:
                return False
            disk = measured
        elif measured is None or measured - measured // 20 >= self.capacity:
            disk = held
        else:
            disk = measured
        self.disk = disk
        fits = max(cost, disk - max(disk // 20, DISK_MARGIN_BLOCKS * cost))
        if fits >= self.capacity:
            return False
        self.capacity = fits
        self.disk_bound = True
        return True

    def disk_headroom(self) -> int | None:
        """Block files the disk holds beyond the capacity, as last measured (``None``: not
        measured): the room spare files may take."""
        if self.disk is None:
            return None
        return max(0, self.disk - self.capacity) // self.cost

    def clear(self) -> int:
        """Forget every stored block (their directory is gone); how many there were."""
        gone = len(self._blocks)
        self._blocks.clear()
        return gone


# -- jobs in flight ---------------------------------------------------------------------------


@dataclass
class Job:
    """A job's shares reported so far: what landed, what failed and the first reason."""

    direction: JobDirection
    keys: int
    parts_left: int
    order: list[bytes]  # a store's keys, in job order
    written: set[bytes] = field(default_factory=set)
    failed: int = 0
    #: the keys that failed (their store or load did not happen), reported per key
    failed_keys: set[bytes] = field(default_factory=set)
    kind: str | None = None
    reason: str | None = None

    def merge(self, outcome: Outcome) -> bool:
        """One share's outcome; whether it was the last."""
        if self.direction is JobDirection.STORE:
            self.written.update(outcome.done)
        self.parts_left -= 1
        if outcome.failed or outcome.untried:
            self.failed += len(outcome.failed) + len(outcome.untried)
            self.failed_keys.update(k for k, _, _ in outcome.failed)
            self.failed_keys.update(outcome.untried)
            if self.reason is None and outcome.failed:
                key, kind, message = outcome.failed[0]
                self.kind, self.reason = kind, f"block {key.hex()}: {message}"
        if outcome.error is not None:  # the blocks are whole, but not known to be durable
            self.failed += len(outcome.done)
            self.failed_keys.update(outcome.done)
            if self.reason is None:
                self.kind, self.reason = outcome.error
        return not self.parts_left

    def result(self, job_id: int) -> JobResult:
        """The job's result: a success if any key landed, naming the keys that failed."""
        some_landed = self.failed < self.keys
        failed_keys = frozenset(map(OffloadKey, self.failed_keys))
        return JobResult(
            job_id,
            not self.failed or some_landed,
            self.reason,
            failed_keys if self.failed and some_landed else frozenset(),
        )


# -- the tier -----------------------------------------------------------------------------------


class FileSystemTier(SecondaryTierManager):
    """A persistent disk tier (entry point ``fs``); see the package README for the keys.

    ``root_dir`` (required) holds the blocks; exactly one of ``capacity_bytes`` (disk bytes,
    headers included) or ``capacity_blocks`` bounds it; ``fsync`` is ``"never"`` (default:
    a block survives a process crash, a power loss may drop it, never corrupt it) or
    ``"always"`` (a store is reported only once the block is on stable storage);
    ``io_threads`` I/O threads (default 4); ``delete_on_shutdown`` removes everything the tier
    wrote (and ``root_dir``, if the tier created it) at shutdown.
    """

    #: Empty files created ahead of stores at most (see :data:`PRECREATE_FILES`; a subclass
    #: may lower it, 0 creates none).
    precreate_files: int = PRECREATE_FILES

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str | Path | None = None,
        capacity_bytes: int | None = None,
        capacity_blocks: int | None = None,
        fsync: str = "never",
        io_threads: int = 4,
        delete_on_shutdown: bool = False,
        auth_key_env: str | None = None,
        auth_key_previous_env: str | None = None,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type)
        started = time.perf_counter()
        block_size = config.block_size_bytes
        settings = validate(
            tier_type,
            block_size,
            root_dir=root_dir,
            capacity_bytes=capacity_bytes,
            capacity_blocks=capacity_blocks,
            fsync=fsync,
            io_threads=io_threads,
            delete_on_shutdown=delete_on_shutdown,
            auth_key_env=auth_key_env,
            auth_key_previous_env=auth_key_previous_env,
        )
        self.settings = settings
        self.root_dir = settings.root_dir
        bytes_cost = settings.capacity_in_bytes
        self._index = BlockIndex(
            settings.capacity, layout.file_size(block_size) if bytes_cost else 1
        )
        self._stats = FsTierStats(
            name=self.tier_type,
            capacity=settings.capacity,
            capacity_unit="bytes" if bytes_cost else "blocks",
        )
        self._jobs: dict[int, Job] = {}
        self._finished: list[JobResult] = []
        self._auth_log = AuthFailureLog(tier_type, logger)
        self._closed = False
        self._root_watch = RootWatch(settings.root_dir, block_size, tier_type)
        root = RootDir(settings.root_dir, block_size, tier_type)
        try:
            found = scan(root)
            self._io = BlockIO(
                tier_type,
                settings.io_threads,
                root,
                block_size,
                settings.durable,
                settings.auth,
                np.asarray(primary_kv_view),
                self.precreate_files,
                self._index.room,
            )
        except BaseException:
            root.close()
            raise
        self._index.add(found.keys)
        stats = self._stats
        stats.recovered(found)
        found.log(tier_type, settings.root_dir)
        self._fit_to_disk(full=False)  # a disk that cannot hold the capacity bounds it
        self._make_room(0)  # the capacity may have shrunk since the blocks were written
        stats.startup_seconds = time.perf_counter() - started

    @classmethod
    def validate_arguments(cls, **arguments: Any) -> None:
        """The keys as written, and ``root_dir`` usable (a writable directory, or creatable;
        not another program's, not of another format version); nothing is created."""
        check_arguments("fs", **arguments)

    @classmethod
    def validate_for_stack(cls, config: OffloadingConfig, **arguments: Any) -> None:
        """``capacity_bytes`` holds one block file; an existing ``root_dir`` holds blocks of
        this stack's ``block_size_bytes``."""
        check_for_block_size("fs", config.block_size_bytes, **arguments)

    # -- lookups: memory only -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def stored_keys(self) -> list[bytes]:
        """The stored blocks' keys, least recently used first (a snapshot)."""
        return list(self._index)

    @property
    def blocks_being_stored(self) -> int:
        """Blocks whose store is in flight (they hold room in the capacity already)."""
        return self._index.num_storing

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        index = self._index
        if key in index:
            return True
        return None if index.storing(key) else False

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        touch = self._index.touch
        for key in keys:
            touch(key)

    # -- submitting jobs ------------------------------------------------------------------------

    def submit_store(self, job: JobMetadata) -> None:
        if self._refused(job):
            return
        if (problem := layout.bad_key(job.keys)) is not None:
            self._refuse(job, "bad_key", problem)
            return
        index = self._index
        new, stored = index.to_store(zip(job.keys, job.block_ids.tolist()))
        self._stats.already_stored_blocks += stored
        if not new:
            self._finished.append(JobResult(job.job_id, True))
            return
        if not self._make_room(len(new)):
            self._refuse(
                job,
                "full",
                f"no room for {len(new)} blocks: the tier's capacity is held by blocks being "
                "loaded or stored",
            )
            return
        index.reserve(key for key, _ in new)
        self._stats.stores_in_flight += 1
        self._start(job, new)

    def submit_load(self, job: JobMetadata) -> None:
        if self._refused(job):
            return
        index = self._index
        missing = next((k for k in job.keys if k not in index), None)
        if missing is not None:
            self._refuse(job, "missing", f"block {missing!r} is not in this tier")
            return
        index.loads_started(job.keys)
        self._stats.loads_in_flight += 1
        self._start(job, list(zip(job.keys, job.block_ids.tolist())))

    def _start(self, job: JobMetadata, items: list[tuple[bytes, int]]) -> None:
        """Record ``job`` (its ``items``: key, CPU slot) and hand it to the I/O threads."""
        store = job.direction is JobDirection.STORE
        shares = self._io.submit(job.job_id, job.direction, items)
        order = [key for key, _ in items] if store else []
        self._jobs[job.job_id] = Job(job.direction, len(items), shares, order)

    def _refused(self, job: JobMetadata) -> bool:
        """Refuse a job the tier cannot take now (shut down, ``root_dir`` gone); whether it
        did. A gone ``root_dir`` fails its jobs at once and unlogged: it was said once."""
        if self._closed:
            self._refuse(job, "closed", "the tier is shut down")
            return True
        if self._root_watch.gone and not self._root_back():
            self._stats.root_gone_jobs += 1
            self._fail(job, "root_gone", f"root_dir {self.root_dir} is gone")
            return True
        return False

    def _refuse(self, job: JobMetadata, kind: str, message: str) -> None:
        """Fail ``job`` before any I/O (nothing was reserved). A load of a block evicted since
        its lookup (``missing``) is a race every bounded tier has, not a fault: the manager
        answers the key MISS; it is logged at DEBUG, counted in ``failed_load_jobs``."""
        logger.log(
            logging.DEBUG if kind == "missing" else logging.WARNING,
            "tier %r: %s job %d (%d blocks) failed: %s",
            self.tier_type,
            job.direction.value,
            job.job_id,
            len(job.keys),
            message,
        )
        self._fail(job, kind, message)

    def _fail(self, job: JobMetadata, kind: str, message: str) -> None:
        """Fail ``job`` before any I/O, unlogged."""
        self._stats.job_failed(job.direction is JobDirection.STORE, kind)
        self._finished.append(JobResult(job.job_id, False, reason=message))

    def _make_room(self, blocks: int) -> bool:
        """Evict least recently used blocks (not being loaded) until ``blocks`` more fit;
        their files are deleted by the I/O threads. All or nothing."""
        victims = self._index.make_room(blocks)
        if victims is None:
            return False
        if victims:
            self._stats.evicted_blocks += len(victims)
            self._io.evict(victims)
        return True

    # -- finishing jobs -------------------------------------------------------------------------

    def get_finished(self) -> list[JobResult]:
        for outcome in self._io.finished():
            self._apply(outcome)
            job = self._jobs[outcome.job_id]
            if job.merge(outcome):
                del self._jobs[outcome.job_id]
                self._job_done(outcome.job_id, job)
        finished, self._finished = self._finished, []
        return finished

    def _apply(self, outcome: Outcome) -> None:
        """One share's outcome on the index and the counters."""
        stats = self._stats
        index = self._index
        if outcome.direction is JobDirection.STORE:
            # Written blocks join the index when the whole job is reported, in job order.
            for key, _, _ in outcome.failed:
                index.store_ended(key, False)
            for key in outcome.untried:
                index.store_ended(key, False)
            stats.stored_blocks += len(outcome.done)
            return
        for key in [*outcome.done, *outcome.untried, *(k for k, _, _ in outcome.failed)]:
            index.load_ended(key)
        for key, kind, message in outcome.failed:
            if index.drop(key):
                stats.dropped_blocks += 1
                _count(stats.drop_reasons, kind)
            if kind in AUTH_KINDS:
                stats.auth_failures += 1
                self._auth_log.report(kind, f"block {key.hex()}: {message}", "file deleted")
        stats.loaded_blocks += len(outcome.done)

    def _job_done(self, job_id: int, job: Job) -> None:
        """The job's last share is in: its stored blocks join the index in job order (unless
        their files went with a removed ``root_dir``), a removed ``root_dir`` or a full disk is
        reacted to, and the job is counted and reported once."""
        watch = self._root_watch
        stats = self._stats
        if job.direction is JobDirection.STORE:
            present = not watch.gone
            for key in job.order:
                if key in job.written:
                    self._index.store_ended(key, present)
            stats.stores_in_flight -= 1
        else:
            stats.loads_in_flight -= 1
        if job.kind in ("ENOENT", "missing") and not watch.gone:
            missing = self._io.root.missing()  # a directory of the layout removed?
            if missing:
                watch.lose(self._index.clear(), missing)
                self._io.forget_spares()
                stats.root_lost += 1
        if job.kind == "ENOSPC":  # a store found the disk full
            self._io.drop_spares()
            if self._fit_to_disk(full=True):
                self._make_room(0)  # for later stores, instead of every store failing
        if job.failed:
            stats.job_failed(job.direction is JobDirection.STORE, job.kind or "unknown")
            # Said once already: a gone root_dir; logged by the rate-limited auth log.
            if not watch.gone and job.kind not in AUTH_KINDS:
                logger.warning(
                    "tier %r: %s job %d failed for %d of %d blocks: %s",
                    self.tier_type,
                    job.direction.value,
                    job_id,
                    job.failed,
                    job.keys,
                    job.reason,
                )
        self._finished.append(job.result(job_id))

    # -- the capacity and the disk ------------------------------------------------------------

    def _fit_to_disk(self, full: bool) -> bool:
        """Bound the capacity by what the disk holds (``full``: a store found it full); a
        shrink is logged with both figures and counted. Whether it shrank (then the caller
        evicts down to it, so later stores find room instead of failing)."""
        index = self._index
        before = index.capacity
        shrank = index.fit_to_disk(self._io.root.free_files(), full)
        self._io.limit_spares(index.disk_headroom())
        if not shrank:
            return False
        logger.warning(
            "tier %r: the disk under %s %s %d %s (%d stored), below the capacity of %d: the "
            "capacity is now %d (5%% left for files in flight); free space or lower the capacity",
            self.tier_type,
            self.root_dir,
            "is full at" if full else "holds at most",
            index.disk,
            self._stats.capacity_unit,
            index.used,
            before,
            index.capacity,
        )
        self._stats.capacity = index.capacity
        self._stats.capacity_shrinks += 1
        return True

    def _root_back(self) -> bool:
        """While ``root_dir`` is gone: whether it is back (its blocks, if any, indexed)."""
        back = self._root_watch.reopen(self._io.root, bool(self._jobs))
        if back is None:
            return False
        root, found = back
        self._io.set_root(root)
        self._index.add(found.keys)  # a directory that came back with blocks (say, remounted)
        self._make_room(0)
        return True

    # -- stats and shutdown ---------------------------------------------------------------------

    def get_stats(self) -> FsTierStats:
        return self._stats.snapshot(
            spare_files=self._io.spare_files,
            precreated_files=self._io.precreated_files,
            deleted_files=self._io.removed_files,
            blocks=len(self._index),
            used=self._index.used,
        )

    def shutdown(self) -> None:
        """Finish the queued I/O (deletes included), release the directory; with
        ``delete_on_shutdown``, remove what the tier wrote."""
        if self._closed:
            return
        self._closed = True
        self._io.close()
        self.get_finished()
        root = self._io.root
        root.close()
        self._root_watch.close()
        if self.settings.delete_on_shutdown:
            root.destroy()
