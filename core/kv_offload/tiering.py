"""The CPU tier in front of secondary tiers: cascades stores, promotes misses.

* A successful ``complete_store`` cascades the blocks to every secondary tier; each tier's job
  pins the CPU blocks (one reader per job) until the tier reports the job finished.
* A CPU miss that a tier has reserves a CPU slot (a pending store in the CPU tier, so ``lookup``
  answers ``PENDING`` and the slot cannot be evicted) and queues a promotion. Promotions queued
  during a scheduler step go out at ``on_schedule_end()`` as one job per (tier, request).
* Every job ends in exactly one result. A failed or crashed job releases its pins; a failed
  promotion frees its slot, so the key is a ``MISS`` in the CPU tier again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .buffer import CPUKVBuffer
from .errors import ConfigError, HookError, KeyStateError, ManagerError
from .events import OffloadingEvent
from .hooks import register_if_hookimpl
from .keys import OffloadKey
from .lookup import LookupResult
from .manager import CPUOffloadingManager, _as_list
from .request import ReqContext
from .spec import CPULoadStoreSpec, PrepareStoreOutput
from .stats import OffloadingStats
from .tier import JobDirection, JobMetadata, JobResult, SecondaryTierManager

__all__ = ["TieringOffloadingManager", "TierStats", "TieringStats"]

logger = logging.getLogger("kv_offload.tiering")

_HIT = LookupResult.HIT
_MISS = LookupResult.MISS
_PENDING = LookupResult.PENDING


@dataclass
class TierStats:
    """Counters of one secondary tier, cumulative. ``lookups`` counts the CPU misses this
    tier was asked about, ``lookup_hits`` those it held."""

    name: str
    lookup_hits: int = 0
    promoted_blocks: int = 0
    failed_promotions: int = 0
    refused_promotions: int = 0
    cascaded_blocks: int = 0
    failed_cascades: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    lookups: int = 0  # last: existing positional uses keep their meaning


@dataclass(frozen=True)
class TieringStats:
    """The CPU tier's stats plus one :class:`TierStats` per secondary tier, in order."""

    cpu: OffloadingStats
    tiers: list[TierStats] = field(default_factory=list)
    jobs_in_flight: int = 0
    promotions_queued: int = 0


@dataclass
class _Job:
    tier: int
    meta: JobMetadata
    submitted: float  # time.perf_counter() at submission


class TieringOffloadingManager:
    """The manager API of :class:`CPUOffloadingManager`, over a CPU tier and ``tiers``."""

    def __init__(
        self,
        primary: CPUOffloadingManager,
        secondary_tiers: Sequence[SecondaryTierManager],
        *,
        drain_timeout: float = 30.0,
    ) -> None:
        if primary.kv_buffer is None:
            raise ConfigError(
                "TieringOffloadingManager needs a CPU tier with a KV buffer: create the "
                "CPUOffloadingManager with block_size_bytes=... (tiers copy real bytes)"
            )
        names = [tier.name for tier in secondary_tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"secondary tiers need distinct names, got {names}")
        self.primary = primary
        self.tiers: list[SecondaryTierManager] = list(secondary_tiers)
        self.drain_timeout = drain_timeout
        self._block_size = primary.kv_buffer.block_size_bytes
        self._jobs: dict[int, _Job] = {}
        self._next_job_id = 0
        # (tier index, req_id) -> (context, keys, slots) promotions waiting for the step end
        self._queued: dict[tuple[int, str], tuple[ReqContext, list[OffloadKey], list[int]]] = {}
        self._promoting: set[OffloadKey] = set()
        self._deferred: list[HookError] = []
        # req_id -> keys its lookups answered HIT or PENDING (protected from its promotions)
        self._found: dict[str, set[OffloadKey]] = {}
        self._tier_stats = [TierStats(name) for name in names]
        self._events: list[OffloadingEvent] | None = [] if primary._events is not None else None
        self._closed = False
        self.plugin_manager = primary.plugin_manager
        self._hooks = primary._hooks
        self._own_plugins = [
            p for tier in self.tiers for p in register_if_hookimpl(self.plugin_manager, tier)
        ]

    # -- delegated parts of the manager API -----------------------------------------------

    @property
    def kv_buffer(self) -> CPUKVBuffer:
        buffer = self.primary.kv_buffer
        if buffer is None:  # pragma: no cover - checked in __init__
            raise ManagerError("the CPU tier has no KV buffer")
        return buffer

    def on_new_request(self, req_context: ReqContext) -> None:
        self.primary.on_new_request(req_context)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        return self.primary.prepare_load(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.primary.complete_load(keys, req_context)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """The CPU tier's ``prepare_store``; if blocks pinned by finished cascades are in the
        way, collect those tier results first and try once more."""
        output = self.primary.prepare_store(keys, req_context)
        if output is None and self._jobs:
            self._poll()
            output = self.primary.prepare_store(keys, req_context)
            self._raise_deferred()
        return output

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.primary.touch(keys, req_context)
        for tier in self.tiers:
            tier.touch(keys, req_context)

    # -- lookups and promotions -----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """The CPU tier's answer; on a CPU miss, the first tier holding the key is asked to
        promote it (``PENDING`` until it lands, ``MISS`` if no CPU slot can be freed). When no
        tier holds it but one answered ``None`` ("ask again"), ``PENDING``."""
        result = self.primary.lookup(key, req_context)
        if not self.tiers:
            return result
        if result is not _MISS:
            # What a request found stays protected from its own promotions until it finishes:
            # evicting an earlier HIT of the same prefix would break its prepare_load.
            self._found.setdefault(req_context.req_id, set()).add(key)
            return result
        ask_again = False
        for index, tier in enumerate(self.tiers):
            self._tier_stats[index].lookups += 1
            answer = tier.lookup(key, req_context)
            if answer is True:
                result = self._reserve_promotion(index, key, req_context)
                if result is _PENDING:
                    self._found.setdefault(req_context.req_id, set()).add(key)
                return result
            if answer is None:  # the tier cannot tell yet: the engine asks again next step
                ask_again = True
        return _PENDING if ask_again else _MISS

    def _reserve_promotion(self, index: int, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        stats = self._tier_stats[index]
        stats.lookup_hits += 1
        error: HookError | None = None
        try:
            out = self.primary.prepare_store([key], ctx, protected=self._found.get(ctx.req_id, ()))
        except HookError as exc:
            # A store-admission hook raises before anything changed. An eviction hook raises
            # after the slot was reserved: queue the promotion as usual, then report.
            reserved = self.primary.block_id(key)
            if reserved is None:
                raise
            error, slot = exc, reserved
        else:
            if out is None or not out.keys_to_store:
                stats.refused_promotions += 1
                return _MISS
            slot = int(out.store_spec.block_ids[0])
        self._promoting.add(key)
        _, keys, slots = self._queued.setdefault((index, ctx.req_id), (ctx, [], []))
        keys.append(key)
        slots.append(slot)
        if error is not None:
            self._found.setdefault(ctx.req_id, set()).add(key)
            raise error
        return _PENDING

    def on_schedule_end(self) -> None:
        """Tell every tier the step ended, submit the promotions queued this step, then
        collect finished tier jobs."""
        for tier in self.tiers:
            try:
                tier.on_schedule_end()
            except Exception:
                logger.exception("tier %r raised from on_schedule_end()", tier.name)
        self._submit_queued()
        self._poll()
        self._raise_deferred()

    def _submit_queued(self, req_id: str | None = None) -> None:
        for group in [g for g in self._queued if req_id is None or g[1] == req_id]:
            ctx, keys, slots = self._queued.pop(group)
            self._submit(group[0], JobDirection.LOAD, keys, np.asarray(slots, np.int64), ctx)

    def _submit(
        self,
        index: int,
        direction: JobDirection,
        keys: list[OffloadKey],
        slots: np.ndarray,
        ctx: ReqContext,
    ) -> None:
        job_id = self._next_job_id
        self._next_job_id += 1
        meta = JobMetadata(job_id, keys, slots, direction, ctx)
        self._jobs[job_id] = _Job(index, meta, time.perf_counter())
        tier = self.tiers[index]
        try:
            if direction is JobDirection.LOAD:
                tier.submit_load(meta)
            else:
                tier.submit_store(meta)
        except Exception:
            logger.exception(
                "tier %r raised from submit_%s (job %d, %d keys); the job is failed and its "
                "CPU blocks are released",
                tier.name,
                direction.value,
                job_id,
                len(keys),
            )
            self._finish(JobResult(job_id, success=False), tier)

    def _poll(self) -> None:
        for tier in self.tiers:
            try:
                results = list(tier.get_finished())
            except Exception:
                logger.exception("tier %r raised from get_finished(); will poll again", tier.name)
                continue
            for result in results:
                self._finish(result, tier)

    def _finish(self, result: JobResult, tier: SecondaryTierManager) -> None:
        job = self._jobs.get(result.job_id)
        if job is None or self.tiers[job.tier] is not tier:
            logger.warning(
                "tier %r reported job %r, which it does not own or already reported; ignored",
                tier.name,
                result.job_id,
            )
            return
        del self._jobs[result.job_id]
        meta = job.meta
        stats = self._tier_stats[job.tier]
        nbytes = len(meta.keys) * self._block_size if result.success else 0
        hooks = self._hooks
        if meta.direction is JobDirection.LOAD:
            self._promoting.difference_update(meta.keys)
            try:
                self.primary.complete_store(meta.keys, meta.req_context, success=result.success)
            except HookError as exc:  # the CPU tier's state is final; report after our hooks
                self._deferred.append(exc)
            if result.success:
                stats.promoted_blocks += len(meta.keys)
                stats.bytes_read += nbytes
                event_hook = hooks.blocks_loaded
            else:
                stats.failed_promotions += len(meta.keys)
                event_hook = None
        else:
            self.primary.unpin(meta.keys, meta.req_context, "cascade")
            if result.success:
                stats.cascaded_blocks += len(meta.keys)
                stats.bytes_written += nbytes
                if self._events is not None:
                    self._events.append(OffloadingEvent(list(meta.keys), tier.name, False))
                event_hook = hooks.blocks_stored
            else:
                stats.failed_cascades += len(meta.keys)
                event_hook = hooks.store_failed
        self._call_hook(
            hooks.tier_job_finished,
            manager=self,
            tier=tier.name,
            direction=meta.direction.value,
            keys=list(meta.keys),
            success=result.success,
            nbytes=nbytes,
            req_context=meta.req_context,
            seconds=time.perf_counter() - job.submitted,
            reason=result.reason,
        )
        self._call_hook(
            event_hook,
            manager=self,
            keys=list(meta.keys),
            medium=tier.name,
            req_context=meta.req_context,
        )

    def _call_hook(self, hook: Any, **kwargs: Any) -> None:
        """Fire an event hook; a raising plugin is reported once the current call is done,
        so one plugin cannot make the manager drop the other results it is processing."""
        if hook is not None:
            try:
                hook(**kwargs)
            except HookError as exc:
                self._deferred.append(exc)

    def _raise_deferred(self) -> None:
        if self._deferred:
            first, self._deferred = self._deferred[0], []
            raise first

    # -- stores and cascades --------------------------------------------------------------

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Complete the CPU store; on success cascade the blocks to every secondary tier."""
        key_list = _as_list(keys, "complete_store")
        if self._promoting and not self._promoting.isdisjoint(key_list):
            key = next(k for k in key_list if k in self._promoting)
            raise KeyStateError(
                f"complete_store: key {key!r} is being promoted from a secondary tier, not "
                f"stored by the engine; pass the keys_to_store of prepare_store",
                key=key,
                operation="complete_store",
            )
        error: HookError | None = None
        try:
            self.primary.complete_store(key_list, req_context, success)
        except HookError as exc:  # the CPU store is done: cascade it, then report
            error = exc
        if success and key_list:
            for index in range(len(self.tiers)):
                slots = self.primary.pin(key_list, req_context, "cascade")
                self._submit(
                    index, JobDirection.STORE, key_list, np.asarray(slots, np.int64), req_context
                )
        if error is not None:
            raise error

    # -- lifecycle ------------------------------------------------------------------------

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._submit_queued(req_context.req_id)
        self._found.pop(req_context.req_id, None)
        for tier in self.tiers:
            tier.on_request_finished(req_context)
        self.primary.on_request_finished(req_context)
        self._raise_deferred()

    def has_pending_work(self) -> bool:
        """Whether tier jobs or queued promotions are outstanding."""
        return bool(self._jobs or self._queued)

    def drain(self, timeout: float | None = None) -> None:
        """Submit queued promotions and wait until every tier job has reported."""
        self._drain(timeout)
        self._raise_deferred()

    def _drain(self, timeout: float | None = None) -> None:
        self._submit_queued()
        deadline = time.monotonic() + (self.drain_timeout if timeout is None else timeout)
        delay = 0.0005
        while True:
            self._poll()
            if not self._jobs:
                return
            if time.monotonic() >= deadline:
                waiting = sorted({self.tiers[j.tier].name for j in self._jobs.values()})
                raise ManagerError(
                    f"{len(self._jobs)} tier job(s) did not finish within the drain timeout "
                    f"(tiers: {', '.join(waiting)}); a tier must report every job it accepts"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def take_events(self) -> list[OffloadingEvent]:
        events = self.primary.take_events()
        if self._events:
            events = self._events + events
            self._events = []
        return events

    def reset_cache(self) -> None:
        """Drain tier jobs, then empty the CPU tier. Secondary tiers keep their blocks: they
        may be shared with other engines."""
        self._drain()
        try:
            self.primary.reset_cache()
        except HookError as exc:  # the CPU tier is empty: finish the reset, then report
            self._deferred.append(exc)
        self._promoting.clear()
        self._found.clear()
        self._tier_stats = [TierStats(s.name) for s in self._tier_stats]
        self._raise_deferred()

    def get_stats(self) -> TieringStats:
        return TieringStats(
            cpu=self.primary.get_stats(),
            tiers=[TierStats(**vars(s)) for s in self._tier_stats],
            jobs_in_flight=len(self._jobs),
            promotions_queued=sum(len(k) for _, k, _ in self._queued.values()),
        )

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
                self.primary.shutdown()
            except HookError as exc:
                self._deferred.append(exc)
            finally:
                for tier in self.tiers:
                    try:
                        tier.shutdown()
                    except Exception:
                        logger.exception("tier %r raised from shutdown()", tier.name)
                for plugin in self._own_plugins:
                    self.plugin_manager.unregister(plugin)
        self._raise_deferred()
