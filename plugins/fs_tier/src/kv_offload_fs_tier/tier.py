"""The fs tier: blocks as checksummed files under ``root_dir``, written and read by threads.

Scheduler side (every :class:`FileSystemTier` method): only memory. The index of stored
blocks (:mod:`._index`, least recently used first) is rebuilt from the directory at
construction and is touched by the scheduler thread only, so ``lookup`` is a set probe:
``True`` for a stored block, ``None`` while a store of the key is in flight, ``False``
otherwise. ``submit_*`` reserve room, split the job by I/O thread and return.

I/O side (:mod:`._lanes`, :mod:`._shares`, :mod:`._io`): each thread writes or reads its share
of a job's blocks straight from or into the CPU buffer rows and reports per-key outcomes. The
scheduler applies them in ``get_finished`` and reports each job once, when its last share is
in (:mod:`._jobs`). Spare files (:mod:`._spares`) save stores the cost of creating a file.

Invariants: every job reports exactly one :class:`JobResult`; a block is in the index only
once its file is complete; the index never holds more than the capacity (blocks being
written are counted when their store is submitted); a block that fails to load (missing,
corrupted, unreadable) leaves the index and its file is removed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
from kv_offload import OffloadKey, ReqContext
from kv_offload.block_auth import AuthFailureLog
from kv_offload.tiering import (
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)

from . import _format
from ._config import check_arguments, check_for_block_size, validate
from ._disk import fit_to_disk, free_files
from ._index import BlockIndex
from ._jobs import Job, JobBook, by_lane
from ._lanes import Lanes
from ._layout import RootDir
from ._root_watch import RootWatch
from ._scan import scan
from ._shares import EvictShare, IOContext, LoadShare, Outcome, StoreShare
from ._spares import PRECREATE_FILES, SparePool
from ._stats import FsTierStats

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
        self.root_dir = settings.root_dir
        bytes_cost = settings.capacity_in_bytes
        self._index = BlockIndex(
            settings.capacity, _format.file_size(block_size) if bytes_cost else 1
        )
        self._stats = FsTierStats(
            name=self.name,
            capacity=settings.capacity,
            capacity_unit="bytes" if bytes_cost else "blocks",
        )
        self._book = JobBook(self._index, self._stats, AuthFailureLog(tier_type, logger))
        self._closed = False
        self._spares = SparePool(tier_type, self.precreate_files)
        self._root_watch = RootWatch(settings.root_dir, block_size, tier_type)
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
            found = scan(root)
            self._lanes = Lanes(settings.io_threads, tier_type, self._precreate)
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
        self._book.refuse(self.name, job, kind, message)

    def _refused(self, job: JobMetadata) -> bool:
        """Refuse a job the tier cannot take now (shut down, ``root_dir`` gone); whether it
        did. A gone ``root_dir`` fails its jobs at once and unlogged: it was said once."""
        if self._closed:
            self._refuse(job, "closed", "the tier is shut down")
            return True
        if self._root_watch.gone and not self._root_back():
            self._stats.root_gone_jobs += 1
            self._book.fail(job, "root_gone", f"root_dir {self.root_dir} is gone")
            return True
        return False

    def submit_store(self, job: JobMetadata) -> None:
        if self._refused(job):
            return
        if (problem := _format.bad_key(job.keys)) is not None:
            self._refuse(job, "bad_key", problem)
            return
        index = self._index
        new, stored = index.to_store(zip(job.keys, job.block_ids.tolist()))
        self._stats.already_stored_blocks += stored
        if not new:
            self._book.succeed(job)
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
        self._dispatch(job, new, StoreShare)

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
        self._dispatch(job, list(zip(job.keys, job.block_ids.tolist())), LoadShare)

    def _dispatch(
        self,
        job: JobMetadata,
        items: list[tuple[bytes, int]],
        share: type[StoreShare] | type[LoadShare],
    ) -> None:
        lanes = self._lanes
        for lane, part in self._book.split(job, items, len(lanes)).items():
            task = share(self._io, job.job_id, part)
            lanes.submit(lane, task, task.fail)

    def _make_room(self, blocks: int) -> bool:
        """Evict least recently used blocks (not being loaded) until ``blocks`` more fit;
        their files are deleted by the I/O threads. All or nothing."""
        victims = self._index.make_room(blocks)
        if victims is None:
            return False
        self._stats.evicted_blocks += len(victims)
        lanes = self._lanes
        for lane, part in by_lane(((key, 0) for key in victims), len(lanes)).items():
            task = EvictShare(self._io, part)
            lanes.submit(lane, task, task.fail)
        return True

    def get_finished(self) -> list[JobResult]:
        book = self._book
        done = self._lanes.done
        while not done.empty():
            item = done.get_nowait()
            if not isinstance(item, Outcome):
                self._stats.deleted_files += item
            elif (job := book.apply(item)) is not None:
                self._job_done(item.job_id, job)
        return book.take_finished()

    def _job_done(self, job_id: int, job: Job) -> None:
        """The job's last share is in: land its blocks, react to a removed ``root_dir`` or a
        full disk, report it once."""
        watch = self._root_watch
        self._book.land(job, present=not watch.gone)  # else the files went with the directory
        if job.kind in ("ENOENT", "missing") and not watch.gone:
            missing = self._io.root.missing()  # a directory of the layout removed?
            if missing:
                watch.lose(self._index.clear(), missing)
                self._spares.drop_all(None)  # forgotten: the scan at the reopen removes any left
                self._stats.root_lost += 1
        if job.kind == "ENOSPC":  # a store found the disk full
            self._spares.drop_all(self._io.root.tmp_fd)
            if self._fit_to_disk(full=True):
                self._make_room(0)  # for later stores, instead of every store failing
        self._book.report(self.name, job_id, job, quiet=watch.gone)

    def _fit_to_disk(self, full: bool) -> bool:
        """Bound the capacity by what the disk holds (:mod:`._disk`); whether it shrank."""
        root = self._io.root
        free = free_files(root.tmp_fd, _format.file_size(self._io.block_size))
        return fit_to_disk(
            self.name, self.root_dir, self._index, self._stats, self._spares, free, full
        )

    # -- a removed root_dir ------------------------------------------------------------------

    def _root_back(self) -> bool:
        """While ``root_dir`` is gone: whether it is back (its blocks, if any, indexed)."""
        back = self._root_watch.reopen(self._io.root, bool(self._book))
        if back is None:
            return False
        root, found = back
        self._io = dataclasses.replace(self._io, root=root)
        self._index.add(found.keys)  # a directory that came back with blocks (say, remounted)
        self._spares.resume()  # creating files ahead failed while tmp/ was gone
        self._make_room(0)
        return True

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
