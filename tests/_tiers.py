"""Test tiers and byte helpers shared by the tiering tests.

* :func:`block_bytes` derives a block's bytes from its key, so any read back can be checked
  without remembering what was written.
* :class:`RecordingTier` is the example tier plus a log of every job and shutdown call.
* :class:`FaultyTier` keeps real bytes like the example tier, but fails a fraction of jobs,
  reports results late (after a number of ``get_finished`` polls) and raises from
  ``submit_*``. It copies bytes when a job *completes*, not when it is submitted, so a manager
  that released a pin or reused a reserved slot too early would corrupt what it reads back.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from kv_offload import (
    JobDirection,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    OffloadKey,
    ReqContext,
    SecondaryTierManager,
    make_offload_key,
)
from kv_offload_example_tier import ExampleSecondaryTierManager

__all__ = [
    "FaultyTier",
    "InjectedFault",
    "RecordedJob",
    "RecordingTier",
    "block_bytes",
    "expected_rows",
    "key",
]


def key(i: int) -> OffloadKey:
    return make_offload_key(i)


def block_bytes(k: OffloadKey, size: int) -> bytes:
    """``size`` bytes that depend only on the key (blake2b in counter mode)."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.blake2b(k + counter.to_bytes(4, "big"), digest_size=64).digest()
        counter += 1
    return bytes(out[:size])


def expected_rows(keys: Collection[OffloadKey], size: int) -> npt.NDArray[np.uint8]:
    return np.frombuffer(b"".join(block_bytes(k, size) for k in keys), np.uint8).reshape(
        len(keys), size
    )


@dataclass
class RecordedJob:
    job_id: int
    direction: JobDirection
    keys: list[OffloadKey]
    block_ids: list[int]
    req_id: str


class RecordingTier(ExampleSecondaryTierManager):
    """The example tier, logging jobs; ``fail_loads`` makes every promotion fail."""

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        capacity_blocks: int | None = None,
        fail_loads: bool = False,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type, capacity_blocks)
        self.fail_loads = fail_loads
        self.jobs: list[RecordedJob] = []
        self.shutdown_calls = 0
        self.finished_reqs: list[str] = []

    def _record(self, job: JobMetadata) -> None:
        self.jobs.append(
            RecordedJob(
                job.job_id,
                job.direction,
                list(job.keys),
                job.block_ids.tolist(),
                job.req_context.req_id,
            )
        )

    def submit_store(self, job: JobMetadata) -> None:
        self._record(job)
        super().submit_store(job)

    def submit_load(self, job: JobMetadata) -> None:
        self._record(job)
        if self.fail_loads:
            self._finished.append(JobResult(job.job_id, success=False))
        else:
            super().submit_load(job)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.finished_reqs.append(req_context.req_id)

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        super().shutdown()

    def loads(self) -> list[RecordedJob]:
        return [j for j in self.jobs if j.direction is JobDirection.LOAD]

    def stores(self) -> list[RecordedJob]:
        return [j for j in self.jobs if j.direction is JobDirection.STORE]


class InjectedFault(RuntimeError):
    """What :class:`FaultyTier` raises from ``submit_*``."""


@dataclass
class _InFlight:
    job: JobMetadata
    polls_left: int
    success: bool


@dataclass
class FaultCounters:
    submitted: int = 0
    failed: int = 0
    raised: int = 0
    delayed: int = 0
    torn_writes: int = 0
    missing_on_load: int = 0
    stored_blocks: int = 0
    loaded_blocks: int = 0
    evicted_blocks: int = 0
    shutdowns: int = 0
    polls: int = 0
    counts_by_dir: dict[str, int] = field(default_factory=dict)


class FaultyTier(SecondaryTierManager):
    """A bytes-keeping tier (LRU, ``capacity_blocks``) with injected faults.

    ``fail_rate``: fraction of jobs that report ``success=False`` (a failing load first
    scribbles garbage over its CPU rows, as a torn transfer would). ``min_delay``,
    ``max_delay``: a job's result is held for ``min_delay..max_delay`` polls of
    ``get_finished``. ``raise_rate``: fraction of
    ``submit_*`` calls that raise :class:`InjectedFault` without accepting the job.
    """

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        *,
        seed: int = 0,
        fail_rate: float = 0.0,
        max_delay: int = 0,
        min_delay: int = 0,
        raise_rate: float = 0.0,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type)
        self._cpu: npt.NDArray[np.uint8] = np.asarray(primary_kv_view)
        self._rng = random.Random(seed)
        self.fail_rate = fail_rate
        self.max_delay = max(max_delay, min_delay)
        self.min_delay = min_delay
        self.raise_rate = raise_rate
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[OffloadKey, bytes] = OrderedDict()
        self._storing: dict[OffloadKey, int] = {}  # keys of in-flight stores -> job count
        self._in_flight: list[_InFlight] = []
        self.counters = FaultCounters()

    # -- the tier interface -------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if key in self._blocks:
            return True
        return None if key in self._storing else False

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for k in keys:
            if k in self._blocks:
                self._blocks.move_to_end(k)

    def submit_store(self, job: JobMetadata) -> None:
        self._accept(job)
        for k in job.keys:
            self._storing[k] = self._storing.get(k, 0) + 1

    def submit_load(self, job: JobMetadata) -> None:
        self._accept(job)

    def get_finished(self) -> list[JobResult]:
        self.counters.polls += 1
        done: list[JobResult] = []
        waiting: list[_InFlight] = []
        for item in self._in_flight:
            if item.polls_left > 0:
                item.polls_left -= 1
                waiting.append(item)
            else:
                done.append(self._complete(item))
        self._in_flight = waiting
        return done

    def shutdown(self) -> None:
        self.counters.shutdowns += 1
        self._blocks.clear()

    # -- faults and bytes ---------------------------------------------------------------

    def _accept(self, job: JobMetadata) -> None:
        rng = self._rng
        direction = job.direction.value
        self.counters.counts_by_dir[direction] = self.counters.counts_by_dir.get(direction, 0) + 1
        if rng.random() < self.raise_rate:
            self.counters.raised += 1
            raise InjectedFault(f"{self.name}: injected failure in submit_{direction}")
        self.counters.submitted += 1
        delay = rng.randint(self.min_delay, self.max_delay) if self.max_delay else 0
        if delay:
            self.counters.delayed += 1
        success = rng.random() >= self.fail_rate
        self._in_flight.append(_InFlight(job, delay, success))

    def _complete(self, item: _InFlight) -> JobResult:
        job = item.job
        slots = job.block_ids.tolist()
        size = self.config.block_size_bytes
        if job.direction is JobDirection.STORE:
            for k in job.keys:
                left = self._storing[k] - 1
                if left:
                    self._storing[k] = left
                else:
                    del self._storing[k]
            if item.success:
                for k, slot in zip(job.keys, slots):
                    self._blocks[k] = self._cpu[slot].tobytes()
                    self._blocks.move_to_end(k)
                self.counters.stored_blocks += len(slots)
                self._evict_over_capacity()
        else:
            rows = [self._blocks.get(k) for k in job.keys]
            success = item.success
            if any(row is None for row in rows):
                self.counters.missing_on_load += 1
                success = False
            if success:
                for row, slot in zip(rows, slots):
                    self._cpu[slot] = np.frombuffer(row, np.uint8)  # type: ignore[arg-type]
                self.counters.loaded_blocks += len(slots)
            else:
                # A torn transfer: the reserved rows hold garbage; the manager must free them.
                self.counters.torn_writes += 1
                for slot in slots:
                    self._cpu[slot] = np.frombuffer(bytes([0xEE]) * size, np.uint8)
            item.success = success
        if not item.success:
            self.counters.failed += 1
        return JobResult(job.job_id, item.success)

    def _evict_over_capacity(self) -> None:
        if self.capacity_blocks is None:
            return
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.counters.evicted_blocks += 1

    def __len__(self) -> int:
        return len(self._blocks)
