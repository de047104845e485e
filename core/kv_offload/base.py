"""The manager interface every kv-offload manager implements (vLLM's ``OffloadingManager``).

An engine, the CLI and the replay talk to this interface only: :func:`~kv_offload.build_manager`
returns an :class:`OffloadingManager` whether the stack is a CPU tier alone
(:class:`~kv_offload.CPUOffloadingManager`) or a CPU tier in front of secondary tiers
(:class:`~kv_offload.TieringOffloadingManager`).

The request flow, per scheduler step: ``lookup`` each block in prefix order until the first
non-``HIT``; ``prepare_load`` / ``complete_load`` the hits; ``touch`` them;
``prepare_store`` / ``complete_store`` the rest; ``on_request_finished`` when a request ends;
``on_schedule_end`` once per step. See ``docs/architecture.md``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import TYPE_CHECKING

from .keys import OffloadKey
from .tier_types import RequestOffloadingContext
from .types import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
    TieringStats,
    TierStats,
)

if TYPE_CHECKING:
    from .buffer import CPUKVBuffer
    from .plugins.loading import KVOffloadPluginManager

__all__ = ["OffloadingManager"]


class OffloadingManager(ABC):
    """Which block lives where, and when it may be read, written or reused.

    Every method validates its whole input before changing anything: a call that raises a
    :class:`~kv_offload.ManagerError` leaves the manager as it was. A hook plugin that raises
    in an event hook is reported as :class:`~kv_offload.errors.HookError` after the call's effect
    took place (see :mod:`kv_offload.plugins.dispatch`).

    Threads: a manager is driven by one thread (the scheduler's) and takes no lock. The
    request-flow and whole-cache methods detect a second entry while a call runs, from
    another thread or from a hook plugin calling back on the same thread, and raise
    :class:`~kv_offload.ConcurrentUseError` before anything changed. The stats reads
    (:meth:`get_stats`, :meth:`cpu_stats`, :meth:`tier_stats`) take no guard and may be
    called from hooks and other threads. Callers that truly share a manager wrap it with
    :func:`kv_offload.synchronized`. See :mod:`kv_offload.concurrency`.
    """

    #: The KV bytes of the CPU tier, when the manager owns them.
    kv_buffer: CPUKVBuffer | None
    #: The pluggy plugin manager whose hooks this manager fires.
    plugin_manager: KVOffloadPluginManager

    # -- request lifecycle ----------------------------------------------------------------

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext | None:
        """A request arrived. The tiered manager answers with the request's offload policy
        (``REQUEST_LEVEL`` if a tier asked for the whole request); the CPU manager ``None``."""

    @abstractmethod
    def on_request_finished(self, req_context: ReqContext) -> None:
        """A request ended; per-request state may be dropped."""

    @abstractmethod
    def on_schedule_end(self) -> None:
        """End of a scheduler step: deferred work (tier jobs) is submitted and collected."""

    # -- lookups and loads ----------------------------------------------------------------

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``HIT`` if loadable now, ``PENDING`` if arriving (ask again next step), else
        ``MISS``."""

    @abstractmethod
    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        """Pin loadable blocks until :meth:`complete_load`; their slots in key order."""

    @abstractmethod
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin blocks pinned by :meth:`prepare_load`."""

    @abstractmethod
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark blocks as recently used; absent keys are ignored."""

    # -- stores ---------------------------------------------------------------------------

    @abstractmethod
    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        *,
        protected: Collection[OffloadKey] = (),
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not yet stored, evicting idle blocks not in ``keys``
        or ``protected``; ``None``, with no state change, when there is no room."""

    @abstractmethod
    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Make stored blocks loadable, or free their slots when ``success`` is false."""

    # -- whole-cache operations -----------------------------------------------------------

    @abstractmethod
    def take_events(self) -> list[OffloadingEvent]:
        """Events recorded since the last call, in the order they happened."""

    @abstractmethod
    def reset_cache(self) -> None:
        """Empty the CPU tier; counters restart at zero."""

    @abstractmethod
    def get_stats(self) -> OffloadingStats | TieringStats:
        """A snapshot of the counters (the concrete managers narrow the type)."""

    @abstractmethod
    def cpu_stats(self) -> OffloadingStats:
        """The CPU tier's counters, whatever the stack."""

    def tier_stats(self) -> list[TierStats]:
        """One entry per secondary tier, in config order; a manager without secondary tiers
        has none. A snapshot read: no entry guard."""
        return []

    def has_pending_work(self) -> bool:
        """Whether work the manager started is still outstanding (tier jobs not yet reported,
        promotions queued); a manager without secondary tiers never has any. A snapshot read:
        no entry guard, like the stats reads."""
        return False

    @abstractmethod
    def shutdown(self) -> None:
        """Release everything; later stores raise :class:`~kv_offload.ManagerError`."""
