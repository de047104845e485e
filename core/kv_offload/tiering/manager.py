"""The CPU tier in front of secondary tiers: cascades stores, promotes misses.

* A successful ``complete_store`` cascades the blocks to every secondary tier (a job per
  tier); a tier with backpressure on has a cascade gate that may drop cascades to it
  (:mod:`kv_offload.tiering.cascade_gate`).
* A CPU miss that a tier has reserves a CPU slot and queues a promotion, submitted at
  ``on_schedule_end()``.
* Request-level offload and per-request tier filters: :mod:`kv_offload.tiering.request_scope`.
* Which blocks each tier writes, and when (write-through or write-back, admission):
  :mod:`kv_offload.tiering.writes`; this module acts on its decisions.

This module is the only code that calls the CPU tier: the CPU manager is handed over to it
(``CPUOffloadingManager.hand_over``, :mod:`kv_offload.cpu.handover`) and refuses every other
caller from then on. The job table (:mod:`kv_offload.tiering.jobs`: jobs, per-tier counters
and fault reports), the promotions (:mod:`kv_offload.tiering.promotions`: the promotion state
machine) and the request scope decide what to pin, reserve, complete or ask; the manager acts
on their decisions and tells them the outcome. Each call of the stack takes this manager's
entry guard once; the CPU tier's bodies run without a second one and validate the input
once. The tiers' events are
recorded in the CPU manager's event log, so one log holds the whole stack's events in order.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..base import OffloadingManager
from ..buffer import CPUKVBuffer
from ..concurrency import entry_guarded, new_entry_token
from ..cpu import CPUOffloadingManager
from ..cpu.validation import all_keys, as_list, check_context, check_keys, closed_error
from ..errors import ConfigError
from ..keys import OffloadKey
from ..plugins.dispatch import HookErrorLog
from ..plugins.loading import register_if_hookimpl
from ..tier_types import RequestOffloadingContext, TierFilter
from ..types import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
    TieringStats,
    TierStats,
)
from .base import JobDirection, SecondaryTierManager
from .jobs import Finished, JobTable
from .promotions import PromotionLimits
from .record import TierEntry, TierRecord, tier_records
from .request_scope import LoadPins, RequestScope, WholeRequest
from .waiting import backoff
from .writes import StackWrites

__all__ = ["TieringOffloadingManager"]

logger = logging.getLogger("kv_offload.tiering")

_MISS = LookupResult.MISS
#: The context of write-back jobs: a step's evictions of many requests, written as one job.
_WRITE_BACK_CONTEXT = ReqContext("kv-offload:write-back")
_HIT = LookupResult.HIT
_PENDING = LookupResult.PENDING
_LOAD = JobDirection.LOAD
_STORE = JobDirection.STORE


#: Refuses a batch holding a key that is not bytes-like: a tier writes keys as bytes, and one
#: bad key in a cascade job would fail the good keys with it.
class TieringOffloadingManager(OffloadingManager):
    """The manager API over a CPU tier (``primary``) and secondary tiers.

    Each of ``secondary_tiers`` is a :class:`~kv_offload.tiering.TierEntry` (a tier plugin
    and the stack's settings for it: name, locality, cascade gate, write policy, admission)
    or a bare tier plugin (an entry with the defaults). The manager keeps one record per
    tier (:mod:`kv_offload.tiering.record`) and never sets anything on a plugin; ``tiers``
    lists the plugins, :attr:`entries` their settings under the names the stack gave them.
    ``backpressure`` is the default ``backpressure`` table of tiers that have no cascade gate
    of their own (a config's global ``[backpressure]``); ``None`` leaves them ungated.
    ``promotion_limits`` bounds every ``PENDING`` answer (promotion deadline, failure backoff:
    :mod:`kv_offload.tiering.promotions`); ``None`` takes the defaults.

    Single-threaded like its CPU tier, which is handed over to it (its only caller from then
    on): every request-flow method, ``drain``, ``take_events``, ``reset_cache`` and
    ``shutdown`` take the entry guard of :mod:`kv_offload.concurrency` once, so a second
    thread, or a hook calling back into this manager (say from ``tier_job_finished``), gets
    :class:`~kv_offload.ConcurrentUseError` with nothing changed; the CPU tier's request flow
    refuses every caller but this manager, at any time. ``get_stats()``, ``cpu_stats()``,
    ``tier_stats()`` and ``has_pending_work()`` are lock-free reads. Tiers never call the
    manager: their threads touch only the CPU buffer rows of their jobs, and results are
    collected here, on the scheduler's thread. Share the stack between threads with
    :func:`kv_offload.synchronized`.
    """

    def __init__(
        self,
        primary: CPUOffloadingManager,
        secondary_tiers: Sequence[SecondaryTierManager | TierEntry],
        *,
        drain_timeout: float = 30.0,
        backpressure: Mapping[str, Any] | None = None,
        promotion_limits: PromotionLimits | None = None,
    ) -> None:
        if primary.kv_buffer is None:
            raise ConfigError(
                "TieringOffloadingManager needs a CPU tier with a KV buffer: create the "
                "CPUOffloadingManager with block_size_bytes=... (tiers copy real bytes)"
            )
        records = tier_records(secondary_tiers, backpressure)
        self.primary = primary
        self.kv_buffer: CPUKVBuffer = primary.kv_buffer
        #: The manager's record of each tier, in cascade order.
        self._tiers: list[TierRecord] = records
        #: The tier plugins, in cascade order.
        self.tiers: list[SecondaryTierManager] = [tier.plugin for tier in records]
        self.drain_timeout = drain_timeout
        self.plugin_manager = primary.plugin_manager
        #: The one error channel of a call: hook errors and broken admissions, raised when
        #: the call has done its work.
        self._errors = HookErrorLog()
        block_size = primary.kv_buffer.block_size_bytes
        self._jobs = JobTable(self, records, self._errors, block_size, promotion_limits)
        self._promotions = self._jobs.promotions
        self._scope = RequestScope(records)
        self._closed = False
        self._load_pins = LoadPins()  # the engine's, not the cascades'
        #: The stack's entry guard, taken once per call here, the object the engine holds
        #: (concurrency.py); the CPU tier is driven through its hand-over, below.
        self._entry = new_entry_token()
        self._own_plugins = [
            p for tier in self.tiers for p in register_if_hookimpl(self.plugin_manager, tier)
        ]
        #: What each tier writes and when (tiering/writes.py); ``_back`` its write-back part.
        self._writes = StackWrites(records, self.kv_buffer.array, primary.num_blocks)
        self._back = self._writes.back
        self._lookup_observers = self._writes.lookup_observers
        #: The CPU tier's request flow, handed over to this manager, its only caller
        #: (cpu/handover.py): its method bodies, without a second guard. Write-back tiers
        #: take the bytes of the blocks the CPU tier evicts.
        self._cpu = primary.hand_over(
            self, on_evict=None if self._back is None else self._back.evicted
        )

    # -- the request flow -----------------------------------------------------------------

    @entry_guarded
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Start the request in the CPU tier and ask every tier for its offload policy:
        ``REQUEST_LEVEL`` if any tier wants the whole request, else ``CHUNK_LEVEL``."""
        self._cpu.start_request(req_context)
        return self._scope.start(req_context)

    @entry_guarded
    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        if self._closed:
            raise closed_error("prepare_load")
        spec = self._cpu.prepare_load(keys, req_context)
        self._load_pins.add(keys)
        return spec

    @entry_guarded
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """The CPU tier's ``complete_load``, refused for a key the engine has not pinned: a
        block may also be pinned by a cascade job, and a second ``complete_load`` would
        otherwise take the cascade's pin and let the block be evicted while a tier reads it."""
        if self._closed:
            raise closed_error("complete_load")
        key_list = keys if type(keys) is list else as_list(keys, "complete_load")
        self._load_pins.check_pinned(key_list)
        self._cpu.complete_load(key_list, req_context)
        self._load_pins.release(key_list)

    @entry_guarded
    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        *,
        protected: Collection[OffloadKey] = (),
    ) -> PrepareStoreOutput | None:
        """The CPU tier's ``prepare_store``; if blocks pinned by finished cascades may be in
        the way, collect those tier results first. For a request some tiers
        want whole, its blocks already in the CPU tier are cascaded to those tiers."""
        keys = keys if type(keys) is list else as_list(keys, "prepare_store")
        if not all_keys(keys):  # keys reach the tiers from here: refused whole, up front
            check_keys(keys, "prepare_store")
        primary = self.primary
        if len(self._jobs) and len(keys) > primary.num_storable_blocks:
            # Blocks pinned by finished cascades may be in the way: collect those results
            # first, so the CPU tier is asked once (one offer, one allocation counted).
            self._collect()
        back = self._back
        if back is not None:
            self._wait_for_rows(len(keys))
        output: PrepareStoreOutput | None = self._errors.call(
            self._cpu.prepare_store, keys, req_context, protected=protected
        )
        if back is not None and back.pending:
            back.admit_evicted(req_context, self._errors)
        if output is not None and self._scope.whole:
            whole = self._scope.whole.get(req_context.req_id)
            if whole is not None:
                new = set(output.keys_to_store)
                self._cascade_present([k for k in keys if k not in new], whole)
        if self._errors.pending:
            self._errors.raise_pending(output)
        return output

    @property
    def entries(self) -> tuple[TierEntry, ...]:
        """Each tier's plugin and settings, in cascade order, under the name the stack calls
        it by (``entries[i].tier is tiers[i]``)."""
        return tuple(tier.entry() for tier in self._tiers)

    @entry_guarded
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if self._closed:
            raise closed_error("touch")
        key_list = keys if type(keys) is list else as_list(keys, "touch")
        if not all_keys(key_list):  # the tiers are told: refused whole, up front
            check_keys(key_list, "touch")
        self._cpu.touch(key_list, req_context)
        for tier in self.tiers:
            tier.touch(key_list, req_context)

    # -- lookups and promotions -----------------------------------------------------------

    @entry_guarded
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """The CPU tier's answer; on a CPU miss, the first tier holding the key is asked to
        promote it (``PENDING`` until it lands, ``MISS`` if no CPU slot can be freed).

        A tier answering ``None`` ("ask again": its store is in flight, or its existence check
        has not finished) makes the answer ``PENDING`` unless a later tier holds the key, so
        the engine asks again after its next step instead of recomputing the block. Only the
        tiers the request's ``load_tier_filter`` allows are asked.
        """
        asked = self._scope.tiers_for(req_context)  # raises before anything changed
        result = self._cpu.lookup(key, req_context)
        if not self.tiers:
            return result
        if self._lookup_observers:
            for observe in self._lookup_observers:
                observe(key, req_context)
        promotions = self._promotions
        if result is not _MISS:
            if result is _PENDING and promotions.expired(key):
                return _MISS  # a promotion past its deadline (tiering/promotions.py)
            promotions.note_found(req_context.req_id, key)
            return result
        if self._back is not None and self._back.holds(key):
            rescued = self._rescue(key, req_context)
            if rescued is not None:
                return rescued
        answer, holder = promotions.ask(asked, key, req_context)
        if holder is None:
            return answer
        return self._reserve(holder, key, req_context)

    def _reserve(self, tier: TierRecord, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        """Reserve a CPU slot for ``key``, held by ``tier``, and queue its load:
        ``PENDING``, or ``MISS`` when no CPU slot can be freed (or an admission hook said no).
        Keys the request found are protected: evicting an earlier hit of the same prefix
        would break its ``prepare_load``."""
        # A store-admission hook raises before anything changed (and so does this call); an
        # eviction hook raises after the slot was reserved: queue the promotion, then report.
        # A promotion is not an offer: the reuse filter admitted the block when it was stored.
        out = self._reserve_slot(key, ctx)
        if out is None or not out.keys_to_store:
            self._errors.raise_pending()  # an admission hook raised: nothing changed
            self._promotions.refused(tier)
            return _MISS
        self._promotions.reserved(tier, key, ctx, int(out.store_spec.block_ids[0]))
        self._errors.raise_pending()
        return _PENDING

    def _reserve_slot(self, key: OffloadKey, ctx: ReqContext) -> PrepareStoreOutput | None:
        """A CPU slot for ``key`` that a tier or a staging row fills (not an offer: the block
        was admitted when the engine first stored it), writing back what it evicts."""
        back = self._back
        if back is not None:
            self._wait_for_rows(1)
        out: PrepareStoreOutput | None = self._errors.call(
            self._cpu.reserve, [key], ctx, protected=self._promotions.protected(ctx.req_id)
        )
        if back is not None and back.pending:
            back.admit_evicted(ctx, self._errors)
        return out

    def _rescue(self, key: OffloadKey, ctx: ReqContext) -> LookupResult | None:
        """A CPU miss for a block whose write-back is in flight: copy its staged bytes into a
        CPU slot and answer ``HIT``; ``None`` when no slot can be freed (the tiers are asked)."""
        back = self._back
        if back is None:  # pragma: no cover - the caller checked
            return None
        out = self._reserve_slot(key, ctx)
        reserved = out is not None and bool(out.keys_to_store)
        # Waiting for a staging row may have ended the key's write-back: then ask the tiers.
        landed = reserved and back.holds(key)
        if landed and out is not None:
            back.staging.copy_out(key, int(out.store_spec.block_ids[0]))
            back.rescued += 1
            self._promotions.note_found(ctx.req_id, key)
        if reserved:
            self._errors.call(self._cpu.complete_store, [key], ctx, landed)
        self._errors.raise_pending()
        return _HIT if landed else None

    @entry_guarded
    def on_schedule_end(self) -> None:
        """Tell every tier the step ended, submit the promotions queued this step, then
        collect finished tier jobs."""
        if self._closed:
            raise closed_error("on_schedule_end")
        for tier in self._tiers:
            try:
                tier.plugin.on_schedule_end()
            except Exception:
                logger.exception("tier %r raised from on_schedule_end(); ignored", tier.name)
        self._submit_queued()
        self._submit_write_backs()
        self._collect()
        if self._scope.whole:
            for whole, keys in self._scope.take_parked():
                self._cascade_present(keys, whole)
        self._errors.raise_pending()

    # -- stores and cascades --------------------------------------------------------------

    @entry_guarded
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Complete the CPU store; on success cascade the blocks to every secondary tier."""
        if self._closed:
            raise closed_error("complete_store")
        key_list = keys if type(keys) is list else as_list(keys, "complete_store")
        self._promotions.check_not_promoting(key_list, "complete_store")
        # The CPU store is done even if one of its hooks raised: cascade it, then report.
        self._errors.call(self._cpu.complete_store, key_list, req_context, success)
        if success and key_list:
            if self._back is not None:
                self._back.stored(key_list)  # written back when evicted
            for tier in self._writes.through:
                writes = tier.writes
                if writes.admission is None:
                    self._cascade(tier, key_list, req_context)
                else:
                    admitted = writes.admit(key_list, req_context, self._errors)
                    if admitted:
                        self._cascade(tier, admitted, req_context)
        self._errors.raise_pending()

    def _cascade(self, tier: TierRecord, keys: list[OffloadKey], ctx: ReqContext) -> None:
        """One cascade job of ``keys`` to ``tier``, pinning them, unless its gate drops it
        (the job table counts that and fires ``kv_offload_cascade_dropped``)."""
        primary = self.primary
        if self._jobs.admit(tier, keys, ctx, primary.hooks):
            slots = self._cpu.pin(keys, ctx, "cascade")
            self._submit(tier, _STORE, keys, slots, ctx)

    def _submit_write_backs(self) -> None:
        """Submit each write-back tier's job of the blocks it admitted since the last one
        (its backpressure gate may drop it: the rows are released)."""
        back = self._back
        if back is None:
            return
        hooks = self.primary.hooks
        for tier, keys, rows in back.batches():
            if self._jobs.admit(tier, keys, _WRITE_BACK_CONTEXT, hooks):
                self._submit(tier, _STORE, keys, rows, _WRITE_BACK_CONTEXT, staged=True)
            else:
                back.release(keys)

    def _wait_for_rows(self, wanted: int) -> None:
        """Before a CPU call that may evict ``wanted`` dirty blocks: while the write-back
        staging is short of rows, submit the admitted write-backs and collect finished jobs,
        for at most ``drain_timeout`` (the eviction waits for its write-backs, never forever);
        victims that still find no row are not written back."""
        back = self._back
        if back is None or not back.short_of_rows(wanted):
            return
        self._submit_write_backs()
        for _ in backoff(self.drain_timeout):
            self._collect()
            if not back.short_of_rows(wanted):
                return
        back.rows_timed_out(self.drain_timeout)

    def _cascade_present(self, keys: list[OffloadKey], whole: WholeRequest) -> None:
        """Cascade the request's ``keys`` that are readable in the CPU tier to the tiers that
        want it whole (the request scope decides, parking keys still being promoted)."""
        ready = self._scope.ready(whole, keys, self._promotions.promoting, self.primary.ref_count)
        if ready:
            for tier in whole.tiers:
                self._cascade(tier, ready, whole.context)

    # -- jobs -------------------------------------------------------------------------------

    def _submit(
        self,
        tier: TierRecord,
        direction: JobDirection,
        keys: list[OffloadKey],
        slots: Sequence[int],
        ctx: ReqContext,
        *,
        staged: bool = False,
    ) -> None:
        failed = self._jobs.submit(tier, direction, keys, slots, ctx, staged=staged)
        if failed is not None:  # the tier raised: the job failed at once
            self._land(failed)

    def _submit_queued(self, req_id: str | None = None) -> None:
        """Submit the queued promotions (of one request, or all) as tier jobs."""
        for tier, ctx, keys, slots in self._promotions.take_queued(req_id):
            self._submit(tier, _LOAD, keys, slots, ctx)

    def _collect(self) -> None:
        """Act on every finished tier job."""
        for done in self._jobs.collect():
            self._land(done)

    def _land(self, done: Finished) -> None:
        """A job ended: a promotion completes its CPU store (landed keys loadable, failed
        keys' slots freed); a cascade releases its pins and records the tier's event. Then
        the job table counts it and fires the tier hooks."""
        primary = self.primary
        ctx = done.req_context
        if done.direction is _LOAD:
            call = self._errors.call
            if done.good:
                call(self._cpu.complete_store, done.good, ctx, True)
            if done.failed:
                call(self._cpu.complete_store, done.failed, ctx, False)
        else:
            if done.job.staged:
                if self._back is not None:
                    self._back.release(done.keys)
            else:
                self._cpu.unpin(done.keys, ctx, "cascade")
            log = primary.event_log
            if log is not None and done.good:
                log.record(list(done.good), done.tier.name, False)
        self._jobs.report(done, primary.hooks)

    def _drain(self, timeout: float | None = None) -> None:
        """Submit queued promotions and poll until every tier job has reported; raise
        :class:`~kv_offload.errors.ManagerError` after ``timeout`` seconds."""
        self._submit_queued()
        self._submit_write_backs()
        for _ in backoff(self.drain_timeout if timeout is None else timeout):
            self._collect()
            if not len(self._jobs):
                return
        raise self._jobs.waiting_error()

    # -- lifecycle ------------------------------------------------------------------------

    @entry_guarded
    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._closed:
            raise closed_error("on_request_finished")
        if getattr(req_context, "req_id", None) is None:  # before any tier is told
            check_context(req_context, "on_request_finished")
        req_id = req_context.req_id
        self._submit_queued(req_id)  # its queued promotions go out now
        self._promotions.finish_request(req_id)
        for finished in self._writes.finish_observers:
            finished(req_context)
        if self._scope.whole:
            self._scope.finish(req_id)
        for tier in self.tiers:
            tier.on_request_finished(req_context)
        self._errors.call(self._cpu.finish_request, req_context)
        self._errors.raise_pending()

    def queued_promotions(self) -> dict[str, int]:
        """Blocks whose promotion is queued for the step end (not yet submitted), per tier
        name: what ``on_schedule_end()`` will hand out."""
        return self._promotions.queued_per_tier()

    def whole_requests(self) -> dict[str, tuple[list[str], list[OffloadKey]]]:
        """The requests some tiers want whole (request-level offload): per request, those
        tiers' names and its keys parked until their promotion lands."""
        return {
            req_id: ([tier.name for tier in whole.tiers], list(whole.parked))
            for req_id, whole in self._scope.whole.items()
        }

    def tiers_allowed(self, tier_filter: TierFilter) -> list[str]:
        """The names of the tiers a request with ``tier_filter`` may load from, in order."""
        return [tier.name for tier in self._scope.allowed(tier_filter)]

    def has_pending_work(self) -> bool:
        """Whether tier jobs or queued promotions are outstanding."""
        return bool(len(self._jobs) or self._promotions.queued)

    @entry_guarded
    def drain(self, timeout: float | None = None) -> None:
        """Submit queued promotions and wait until every tier job has reported."""
        self._drain(timeout)
        self._errors.raise_pending()

    @entry_guarded
    def take_events(self) -> list[OffloadingEvent]:
        """The whole stack's events since the last call, in the order they happened."""
        return self._cpu.take_events()

    @entry_guarded
    def reset_cache(self) -> None:
        """Cancel the queued promotions (never submitted), wait for every tier job in flight,
        then empty the CPU tier, so no promotion lands in the reset cache. Tier counters and
        backpressure measurements restart; secondary tiers keep their blocks (they may be
        shared with other engines). If a tier does not report in time the drain raises
        :class:`~kv_offload.errors.ManagerError` and nothing is reset."""
        for ctx, keys in self._promotions.cancel_queued():
            self._errors.call(self._cpu.complete_store, keys, ctx, False)
        self._drain(self.drain_timeout)
        self._errors.call(self._cpu.reset_cache)
        self._load_pins.clear()
        self._jobs.reset()
        self._writes.reset()
        for whole in self._scope.whole.values():
            whole.parked.clear()
        self._errors.raise_pending()

    def get_stats(self) -> TieringStats:
        return TieringStats(
            cpu=self.primary.get_stats(),
            tiers=self.tier_stats(),
            jobs_in_flight=len(self._jobs),
            promotions_queued=self._promotions.blocks_queued(),
        )

    def cpu_stats(self) -> OffloadingStats:
        return self.primary.get_stats()

    def tier_stats(self) -> list[TierStats]:
        out = []
        for tier in self._tiers:
            stats = self._jobs.tier_stats(tier)
            self._writes.fill(tier, stats)
            out.append(stats)
        return out

    @entry_guarded
    def shutdown(self) -> None:
        """Drain, shut the CPU tier down (tiers with hooks still hear its events), then every
        tier. Shutdown always completes; errors are reported after."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drain()
        finally:
            try:
                self._errors.call(self._cpu.shutdown)
            finally:
                for tier in self._tiers:
                    try:
                        tier.plugin.shutdown()
                    except Exception:
                        logger.exception("tier %r raised from shutdown()", tier.name)
                for plugin in self._own_plugins:
                    self.plugin_manager.unregister(plugin)
        self._errors.raise_pending()
