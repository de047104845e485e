"""A kv-offload secondary tier as a vLLM ``SecondaryTierManager`` (written to 0.33's interface;
what another release differs in is bridged by :mod:`kv_offload_vllm.compat`).

vLLM's ``SecondaryTierFactory`` constructs the class with ``offloading_spec=``,
``primary_kv_view=``, ``tier_type=``, ``backpressure_detector=`` and the tier config's other
keys. The adapter keeps ``medium``, ``locality`` and ``drain_timeout`` for itself and builds the
kv-offload tier through kv-offload's own factory with the rest (unknown keys are refused there,
naming the tier and what it accepts). Then:

* the primary view is vLLM's int8 mmap rows; the kv-offload tier gets the same memory re-viewed
  as ``uint8``, shape ``(num_chunks, row_stride)``;
* ``lookup`` answers ``True``/``False``/``None`` -> ``HIT``/``MISS``/``RETRY``;
* a ``TransferJob`` becomes a :class:`~kv_offload.tiering.JobMetadata` (same id, keys, slots as
  ``int64``, ``is_promotion`` -> ``LOAD``); results come back from ``get_finished_jobs`` with
  the bytes moved and the time since submission. A result for a job the tier does not own, or
  reports twice, is dropped with a warning (vLLM would assert). A result that failed some of
  its keys (``failed_keys``) is a failed job to vLLM; a load's other keys are its
  ``successful_keys`` (the failed keys' rows were not written: vLLM must not serve them);
* a ``submit_*`` that raises fails the job at once (every job must report, or its CPU chunks
  stay pinned). A raising ``submit_load`` may have started writing rows already: where vLLM
  can hold a failed load's chunks (0.34's ``deferred_release``), they are held until the tier
  reports that job after all, ``drain_timeout`` seconds pass (logged) or the tier shuts down;
* ``drain_jobs`` polls the tier until every submitted job has reported (or ``drain_timeout``
  seconds pass, then a :class:`~kv_offload.ManagerError` naming the tier); results met while
  draining are handed out by the next ``get_finished_jobs``;
* ``shutdown`` shuts the tier down and drops every view of vLLM's buffer it was given, so vLLM
  can unmap its shared memory region without warning.

kv-offload hooks fire as under kv-offload's own tiered manager: ``tier_job_finished`` for every
result, ``blocks_stored`` / ``store_failed`` for cascades and ``blocks_loaded`` for successful
promotions, with ``medium`` the tier's name; a tier that implements hooks itself is registered
with the plugin manager while it runs.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from kv_offload import ConfigError, ManagerError, OffloadKey
from kv_offload.plugins import get_plugin_manager
from kv_offload.tiering import (
    JobDirection,
    JobMetadata,
    OffloadingConfig,
    SecondaryTierFactory,
    SecondaryTierManager,
)

from ._common import PREFIX, fire_hook, kvo_context
from .compat import vllm_api

__all__ = ["tier_adapter"]

logger = logging.getLogger("kv_offload_vllm")

_HOOK_MARKER = "kv_offload_impl"


@dataclass
class _Job:
    meta: JobMetadata
    submit_time: float
    #: Set for a load already reported failed to vLLM while the tier may still be writing
    #: its rows (its ``submit_load`` raised): vLLM holds the rows until this event is set.
    release: threading.Event | None = None


def _has_hookimpl(obj: object) -> bool:
    return any(
        hasattr(getattr(type(obj), attr, None), _HOOK_MARKER)
        for attr in dir(type(obj))
        if attr.startswith("kv_offload_")
    )


def _enum_member(enum_cls: Any, value: Any, what: str, tier: str) -> Any:
    if value is None or isinstance(value, enum_cls):
        return value
    try:
        return enum_cls[str(value).upper()]
    except KeyError:
        options = ", ".join(repr(m.name) for m in enum_cls)
        raise ConfigError(
            f"tier {tier!r}: {what} must be one of {options}, got {value!r}"
        ) from None


@functools.cache
def tier_adapter(name: str) -> type[Any]:
    """The vLLM ``SecondaryTierManager`` subclass running kv-offload's tier ``name``.

    ``name`` resolves through kv-offload's own factory (runtime registrations, installed entry
    points); an unknown name raises its :class:`~kv_offload.errors.PluginNotFoundError`.
    """
    api = vllm_api()
    kvo_cls = SecondaryTierFactory.get_tier_class({"type": name})
    bridged_name = PREFIX + name
    Medium, Locality, LookupResult = api.Medium, api.Locality, api.LookupResult
    answers = {True: LookupResult.HIT, False: LookupResult.MISS, None: LookupResult.RETRY}
    hit_sources = {Medium.CPU: api.CacheHitSource.HOST, Medium.STORAGE: api.CacheHitSource.DISK}

    vllm_tier: Any = api.SecondaryTierManager

    class BridgedSecondaryTier(vllm_tier):  # type: ignore[misc]  # vLLM's class is Any
        # A secondary tier is slower than CPU RAM by kv-offload's definition; a config's
        # "medium" overrides this per instance.
        medium = Medium.STORAGE
        kvo_tier_name = name
        kvo_tier_class = kvo_cls

        def __init__(
            self,
            offloading_spec: Any,
            primary_kv_view: memoryview,
            tier_type: str,
            backpressure_detector: Any = None,
            *,
            medium: str | None = None,
            locality: str | None = "LOCAL",
            drain_timeout: float = 30.0,
            **tier_config: Any,
        ) -> None:
            super().__init__(
                offloading_spec=offloading_spec,
                primary_kv_view=primary_kv_view,
                tier_type=tier_type,
                backpressure_detector=backpressure_detector,
            )
            if medium is not None:
                self.medium = _enum_member(Medium, medium, "medium", tier_type)
                self.cache_hit_source = hit_sources[self.medium]
            self.locality = _enum_member(Locality, locality, "locality", tier_type)
            self.drain_timeout = float(drain_timeout)
            rows = np.asarray(primary_kv_view)
            if rows.ndim != 2:
                raise ConfigError(
                    f"tier {tier_type!r}: expected vLLM's primary view of shape "
                    f"(num_chunks, row_bytes), got shape {rows.shape}"
                )
            # vLLM's rows are int8; kv-offload tiers copy bytes (uint8). Same memory.
            self._rows: np.ndarray[Any, Any] | None = rows.view(np.uint8)
            self._view: memoryview | None = self._rows.data
            config = OffloadingConfig(num_blocks=rows.shape[0], block_size_bytes=rows.shape[1])
            self._block_size = rows.shape[1]
            self.tier: SecondaryTierManager | None = SecondaryTierFactory.create_secondary_tier(
                {"type": name, **tier_config}, self._view, config
            )
            self._jobs: dict[int, _Job] = {}
            self._drained: list[Any] = []
            self._plugin_manager = get_plugin_manager()
            self._registered = False
            if _has_hookimpl(self.tier):
                self._plugin_manager.register(self.tier)
                self._registered = True

        @property
        def _tier(self) -> SecondaryTierManager:
            if self.tier is None:
                raise ManagerError(f"tier {bridged_name!r} was shut down; create a new one")
            return self.tier

        # -- lookups and jobs -------------------------------------------------------------

        def lookup(self, key: OffloadKey, req_context: Any) -> Any:
            return answers[self._tier.lookup(key, kvo_context(req_context))]

        def submit_store(self, job_metadata: Any) -> None:
            self._submit(job_metadata, JobDirection.STORE)

        def submit_load(self, job_metadata: Any) -> None:
            self._submit(job_metadata, JobDirection.LOAD)

        def _submit(self, job: Any, direction: JobDirection) -> None:
            keys = list(job.keys)
            slots = np.asarray(job.chunk_ids, dtype=np.int64)
            if len(keys) != len(slots):
                raise ManagerError(
                    f"tier {bridged_name!r}: job {job.job_id} has {len(keys)} keys but "
                    f"{len(slots)} chunk ids"
                )
            meta = JobMetadata(job.job_id, keys, slots, direction, kvo_context(job.req_context))
            self._jobs[job.job_id] = _Job(meta, job.submit_time)
            tier = self._tier
            try:
                if direction is JobDirection.LOAD:
                    tier.submit_load(meta)
                else:
                    tier.submit_store(meta)
            except Exception:
                # Every job must report: a job lost here would pin its CPU chunks forever.
                logger.exception(
                    "tier %r raised from submit_%s (job %d, %d keys); the job is failed",
                    bridged_name,
                    direction.value,
                    job.job_id,
                    len(keys),
                )
                release = None
                if direction is JobDirection.LOAD and api.release.deferred_release:
                    # The tier may have started writing the rows: vLLM holds them until the
                    # tier reports the job (or _expire_releases gives up on it).
                    release = threading.Event()
                    self._jobs[job.job_id].release = release
                else:
                    del self._jobs[job.job_id]
                self._drained.append(
                    self._result(meta, job.submit_time, [], "submit raised (see the log)", release)
                )

        def _collect(self) -> list[Any]:
            results = []
            for result in self._tier.get_finished():
                job = self._jobs.pop(result.job_id, None)
                if job is None:
                    logger.warning(
                        "tier %r reported job %r, which it does not own or already reported; "
                        "ignored",
                        bridged_name,
                        result.job_id,
                    )
                    continue
                if job.release is not None:  # reported failed already; now the tier is done
                    job.release.set()
                    continue
                keys = job.meta.keys
                if not result.success:
                    succeeded = []
                else:
                    failed = getattr(result, "failed_keys", None) or ()
                    succeeded = [key for key in keys if key not in failed] if failed else keys
                results.append(
                    self._result(
                        job.meta, job.submit_time, succeeded, getattr(result, "reason", None)
                    )
                )
            self._expire_releases()
            return results

        def _expire_releases(self) -> None:
            """Bound the hold on a raising load's rows: ``drain_timeout`` seconds after its
            submission the tier is taken to be done with them (vLLM needs every hold to end,
            and before ``drain_jobs`` returns)."""
            now = time.monotonic()
            for job_id, job in list(self._jobs.items()):
                if job.release is not None and now - job.submit_time >= self.drain_timeout:
                    logger.warning(
                        "tier %r raised from submit_load for job %d and has not reported it "
                        "within drain_timeout=%ss; vLLM may reuse its %d CPU chunks now",
                        bridged_name,
                        job_id,
                        self.drain_timeout,
                        len(job.meta.keys),
                    )
                    del self._jobs[job_id]
                    job.release.set()

        def _result(
            self,
            meta: JobMetadata,
            submit_time: float,
            succeeded: list[OffloadKey],
            reason: str | None,
            release: threading.Event | None = None,
        ) -> Any:
            """vLLM's result of a job whose keys ``succeeded`` (all of them: a success)."""
            success = len(succeeded) == len(meta.keys)
            nbytes = len(succeeded) * self._block_size
            seconds = time.monotonic() - submit_time
            self._fire_job_hooks(meta, succeeded, nbytes, seconds, reason)
            partial_load = not success and succeeded and meta.direction is JobDirection.LOAD
            return api.release.job_result(
                api.JobResult,
                job_id=meta.job_id,
                success=success,
                successful_keys=list(succeeded) if partial_load else None,
                transfer_time=seconds,
                transfer_bytes=nbytes or None,
                release=release,
            )

        def _fire_job_hooks(
            self,
            meta: JobMetadata,
            succeeded: list[OffloadKey],
            nbytes: int,
            seconds: float,
            reason: str | None,
        ) -> None:
            keys = list(meta.keys)
            success = len(succeeded) == len(keys)
            fire_hook(
                "kv_offload_tier_job_finished",
                bridged_name,
                manager=self,
                keys=keys,
                req_context=meta.req_context,
                tier=self.tier_type,
                direction=meta.direction.value,
                success=success,
                nbytes=nbytes,
                seconds=seconds,
                reason=reason,
            )
            failed = keys if not succeeded else [key for key in keys if key not in succeeded]
            loaded = meta.direction is JobDirection.LOAD
            for hook, hook_keys in (
                ("kv_offload_blocks_loaded" if loaded else "kv_offload_blocks_stored", succeeded),
                (None if loaded else "kv_offload_store_failed", failed),
            ):
                if hook is not None and hook_keys:
                    fire_hook(
                        hook,
                        bridged_name,
                        manager=self,
                        keys=list(hook_keys),
                        req_context=meta.req_context,
                        medium=self.tier_type,
                    )

        def get_finished_jobs(self) -> Iterable[Any]:
            drained, self._drained = self._drained, []
            return drained + self._collect()

        def drain_jobs(self) -> None:
            deadline = time.monotonic() + self.drain_timeout
            delay = 0.0005
            while self._jobs:
                self._drained.extend(self._collect())
                if not self._jobs:
                    return
                if time.monotonic() >= deadline:
                    self._expire_releases()  # a raising load's hold ends by now
                    if not self._jobs:
                        return
                    raise ManagerError(
                        f"tier {bridged_name!r}: {len(self._jobs)} job(s) did not finish within "
                        f"drain_timeout={self.drain_timeout}s; a tier must report every job it "
                        f"accepts"
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

        def has_pending_work(self) -> bool:
            return bool(self._jobs or self._drained)

        # -- requests ---------------------------------------------------------------------

        def on_new_request(self, req_context: Any) -> Any:
            kvo_context(req_context)
            return api.RequestOffloadingContext()

        def touch(self, keys: Collection[OffloadKey], req_context: Any) -> None:
            self._tier.touch(list(keys), kvo_context(req_context))

        def on_request_finished(self, req_context: Any) -> None:
            self._tier.on_request_finished(kvo_context(req_context))

        def on_schedule_end(self, context: Any) -> None:
            # kv-offload's optional step-end callback (a no-op where the core lacks it).
            step_end = getattr(self._tier, "on_schedule_end", None)
            if step_end is not None:
                step_end()

        # -- metrics and lifecycle --------------------------------------------------------

        @classmethod
        def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
            return ("kv_offload_tier",)

        def config_info(self) -> dict[str, str | int | float | bool]:
            return {"kv_offload_tier": name}

        def shutdown(self) -> None:
            tier = self.tier
            if tier is None:
                return
            try:
                if self._jobs:
                    self.drain_jobs()
            finally:
                try:
                    tier.shutdown()
                finally:
                    for job in self._jobs.values():  # the tier has stopped writing anything
                        if job.release is not None:
                            job.release.set()
                    if self._registered:
                        self._plugin_manager.unregister(tier)
                        self._registered = False
                    self.tier = None
                    del tier
                    self._release_views()

        def _release_views(self) -> None:
            """Drop every view of vLLM's buffer, so vLLM can unmap its shared memory; warn if
            the tier still holds one (vLLM then keeps the region mapped)."""
            view, rows = self._view, self._rows
            self._view = self._rows = None
            self._primary_kv_view = None
            if view is None or rows is None:
                return
            alive = weakref.ref(rows)
            view.release()
            del view, rows
            if alive() is not None:
                gc.collect()  # a reference cycle in the tier may still hold an array
            if alive() is not None:
                logger.warning(
                    "tier %r still holds arrays over vLLM's CPU buffer after shutdown(); "
                    "vLLM cannot unmap its shared memory until they are dropped",
                    bridged_name,
                )

    BridgedSecondaryTier.__name__ = BridgedSecondaryTier.__qualname__ = bridged_name
    BridgedSecondaryTier.__doc__ = (
        f"kv-offload tier {name!r} ({kvo_cls.__module__}.{kvo_cls.__qualname__}) inside "
        f"vLLM's TieringOffloadingManager."
    )
    return BridgedSecondaryTier
