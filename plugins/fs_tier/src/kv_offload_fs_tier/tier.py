"""The fs tier: blocks as checksummed files under ``root_dir``, written and read by threads.

Scheduler side (every :class:`FileSystemTier` method): only memory. The index of stored
blocks (:mod:`._index`, least recently used first) is rebuilt from the directory at
construction and is touched by the scheduler thread only, so ``lookup`` is a set probe:
``True`` for a stored block, ``None`` while a store of the key is in flight, ``False``
otherwise. ``submit_*`` reserve room, split the job by I/O thread and return.

I/O side (:mod:`._lanes`, :mod:`._shares`, :mod:`._io`): each thread writes or reads its share
of a job's blocks straight from or into the CPU buffer rows and reports per-key outcomes. The
scheduler applies them in ``get_finished`` and reports each job once, when its last share is
in. Spare files (:mod:`._spares`) save stores the cost of creating a file.

Invariants: every job reports exactly one :class:`JobResult`; a block is in the index only
once its file is complete; the index never holds more than the capacity (blocks being
written are counted when their store is submitted); a block that fails to load (missing,
corrupted, unreadable) leaves the index and its file is removed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Iterable
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

from . import _format
from ._config import check_arguments, check_for_block_size, validate
from ._index import BlockIndex
from ._jobs import Job
from ._lanes import Lanes
from ._layout import RootDir, shard_of
from ._root_watch import RootWatch
from ._shares import EvictShare, IOContext, LoadShare, Outcome, StoreShare
from ._spares import PRECREATE_FILES, SparePool
from ._stats import FsTierStats, count

__all__ = ["FileSystemTier", "FsTierStats", "PRECREATE_FILES"]

logger = logging.getLogger("kv_offload.fs_tier")


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
        self._auth_log = AuthFailureLog(tier_type, logger)
        self.root_dir = settings.root_dir
        self._block_size = block_size
        bytes_cost = settings.capacity_in_bytes
        self._index = BlockIndex(
            settings.capacity, _format.file_size(block_size) if bytes_cost else 1
        )
        self._jobs: dict[int, Job] = {}
        self._finished: list[JobResult] = []
        self._stats = FsTierStats(
            name=self.name,
            capacity=settings.capacity,
            capacity_unit="bytes" if bytes_cost else "blocks",
        )
        self._closed = False
        self._spares = SparePool(tier_type, self.precreate_files)
        self._root_watch = RootWatch(settings.root_dir, block_size, tier_type)
        #: the capacity was shrunk to what a full disk held, and no store has landed since
        self._shrunk = False
        root = RootDir(settings.root_dir, block_size, tier_type)
        self._io = IOContext(
            tier_type,
            root,
            block_size,
            settings.durable,
            settings.auth,
            np.asarray(primary_kv_view),
            self._spares,
        )
        try:
            scan = root.scan()
            self._lanes = Lanes(settings.io_threads, tier_type, self._precreate)
        except BaseException:
            root.close()
            raise
        self._index.add(scan.keys)
        stats = self._stats
        stats.recovered(
            len(scan.keys), scan.temporary_files, scan.wrong_size_files, scan.foreign_entries
        )
        scan.log(tier_type, settings.root_dir)
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

    def _refuse(self, job: JobMetadata, kind: str, message: str) -> None:
        """Fail ``job`` before any I/O (nothing was reserved). A load of a block evicted since
        its lookup (``missing``) is a race every bounded tier has, not a fault: the manager
        answers the key MISS; it is logged at DEBUG, counted in ``failed_load_jobs``."""
        self._stats.job_failed(job.direction is JobDirection.STORE, kind)
        logger.log(
            logging.DEBUG if kind == "missing" else logging.WARNING,
            "tier %r: %s job %d (%d blocks) failed: %s",
            self.name,
            job.direction.value,
            job.job_id,
            len(job.keys),
            message,
        )
        self._finished.append(JobResult(job.job_id, False, reason=message))

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
        if self._root_watch.gone and not self._root_back():
            self._refuse_root_gone(job)
            return
        if not self._check_keys(job):
            return
        index = self._index
        new: list[tuple[bytes, int]] = []
        seen: set[bytes] = set()
        for key, slot in zip(job.keys, job.block_ids.tolist()):
            if index.touch(key):
                self._stats.already_stored_blocks += 1
            elif not index.storing(key) and key not in seen:
                # A block already stored or being stored has these bytes: its key names them.
                seen.add(key)
                new.append((key, slot))
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
        index.reserve(seen)
        self._stats.stores_in_flight += 1
        self._dispatch(job, new, StoreShare)

    def submit_load(self, job: JobMetadata) -> None:
        if self._closed:
            self._refuse(job, "closed", "the tier is shut down")
            return
        if self._root_watch.gone and not self._root_back():
            self._refuse_root_gone(job)
            return
        index = self._index
        missing = next((k for k in job.keys if k not in index), None)
        if missing is not None:
            self._refuse(job, "missing", f"block {missing!r} is not in this tier")
            return
        index.loads_started(job.keys)
        self._stats.loads_in_flight += 1
        self._dispatch(job, list(zip(job.keys, job.block_ids.tolist())), LoadShare)

    def _dispatch(
        self,
        job: JobMetadata,
        items: list[tuple[bytes, int]],
        share: type[StoreShare] | type[LoadShare],
    ) -> None:
        lanes = self._lanes
        lane_count = len(lanes)
        by_lane: dict[int, list[tuple[bytes, int, int]]] = {}
        for key, slot in items:
            h = shard_of(key)
            by_lane.setdefault((h >> 8) % lane_count, []).append((key, slot, h & 0xFF))
        order = [key for key, _ in items] if job.direction is JobDirection.STORE else []
        self._jobs[job.job_id] = Job(job.direction, len(items), len(by_lane), order)
        for lane, part in by_lane.items():
            task = share(self._io, job.job_id, part)
            lanes.submit(lane, task, task.fail)

    def _make_room(self, blocks: int) -> bool:
        """Evict least recently used blocks (not being loaded) until ``blocks`` more fit;
        their files are deleted by the I/O threads. All or nothing."""
        victims = self._index.make_room(blocks)
        if victims is None:
            return False
        if victims:
            self._stats.evicted_blocks += len(victims)
            self._delete(victims)
        return True

    def _delete(self, keys: Iterable[bytes]) -> None:
        lane_count = len(self._lanes)
        by_lane: dict[int, list[tuple[bytes, int]]] = {}
        for key in keys:
            h = shard_of(key)
            by_lane.setdefault((h >> 8) % lane_count, []).append((key, h & 0xFF))
        for lane, part in by_lane.items():
            task = EvictShare(self._io, part)
            self._lanes.submit(lane, task, task.fail)

    def get_finished(self) -> list[JobResult]:
        done = self._lanes.done
        while not done.empty():
            item = done.get_nowait()
            if isinstance(item, Outcome):
                self._apply(item)
            else:
                self._stats.deleted_files += item
        finished, self._finished = self._finished, []
        return finished

    def _apply(self, outcome: Outcome) -> None:
        stats = self._stats
        index = self._index
        job = self._jobs[outcome.job_id]
        if outcome.direction is JobDirection.STORE:
            # Written blocks join the index when the whole job is reported, in job order.
            for key, _, _ in outcome.failed:
                index.store_ended(key, False)
            for key in outcome.untried:
                index.store_ended(key, False)
            stats.stored_blocks += len(outcome.done)
        else:
            for key in [*outcome.done, *outcome.untried, *(k for k, _, _ in outcome.failed)]:
                index.load_ended(key)
            for key, kind, message in outcome.failed:
                if index.drop(key):
                    stats.dropped_blocks += 1
                    count(stats.drop_reasons, kind)
                if kind in AUTH_KINDS:
                    stats.auth_failures += 1
                    self._auth_log.report(kind, f"block {key.hex()}: {message}", "file deleted")
            stats.loaded_blocks += len(outcome.done)
        if job.merge(outcome):
            del self._jobs[outcome.job_id]
            self._job_done(outcome.job_id, job)

    def _job_done(self, job_id: int, job: Job) -> None:
        """The job's last share is in: land its blocks, count it, report it once."""
        stats = self._stats
        store = job.direction is JobDirection.STORE
        if store:
            present = not self._root_watch.gone  # else the files went with the directory
            for key in job.order:
                if key in job.written:
                    self._index.store_ended(key, present)
            stats.stores_in_flight -= 1
            if job.written:
                self._shrunk = False
            watch = self._root_watch
            if job.kind == "ENOENT" and not watch.gone and watch.removed():
                watch.lose(self._index.clear())
                self._spares.drop_all(None)  # their files went with the directory
                stats.root_lost += 1
            elif job.kind == "ENOSPC":
                self._spares.drop_all(self._io.root.tmp_fd)
                self._shrink_to_fit()
        else:
            stats.loads_in_flight -= 1
        if job.failed:
            stats.job_failed(store, job.kind or "unknown")
        if job.failed and not self._root_watch.gone and job.kind not in AUTH_KINDS:
            logger.warning(
                "tier %r: %s job %d failed for %d of %d blocks: %s",
                self.name,
                job.direction.value,
                job_id,
                job.failed,
                job.keys,
                job.reason,
            )
        self._finished.append(job.result(job_id))

    # -- a removed root_dir, a full disk -----------------------------------------------------

    def _root_back(self) -> bool:
        """While ``root_dir`` is gone: whether it is back (its blocks, if any, indexed)."""
        back = self._root_watch.reopen(self._io.root, bool(self._jobs))
        if back is None:
            return False
        root, scan = back
        self._io = dataclasses.replace(self._io, root=root)
        self._index.add(scan.keys)  # a directory that came back with blocks (say, remounted)
        self._make_room(0)
        return True

    def _refuse_root_gone(self, job: JobMetadata) -> None:
        self._stats.root_gone_jobs += 1
        self._stats.job_failed(job.direction is JobDirection.STORE, "root_gone")
        self._finished.append(JobResult(job.job_id, False, f"root_dir {self.root_dir} is gone"))

    def _shrink_to_fit(self) -> None:
        """The disk is full before the capacity is: the capacity becomes what the disk held
        (less one job's worth of blocks, for the files in flight), and least recently used
        blocks are evicted to make room for later stores instead of every store failing."""
        if self._shrunk:
            return  # once per full disk: files being deleted free the space after it
        index = self._index
        before = index.capacity
        if not index.shrink_to_used():
            return
        self._shrunk = True
        logger.warning(
            "tier %r: the disk under %s is full at %d %s, below the capacity of %d: the "
            "capacity is now %d (evicting to make room); free space or lower the capacity",
            self.name,
            self.root_dir,
            index.used,
            self._stats.capacity_unit,
            before,
            index.capacity,
        )
        self._stats.capacity = index.capacity
        self._stats.capacity_shrinks += 1
        self._make_room(0)

    def get_stats(self) -> FsTierStats:
        self._stats.name = self.name
        return self._stats.snapshot(
            spare_files=len(self._spares),
            precreated_files=self._spares.precreated,
            blocks=len(self._index),
            used=self._index.used,
        )

    def shutdown(self) -> None:
        """Finish the queued I/O (deletes included), release the directory; with
        ``delete_on_shutdown``, remove what the tier wrote."""
        if self._closed:
            return
        self._closed = True
        self._lanes.close()
        self.get_finished()
        root = self._io.root
        self._spares.drop_all(root.tmp_fd)
        root.close()
        self._root_watch.close()
        if self.settings.delete_on_shutdown:
            root.destroy()

    def _precreate(self) -> bool:
        """Idle work of an I/O thread: one empty spare file ahead of stores, if the capacity
        has room for the blocks it would hold (:meth:`SparePool.precreate`)."""
        return self._spares.precreate(self._io.root.tmp_fd, self._index.room, lambda: self._closed)
