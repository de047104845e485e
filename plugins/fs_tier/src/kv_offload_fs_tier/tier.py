"""The fs tier: blocks as checksummed files under ``root_dir``, written and read by threads.

Scheduler side (every :class:`FileSystemTier` method): only memory. The index of stored
blocks (an ``OrderedDict``, least recently used first) is rebuilt from the directory at
construction and is touched by the scheduler thread only, so ``lookup`` is a dict probe:
``True`` for a stored block, ``None`` while a store of the key is in flight, ``False``
otherwise. ``submit_*`` reserve room, split the job by I/O thread and return.

I/O side (:mod:`._lanes`, :mod:`._io`): each thread writes or reads its share of a job's
blocks straight from or into the CPU buffer rows and reports per-key outcomes. The scheduler
applies them in ``get_finished`` and reports each job once, when its last share is in.

Invariants: every job reports exactly one :class:`JobResult`; a block is in the index only
once its file is complete; the index never holds more than the capacity (blocks being
written are counted when their store is submitted); a block that fails to load (missing,
corrupted, unreadable) leaves the index and its file is removed.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from kv_offload import OffloadKey, ReqContext
from kv_offload.block_auth import AUTH_KINDS, AuthFailureLog
from kv_offload.errors import ConfigError
from kv_offload.tiering import (
    JobDirection,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)

from . import _format, _io
from ._config import check_arguments, check_for_block_size, validate
from ._lanes import Lanes
from ._layout import RootDir, key_name, shard_of

__all__ = ["FileSystemTier", "FsTierStats"]

logger = logging.getLogger("kv_offload.fs_tier")

#: Evicted block files kept for reuse at most (the rest are deleted).
SPARE_FILES = 256
#: Empty files the I/O threads create ahead of stores while they have nothing else to do, at
#: most (and never more than the capacity has room for). Creating a file costs more than
#: writing a block into it (0.1 to 1 ms against ~0.2 ms for 256 KiB on the development VM's
#: ext4, see ``benchmarks/fs_tier.py``), so a burst of stores into a tier with room fills
#: files made while it was idle; a sustained stream beyond them pays the creation again.
PRECREATE_FILES = 256

#: Seconds between two looks for a removed ``root_dir``.
ROOT_RETRY_S = 1.0


def _result(job_id: int, success: bool, reason: str | None = None) -> JobResult:
    return JobResult(job_id, success, reason=reason)


def _os_reason(exc: OSError) -> tuple[str, str]:
    code = errno.errorcode.get(exc.errno or 0, "OSError")
    return code, f"{code}: {exc.strerror or exc}"


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
    #: while it was gone; times a full disk (ENOSPC) shrank ``capacity`` to what fitted
    root_lost: int = 0
    root_gone_jobs: int = 0
    capacity_shrinks: int = 0
    #: what the start found: blocks, leftover temporary files, files of the wrong size
    recovered_blocks: int = 0
    removed_temporary_files: int = 0
    removed_wrong_size_files: int = 0
    foreign_entries: int = 0
    startup_seconds: float = 0.0


@dataclass
class _Job:
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


@dataclass
class _Outcome:
    """One I/O thread's share of a job: keys done, keys failed with why, keys not tried."""

    job_id: int
    direction: JobDirection
    done: list[bytes] = field(default_factory=list)
    failed: list[tuple[bytes, str, str]] = field(default_factory=list)  # key, kind, message
    untried: list[bytes] = field(default_factory=list)
    #: a failure of the share as a whole (kind, message), e.g. a directory fsync
    error: tuple[str, str] | None = None


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
        self._auth = settings.auth
        self._auth_log = AuthFailureLog(tier_type, logger)
        self.root_dir = settings.root_dir
        self._block_size = block_size
        self._durable = settings.durable
        self._capacity = settings.capacity
        self._bytes_cost = settings.capacity_in_bytes
        self._cpu: npt.NDArray[np.uint8] = np.asarray(primary_kv_view)
        self._file_cost = _format.file_size(block_size) if self._bytes_cost else 1
        # key -> cost (1, or the file's bytes), least recently used first; scheduler-only
        self._index: OrderedDict[bytes, int] = OrderedDict()
        self._used = 0
        self._storing: dict[bytes, int] = {}  # key -> cost reserved for its in-flight store
        self._reserved = 0  # sum of self._storing's costs
        self._loading: dict[bytes, int] = {}  # key -> number of in-flight loads
        self._jobs: dict[int, _Job] = {}
        self._finished: list[JobResult] = []
        self._stats = FsTierStats(
            name=self.name,
            capacity=self._capacity,
            capacity_unit="bytes" if self._bytes_cost else "blocks",
        )
        self._closed = False
        # Evicted files waiting to be overwritten by a store (deque: thread-safe ends).
        self._spares: deque[tuple[str, int]] = deque()
        self._spare_ids = itertools.count()
        self._precreate_lock = threading.Lock()
        self._precreating = True
        #: monotonic time root_dir was found removed (None: present), when it was last
        #: looked for, and the directories it replaced (closed at shutdown: I/O queued
        #: before the loss may still hold their descriptors)
        self._lost_since: float | None = None
        self._lost_checked = 0.0
        self._old_roots: list[RootDir] = []
        #: the capacity was shrunk to what a full disk held, and no store has landed since
        self._shrunk = False
        self._root = RootDir(settings.root_dir, block_size, tier_type)
        try:
            scan = self._root.scan()
            self._lanes = Lanes(settings.io_threads, tier_type, self._precreate)
        except BaseException:
            self._root.close()
            raise
        for key in scan.keys:
            cost = self._cost(key)
            self._index[key] = cost
            self._used += cost
        stats = self._stats
        stats.recovered_blocks = len(scan.keys)
        stats.removed_temporary_files = scan.temporary_files
        stats.removed_wrong_size_files = scan.wrong_size_files
        stats.foreign_entries = scan.foreign_entries
        if scan.temporary_files or scan.wrong_size_files:
            logger.info(
                "tier %r: removed %d unfinished and %d wrong-size block file(s) left in %s",
                tier_type,
                scan.temporary_files,
                scan.wrong_size_files,
                settings.root_dir,
            )
        if scan.foreign_entries:
            logger.warning(
                "tier %r: %d entries under %s/blocks are not block files; left alone",
                tier_type,
                scan.foreign_entries,
                settings.root_dir,
            )
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

    # -- scheduler side: memory only ------------------------------------------------------

    def _cost(self, key: bytes) -> int:
        """1 per block, or its file size (one shared int)."""
        return self._file_cost

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if key in self._index:
            return True
        return None if key in self._storing else False

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        index = self._index
        for key in keys:
            if key in index:
                index.move_to_end(key)

    def _refuse(self, job: JobMetadata, kind: str, message: str) -> None:
        """Fail ``job`` before any I/O (nothing was reserved). A load of a block evicted since
        its lookup (``missing``) is a race every bounded tier has, not a fault: the manager
        answers the key MISS; it is logged at DEBUG, counted in ``failed_load_jobs``."""
        if job.direction is JobDirection.STORE:
            self._stats.failed_store_jobs += 1
            self._count(self._stats.store_errors, kind)
        else:
            self._stats.failed_load_jobs += 1
        logger.log(
            logging.DEBUG if kind == "missing" else logging.WARNING,
            "tier %r: %s job %d (%d blocks) failed: %s",
            self.name,
            job.direction.value,
            job.job_id,
            len(job.keys),
            message,
        )
        self._finished.append(_result(job.job_id, False, message))

    def _check_keys(self, job: JobMetadata) -> bool:
        for key in job.keys:
            if not isinstance(key, bytes) or not key or len(key) > _format.MAX_KEY_BYTES:
                self._refuse(
                    job,
                    "bad_key",
                    f"key {key!r} is not 1..{_format.MAX_KEY_BYTES} bytes (build keys with "
                    "kv_offload.make_offload_key)",
                )
                return False
        return True

    def submit_store(self, job: JobMetadata) -> None:
        if self._closed:
            self._refuse(job, "closed", "the tier is shut down")
            return
        if self._lost_since is not None and not self._root_back():
            self._refuse_root_gone(job)
            return
        if not self._check_keys(job):
            return
        index, storing = self._index, self._storing
        new: list[tuple[bytes, int]] = []
        seen: set[bytes] = set()
        need = 0
        for key, slot in zip(job.keys, job.block_ids.tolist()):
            if key in index:
                index.move_to_end(key)
                self._stats.already_stored_blocks += 1
            elif key not in storing and key not in seen:
                # A block already stored or being stored has these bytes: its key names them.
                seen.add(key)
                new.append((key, slot))
                need += self._cost(key)
        if not new:
            self._finished.append(_result(job.job_id, True))
            return
        if not self._make_room(need):
            self._refuse(
                job,
                "full",
                f"no room for {len(new)} blocks: the tier's capacity is held by blocks being "
                "loaded or stored",
            )
            return
        for new_key, _ in new:
            storing[new_key] = self._cost(new_key)
        self._reserved += need
        self._stats.stores_in_flight += 1
        self._dispatch(job, new, _StoreShare)

    def submit_load(self, job: JobMetadata) -> None:
        if self._closed:
            self._refuse(job, "closed", "the tier is shut down")
            return
        if self._lost_since is not None and not self._root_back():
            self._refuse_root_gone(job)
            return
        index = self._index
        missing = next((k for k in job.keys if k not in index), None)
        if missing is not None:
            self._refuse(job, "missing", f"block {missing!r} is not in this tier")
            return
        loading = self._loading
        for key in job.keys:
            index.move_to_end(key)
            loading[key] = loading.get(key, 0) + 1
        self._stats.loads_in_flight += 1
        self._dispatch(job, list(zip(job.keys, job.block_ids.tolist())), _LoadShare)

    def _dispatch(
        self, job: JobMetadata, items: list[tuple[bytes, int]], share: type[_Share]
    ) -> None:
        lanes = self._lanes
        count = len(lanes)
        by_lane: dict[int, list[tuple[bytes, int, int]]] = {}
        for key, slot in items:
            h = shard_of(key)
            by_lane.setdefault((h >> 8) % count, []).append((key, slot, h & 0xFF))
        order = [key for key, _ in items] if job.direction is JobDirection.STORE else []
        self._jobs[job.job_id] = _Job(job.direction, len(items), len(by_lane), order)
        for lane, part in by_lane.items():
            task = share(self, job.job_id, part)
            lanes.submit(lane, task, task.fail)

    def _make_room(self, need: int) -> bool:
        """Evict least recently used blocks (not being loaded) until ``need`` more fits;
        their files are deleted by the I/O threads. All or nothing."""
        over = self._used + self._reserved + need - self._capacity
        if over <= 0:
            return True
        loading = self._loading
        victims: list[bytes] = []
        freed = 0
        for key, cost in self._index.items():
            if key not in loading:
                victims.append(key)
                freed += cost
                if freed >= over:
                    break
        if freed < over:
            return False
        for key in victims:
            self._used -= self._index.pop(key)
        self._stats.evicted_blocks += len(victims)
        self._delete(victims)
        return True

    def _delete(self, keys: Iterable[bytes]) -> None:
        count = len(self._lanes)
        by_lane: dict[int, list[tuple[bytes, int]]] = {}
        for key in keys:
            h = shard_of(key)
            by_lane.setdefault((h >> 8) % count, []).append((key, h & 0xFF))
        for lane, part in by_lane.items():
            task = _EvictShare(self, part)
            self._lanes.submit(lane, task, task.fail)

    def get_finished(self) -> list[JobResult]:
        done = self._lanes.done
        while not done.empty():
            item = done.get_nowait()
            if isinstance(item, _Outcome):
                self._apply(item)
            else:
                self._stats.deleted_files += item
        finished, self._finished = self._finished, []
        return finished

    def _apply(self, outcome: _Outcome) -> None:
        stats = self._stats
        index = self._index
        if outcome.direction is JobDirection.STORE:
            storing = self._storing
            # Written blocks join the index when the whole job is reported, in job order.
            job_written = self._jobs[outcome.job_id].written
            job_written.update(outcome.done)
            for key, _, _ in outcome.failed:
                self._reserved -= storing.pop(key)
            for key in outcome.untried:
                self._reserved -= storing.pop(key)
            stats.stored_blocks += len(outcome.done)
        else:
            loading = self._loading
            for key in [*outcome.done, *outcome.untried, *(k for k, _, _ in outcome.failed)]:
                left = loading[key] - 1
                if left:
                    loading[key] = left
                else:
                    del loading[key]
            for key, kind, message in outcome.failed:
                cost = index.pop(key, 0)
                if cost:
                    self._used -= cost
                    stats.dropped_blocks += 1
                    self._count(stats.drop_reasons, kind)
                if kind in AUTH_KINDS:
                    stats.auth_failures += 1
                    self._auth_log.report(kind, f"block {key.hex()}: {message}", "file deleted")
            stats.loaded_blocks += len(outcome.done)
        job = self._jobs[outcome.job_id]
        job.parts_left -= 1
        if outcome.failed or outcome.untried:
            job.failed += len(outcome.failed) + len(outcome.untried)
            job.failed_keys.update(k for k, _, _ in outcome.failed)
            job.failed_keys.update(outcome.untried)
            if job.reason is None and outcome.failed:
                key, kind, message = outcome.failed[0]
                job.kind, job.reason = kind, f"block {key.hex()}: {message}"
        if outcome.error is not None:  # the blocks are whole, but not known to be durable
            job.failed += len(outcome.done)
            job.failed_keys.update(outcome.done)
            if job.reason is None:
                job.kind, job.reason = outcome.error
        if job.parts_left:
            return
        del self._jobs[outcome.job_id]
        store = job.direction is JobDirection.STORE
        if store:
            for key in job.order:
                if key in job.written:
                    cost = self._storing.pop(key)
                    self._reserved -= cost
                    if self._lost_since is None:  # else its file went with the directory
                        index[key] = cost
                        self._used += cost
            stats.stores_in_flight -= 1
            if job.written:
                self._shrunk = False
            if job.kind == "ENOENT" and self._lost_since is None and self._root_removed():
                self._lose_root()
            elif job.kind == "ENOSPC":
                self._drop_spares()
                self._shrink_to_fit()
        else:
            stats.loads_in_flight -= 1
        if job.failed:
            if store:
                stats.failed_store_jobs += 1
                self._count(stats.store_errors, job.kind or "unknown")
            else:
                stats.failed_load_jobs += 1
        if job.failed and self._lost_since is None and job.kind not in AUTH_KINDS:
            logger.warning(
                "tier %r: %s job %d failed for %d of %d blocks: %s",
                self.name,
                job.direction.value,
                outcome.job_id,
                job.failed,
                job.keys,
                job.reason,
            )
        # Only the keys that failed fail: a bad block never takes its neighbours with it.
        some_landed = job.failed < job.keys
        self._finished.append(
            JobResult(
                outcome.job_id,
                not job.failed or some_landed,
                job.reason,
                frozenset(map(OffloadKey, job.failed_keys))
                if job.failed and some_landed
                else frozenset(),
            )
        )

    # -- a removed root_dir, a full disk -----------------------------------------------------

    def _root_removed(self) -> bool:
        """Whether ``root_dir`` (or its ``blocks`` directory) no longer exists."""
        return not (self.root_dir / "blocks").is_dir()

    def _lose_root(self) -> None:
        """``root_dir`` was removed under the tier: its blocks are gone. Say so once; jobs
        fail at once (no I/O, no warning each) until the directory exists again."""
        self._lost_since = self._lost_checked = time.monotonic()
        gone = len(self._index)
        self._index.clear()
        self._used = 0
        self._spares.clear()  # their files went with the directory
        self._stats.root_lost += 1
        logger.warning(
            "tier %r: root_dir %s was removed while the tier ran (its %d blocks are gone); "
            "its jobs fail at once until the directory exists again (looked for every %.0f s)",
            self.name,
            self.root_dir,
            gone,
            ROOT_RETRY_S,
        )

    def _root_back(self) -> bool:
        """While ``root_dir`` is gone: open it again once it exists (looked for at most every
        :data:`ROOT_RETRY_S`, and only with no job in flight on the old one)."""
        now = time.monotonic()
        if now - self._lost_checked < ROOT_RETRY_S or self._jobs:
            return False
        self._lost_checked = now
        if not self.root_dir.is_dir():
            return False
        try:
            root = RootDir(self.root_dir, self._block_size, self.name)
            scan = root.scan()
        except (ConfigError, OSError) as exc:
            logger.debug("tier %r: root_dir %s not usable yet: %s", self.name, self.root_dir, exc)
            return False
        self._old_roots.append(self._root)
        self._root = root
        for key in scan.keys:  # a directory that came back with blocks (say, remounted)
            cost = self._cost(key)
            self._index[key] = cost
            self._used += cost
        self._make_room(0)
        logger.warning(
            "tier %r: root_dir %s is back after %.1f s (%d blocks in it); storing again",
            self.name,
            self.root_dir,
            now - (self._lost_since or now),
            len(scan.keys),
        )
        self._lost_since = None
        return True

    def _refuse_root_gone(self, job: JobMetadata) -> None:
        self._stats.root_gone_jobs += 1
        if job.direction is JobDirection.STORE:
            self._stats.failed_store_jobs += 1
            self._count(self._stats.store_errors, "root_gone")
        else:
            self._stats.failed_load_jobs += 1
        self._finished.append(_result(job.job_id, False, f"root_dir {self.root_dir} is gone"))

    def _drop_spares(self) -> None:
        """A full disk: delete the spare files (evicted ones keep their bytes' space), so the
        space of evicted blocks is free for the next stores."""
        spares = self._spares
        while True:
            try:
                name, _ = spares.popleft()  # an I/O thread may take one too: each once
            except IndexError:
                return
            with contextlib.suppress(OSError):
                _io.remove_block(self._root.tmp_fd, name)

    def _shrink_to_fit(self) -> None:
        """The disk is full before the capacity is: the capacity becomes what the disk held
        (less one job's worth of blocks, for the files in flight), and least recently used
        blocks are evicted to make room for later stores instead of every store failing."""
        if self._shrunk:
            return  # once per full disk: files being deleted free the space after it
        fits = max(self._file_cost, self._used - self._used // 20)
        if fits >= self._capacity:
            return
        self._shrunk = True
        logger.warning(
            "tier %r: the disk under %s is full at %d %s, below the capacity of %d: the "
            "capacity is now %d (evicting to make room); free space or lower the capacity",
            self.name,
            self.root_dir,
            self._used,
            self._stats.capacity_unit,
            self._capacity,
            fits,
        )
        self._capacity = self._stats.capacity = fits
        self._stats.capacity_shrinks += 1
        self._make_room(0)

    @staticmethod
    def _count(counter: dict[str, int], kind: str) -> None:
        counter[kind] = counter.get(kind, 0) + 1

    def get_stats(self) -> FsTierStats:
        stats = self._stats
        stats.name = self.name
        stats.spare_files = len(self._spares)
        stats.blocks = len(self._index)
        stats.used = self._used
        copy = FsTierStats(**vars(stats))
        copy.drop_reasons = dict(stats.drop_reasons)
        copy.store_errors = dict(stats.store_errors)
        return copy

    def shutdown(self) -> None:
        """Finish the queued I/O (deletes included), release the directory; with
        ``delete_on_shutdown``, remove what the tier wrote."""
        if self._closed:
            return
        self._closed = True
        self._lanes.close()
        self.get_finished()
        while self._spares:
            with contextlib.suppress(OSError):
                _io.remove_block(self._root.tmp_fd, self._spares.popleft()[0])
        self._root.close()
        for old in self._old_roots:
            old.close()
        if self.settings.delete_on_shutdown:
            self._root.destroy()

    # -- I/O side helpers (run on the I/O threads) ----------------------------------------

    def _precreate(self) -> bool:
        """Idle work of an I/O thread: create one empty spare file if the pool is short and
        the capacity has room for the blocks it will hold; ``False`` when there is nothing
        to do. Reads the scheduler's counters without a lock: an estimate is enough (a spare
        costs an inode and no data). A failure (a full disk, ...) stops it for good."""
        with self._precreate_lock:
            spares = self._spares
            if self._closed or not self._precreating or len(spares) >= self.precreate_files:
                return False
            room = (self._capacity - self._used - self._reserved) // self._file_cost
            if len(spares) >= room:
                return False
            name = f"spare-{next(self._spare_ids)}"
            try:
                _io.create_spare(self._root.tmp_fd, name)
            except OSError as exc:
                self._precreating = False
                logger.info("tier %r: no more files created ahead of stores: %s", self.name, exc)
                return False
            spares.append((name, 0))
            self._stats.precreated_files += 1
            return True

    def _row(self, slot: int) -> memoryview:
        view: memoryview = self._cpu[slot].data
        return view


class _Share:
    """One I/O thread's share of a job. ``fail`` is the result when the share raises."""

    def __init__(self, tier: FileSystemTier, job_id: int, items: list[tuple[bytes, int, int]]):
        self.tier = tier
        self.items = items
        self.outcome = _Outcome(job_id, self.direction)
        self._next = 0

    direction = JobDirection.STORE

    def __call__(self) -> _Outcome:  # pragma: no cover - overridden
        raise NotImplementedError

    def fail(self, exc: BaseException) -> _Outcome:
        """The keys done before ``exc`` stay done; the one that raised failed; the rest were
        not tried."""
        logger.error(
            "tier %r: I/O thread raised on a %s (the job fails, the tier keeps serving)",
            self.tier.name,
            self.direction.value,
            exc_info=exc,
        )
        outcome = self.outcome
        if self._next < len(self.items):
            key = self.items[self._next][0]
            outcome.failed.append((key, "internal", f"internal error: {type(exc).__name__}: {exc}"))
            outcome.untried.extend(k for k, _, _ in self.items[self._next + 1 :])
        return outcome


class _StoreShare(_Share):
    direction = JobDirection.STORE

    def __call__(self) -> _Outcome:
        tier = self.tier
        root = tier._root
        block_size = tier._block_size
        durable = tier._durable
        auth = tier._auth
        outcome = self.outcome
        synced: set[int] = set()
        spares = tier._spares
        for position, (key, slot, shard) in enumerate(self.items):
            self._next = position
            row = tier._row(slot)
            if auth is None:
                header = _format.pack_header(key, block_size, _format.checksum(row))
            else:
                header = _format.pack_signed_header(key, block_size, row, auth)
            try:
                spare = spares.popleft()
            except IndexError:
                spare = None
            try:
                _io.write_block(
                    root.tmp_fd, root.shard_fds[shard], key_name(key), header, row, durable, spare
                )
            except OSError as exc:
                kind, message = _os_reason(exc)
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
                kind, message = _os_reason(exc)
                outcome.error = (kind, f"syncing the block directory: {message}")
        return outcome


class _LoadShare(_Share):
    direction = JobDirection.LOAD

    def __call__(self) -> _Outcome:
        tier = self.tier
        root = tier._root
        block_size = tier._block_size
        auth = tier._auth
        outcome = self.outcome
        spare = bytearray(1)
        head = bytearray(_format.HEADER_SPACE)
        for position, (key, slot, shard) in enumerate(self.items):
            self._next = position
            row = tier._row(slot)
            shard_fd = root.shard_fds[shard]
            name = key_name(key)
            problem: tuple[str, str] | None
            try:
                nread = _io.read_block(shard_fd, name, head, row, spare)
            except FileNotFoundError:
                problem = ("missing", "the block file is gone")
            except OSError as exc:
                problem = _os_reason(exc)
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


class _EvictShare:
    """Evicted blocks' files: moved to the spare pool (up to ``SPARE_FILES``), else deleted."""

    def __init__(self, tier: FileSystemTier, items: list[tuple[bytes, int]]) -> None:
        self.tier = tier
        self.items = items

    def __call__(self) -> int:
        """How many of the files were removed or recycled (a file already gone, or one the
        OS refused to remove, is left to startup recovery, which scans the shards)."""
        tier = self.tier
        root = tier._root
        spares = tier._spares
        removed = 0
        for key, shard in self.items:
            name = key_name(key)
            try:
                if len(spares) < SPARE_FILES:
                    spare = f"spare-{next(tier._spare_ids)}"
                    gone = not _io.recycle_block(root.shard_fds[shard], name, root.tmp_fd, spare)
                    if not gone:
                        spares.append((spare, _format.file_size(tier._block_size)))
                else:
                    gone = not _io.remove_block(root.shard_fds[shard], name)
            except OSError:
                continue
            if not gone:
                removed += 1
        return removed

    def fail(self, exc: BaseException) -> int:
        logger.error("tier %r: removing evicted blocks raised", self.tier.name, exc_info=exc)
        return 0
