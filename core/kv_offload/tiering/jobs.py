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

Tier plugins that raise or break their contract are counted in the tier's record and
reported by its :class:`~kv_offload.tiering.faults.TierFaults`.
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
from ..types import ReqContext, TierStats
from .base import JobDirection, JobMetadata, JobResult
from .promotions import PromotionLimits, Promotions
from .record import TierRecord

__all__ = ["Finished", "JobTable"]

logger = logging.getLogger("kv_offload.tiering")

_LOAD = JobDirection.LOAD
_STORE = JobDirection.STORE


@dataclass
class _Job:
    tier: TierRecord
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
    good: list[OffloadKey]
    failed: list[OffloadKey]
    reason: str | None

    @property
    def tier(self) -> TierRecord:
        return self.job.tier

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
    """The jobs of one tiered manager, counted into each tier's record, and its
    :attr:`promotions` (:mod:`kv_offload.tiering.promotions`)."""

    def __init__(
        self,
        owner: object,
        tiers: Sequence[TierRecord],
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
        #: The promotion state machine; a job's result moves its promotions on.
        self.promotions = Promotions(limits)

    def __len__(self) -> int:
        return len(self._jobs)

    # -- counters ---------------------------------------------------------------------------

    def reset(self) -> None:
        """``reset_cache``: forget promotions and waits, restart the counters and gates.
        Failure records are kept: the tiers keep their blocks."""
        self.promotions.reset()
        for tier in self._tiers:
            tier.stats = TierStats(tier.name)
            if tier.gate is not None:
                tier.gate.reset()

    @staticmethod
    def tier_stats(tier: TierRecord) -> TierStats:
        """A copy of ``tier``'s counters, with its gate's figures filled in."""
        copy = TierStats(**vars(tier.stats))
        gate = tier.gate
        if gate is not None:
            copy.cascades_in_flight = gate.in_flight
            copy.peak_cascades_in_flight = gate.peak_in_flight
            copy.backpressure = gate.detector.stats()
        return copy

    # -- cascades ---------------------------------------------------------------------------

    def admit(
        self, tier: TierRecord, keys: list[OffloadKey], ctx: ReqContext, hooks: HookCallers
    ) -> bool:
        """Whether a cascade of ``keys`` to ``tier`` goes out (the manager then pins the
        blocks and submits it). A gate that drops it: counted, ``kv_offload_cascade_dropped``
        fired, ``False``."""
        gate = tier.gate
        if gate is None:
            return True
        reason = gate.admit(len(keys))
        if reason is None:
            return True
        stats = tier.stats
        stats.dropped_cascades += 1
        stats.dropped_blocks += len(keys)
        self._errors.fire(
            hooks.cascade_dropped,
            manager=self._owner,
            tier=tier.name,
            keys=list(keys),
            reason=reason,
            req_context=ctx,
        )
        return False

    # -- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        tier: TierRecord,
        direction: JobDirection,
        keys: list[OffloadKey],
        slots: Sequence[int],
        ctx: ReqContext,
        *,
        staged: bool = False,
    ) -> Finished | None:
        """Hand a job to ``tier``. A tier that raises fails the job at once: the
        :class:`Finished` failure is returned for the manager to act on."""
        job_id = self._next_id
        self._next_id += 1
        meta = JobMetadata(job_id, keys, np.asarray(slots, np.int64), direction, ctx)
        job = self._jobs[job_id] = _Job(tier, meta, time.perf_counter(), staged=staged)
        if direction is _STORE and tier.gate is not None:
            job.started = time.monotonic()
        try:
            if direction is _LOAD:
                tier.plugin.submit_load(meta)
            else:
                tier.plugin.submit_store(meta)
        except Exception as exc:
            tier.stats.submit_errors += 1
            tier.faults.report(
                f"submit_{direction.value}",
                exc,
                "the job is failed and its CPU blocks are released",
            )
            return self._finished(JobResult(job_id, success=False), tier)
        return None

    def collect(self) -> Iterator[Finished]:
        """Every tier's finished jobs, one at a time (the manager acts on each before the
        next is taken)."""
        for tier in self._tiers:
            try:
                results = list(tier.plugin.get_finished())
            except Exception as exc:  # raising, or not an iterable of results
                tier.stats.contract_errors += 1
                tier.faults.report("get_finished", exc, "it is polled again")
                continue
            for result in results:
                finished = self._finished(result, tier)
                if finished is not None:
                    yield finished
            if tier.gate is not None:
                tier.last_poll = time.monotonic()

    def waiting_error(self) -> ManagerError:
        """The drain timed out: which tiers still hold jobs."""
        waiting = sorted({j.tier.name for j in self._jobs.values()})
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
        return max(0.0, job.tier.last_poll - job.started)

    def _finished(self, result: object, tier: TierRecord) -> Finished | None:
        """Take the job ``result`` reports out of the table: landed or failed (a promotion's
        state moves on here), or ``None`` for a result that is not one."""
        if not isinstance(result, JobResult):
            tier.stats.contract_errors += 1
            tier.faults.report(
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
        if job is None or job.tier is not tier:
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
            self.promotions.ended(tier, keys, failed)
        return Finished(job, good, failed, result.reason)

    def report(self, done: Finished, hooks: HookCallers) -> None:
        """After the manager acted on ``done`` in the CPU tier: count it, tell the gate, and
        fire the tier hooks."""
        job = done.job
        good, failed = done.good, done.failed
        tier = job.tier
        stats = tier.stats
        nbytes = len(good) * self._block_size
        if job.meta.direction is _LOAD:
            stats.promoted_blocks += len(good)
            stats.bytes_read += nbytes
            stats.failed_promotions += len(failed)
            done_hook, failed_hook = hooks.blocks_loaded, None
        else:
            gate = tier.gate
            if gate is not None:
                gate.finished(not failed, self._gate_seconds(job), nbytes)
            stats.cascaded_blocks += len(good)
            stats.bytes_written += nbytes
            stats.failed_cascades += len(failed)
            if good:  # stored again: it may be promoted from the tier
                self.promotions.stored(tier, good)
            done_hook, failed_hook = hooks.blocks_stored, hooks.store_failed
        errors = self._errors
        ctx = job.meta.req_context
        name = tier.name
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
