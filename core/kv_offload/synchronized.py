"""A manager any number of threads may call: every call holds one re-entrant lock.

The managers are single-threaded and detect concurrent entry (:mod:`kv_offload.concurrency`);
callers that truly share one between threads wrap it with :func:`synchronized`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Collection
from typing import Any

from .base import OffloadingManager
from .errors import InvalidArgumentError
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

__all__ = ["SynchronizedManager", "synchronized"]


class SynchronizedManager(OffloadingManager):
    """An :class:`~kv_offload.OffloadingManager` whose every call holds one lock, for callers
    that truly share a manager between threads (:func:`synchronized` builds it).

    Calls are serialised, so counters and ref counts stay what one thread would produce. The
    lock is re-entrant: a hook that calls the wrapper back on the same thread gets the inner
    manager's :class:`~kv_offload.ConcurrentUseError` instead of a deadlock. Attributes the
    interface does not declare (``drain()``, ``primary``, ``ref_count()``, ...) are forwarded,
    methods under the lock.
    """

    wrapped: OffloadingManager

    def __init__(self, manager: OffloadingManager) -> None:
        if not isinstance(manager, OffloadingManager):
            raise InvalidArgumentError(
                f"synchronized() takes an OffloadingManager (CPUOffloadingManager, "
                f"TieringOffloadingManager, build_manager(...)), got {type(manager).__name__}"
            )
        #: The lock every forwarded call holds (re-entrant; shared by wrappers of a wrapper).
        self.lock: threading.RLock = threading.RLock()
        if isinstance(manager, SynchronizedManager):
            self.lock = manager.lock
            manager = manager.wrapped
        #: The manager every call is forwarded to.
        self.wrapped = manager
        self.kv_buffer = manager.kv_buffer  # fixed at construction in every manager
        self.plugin_manager = manager.plugin_manager

    def __getattr__(self, name: str) -> Any:
        if name in ("wrapped", "lock"):  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        value = getattr(self.wrapped, name)
        if not callable(value) or name.startswith("__"):
            return value
        lock = self.lock

        @functools.wraps(value)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return value(*args, **kwargs)

        return locked

    def __repr__(self) -> str:
        return f"synchronized({self.wrapped!r})"

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext | None:
        with self.lock:
            return self.wrapped.on_new_request(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        with self.lock:
            self.wrapped.on_request_finished(req_context)

    def on_schedule_end(self) -> None:
        with self.lock:
            self.wrapped.on_schedule_end()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        with self.lock:
            return self.wrapped.lookup(key, req_context)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        with self.lock:
            return self.wrapped.prepare_load(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        with self.lock:
            self.wrapped.complete_load(keys, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        with self.lock:
            self.wrapped.touch(keys, req_context)

    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        *,
        protected: Collection[OffloadKey] = (),
    ) -> PrepareStoreOutput | None:
        with self.lock:
            return self.wrapped.prepare_store(keys, req_context, protected=protected)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        with self.lock:
            self.wrapped.complete_store(keys, req_context, success)

    def take_events(self) -> list[OffloadingEvent]:
        with self.lock:
            return self.wrapped.take_events()

    def reset_cache(self) -> None:
        with self.lock:
            self.wrapped.reset_cache()

    def get_stats(self) -> OffloadingStats | TieringStats:
        with self.lock:  # a snapshot between calls: every field from the same moment
            return self.wrapped.get_stats()

    def cpu_stats(self) -> OffloadingStats:
        with self.lock:
            return self.wrapped.cpu_stats()

    def tier_stats(self) -> list[TierStats]:
        with self.lock:
            return self.wrapped.tier_stats()

    def shutdown(self) -> None:
        with self.lock:
            self.wrapped.shutdown()


def synchronized(manager: OffloadingManager) -> SynchronizedManager:
    """``manager`` behind one re-entrant lock: any number of threads may call it.

    For callers that share a manager between threads; the scheduler's own thread needs no
    wrapper (see :mod:`kv_offload.concurrency`). A manager already wrapped is returned as it
    is: one lock per manager is what serialises its callers.
    """
    if isinstance(manager, SynchronizedManager):
        return manager
    return SynchronizedManager(manager)
