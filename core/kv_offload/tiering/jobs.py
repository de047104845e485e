"""The job table: every tier job and every promotion of one tiered manager, in one place.

It *decides* and keeps the books; it never calls the CPU tier. The tiered manager
(:mod:`kv_offload.tiering.manager`) asks it what to do, does the CPU side (pin, unpin,
reserve a slot, complete a store) and tells it the outcome:

* **Cascades** (``STORE`` jobs): :meth:`JobTable.admit` says whether a tier's cascade gate
  (backpressure, :mod:`kv_offload.tiering.cascade_gate`) lets a cascade through; the manager
  pins the blocks and :meth:`JobTable.submit` hands the job to the tier. A gated tier's jobs
  are timed to the last poll that found them unfinished (:meth:`JobTable._gate_seconds`).
* **Promotions** (``LOAD`` jobs) follow one state machine, per key::

      asked -> reserved -> loading -> landed
                  |           |   \\-> failed -> backoff (then asked again, a bounded
                  |           |                   number of times)
                  \\-----------+-> expired (answered MISS; the slot waits for the job)

  *asked*: :meth:`JobTable.ask` picks the first tier holding a CPU miss (or says ``MISS``
  or ``PENDING``); *reserved*: the manager reserved a CPU slot and :meth:`JobTable.reserved`
  queues the load until the step ends; *loading*: :meth:`JobTable.take_queued` hands the
  step's loads out as one job per (tier, request); *landed* / *failed*: the job's result.
  ``promoting`` holds every key between *reserved* and the result.
* **Results**: :meth:`JobTable.collect` yields each finished job as a :class:`Finished`
  decision (which keys landed, which failed); the manager does the CPU side and hands it to
  :meth:`JobTable.report`, which counts it and fires the tier hooks. Every job ends in
  exactly one result.

The bound on every ``PENDING`` answer, whatever a tier does:

* a promotion not landed ``timeout`` seconds after its slot was reserved *expires*: its
  lookups answer ``MISS``; the slot stays reserved (a pending store) until the job reports,
  because the tier may still write into it, and a late success lands the right bytes;
* a tier answering ``None`` ("ask again") ``timeout`` seconds after its first ``None`` for
  that request and key is taken as not holding it;
* a failed promotion resolves the key as ``MISS`` at once, and that tier is not asked about
  the key for ``backoff`` seconds, doubling per failure in a row; after ``max_failures``
  failures in a row it is not asked again until the key is stored to that tier again.

Tier plugins that raise or break their contract are counted per tier and reported through
:class:`~kv_offload.tiering.faults.FaultReporter`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import KeyStateError, ManagerError, PluginError
from ..keys import OffloadKey
from ..plugins import HookCallers, HookErrorLog
from ..types import LookupResult, ReqContext
from .base import JobDirection, JobMetadata, JobResult, SecondaryTierManager
from .faults import FaultReporter
from .stats import TierStats

__all__ = ["Finished", "JobTable", "PromotionLimits"]

logger = logging.getLogger("kv_offload.tiering")

_MISS = LookupResult.MISS
_PENDING = LookupResult.PENDING
_LOAD = JobDirection.LOAD
_STORE = JobDirection.STORE

#: Default seconds a promotion may stay ``PENDING`` (config key ``promotion_timeout_s``).
DEFAULT_TIMEOUT = 10.0
#: Default first backoff after a failed promotion (``promotion_backoff_s``).
DEFAULT_BACKOFF = 1.0
#: Default failures in a row after which a tier is not asked again until the key is stored.
DEFAULT_MAX_FAILURES = 3
#: Backoff records kept at most (the oldest is forgotten first: it is then asked again).
MAX_RECORDS = 1 << 17


@dataclass(frozen=True)
class PromotionLimits:
    """The bound on ``PENDING`` answers: promotion deadline and ask-again wait (``timeout``
    seconds), the first backoff after a failed promotion, and the failures in a row after
    which a tier is not asked about a key until the key is stored to it again."""

    timeout: float = DEFAULT_TIMEOUT
    backoff: float = DEFAULT_BACKOFF
    max_failures: int = DEFAULT_MAX_FAILURES


@dataclass
class _Job:
    tier: int
    meta: JobMetadata
    submitted: float  # time.perf_counter() at submission
    started: float = 0.0  # time.monotonic() at submission (gated cascades only)
    #: A write-back job: its rows are staging rows (tiering/writes.py), not pinned CPU slots.
    staged: bool = False


@dataclass
class _Promotion:
    """One key between *reserved* and its job's result."""

    tier: int
    reserved_at: float  # time.monotonic()
    expired: bool = False


@dataclass
class _Failures:
    count: int
    retry_at: float


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
    """The jobs, promotions and per-tier counters of one tiered manager."""

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
        self.limits = limits if limits is not None else PromotionLimits()
        #: ``time.monotonic()`` when each tier's results were last collected: a job reported
        #: now finished after that, so it took at least that long (see :meth:`_gate_seconds`).
        self._last_poll = [0.0] * len(tiers)
        #: Keys whose promotion is reserved (queued or loading), with its state.
        self.promoting: dict[OffloadKey, _Promotion] = {}
        #: (tier index, req_id) -> (context, keys, slots): loads waiting for the step end.
        self.queued: dict[tuple[int, str], tuple[ReqContext, list[OffloadKey], list[int]]] = {}
        #: req_id -> keys its lookups answered HIT or PENDING (protected from its promotions).
        self.found: dict[str, set[OffloadKey]] = {}
        #: (tier index, key) -> failures in a row and when the tier may be asked again.
        self._failures: dict[tuple[int, OffloadKey], _Failures] = {}
        #: req_id -> key -> when a tier first answered ``None`` for it.
        self._asked_again: dict[str, dict[OffloadKey, float]] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    # -- counters ---------------------------------------------------------------------------

    def reset(self) -> None:
        """``reset_cache``: forget promotions and waits, restart the counters and gates.
        Failure records are kept: the tiers keep their blocks."""
        self.promoting.clear()
        self.found.clear()
        self._asked_again.clear()
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

    def blocks_queued(self) -> int:
        return sum(len(keys) for _, keys, _ in self.queued.values())

    # -- promotions: asked -> reserved ------------------------------------------------------

    def note_found(self, req_id: str, key: OffloadKey) -> None:
        self.found.setdefault(req_id, set()).add(key)

    def protected(self, req_id: str) -> set[OffloadKey] | tuple[()]:
        """The keys a promotion for the request must not evict (those it found)."""
        return self.found.get(req_id, ())

    def ask(self, indices: tuple[int, ...], key: OffloadKey, ctx: ReqContext) -> int | LookupResult:
        """A CPU miss: the index of the first tier at ``indices`` that holds ``key`` (the
        manager reserves a CPU slot, then calls :meth:`reserved` or :meth:`refused`), or the
        answer: ``PENDING`` if none does but one said "ask again" within the timeout, else
        ``MISS``. A tier whose ``lookup`` raises or answers something other than True, False
        or None counts as a miss there; so does a tier backing off from the key."""
        ask_again = False
        tiers = self._tiers
        stats = self.stats
        failures = self._failures
        for index in indices:
            if failures:
                record = failures.get((index, key))
                if record is not None and time.monotonic() < record.retry_at:
                    stats[index].backed_off_lookups += 1
                    continue
            stats[index].lookups += 1
            try:
                held = tiers[index].lookup(key, ctx)
            except Exception as exc:  # contained: a miss for this tier (tiering/faults.py)
                stats[index].lookup_errors += 1
                self.faults.report(tiers[index].name, "lookup", exc, "the key is a miss there")
                continue
            if held is True:
                self._answered(ctx.req_id, key)
                stats[index].lookup_hits += 1
                return index
            if held is None:
                if self._may_wait(ctx.req_id, key):
                    ask_again = True
                else:
                    stats[index].ask_again_timeouts += 1
            elif held is not False:
                stats[index].contract_errors += 1
                self.faults.report(
                    tiers[index].name,
                    "lookup",
                    PluginError(
                        f"lookup() returned {type(held).__name__} {held!r:.40}; a tier's "
                        f"lookup must return True, False or None",
                        kind="tier",
                        plugin=tiers[index].name,
                    ),
                    "the key is a miss there",
                )
        if not ask_again:
            self._answered(ctx.req_id, key)
            return _MISS
        return _PENDING

    def _may_wait(self, req_id: str, key: OffloadKey) -> bool:
        """A tier answered ``None`` for ``key``: whether the request may still wait for it
        (``False`` once ``timeout`` seconds passed since the first such answer)."""
        waits = self._asked_again.setdefault(req_id, {})
        now = time.monotonic()
        first = waits.setdefault(key, now)
        return now - first < self.limits.timeout

    def _answered(self, req_id: str, key: OffloadKey) -> None:
        """A tier answered ``True`` or ``False`` for ``key``: the wait (if any) is over."""
        waits = self._asked_again.get(req_id)
        if waits:
            waits.pop(key, None)

    def reserved(self, index: int, key: OffloadKey, ctx: ReqContext, slot: int) -> None:
        """The manager reserved CPU ``slot`` for promoting ``key`` from tier ``index``: queue
        the load for the step end."""
        self.promoting[key] = _Promotion(index, time.monotonic())
        _, keys, slots = self.queued.setdefault((index, ctx.req_id), (ctx, [], []))
        keys.append(key)
        slots.append(slot)
        self.note_found(ctx.req_id, key)

    def refused(self, index: int) -> None:
        """No CPU slot could be reserved (or an admission hook said no): the key is a miss."""
        self.stats[index].refused_promotions += 1

    def expired(self, key: OffloadKey) -> bool:
        """Whether ``key``, answered ``PENDING`` by the CPU tier, is a promotion past its
        deadline (then the lookup answers ``MISS``; the slot waits for the job)."""
        promotion = self.promoting.get(key)
        if promotion is None:
            return False
        if not promotion.expired:
            if time.monotonic() - promotion.reserved_at < self.limits.timeout:
                return False
            promotion.expired = True
            self.stats[promotion.tier].expired_promotions += 1
            self.faults.report(
                self._tiers[promotion.tier].name,
                "promotion",
                ManagerError(
                    f"a promotion did not land within {self.limits.timeout:g} s "
                    f"(promotion_timeout_s)"
                ),
                "the key is answered MISS; its CPU slot stays reserved until the job reports",
            )
        return True

    def check_not_promoting(self, keys: list[OffloadKey], operation: str) -> None:
        """Raise if the engine completes a store of a key a promotion reserved: its slot is
        written by the tier's load, and completed by the tiered manager when that lands."""
        promoting = self.promoting
        if promoting and not promoting.keys().isdisjoint(keys):
            from ..cpu.validation import short  # the error path only

            key = next(k for k in keys if k in promoting)
            raise KeyStateError(
                f"{operation}: key {short(key)} is being promoted from a secondary tier, "
                f"not stored by the engine; pass the keys_to_store of prepare_store",
                key=key,
                operation=operation,
            )

    # -- promotions: reserved -> loading ----------------------------------------------------

    def take_queued(
        self, req_id: str | None = None
    ) -> list[tuple[int, ReqContext, list[OffloadKey], list[int]]]:
        """The queued loads (of one request, or all) to submit now, as (tier index, context,
        keys, slots): the manager submits each with :meth:`submit`."""
        queued = self.queued
        if not queued:
            return []
        groups = [g for g in queued if req_id is None or g[1] == req_id]
        return [(g[0], *queued.pop(g)) for g in groups]

    def finish_request(self, req_id: str) -> None:
        """The request finished (its queued loads were taken): its found keys are
        unprotected, its "ask again" waits forgotten."""
        self.found.pop(req_id, None)
        self._asked_again.pop(req_id, None)

    def cancel_queued(self) -> list[tuple[ReqContext, list[OffloadKey]]]:
        """``reset_cache``: drop every queued load (never submitted); the manager fails their
        CPU stores, which frees the slots."""
        dropped = [(ctx, keys) for ctx, keys, _ in self.queued.values()]
        for _, keys in dropped:
            for key in keys:
                self.promoting.pop(key, None)
        self.queued.clear()
        self.found.clear()
        return dropped

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
            self._promotion_ended(job.tier, keys, failed)
        return Finished(job, tier, good, failed, result.reason)

    def _promotion_ended(
        self, index: int, keys: list[OffloadKey], failed: list[OffloadKey]
    ) -> None:
        """loading -> landed (the key's failure record is cleared) or failed -> backoff."""
        promoting = self.promoting
        for key in keys:
            promoting.pop(key, None)
        failures = self._failures
        failed_set = set(failed)
        now = time.monotonic()
        for key in keys:
            if key in failed_set:
                self._failed(index, key, now)
            elif failures:
                failures.pop((index, key), None)

    def _failed(self, index: int, key: OffloadKey, now: float) -> None:
        """failed -> backoff: not asked for ``backoff * 2**(n-1)`` seconds after the n-th
        failure in a row; after ``max_failures``, not until the key is stored there again."""
        record = self._failures.pop((index, key), None)  # re-inserted last: newest
        count = 1 if record is None else record.count + 1
        limits = self.limits
        last = count >= limits.max_failures
        retry_at = math.inf if last else now + limits.backoff * (1 << (count - 1))
        self._failures[index, key] = _Failures(count, retry_at)
        if len(self._failures) > MAX_RECORDS:
            del self._failures[next(iter(self._failures))]

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
            if good and self._failures:  # stored again: it may be promoted from the tier
                for key in good:
                    self._failures.pop((job.tier, key), None)
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
