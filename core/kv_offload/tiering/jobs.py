"""Tier jobs in flight: submitting them, collecting their results, and what a result does.

* A cascade (``STORE``) job pins its CPU blocks (one reader per job) until the tier reports it.
* A promotion (``LOAD``) job fills CPU slots reserved as pending stores; promotions queued
  during a scheduler step go out at ``on_schedule_end()`` as one job per (tier, request).
* Every job ends in exactly one result. A failed or crashed job releases its pins; a failed
  promotion frees its slot, so the key is a ``MISS`` in the CPU tier again.
* A tier with a cascade gate (backpressure on, :mod:`kv_offload.tiering.cascade_gate`) has
  its cascade jobs timed from submission to the poll that collects the result, and the gate
  told; tiers without one pay nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..cpu import CPUOffloadingManager
from ..errors import ManagerError, PluginError
from ..events import EventLog
from ..keys import OffloadKey
from ..plugins import HookErrorLog
from ..types import ReqContext
from .base import JobDirection, JobMetadata, JobResult, SecondaryTierManager
from .faults import FaultReporter
from .promotion_limits import PromotionLimits
from .stats import TierStats

__all__ = ["JobTable"]

logger = logging.getLogger("kv_offload.tiering")


@dataclass
class _Job:
    tier: int
    meta: JobMetadata
    submitted: float  # time.perf_counter() at submission
    started: float = 0.0  # time.monotonic() at submission (gated cascades only)


class JobTable:
    """The jobs of one tiered manager, by id; results update the CPU tier and the stats."""

    def __init__(
        self,
        owner: object,
        primary: CPUOffloadingManager,
        tiers: Sequence[SecondaryTierManager],
        errors: HookErrorLog,
        limits: PromotionLimits | None = None,
    ) -> None:
        self._owner = owner  # the manager hooks name as ``manager``
        self._primary = primary
        self._tiers = tiers
        self._errors = errors
        self._block_size = primary.kv_buffer.block_size_bytes if primary.kv_buffer else 0
        self._jobs: dict[int, _Job] = {}
        self._next_id = 0
        self.stats = [TierStats(tier.name) for tier in tiers]
        #: Each tier's cascade gate, or ``None`` (no backpressure for it).
        self.gates = [tier.cascade_gate for tier in tiers]
        #: Keys whose promotion is queued or in flight.
        self.promoting: set[OffloadKey] = set()
        self.faults = FaultReporter()
        #: The bound on PENDING answers: promotion deadlines and failure backoff.
        self.limits = limits if limits is not None else PromotionLimits()
        #: ``time.monotonic()`` when each tier's results were last collected: a job reported
        #: now finished after that, so it took at least that long (see :meth:`_gate_seconds`).
        self._last_poll = [0.0] * len(tiers)

    def __len__(self) -> int:
        return len(self._jobs)

    def reset_stats(self) -> None:
        self.stats = [TierStats(s.name) for s in self.stats]
        for gate in self.gates:
            if gate is not None:
                gate.reset()

    def tier_stats(self) -> list[TierStats]:
        """A copy of every tier's counters, with the gates' figures filled in."""
        out = []
        for stats, gate in zip(self.stats, self.gates):
            copy = TierStats(**vars(stats))
            if gate is not None:
                copy.cascades_in_flight = gate.in_flight
                copy.peak_cascades_in_flight = gate.peak_in_flight
                copy.backpressure = gate.detector.stats()
            out.append(copy)
        return out

    def submit(
        self,
        index: int,
        direction: JobDirection,
        keys: list[OffloadKey],
        slots: Sequence[int],
        ctx: ReqContext,
    ) -> None:
        """Hand a job to tier ``index``; a tier that raises fails the job at once."""
        job_id = self._next_id
        self._next_id += 1
        meta = JobMetadata(job_id, keys, np.asarray(slots, np.int64), direction, ctx)
        job = self._jobs[job_id] = _Job(index, meta, time.perf_counter())
        if direction is JobDirection.STORE and self.gates[index] is not None:
            job.started = time.monotonic()
        tier = self._tiers[index]
        try:
            if direction is JobDirection.LOAD:
                tier.submit_load(meta)
            else:
                tier.submit_store(meta)
        except Exception as exc:
            self.stats[index].submit_errors += 1
            self.faults.report(
                tier.name,
                f"submit_{direction.value}",
                exc,
                "the job is failed and its CPU blocks are released",
            )
            self._finish(JobResult(job_id, success=False), tier)

    def cascade(self, index: int, keys: list[OffloadKey], ctx: ReqContext) -> None:
        """One cascade job of ``keys`` to tier ``index`` (pinning them), unless the tier's
        gate drops it: then it is counted and ``kv_offload_cascade_dropped`` fires."""
        gate = self.gates[index]
        if gate is not None:
            reason = gate.admit(len(keys))
            if reason is not None:
                stats = self.stats[index]
                stats.dropped_cascades += 1
                stats.dropped_blocks += len(keys)
                self._errors.fire(
                    self._primary.hooks.cascade_dropped,
                    manager=self._owner,
                    tier=self._tiers[index].name,
                    keys=list(keys),
                    reason=reason,
                    req_context=ctx,
                )
                return
        slots = self._primary.pin(keys, ctx, "cascade")
        self.submit(index, JobDirection.STORE, keys, slots, ctx)

    def poll(self) -> None:
        """Collect every tier's finished jobs."""
        last_poll = self._last_poll
        for index, tier in enumerate(self._tiers):
            try:
                results = list(tier.get_finished())
            except Exception as exc:  # raising, or not an iterable of results
                self.stats[index].contract_errors += 1
                self.faults.report(tier.name, "get_finished", exc, "it is polled again")
                continue
            for result in results:
                self._finish(result, tier)
            if self.gates[index] is not None:
                last_poll[index] = time.monotonic()

    def _gate_seconds(self, job: _Job) -> float:
        """How long a gated cascade job took, for its tier's backpressure detector: from its
        submission to the previous collection of the tier's results (it had not finished
        then), a lower bound. Results are collected once per engine step, so the time to this
        collection would add up to a whole step to every job: at 10 ms steps a 4 KiB block
        would read as 0.4 s/MiB, a disk far from busy as one under pressure."""
        return max(0.0, self._last_poll[job.tier] - job.started)

    def drain(self, timeout: float) -> None:
        """Poll until every job has reported, or raise after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            self.poll()
            if not self._jobs:
                return
            if time.monotonic() >= deadline:
                waiting = sorted({self._tiers[j.tier].name for j in self._jobs.values()})
                raise ManagerError(
                    f"{len(self._jobs)} tier job(s) did not finish within the drain timeout "
                    f"(tiers: {', '.join(waiting)}); a tier must report every job it accepts"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _finish(self, result: object, tier: SecondaryTierManager) -> None:
        if not isinstance(result, JobResult):
            self.stats[self._tiers.index(tier)].contract_errors += 1
            self.faults.report(
                tier.name,
                "get_finished",
                PluginError(
                    f"get_finished() yielded {type(result).__name__} {result!r:.60}, not a "
                    f"JobResult; a tier must yield JobResult(job_id, success)",
                    kind="tier",
                    plugin=tier.name,
                ),
                "the item is ignored (its job stays in flight until it is reported)",
            )
            return
        job = self._jobs.get(result.job_id)
        if job is None or self._tiers[job.tier] is not tier:
            logger.warning(
                "tier %r reported job %r, which it does not own or already reported; ignored",
                tier.name,
                result.job_id,
            )
            return
        del self._jobs[result.job_id]
        meta = job.meta
        keys = meta.keys
        if not result.success:
            good, failed = [], keys
        elif result.failed_keys:
            failed_set = result.failed_keys
            good = [k for k in keys if k not in failed_set]
            failed = [k for k in keys if k in failed_set]
        else:
            good, failed = keys, []
        stats = self.stats[job.tier]
        nbytes = len(good) * self._block_size
        hooks = self._primary.hooks
        errors = self._errors
        ctx = meta.req_context
        if meta.direction is JobDirection.LOAD:
            self.promoting.difference_update(keys)
            self.limits.ended(job.tier, keys, failed)
            if good:
                errors.call(self._primary.complete_store, good, ctx, True)
            if failed:
                errors.call(self._primary.complete_store, failed, ctx, False)
            stats.promoted_blocks += len(good)
            stats.bytes_read += nbytes
            stats.failed_promotions += len(failed)
            done_hook, failed_hook = hooks.blocks_loaded, None
        else:
            self._primary.unpin(keys, ctx, "cascade")
            gate = self.gates[job.tier]
            if gate is not None:
                gate.finished(not failed, self._gate_seconds(job), nbytes)
            stats.cascaded_blocks += len(good)
            stats.bytes_written += nbytes
            stats.failed_cascades += len(failed)
            if good:
                self.limits.stored(job.tier, good)
                log: EventLog | None = self._primary.event_log
                if log is not None:
                    log.record(list(good), tier.name, False)
            done_hook, failed_hook = hooks.blocks_stored, hooks.store_failed
        errors.fire(
            hooks.tier_job_finished,
            manager=self._owner,
            tier=tier.name,
            direction=meta.direction.value,
            keys=list(keys),
            success=not failed,
            nbytes=nbytes,
            req_context=ctx,
            seconds=time.perf_counter() - job.submitted,
            reason=result.reason,
        )
        for hook, group in ((done_hook, good), (failed_hook, failed)):
            if hook is not None and group:
                errors.fire(
                    hook, manager=self._owner, keys=list(group), medium=tier.name, req_context=ctx
                )
