"""The CPU tier in front of secondary tiers: cascades stores, promotes misses.

* A successful ``complete_store`` cascades the blocks to every secondary tier (a job per
  tier, see :mod:`kv_offload.tiering.jobs`).
* A CPU miss that a tier has reserves a CPU slot and queues a promotion, submitted at
  ``on_schedule_end()`` (:mod:`kv_offload.tiering.promotions`).
* A tier with backpressure on has a cascade gate that may drop cascades to it
  (:mod:`kv_offload.tiering.cascade_gate`); request-level offload and per-request tier
  filters live in :mod:`kv_offload.tiering.request_scope`.

It drives the CPU manager through its public API only, and records the tiers' events in the
CPU manager's event log, so one log holds the whole stack's events in order.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..base import OffloadingManager
from ..buffer import CPUKVBuffer
from ..concurrency import entry_guarded, new_entry_token
from ..cpu import CPUOffloadingManager
from ..cpu.validation import as_list, check_context, closed_error, not_bytes, short
from ..errors import ConfigError, KeyStateError
from ..keys import OffloadKey
from ..plugins import HookErrorLog, register_if_hookimpl
from ..tier_types import Locality, RequestOffloadingContext
from ..types import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
)
from .base import SecondaryTierManager
from .cascade_gate import build_gate
from .jobs import JobTable
from .names import name_tiers
from .promotion_limits import PromotionLimits
from .promotions import Promotions
from .request_scope import RequestScope
from .stats import TieringStats, TierStats

__all__ = ["TieringOffloadingManager"]

logger = logging.getLogger("kv_offload.tiering")

_MISS = LookupResult.MISS
_PENDING = LookupResult.PENDING
#: Refuses a batch holding a key that is not bytes-like: a tier writes keys as bytes, and one
#: bad key in a cascade job would fail the good keys with it.
_JOIN = b"".join


class TieringOffloadingManager(OffloadingManager):
    """The manager API over a CPU tier (``primary``) and secondary ``tiers``.

    ``backpressure`` is the default ``backpressure`` table of tiers that have no cascade gate
    of their own (a config's global ``[backpressure]``); ``None`` leaves them ungated.
    ``promotion_limits`` bounds every ``PENDING`` answer (promotion deadline, failure backoff:
    :mod:`kv_offload.tiering.promotion_limits`); ``None`` takes the defaults.

    Single-threaded like its CPU tier: every request-flow method, ``drain``, ``take_events``,
    ``reset_cache`` and ``shutdown`` take the entry guard of :mod:`kv_offload.concurrency`
    (and the CPU tier's own guard when they call it), so a second thread, or a hook calling
    back into the flow (say from ``tier_job_finished``), gets
    :class:`~kv_offload.ConcurrentUseError` with nothing changed. ``get_stats()``,
    ``cpu_stats()``, ``tier_stats()`` and ``has_pending_work()`` are lock-free reads. Tiers
    never call the manager: their threads touch only the CPU buffer rows of their jobs, and
    results are collected here, on the scheduler's thread. Share the stack between threads
    with :func:`kv_offload.synchronized`.
    """

    def __init__(
        self,
        primary: CPUOffloadingManager,
        secondary_tiers: Sequence[SecondaryTierManager],
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
        name_tiers(secondary_tiers)
        self.primary = primary
        primary.fronts_tiers = True
        self.kv_buffer: CPUKVBuffer = primary.kv_buffer
        self.tiers: list[SecondaryTierManager] = list(secondary_tiers)
        self.drain_timeout = drain_timeout
        self.plugin_manager = primary.plugin_manager
        if backpressure is not None:
            for tier in self.tiers:
                if tier.cascade_gate is None:
                    locality = tier.locality or Locality.LOCAL
                    tier.cascade_gate = build_gate(backpressure, tier.name, locality)
        self._errors = HookErrorLog()
        self._jobs = JobTable(self, primary, self.tiers, self._errors, promotion_limits)
        self._scope = RequestScope(self.tiers, primary, self._jobs)
        self._promotions = Promotions(primary, self.tiers, self._jobs, self._errors)
        self._closed = False
        #: Engine pins (prepare_load minus complete_load) per key; cascade pins are not here.
        self._load_pins: Counter[OffloadKey] = Counter()
        self._entry = new_entry_token()  # taken by every request-flow call (concurrency.py)
        self._own_plugins = [
            p for tier in self.tiers for p in register_if_hookimpl(self.plugin_manager, tier)
        ]

    # -- delegated parts of the manager API -----------------------------------------------

    @entry_guarded
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Start the request in the CPU tier and ask every tier for its offload policy:
        ``REQUEST_LEVEL`` if any tier wants the whole request, else ``CHUNK_LEVEL``."""
        self.primary.on_new_request(req_context)
        return self._scope.start(req_context)

    @entry_guarded
    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        if self._closed:
            raise closed_error("prepare_load")
        spec = self.primary.prepare_load(keys, req_context)
        self._load_pins.update(keys)
        return spec

    @entry_guarded
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """The CPU tier's ``complete_load``, refused for a key the engine has not pinned: a
        block may also be pinned by a cascade job, and a second ``complete_load`` would
        otherwise take the cascade's pin and let the block be evicted while a tier reads it."""
        if self._closed:
            raise closed_error("complete_load")
        key_list = as_list(keys, "complete_load")
        pins = self._load_pins
        try:
            unpinned = next((k for k in key_list if pins.get(k, 0) <= 0), None)
        except TypeError:  # an unhashable key: the CPU tier names it
            unpinned = None
        if unpinned is not None:
            raise KeyStateError(
                f"complete_load: key {short(unpinned)} is not pinned by a prepare_load "
                f"(completed already, or never prepared); call complete_load once per "
                f"prepare_load",
                key=unpinned,
                operation="complete_load",
            )
        self.primary.complete_load(key_list, req_context)
        pins.subtract(key_list)
        for k in key_list:
            if pins[k] <= 0:
                del pins[k]

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
        try:  # keys reach the tiers from here: bytes only (join: the cheapest C-level check)
            _JOIN(keys)
        except TypeError:
            raise not_bytes(keys, "prepare_store") from None
        primary = self.primary
        if len(self._jobs) and len(keys) > primary.num_storable_blocks:
            # Blocks pinned by finished cascades may be in the way: collect those results
            # first, so the CPU tier is asked once (one offer, one allocation counted).
            self._jobs.poll()
        output: PrepareStoreOutput | None = self._errors.call(
            primary.prepare_store, keys, req_context, protected=protected
        )
        if output is not None and self._scope.whole:
            whole = self._scope.whole.get(req_context.req_id)
            if whole is not None:
                new = set(output.keys_to_store)
                present = [k for k in keys if k not in new]
                self._scope.cascade_present(present, whole)
        if self._errors.pending:
            self._errors.raise_pending(output)
        return output

    @entry_guarded
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if self._closed:
            raise closed_error("touch")
        self.primary.touch(keys, req_context)
        for tier in self.tiers:
            tier.touch(keys, req_context)

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
        indices = self._scope.tiers_for(req_context)  # raises before anything changed
        result = self.primary.lookup(key, req_context)
        if not self.tiers:
            return result
        if result is not _MISS:
            if result is _PENDING and self._promotions.expired(key):
                return _MISS  # a promotion past its deadline (tiering/promotion_limits.py)
            self._promotions.note_found(req_context.req_id, key)
            return result
        return self._promotions.ask_tiers(indices, key, req_context)

    @entry_guarded
    def on_schedule_end(self) -> None:
        """Tell every tier the step ended, submit the promotions queued this step, then
        collect finished tier jobs."""
        if self._closed:
            raise closed_error("on_schedule_end")
        for tier in self.tiers:
            try:
                tier.on_schedule_end()
            except Exception:
                logger.exception("tier %r raised from on_schedule_end(); ignored", tier.name)
        self._promotions.submit()
        self._jobs.poll()
        if self._scope.whole:
            self._scope.flush_parked()
        self._errors.raise_pending()

    # -- stores and cascades --------------------------------------------------------------

    @entry_guarded
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Complete the CPU store; on success cascade the blocks to every secondary tier."""
        if self._closed:
            raise closed_error("complete_store")
        key_list = as_list(keys, "complete_store")
        self._promotions.check_not_promoting(key_list, "complete_store")
        # The CPU store is done even if one of its hooks raised: cascade it, then report.
        self._errors.call(self.primary.complete_store, key_list, req_context, success)
        if success and key_list:
            for index in range(len(self.tiers)):
                self._jobs.cascade(index, key_list, req_context)
        self._errors.raise_pending()

    # -- lifecycle ------------------------------------------------------------------------

    @entry_guarded
    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._closed:
            raise closed_error("on_request_finished")
        check_context(req_context, "on_request_finished")  # before any tier is told
        self._promotions.finish(req_context.req_id)
        if self._scope.whole:
            self._scope.finish(req_context.req_id)
        for tier in self.tiers:
            tier.on_request_finished(req_context)
        self._errors.call(self.primary.on_request_finished, req_context)
        self._errors.raise_pending()

    def has_pending_work(self) -> bool:
        """Whether tier jobs or queued promotions are outstanding."""
        return bool(len(self._jobs) or self._promotions.queued)

    @entry_guarded
    def drain(self, timeout: float | None = None) -> None:
        """Submit queued promotions and wait until every tier job has reported."""
        self._drain(timeout)
        self._errors.raise_pending()

    def _drain(self, timeout: float | None = None) -> None:
        self._promotions.submit()
        self._jobs.drain(self.drain_timeout if timeout is None else timeout)

    @entry_guarded
    def take_events(self) -> list[OffloadingEvent]:
        """The whole stack's events since the last call, in the order they happened."""
        return self.primary.take_events()

    @entry_guarded
    def reset_cache(self) -> None:
        """Cancel the queued promotions (never submitted), wait for every tier job in flight,
        then empty the CPU tier, so no promotion lands in the reset cache. Tier counters and
        backpressure measurements restart; secondary tiers keep their blocks (they may be
        shared with other engines). If a tier does not report in time the drain raises
        :class:`~kv_offload.errors.ManagerError` and nothing is reset."""
        self._promotions.cancel()
        self._jobs.drain(self.drain_timeout)
        self._errors.call(self.primary.reset_cache)
        self._load_pins.clear()
        self._jobs.promoting.clear()
        self._jobs.limits.clear()
        for whole in self._scope.whole.values():
            whole.parked.clear()
        self._jobs.reset_stats()
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
        return self._jobs.tier_stats()

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
                self._errors.call(self.primary.shutdown)
            finally:
                for tier in self.tiers:
                    try:
                        tier.shutdown()
                    except Exception:
                        logger.exception("tier %r raised from shutdown()", tier.name)
                for plugin in self._own_plugins:
                    self.plugin_manager.unregister(plugin)
        self._errors.raise_pending()
