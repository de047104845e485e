"""The lifecycle hooks of kv-offload (pluggy project ``kv_offload``).

Write a plugin by decorating functions (or methods) named like these specs with
``kv_offload.plugins.hookimpl``; a hookimpl may take any subset of a spec's arguments. Event hooks
fire **once per manager call with the whole batch of keys**, *after* the manager's bookkeeping
is consistent, so a plugin that raises cannot corrupt state: the manager re-raises it as
:class:`~kv_offload.errors.HookError` naming the plugin, and the call's effect stands.
Decision hooks fire *before* the manager changes anything; if one raises, the call has no
effect at all.

Arguments common to most hooks: ``manager`` (the manager firing the hook: a
``CPUOffloadingManager`` or ``TieringOffloadingManager``), ``req_context``, ``keys`` (a list,
in the caller's order) and ``medium`` (``"CPU"`` or a secondary tier's name). Behind a
``TieringOffloadingManager`` the CPU tier fires the CPU events itself (``manager`` is its
``CPUOffloadingManager``, also for calls made on the tiered manager); the tiered manager fires
the events of secondary tiers.
"""

from __future__ import annotations

from typing import Any

import pluggy

from ..keys import OffloadKey
from ..types import ReqContext

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "kv_offload"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def kv_offload_request_started(manager: Any, req_context: ReqContext) -> None:
    """Fires in ``on_new_request``. Result unused."""


@hookspec
def kv_offload_request_finished(manager: Any, req_context: ReqContext) -> None:
    """Fires in ``on_request_finished``, after the policy and tiers were told. Result unused."""


@hookspec
def kv_offload_blocks_stored(
    manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
) -> None:
    """Blocks became loadable in ``medium``: a successful ``complete_store`` (``"CPU"``; a
    promotion from a secondary tier landing in the CPU tier is one too), or a cascade job a
    secondary tier finished successfully (the tier's name). Result unused."""


@hookspec
def kv_offload_blocks_loaded(
    manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
) -> None:
    """Blocks were read out of ``medium``: ``complete_load`` (``"CPU"``, to the GPU), or a
    promotion a secondary tier finished successfully (the tier's name, into the CPU tier).
    Result unused."""


@hookspec
def kv_offload_blocks_evicted(
    manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
) -> None:
    """``prepare_store`` evicted idle blocks from ``medium`` to make room. Result unused."""


@hookspec
def kv_offload_store_failed(
    manager: Any, keys: list[OffloadKey], medium: str, req_context: ReqContext
) -> None:
    """A store did not land: ``complete_store(success=False)`` (``"CPU"``; the slots are
    already free; a failed promotion's reserved slot is one too) or a failed cascade job (the
    tier's name). Result unused."""


@hookspec
def kv_offload_tier_job_finished(
    manager: Any,
    tier: str,
    direction: str,
    keys: list[OffloadKey],
    success: bool,
    nbytes: int,
    req_context: ReqContext,
    seconds: float,
    reason: str | None,
) -> None:
    """A secondary tier reported a job: ``direction`` is ``"store"`` (cascade) or ``"load"``
    (promotion); ``nbytes`` the bytes moved (0 on failure); ``seconds`` the time from the
    job's submission to the manager collecting its result (``time.perf_counter``), the
    latency the engine sees; ``reason`` the tier's reason for a failure
    (``JobResult.reason``, ``None`` if it gave none). Result unused."""


@hookspec
def kv_offload_cascade_dropped(
    manager: Any, tier: str, keys: list[OffloadKey], reason: str, req_context: ReqContext
) -> None:
    """The tiered manager shed a cascade of ``keys`` to ``tier`` instead of submitting it:
    ``reason`` is ``"pressure"`` (the tier's backpressure detector and drop policy said so)
    or ``"in_flight_limit"`` (``max_in_flight_jobs`` cascades already in flight). The blocks
    stay in the CPU tier. Result unused."""


@hookspec
def kv_offload_cache_reset(manager: Any) -> None:
    """``reset_cache`` emptied the CPU tier. Result unused."""


@hookspec
def kv_offload_shutdown(manager: Any) -> None:
    """``shutdown`` ran; the manager accepts no more stores. Result unused."""


@hookspec(firstresult=True)
def kv_offload_store_admission(
    manager: Any, keys: list[OffloadKey], req_context: ReqContext
) -> list[OffloadKey] | None:
    """Decision hook, before ``prepare_store`` allocates anything: return the keys to admit
    (a subset of ``keys``, any order; the manager keeps the caller's order) or ``None`` for no
    opinion. The first non-``None`` answer wins (pluggy ``firstresult``), most recently
    registered plugin first. Keys already stored are filtered before this hook runs, so it
    only sees keys that would take a slot. A rejected key is simply not stored. A promotion
    from a secondary tier reserves its CPU slot through ``prepare_store`` too, so this hook
    sees it (one key) and may refuse it: the lookup then answers ``MISS``. Any other answer
    (a str such as ``"yes"``, a dict, values that are not keys) is a
    :class:`~kv_offload.errors.HookError` naming the plugin, raised before anything is
    stored."""
