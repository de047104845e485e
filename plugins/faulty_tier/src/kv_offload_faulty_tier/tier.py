"""The wrapper tier: forwards to the inner tier, holding and flipping results as planned."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt
from kv_offload import OffloadKey, ReqContext
from kv_offload.errors import ConfigError
from kv_offload.tiering import (
    JobDirection,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierFactory,
    SecondaryTierManager,
)

from .faults import Dice, FaultCounters, FaultPlan, InjectedFault

__all__ = ["FaultyTier"]

logger = logging.getLogger(__name__)

#: What a torn promotion leaves in its CPU rows.
GARBAGE = 0xEE


@dataclass(slots=True)
class _Held:
    """A job whose result is not released yet."""

    job: JobMetadata
    polls_left: int
    ready_at: float
    #: ``None`` while the inner tier has not reported; always ``False`` for an injected failure.
    success: bool | None
    injected: bool
    #: ``defer_transfer``: not handed to the inner tier yet.
    deferred: bool = False


def _check_inner(tier: str, inner: object) -> None:
    if not isinstance(inner, Mapping) or "type" not in inner:
        raise ConfigError(
            f"tier {tier!r}: inner must be a tier table with a 'type' key, e.g. "
            f'[tiers.inner] type = "example"; got {inner!r}',
            key="inner",
        )


class FaultyTier(SecondaryTierManager):
    """Wraps the tier described by ``inner`` (a tier config table) and injects faults.

    Injected failures never reach the inner tier. Results of forwarded jobs are released only
    when the inner tier reported them *and* the planned delay has passed, so a manager that
    reuses a slot before the result would be caught. While a store of a key is held, ``lookup``
    answers ``None`` (ask again), as any asynchronous tier does.

    With ``defer_transfer`` a job is handed to the inner tier only when its delay is over, so
    a synchronous inner tier (``example``) copies the bytes at the last moment an
    asynchronous tier may: a manager that unpins a cascading block or reuses a reserved slot
    before the result then stores or reads back wrong bytes, where copying at submission
    would hide it. An inner ``submit_*`` that raises then fails the job.
    """

    def __init__(
        self,
        config: OffloadingConfig,
        primary_kv_view: memoryview,
        tier_type: str,
        inner: Mapping[str, Any],
        *,
        fail_rate: float = 0.0,
        raise_rate: float = 0.0,
        lookup_raise_rate: float = 0.0,
        delay_polls: int = 0,
        min_delay_polls: int = 0,
        delay_s: float = 0.0,
        seconds_per_mib: float = 0.0,
        seed: int = 0,
        defer_transfer: bool = False,
    ) -> None:
        super().__init__(config, primary_kv_view, tier_type)
        self.plan = FaultPlan.from_arguments(
            tier_type,
            fail_rate=fail_rate,
            raise_rate=raise_rate,
            lookup_raise_rate=lookup_raise_rate,
            delay_polls=delay_polls,
            min_delay_polls=min_delay_polls,
            delay_s=delay_s,
            seconds_per_mib=seconds_per_mib,
            seed=seed,
            defer_transfer=defer_transfer,
        )
        _check_inner(tier_type, inner)
        self.inner = SecondaryTierFactory.create_secondary_tier(inner, primary_kv_view, config)
        self._inner_lookup = self.inner.lookup  # the hottest call: bound once
        self.counters = FaultCounters()
        self._dice = Dice(self.plan)
        self._cpu: npt.NDArray[np.uint8] = np.asarray(primary_kv_view)
        self._held: dict[int, _Held] = {}
        self._storing: dict[OffloadKey, int] = {}
        self._device_free_at = 0.0
        # Skip the clock (and the lookup dice) when the plan has no device time (no lookup faults).
        self._timed = self.plan.delay_s > 0 or self.plan.seconds_per_mib > 0
        self._lookup_rate = self.plan.lookup_raise_rate

    def set_faults(self, **changes: Any) -> None:
        """Change what is injected from now on (a soak's fault schedule turns faults on and
        off while the stack runs); the same keys and checks as the config. Jobs already held
        keep the delay they were given; the dice restart from ``seed``."""
        current = {f.name: getattr(self.plan, f.name) for f in fields(self.plan)}
        self.plan = FaultPlan.from_arguments(self.tier_type, **{**current, **changes})
        self._dice = Dice(self.plan)
        # Once timed, the clock stays on: jobs held with a release time must still see it.
        self._timed = self._timed or self.plan.delay_s > 0 or self.plan.seconds_per_mib > 0
        self._lookup_rate = self.plan.lookup_raise_rate

    @classmethod
    def validate_arguments(cls, **arguments: Any) -> None:
        """The fault settings and the shape of ``inner``, before anything is built (the
        inner tier's own arguments are checked when it is created)."""
        if "inner" in arguments:
            _check_inner("faulty", arguments.pop("inner"))
        FaultPlan.from_arguments("faulty", **arguments)

    # -- the tier interface -------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if self._lookup_rate and self._dice.lookup_raises():
            self.counters.lookup_raised += 1
            raise InjectedFault(f"{self.tier_type}: injected failure in lookup")
        if key in self._storing:
            return None
        return self._inner_lookup(key, req_context)

    def submit_store(self, job: JobMetadata) -> None:
        self._submit(job)
        for key in job.keys:
            self._storing[key] = self._storing.get(key, 0) + 1

    def submit_load(self, job: JobMetadata) -> None:
        self._submit(job)

    def get_finished(self) -> list[JobResult]:
        # A job is due once its polls are used up and its device time has passed; a deferred
        # one is handed to the inner tier then, and released as soon as the inner tier reports.
        now = time.monotonic() if self._timed else 0.0
        all_held = self._held
        due: list[_Held] = []
        for held in all_held.values():
            if held.polls_left > 0:
                held.polls_left -= 1
            elif now >= held.ready_at:
                due.append(held)
                if held.deferred:
                    held.deferred = False
                    self._forward_late(held)
        for result in self.inner.get_finished():
            found = all_held.get(result.job_id)
            if found is not None and found.success is None:
                found.success = result.success
        done: list[JobResult] = []
        for held in due:
            if held.success is not None:
                del all_held[held.job.job_id]
                done.append(self._release(held))
        return done

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.inner.touch(keys, req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.inner.on_request_finished(req_context)

    def on_schedule_end(self) -> None:
        self.inner.on_schedule_end()

    def shutdown(self) -> None:
        self.counters.shutdowns += 1
        self.inner.shutdown()

    # -- faults -------------------------------------------------------------------------

    def _submit(self, job: JobMetadata) -> None:
        direction = job.direction.value
        if self._dice.raises():
            self.counters.raised += 1
            raise InjectedFault(f"{self.tier_type}: injected failure in submit_{direction}")
        injected = self._dice.fails()
        polls = self._dice.polls()
        now = ready_at = 0.0
        if self._timed:
            nbytes = len(job.keys) * self.config.block_size_bytes
            now = time.monotonic()
            ready_at = max(now, self._device_free_at) + self.plan.transfer_seconds(nbytes)
            self._device_free_at = ready_at
        deferred = not injected and self.plan.defer_transfer
        if not injected and not deferred:
            self._forward(job)
        self.counters.submitted += 1
        if polls or ready_at > now:
            self.counters.delayed += 1
        self._held[job.job_id] = _Held(
            job, polls, ready_at, False if injected else None, injected, deferred
        )

    def _forward(self, job: JobMetadata) -> None:
        if job.direction is JobDirection.STORE:
            self.inner.submit_store(job)
        else:
            self.inner.submit_load(job)

    def _forward_late(self, held: _Held) -> None:
        try:
            self._forward(held.job)
        except Exception:  # the job is accepted already: it fails, as a raising tier's would
            logger.exception("%s: inner tier raised from a deferred submit", self.tier_type)
            held.success = False

    def _release(self, held: _Held) -> JobResult:
        job = held.job
        if job.direction is JobDirection.STORE:
            for key in job.keys:
                left = self._storing[key] - 1
                if left:
                    self._storing[key] = left
                else:
                    del self._storing[key]
        elif not held.success:
            # A torn transfer (injected, or a load the inner tier failed, e.g. of a block it
            # evicted since lookup): the reserved rows hold garbage; the manager must free them.
            self._cpu[job.block_ids] = GARBAGE
            self.counters.torn_loads += 1
        self.counters.released += 1
        if not held.success:
            self.counters.failed += 1
        elif job.direction is JobDirection.STORE:
            self.counters.stored_blocks += len(job.keys)
        else:
            self.counters.loaded_blocks += len(job.keys)
        return JobResult(job.job_id, bool(held.success))

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet reported."""
        return len(self._held)
