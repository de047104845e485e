"""The job table: every tier job and every promotion of one tiered manager, in one place.

It *decides* and keeps the books; it never calls the CPU tier. The tiered manager
(:mod:`kv_offload.tiering.manager`) asks it what to do, does the CPU side (pin, unpin,
reserve a slot, complete a store) and tells it the outcome:

* **Cascades** (``STORE`` jobs): :meth:`JobTable.admit` says whether a tier's cascade gate
  (backpressure, :mod:`kv_offload.tiering.cascade_gate`) lets a cascade through; the manager
  pins the blocks and :meth:`JobTable.submit` hands the job to the tier. A gated tier's jobs
  are timed to the last poll that found them unfinished (:meth:`JobTable._gate_seconds`).
* **Results**: :meth:`JobTable.collect` yields each finished job as a :class:`Finished`
  decision (which keys landed, which failed); the manager does the CPU side and hands it to
  :meth:`JobTable.report`, which counts it and fires the tier hooks. Every job ends in
  exactly one result.

Tier plugins that raise or break their contract are counted per tier and reported through
:class:`~kv_offload.tiering.faults.FaultReporter`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ManagerError, PluginError
from ..keys import OffloadKey
from ..plugins.dispatch import HookCallers, HookErrorLog
from ..types import LookupResult, ReqContext
from .base import JobDirection, JobMetadata, JobResult, SecondaryTierManager
from .faults import FaultReporter
from .promotions import PromotionLimits, Promotions
from .stats import TierStats

__all__ = ["Finished", "JobTable"]

logger = logging.getLogger("kv_offload.tiering")

_MISS = LookupResult.MISS
_PENDING = LookupResult.PENDING
_LOAD = JobDirection.LOAD
_STORE = JobDirection.STORE


@dataclass
class _Job:
    tier: int
    meta: JobMetadata
    submitted: float  # time.perf_counter() at submission
    started: float = 0.0  # time.monotonic() at submission (gated cascades only)
    #: A write-back job: its rows are staging rows (tiering/writes.py), not pinned CPU slots.
    staged: bool = False


@dataclass
class Finished:
    """A job that ended: what the manager does in the CPU tier, then hands to
    :meth:`JobTable.report`. ``good`` landed (a promotion) or reached the tier (a cascade);
    ``failed`` did not."""

    job: _Job
    tier: SecondaryTierManager
    good: list[OffloadKey]
    failed: list[OffloadKey]
    reason: str | None

    @property
    def direction(self) -> JobDirection:
        return self.job.meta.direction

    @property
    def keys(self) -> list[OffloadKey]:
        return self.job.meta.keys

    @property
    def req_context(self) -> ReqContext:
        return self.job.meta.req_context


class JobTable:
    """The jobs and per-tier counters of one tiered manager, and its :attr:`promotions`
    (:mod:`kv_offload.tiering.promotions`), which count into the same per-tier stats."""

    def __init__(
        self,
        owner: object,
        tiers: Sequence[SecondaryTierManager],
        errors: HookErrorLog,
        block_size: int,
        limits: PromotionLimits | None = None,
    ) -> None:
        self._owner = owner  # the manager hooks name as ``manager``
        self._tiers = tiers
        self._errors = errors
        self._block_size = block_size
        self._jobs: dict[int, _Job] = {}
        self._next_id = 0
        self.stats = [TierStats(tier.name) for tier in tiers]
        #: Each tier's cascade gate, or ``None`` (no backpressure for it).
        self.gates = [tier.cascade_gate for tier in tiers]
        self.faults = FaultReporter()
        #: ``time.monotonic()`` when each tier's results were last collected: a job reported
        #: now finished after that, so it took at least that long (see :meth:`_gate_seconds`).
        self._last_poll = [0.0] * len(tiers)
        #: The promotion state machine; a job's result moves its promotions on.
        self.promotions = Promotions(tiers, self.stats, self.faults, limits)

    def __len__(self) -> int:
        return len(self._jobs)

    # -- counters ---------------------------------------------------------------------------

    def reset(self) -> None:
        """``reset_cache``: forget promotions and waits, restart the counters and gates.
        Failure records are kept: the tiers keep their blocks."""
        self.promotions.reset()
        stats = self.stats  # restarted in place: the promotions count into the same list
        stats[:] = [TierStats(s.name) for s in stats]
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

    # -- cascades ---------------------------------------------------------------------------

    def admit(
        self, index: int, keys: list[OffloadKey], ctx: ReqContext, hooks: HookCallers
    ) -> bool:
        """Whether a cascade of ``keys`` to tier ``index`` goes out (the manager then pins the
        blocks and submits it). A gate that drops it: counted, ``kv_offload_cascade_dropped``
        fired, ``False``."""
        gate = self.gates[index]
        if gate is None:
            return True
        reason = gate.admit(len(keys))
        if reason is None:
            return True
        stats = self.stats[index]
        stats.dropped_cascades += 1
        stats.dropped_blocks += len(keys)
        self._errors.fire(
            hooks.cascade_dropped,
            manager=self._owner,
            tier=self._tiers[index].name,
            keys=list(keys),
            reason=reason,
            req_context=ctx,
        )
        return False

    # -- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        index: int,
        direction: JobDirection,
        keys: list[OffloadKey],
        slots: Sequence[int],
        ctx: ReqContext,
        *,
        staged: bool = False,
    ) -> Finished | None:
        """Hand a job to tier ``index``. A tier that raises fails the job at once: the
        :class:`Finished` failure is returned for the manager to act on."""
        job_id = self._next_id
        self._next_id += 1
        meta = JobMetadata(job_id, keys, np.asarray(slots, np.int64), direction, ctx)
        job = self._jobs[job_id] = _Job(index, meta, time.perf_counter(), staged=staged)
        if direction is _STORE and self.gates[index] is not None:
            job.started = time.monotonic()
        tier = self._tiers[index]
        try:
            if direction is _LOAD:
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
            return self._finished(JobResult(job_id, success=False), tier)
        return None

    def collect(self) -> Iterator[Finished]:
        """Every tier's finished jobs, one at a time (the manager acts on each before the
        next is taken)."""
        last_poll = self._last_poll
        for index, tier in enumerate(self._tiers):
            try:
                results = list(tier.get_finished())
            except Exception as exc:  # raising, or not an iterable of results
                self.stats[index].contract_errors += 1
                self.faults.report(tier.name, "get_finished", exc, "it is polled again")
                continue
            for result in results:
                finished = self._finished(result, tier)
                if finished is not None:
                    yield finished
            if self.gates[index] is not None:
                last_poll[index] = time.monotonic()

    def waiting_error(self) -> ManagerError:
        """The drain timed out: which tiers still hold jobs."""
        waiting = sorted({self._tiers[j.tier].name for j in self._jobs.values()})
        return ManagerError(
            f"{len(self._jobs)} tier job(s) did not finish within the drain timeout "
            f"(tiers: {', '.join(waiting)}); a tier must report every job it accepts"
        )

    def _gate_seconds(self, job: _Job) -> float:
        """How long a gated cascade job took, for its tier's backpressure detector: from its
        submission to the previous collection of the tier's results (it had not finished
        then), a lower bound. Results are collected once per engine step, so the time to this
        collection would add up to a whole step to every job: at 10 ms steps a 4 KiB block
        would read as 0.4 s/MiB, a disk far from busy as one under pressure."""
        return max(0.0, self._last_poll[job.tier] - job.started)

    def _finished(self, result: object, tier: SecondaryTierManager) -> Finished | None:
        """Take the job ``result`` reports out of the table: landed or failed (a promotion's
        state moves on here), or ``None`` for a result that is not one."""
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
            return None
        job = self._jobs.get(result.job_id)
        if job is None or self._tiers[job.tier] is not tier:
            logger.warning(
                "tier %r reported job %r, which it does not own or already reported; ignored",
                tier.name,
                result.job_id,
            )
            return None
        del self._jobs[result.job_id]
        keys = job.meta.keys
        if not result.success:
            good, failed = [], keys
        elif result.failed_keys:
            failed_set = result.failed_keys
            good = [k for k in keys if k not in failed_set]
            failed = [k for k in keys if k in failed_set]
        else:
            good, failed = keys, []
        if job.meta.direction is _LOAD:
            self.promotions.ended(job.tier, keys, failed)
        return Finished(job, tier, good, failed, result.reason)

    def report(self, done: Finished, hooks: HookCallers) -> None:
        """After the manager acted on ``done`` in the CPU tier: count it, tell the gate, and
        fire the tier hooks."""
        job = done.job
        good, failed = done.good, done.failed
        stats = self.stats[job.tier]
        nbytes = len(good) * self._block_size
        if job.meta.direction is _LOAD:
            stats.promoted_blocks += len(good)
            stats.bytes_read += nbytes
            stats.failed_promotions += len(failed)
            done_hook, failed_hook = hooks.blocks_loaded, None
        else:
            gate = self.gates[job.tier]
            if gate is not None:
                gate.finished(not failed, self._gate_seconds(job), nbytes)
            stats.cascaded_blocks += len(good)
            stats.bytes_written += nbytes
            stats.failed_cascades += len(failed)
            if good:  # stored again: it may be promoted from the tier
                self.promotions.stored(job.tier, good)
            done_hook, failed_hook = hooks.blocks_stored, hooks.store_failed
        errors = self._errors
        ctx = job.meta.req_context
        name = done.tier.name
        errors.fire(
            hooks.tier_job_finished,
            manager=self._owner,
            tier=name,
            direction=job.meta.direction.value,
            keys=list(job.meta.keys),
            success=not failed,
            nbytes=nbytes,
            req_context=ctx,
            seconds=time.perf_counter() - job.submitted,
            reason=done.reason,
        )
        for hook, group in ((done_hook, good), (failed_hook, failed)):
            if hook is not None and group:
                errors.fire(
                    hook, manager=self._owner, keys=list(group), medium=name, req_context=ctx
                )
