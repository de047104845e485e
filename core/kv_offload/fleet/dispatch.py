"""A fleet replay: the trace through N engine processes that share the stack's shared tiers.

Each engine is a process of its own (:mod:`kv_offload.fleet.engine`) running its stack of the
plan (:mod:`kv_offload.fleet.plan`: which tiers it shares with the others).

The dispatcher (this process) keeps the trace's clock: at each request's arrival it asks the
router (:mod:`kv_offload.fleet.routers`) which live engine takes it, given each engine's
unfinished requests, and sends it there; each router call is bounded and its answer checked
(:mod:`kv_offload.fleet.bounded_router`). Every wait is bounded and every engine accounted
for: an engine that cannot start stops the run with its reason; one that dies during the run
is reported (which engine, its exit code or error) and the others' results still count; one
that does not finish in time is stopped and reported (:mod:`kv_offload.fleet.accounts`). The
run never hangs, and ends its engines however it ends: an error or ``SIGTERM`` tells them
to finish and then stops them, and a dispatcher that is killed takes them with it
(:func:`kv_offload.fleet.engine.exit_with_dispatcher`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from types import FrameType
from typing import Any, cast

from ..errors import KVOffloadError
from ..replay_clock import check_clock
from ..replay_records import TimedRequest
from .accounts import EngineState, fleet_report
from .bounded_router import ROUTE_TIMEOUT_S, BoundedRouter
from .engine import ERROR, FINISHED, READY, RESULT, EngineSettings, engine_main
from .plan import FleetPlan
from .routers import Router

__all__ = ["ROUTE_TIMEOUT_S", "FleetError", "run_fleet"]

#: How long an engine may take to build its stack and say it is ready.
START_TIMEOUT_S = 120.0
#: How long engines told to finish may take to exit before they are terminated.
STOP_GRACE_S = 5.0


class FleetError(KVOffloadError):
    """A fleet replay could not run: an engine did not start, or every engine died."""


@dataclass
class _Fleet:
    engines: list[EngineState]
    #: each engine's end of its message pipe (closed here at the engine's EOF)
    readers: list[Connection]
    progress: Callable[[int], None] | None = None

    def pump(self, timeout: float) -> None:
        """Take the engines' messages for up to ``timeout`` seconds, then look for engines
        that died without a word."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if not self._receive(max(deadline - time.monotonic(), 0.0)):
                break
            if time.monotonic() >= deadline:
                break
        for engine in self.engines:
            if engine.live and engine.process.exitcode is not None:
                # It may have sent its last words just before exiting: read them first.
                while self._receive(0.0):
                    pass
                if engine.live:
                    engine.stopped = engine.exit_reason()

    def _receive(self, timeout: float) -> bool:
        """Take the messages ready within ``timeout`` seconds; whether there was any."""
        open_readers = [r for r in self.readers if not r.closed]
        if not open_readers:
            if timeout > 0:
                time.sleep(timeout)
            return False
        ready = connection_wait(open_readers, timeout)
        for ready_reader in ready:
            reader = cast(Connection, ready_reader)
            try:
                message = reader.recv()
            except (EOFError, OSError):  # the engine ended (a torn last message included)
                reader.close()
                continue
            self._take(*message)
        return bool(ready)

    def close(self) -> None:
        for reader in self.readers:
            reader.close()

    def _take(self, kind: str, index: int, payload: Any) -> None:
        """One message of engine ``index`` (see :mod:`kv_offload.fleet.engine`)."""
        engine = self.engines[index]
        if kind == READY:
            engine.ready = True
        elif kind == FINISHED:
            engine.finished += payload
            if self.progress is not None:
                self.progress(payload)
        elif kind == RESULT:
            engine.result = payload
        elif kind == ERROR:
            engine.error = payload

    def live(self) -> list[EngineState]:
        return [e for e in self.engines if e.live]


def run_fleet(
    plan: FleetPlan,
    requests: Sequence[TimedRequest],
    *,
    router: Router,
    settings: EngineSettings,
    finish_timeout_s: float,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Replay ``requests`` through ``plan``'s engines; the fleet's report (see the module
    docstring). Raises :class:`FleetError` if an engine cannot start or all of them die."""
    check_clock(settings.speed, settings.step_s)
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    engines = []
    # One pipe per engine, not one queue for all: a queue's writers share a lock, and an
    # engine killed while its feeder thread held it left every other engine's messages
    # stuck (a live engine "did not finish"). A pipe's only writer is its engine; once this
    # process has closed its copy of the writing end, an engine's death is EOF here.
    writers = []
    readers = []
    for index, stack in enumerate(plan.stacks):
        inbox = context.Queue()
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=engine_main,
            args=(index, stack, settings, inbox, writer, os.getpid()),
            name=f"kv-offload-engine-{index}",
            daemon=True,
        )
        engines.append(EngineState(index, process, inbox))
        readers.append(reader)
        writers.append(writer)
    fleet = _Fleet(engines, readers, progress=progress)
    bounded = BoundedRouter(router)
    try:
        with _terminate_stops_the_fleet():
            for engine, writer in zip(engines, writers):
                engine.process.start()
                writer.close()
            _wait_ready(fleet)
            started = time.monotonic()
            _dispatch(fleet, requests, bounded, settings.speed, started)
            _finish(fleet, finish_timeout_s)
            seconds = time.monotonic() - started
    finally:
        bounded.close()
        for writer in writers:  # an engine that never started
            writer.close()
        _stop(fleet)
    return fleet_report(fleet.engines, plan, requests, settings, seconds)


@contextlib.contextmanager
def _terminate_stops_the_fleet() -> Iterator[None]:
    """While the fleet runs, ``SIGTERM`` raises :class:`FleetError` in the dispatcher, so
    its engines are stopped and its queues closed as on any error (the signal's default
    would end the dispatcher at once and leave that to the engines and to multiprocessing's
    resource tracker). Only the main thread can handle signals; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise FleetError("the fleet was stopped by SIGTERM; its engines were stopped")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait_ready(fleet: _Fleet) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not all(e.ready for e in fleet.engines):
        fleet.pump(0.05)
        for engine in fleet.engines:
            if not engine.ready and not engine.live:
                raise FleetError(
                    f"engine {engine.index} could not start: {engine.error or engine.stopped}"
                )
        if time.monotonic() >= deadline:
            late = [e.index for e in fleet.engines if not e.ready]
            raise FleetError(
                f"engines {late} did not start within {START_TIMEOUT_S:g} s (building the "
                f"stack: is every shared tier's server reachable?)"
            )


def _dispatch(
    fleet: _Fleet,
    requests: Sequence[TimedRequest],
    router: BoundedRouter,
    speed: float,
    started: float,
) -> None:
    """Send each request to its engine at its arrival time."""
    first = requests[0].arrival_s if requests else 0.0
    for request in requests:
        due = started + (request.arrival_s - first) / speed
        while True:
            now = time.monotonic()
            if now >= due:
                break
            fleet.pump(min(due - now, 0.05))
        fleet.pump(0.0)
        live = fleet.live()
        if not live:
            raise FleetError(
                "every engine died: "
                + "; ".join(f"engine {e.index}: {e.error or e.stopped}" for e in fleet.engines)
            )
        chosen = live[router.route(request.keys, [e.load for e in live])]
        chosen.inbox.put((request, due))
        chosen.sent += 1
    for engine in fleet.live():
        engine.inbox.put(None)


def _finish(fleet: _Fleet, timeout_s: float) -> None:
    """Wait for every live engine's result, at most ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while fleet.live():
        if time.monotonic() >= deadline:
            for engine in fleet.live():
                engine.stopped = (
                    f"did not finish within {timeout_s:g} s of the last request; stopped"
                )
            return
        fleet.pump(0.1)


def _stop(fleet: _Fleet) -> None:
    """Every engine process ends: told to finish (a run stopped by an error had not told
    them yet) and given :data:`STOP_GRACE_S` while its messages are read (an engine's exit
    waits until what it sent is written), else terminated, else killed."""
    started = [e for e in fleet.engines if e.process.pid is not None]
    for engine in started:
        if engine.process.exitcode is None:
            with contextlib.suppress(Exception):  # a queue that cannot take it: stopped below
                engine.inbox.put(None)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(e.process.is_alive() for e in started) and time.monotonic() < deadline:
        fleet.pump(0.05)
    for engine in started:
        process = engine.process
        if process.is_alive():
            process.terminate()
            process.join(timeout=5.0)
        if process.is_alive():
            process.kill()
            process.join(timeout=5.0)
        process.join(timeout=0)  # reap it
        _close_inbox(engine)
    fleet.close()


def _close_inbox(engine: EngineState) -> None:
    """Close an ended engine's inbox so that this process's exit cannot wait for it.

    The queue's feeder thread writes the requests into a pipe, and the process's exit waits
    for it; an engine that died or failed leaves requests unread, and a full pipe would
    block that thread for ever. So what it left is read here (this process holds the read
    end too), within a bound, then the queue is closed normally. Only if that bound passes
    is the feeder abandoned (``cancel_join_thread``): abandoning it always would let it end
    during interpreter shutdown, after unlinking a semaphore but before telling the
    resource tracker, which then warns of a leak."""
    inbox = engine.inbox
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        try:
            inbox.get(timeout=0.05)
        except queue.Empty:
            break
        except (OSError, ValueError, EOFError):  # already closed, or a torn message
            break
    else:
        inbox.cancel_join_thread()
    inbox.close()
