"""A router's calls, bounded and checked, as the stack bounds every wait for a plugin.

A router decides on the dispatcher, between the requests it sends on the trace's clock: a
``route()`` that never returns would hang the whole fleet, engines included. So each call
runs on a thread of its own (:class:`BoundedRouter`) and the dispatcher waits for the answer
at most :data:`ROUTE_TIMEOUT_S`; a router that does not answer in time, raises, or answers
anything but an index into the live engines' loads is a
:class:`~kv_offload.errors.PluginError` naming it and the contract it broke, and the run
stops cleanly (its engines told to finish, then ended). A call that never returns leaves
only its daemon thread behind, which does not keep the process alive.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from ..errors import KVOffloadError, PluginError
from ..keys import OffloadKey
from .routers import Router

__all__ = ["ROUTE_TIMEOUT_S", "BoundedRouter"]

#: How long one ``route()`` call may take. A router answers in microseconds; a call that
#: takes seconds has hung (or blocks on something it must not), and a trace's requests
#: cannot wait for it.
ROUTE_TIMEOUT_S = 5.0

_Call = tuple[Sequence[OffloadKey], list[int]]


class BoundedRouter:
    """``router``'s :meth:`~kv_offload.fleet.Router.route`, called on its own thread and
    waited for at most ``timeout_s`` seconds, its answer checked."""

    def __init__(self, router: Router, timeout_s: float = ROUTE_TIMEOUT_S) -> None:
        self._router = router
        self._timeout_s = timeout_s
        cls = type(router)
        self.name = router.plugin_name or cls.__name__
        self._label = f"router {self.name!r} ({cls.__module__}.{cls.__qualname__})"
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        #: (the answer, or the exception route() raised)
        self._answers: queue.SimpleQueue[tuple[object, BaseException | None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._requests = 0

    def route(self, keys: Sequence[OffloadKey], loads: list[int]) -> int:
        """The index into ``loads`` the router picked; a :class:`PluginError` if it did not
        answer in time, raised, or answered something else."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="kv-offload-router", daemon=True
            )
            self._thread.start()
        self._requests += 1
        self._calls.put((keys, loads))
        try:
            answer, error = self._answers.get(timeout=self._timeout_s)
        except queue.Empty:
            raise PluginError(
                f"{self._label} did not answer route() within {self._timeout_s:g} s (request "
                f"{self._requests} of the trace); a router must answer at once. Fix its "
                f"route(); the fleet was stopped",
                kind="router",
                plugin=self.name,
            ) from None
        if error is not None:
            if isinstance(error, KVOffloadError):
                raise error
            raise PluginError(
                f"{self._label} raised {type(error).__name__}: {error} in route() (request "
                f"{self._requests} of the trace); fix the plugin's route()",
                kind="router",
                plugin=self.name,
            ) from error
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(loads):
            raise PluginError(
                f"{self._label} broke the route() contract: it answered "
                f"{type(answer).__name__} {answer!r:.80} (request {self._requests} of the "
                f"trace); route() must return an int index into the {len(loads)} live "
                f"engines' loads. Fix the plugin's route()",
                kind="router",
                plugin=self.name,
            )
        return answer

    def close(self) -> None:
        """End the router's thread once it is done with its call (a hung one is left)."""
        if self._thread is not None:
            self._calls.put(None)

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                self._answers.put((self._router.route(*call), None))
            except BaseException as exc:  # the dispatcher names the router and re-raises
                self._answers.put((None, exc))
