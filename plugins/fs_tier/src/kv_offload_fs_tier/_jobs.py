"""Jobs in flight: split by I/O thread at submit, merged as their shares come in, each
reported once.

A job is split by I/O thread into shares (:mod:`._shares`); each reports on its own. The
scheduler applies every share's outcome to the index and the counters as it arrives (a load's
bad blocks leave the index at once), and the job's record merges them: which keys landed,
which failed and the first reason. Only the keys that failed fail: a bad block never takes
its neighbours with it. Scheduler thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from kv_offload import OffloadKey
from kv_offload.block_auth import AUTH_KINDS, AuthFailureLog
from kv_offload.tiering import JobDirection, JobMetadata, JobResult

from ._index import BlockIndex
from ._layout import shard_of
from ._shares import Items, Outcome
from ._stats import FsTierStats, count

__all__ = ["Job", "JobBook", "by_lane"]

logger = logging.getLogger("kv_offload.fs_tier")


def by_lane(items: Iterable[tuple[bytes, int]], lanes: int) -> dict[int, Items]:
    """``(key, CPU slot)`` items grouped by I/O thread, each with its shard. One hash of the
    key picks both (its low byte the shard directory, the rest the thread), so every
    operation on a key runs on one thread, in the order it was submitted."""
    parts: dict[int, Items] = {}
    for key, slot in items:
        h = shard_of(key)
        parts.setdefault((h >> 8) % lanes, []).append((key, slot, h & 0xFF))
    return parts


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


class JobBook:
    """The jobs in flight and the results not yet handed out, kept against the tier's index
    and counters (given, not owned: the tier reads them too)."""

    def __init__(self, index: BlockIndex, stats: FsTierStats, auth_log: AuthFailureLog) -> None:
        self.index = index
        self.stats = stats
        self.auth_log = auth_log
        self._jobs: dict[int, Job] = {}
        self._finished: list[JobResult] = []

    def __bool__(self) -> bool:
        """Whether a job is in flight."""
        return bool(self._jobs)

    def take_finished(self) -> list[JobResult]:
        """The results since the last call, each job's once."""
        finished, self._finished = self._finished, []
        return finished

    def succeed(self, job: JobMetadata) -> None:
        """A job with nothing to do (every block of a store is stored already)."""
        self._finished.append(JobResult(job.job_id, True))

    def refuse(self, name: str, job: JobMetadata, kind: str, message: str) -> None:
        """Fail ``job`` before any I/O (nothing was reserved). A load of a block evicted since
        its lookup (``missing``) is a race every bounded tier has, not a fault: the manager
        answers the key MISS; it is logged at DEBUG, counted in ``failed_load_jobs``."""
        logger.log(
            logging.DEBUG if kind == "missing" else logging.WARNING,
            "tier %r: %s job %d (%d blocks) failed: %s",
            name,
            job.direction.value,
            job.job_id,
            len(job.keys),
            message,
        )
        self.fail(job, kind, message)

    def fail(self, job: JobMetadata, kind: str, message: str) -> None:
        """Fail ``job`` before any I/O, unlogged."""
        self.stats.job_failed(job.direction is JobDirection.STORE, kind)
        self._finished.append(JobResult(job.job_id, False, reason=message))

    def split(
        self, job: JobMetadata, items: list[tuple[bytes, int]], lanes: int
    ) -> dict[int, Items]:
        """Record ``job`` (its ``items``: key, CPU slot) and its shares, one per I/O thread."""
        parts = by_lane(items, lanes)
        order = [key for key, _ in items] if job.direction is JobDirection.STORE else []
        self._jobs[job.job_id] = Job(job.direction, len(items), len(parts), order)
        return parts

    def apply(self, outcome: Outcome) -> Job | None:
        """One share's outcome on the index and counters; its job, if that was its last share
        (the job then leaves the book: :meth:`land` and :meth:`report` end it)."""
        stats = self.stats
        index = self.index
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
                    self.auth_log.report(kind, f"block {key.hex()}: {message}", "file deleted")
            stats.loaded_blocks += len(outcome.done)
        job = self._jobs[outcome.job_id]
        if not job.merge(outcome):
            return None
        del self._jobs[outcome.job_id]
        return job

    def land(self, job: Job, present: bool) -> None:
        """A job's last share is in: a store's written blocks join the index in job order
        (``present`` false: their files went with a removed ``root_dir``, they do not)."""
        if job.direction is JobDirection.STORE:
            for key in job.order:
                if key in job.written:
                    self.index.store_ended(key, present)
            self.stats.stores_in_flight -= 1
        else:
            self.stats.loads_in_flight -= 1

    def report(self, name: str, job_id: int, job: Job, quiet: bool) -> None:
        """Count an ended job and hand out its one result; a failure is logged unless
        ``quiet`` (the tier said why once already) or an authentication failure (logged by
        ``auth_log``, rate-limited)."""
        if job.failed:
            self.stats.job_failed(job.direction is JobDirection.STORE, job.kind or "unknown")
        if job.failed and not quiet and job.kind not in AUTH_KINDS:
            logger.warning(
                "tier %r: %s job %d failed for %d of %d blocks: %s",
                name,
                job.direction.value,
                job_id,
                job.failed,
                job.keys,
                job.reason,
            )
        self._finished.append(job.result(job_id))
