"""Hook plugins used by the hook tests.

* :class:`RecordingPlugin` implements every hookspec and logs each call with its arguments.
* :class:`NoOpObserver` implements every *event* hook (all arguments, empty body): what a
  passive observer costs the manager.
* :class:`SeenTwiceAdmission` is vLLM's ``store_threshold`` idea written as a hook plugin.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from kv_offload import OffloadKey, ReqContext, hookimpl

__all__ = ["EVENT_HOOKS", "NoOpObserver", "RecordingPlugin", "SeenTwiceAdmission"]

#: Every hook that reports something that happened (every hook but the decision hook).
EVENT_HOOKS = (
    "request_started",
    "request_finished",
    "blocks_stored",
    "blocks_loaded",
    "blocks_evicted",
    "store_failed",
    "tier_job_finished",
    "cascade_dropped",
    "cache_reset",
    "shutdown",
)


class RecordingPlugin:
    """Logs ``(hook, arguments)`` for every hook (names without ``kv_offload_``), and
    ``("step", label)`` markers from :meth:`step`, so a test sees which call fired what."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def step(self, label: str) -> None:
        self.log.append(("step", label))

    def _record(self, hook: str, **arguments: Any) -> None:
        # Copy the key list: a hook must see the batch as it was when the hook fired.
        if "keys" in arguments:
            arguments["keys"] = list(arguments["keys"])
        self.log.append((hook, arguments))

    @hookimpl
    def kv_offload_request_started(self, manager: Any, req_context: ReqContext) -> None:
        self._record("request_started", manager=manager, req_context=req_context)

    @hookimpl
    def kv_offload_request_finished(self, manager: Any, req_context: ReqContext) -> None:
        self._record("request_finished", manager=manager, req_context=req_context)

    @hookimpl
    def kv_offload_blocks_stored(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        self._record(
            "blocks_stored", manager=manager, keys=keys, medium=medium, req_context=req_context
        )

    @hookimpl
    def kv_offload_blocks_loaded(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        self._record(
            "blocks_loaded", manager=manager, keys=keys, medium=medium, req_context=req_context
        )

    @hookimpl
    def kv_offload_blocks_evicted(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        self._record(
            "blocks_evicted", manager=manager, keys=keys, medium=medium, req_context=req_context
        )

    @hookimpl
    def kv_offload_store_failed(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        self._record(
            "store_failed", manager=manager, keys=keys, medium=medium, req_context=req_context
        )

    @hookimpl
    def kv_offload_tier_job_finished(
        self,
        manager: Any,
        tier: str,
        direction: str,
        keys: list[OffloadKey],
        success: bool,
        nbytes: int,
        req_context: ReqContext,
    ) -> None:
        self._record(
            "tier_job_finished",
            manager=manager,
            tier=tier,
            direction=direction,
            keys=keys,
            success=success,
            nbytes=nbytes,
            req_context=req_context,
        )

    @hookimpl
    def kv_offload_cascade_dropped(
        self, manager: Any, tier: str, keys: list[OffloadKey], reason: str, req_context: ReqContext
    ) -> None:
        self._record(
            "cascade_dropped",
            manager=manager,
            tier=tier,
            keys=keys,
            reason=reason,
            req_context=req_context,
        )

    @hookimpl
    def kv_offload_cache_reset(self, manager: Any) -> None:
        self._record("cache_reset", manager=manager)

    @hookimpl
    def kv_offload_shutdown(self, manager: Any) -> None:
        self._record("shutdown", manager=manager)

    @hookimpl
    def kv_offload_store_admission(
        self, manager: Any, keys: list[OffloadKey], req_context: ReqContext
    ) -> None:
        self._record("store_admission", manager=manager, keys=keys, req_context=req_context)
        return None  # no opinion


class NoOpObserver:
    """Implements every event hook, taking every argument, doing nothing."""

    @hookimpl
    def kv_offload_request_started(self, manager: Any, req_context: ReqContext) -> None:
        pass

    @hookimpl
    def kv_offload_request_finished(self, manager: Any, req_context: ReqContext) -> None:
        pass

    @hookimpl
    def kv_offload_blocks_stored(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        pass

    @hookimpl
    def kv_offload_blocks_loaded(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        pass

    @hookimpl
    def kv_offload_blocks_evicted(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        pass

    @hookimpl
    def kv_offload_store_failed(
        self, manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
    ) -> None:
        pass

    @hookimpl
    def kv_offload_tier_job_finished(
        self,
        manager: Any,
        tier: str,
        direction: str,
        keys: list[OffloadKey],
        success: bool,
        nbytes: int,
        req_context: ReqContext,
    ) -> None:
        pass

    @hookimpl
    def kv_offload_cascade_dropped(
        self, manager: Any, tier: str, keys: list[OffloadKey], reason: str, req_context: ReqContext
    ) -> None:
        pass

    @hookimpl
    def kv_offload_cache_reset(self, manager: Any) -> None:
        pass

    @hookimpl
    def kv_offload_shutdown(self, manager: Any) -> None:
        pass


class SeenTwiceAdmission:
    """Store a block only the second time it is offered for storing (vLLM's
    ``store_threshold=2``), as a ``kv_offload_store_admission`` hook plugin.

    vLLM counts *lookups* per key; hooks do not see lookups (``lookup`` is the hottest call and
    fires no hook). What this hook does see is every batch ``prepare_store`` is about to
    allocate for (keys already stored are filtered out before it runs), so "seen twice" here
    means "offered for storing twice": a block one request produced and a later request
    produced again. A key's count is dropped once it is admitted, so a block evicted later
    has to earn its place again. At most ``max_tracked`` counts are kept (oldest forgotten
    first), so one-off blocks cannot grow the table without bound.
    """

    def __init__(self, threshold: int = 2, max_tracked: int | None = 1_000_000) -> None:
        self.threshold = threshold
        self.max_tracked = max_tracked
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()

    @hookimpl
    def kv_offload_store_admission(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        counts = self.counts
        threshold = self.threshold
        admitted = []
        for key in keys:
            seen = counts.pop(key, 0) + 1
            if seen >= threshold:
                admitted.append(key)
            else:
                counts[key] = seen
        if self.max_tracked is not None:
            while len(counts) > self.max_tracked:
                counts.popitem(last=False)
        return admitted
