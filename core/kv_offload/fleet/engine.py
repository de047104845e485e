"""One engine of a fleet replay: a process of its own with its own stack, fed by the
dispatcher through a queue and answering through a pipe of its own
(:mod:`kv_offload.fleet.dispatch`).

The engine builds its manager from the stack it was given (its private tiers already moved to
their own directories), says it is ready, then runs :func:`kv_offload.replay_clock.run_engine`
on the requests the dispatcher sends it, each stamped with its arrival time
(``time.monotonic`` is one clock for every process of a machine). Each step it reports how many
requests it finished (the dispatcher's ``least-loaded`` router reads that); at the end it
drains its tier jobs and sends a plain-data summary. Anything that goes wrong is sent as an
error line before the process exits, so the dispatcher can say which engine and why.

An engine never outlives its dispatcher (:func:`exit_with_dispatcher`): an orphaned engine
would keep its private tiers' locks (an fs tier's ``root_dir``), and the next fleet on them
would be refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from ..build import build_manager
from ..config import StackConfig
from ..load_wait import build_load_wait
from ..replay import drain_for_report
from ..replay_clock import Engine, run_engine
from ..replay_records import ReplayProbe, TimedReplayResult, TimedRequest, register_probe
from ..replay_report import latency_summary

__all__ = ["EngineSettings", "QueueArrivals", "engine_main", "exit_with_dispatcher"]

#: Messages an engine sends the dispatcher: (kind, engine index, payload).
READY, FINISHED, RESULT, ERROR = "ready", "finished", "result", "error"


@dataclass(frozen=True)
class EngineSettings:
    """What every engine of a fleet shares besides its stack."""

    load_wait: str
    load_wait_options: dict[str, Any]
    block_tokens: int
    step_s: float
    speed: float


class QueueArrivals:
    """Requests the dispatcher sent, as ``(request, arrival)``; ``None`` ends them."""

    def __init__(self, inbox: Any) -> None:
        self._inbox = inbox
        self._closed = False

    def due(self, now: float) -> list[tuple[TimedRequest, float]]:
        out: list[tuple[TimedRequest, float]] = []
        while not self._closed:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._closed = True
            else:
                out.append(item)
        return out

    def next_at(self, now: float) -> float:
        return float("inf")  # unknown: the loop steps meanwhile, as an idle engine does

    def exhausted(self) -> bool:
        return self._closed


#: ``prctl`` option: the signal the kernel sends a process when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1
#: The exit status of an engine that ended because its dispatcher died.
ORPHANED_EXIT = 3


def exit_with_dispatcher(index: int, dispatcher_pid: int) -> None:
    """End this engine process as soon as its dispatcher (``dispatcher_pid``) dies, however
    it dies (``kill -9`` included). Two ways, since neither covers every case alone:

    * on Linux, the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): it
      needs no thread of ours to be scheduled, but it follows the dispatcher's *thread* that
      started the engine, and exists on Linux only;
    * everywhere, a daemon thread waiting on the pipe that ``multiprocessing`` keeps open
      from the dispatcher (its end-of-file is the dispatcher's death).

    A dispatcher that died before this ran (while the engine imported its modules) is seen
    at once: the engine's parent is no longer ``dispatcher_pid``."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            print(
                f"kv-offload engine {index}: prctl(PR_SET_PDEATHSIG) failed "
                f"({os.strerror(errno)}); it ends on its dispatcher's pipe only",
                file=sys.stderr,
            )
    if os.getppid() != dispatcher_pid:
        _orphaned(index, dispatcher_pid)
    parent = multiprocessing.parent_process()
    if parent is not None and parent.sentinel is not None:
        threading.Thread(
            target=_wait_for_dispatcher,
            args=(index, dispatcher_pid, parent.sentinel),
            name=f"kv-offload-engine-{index}-watch",
            daemon=True,
        ).start()


def _wait_for_dispatcher(index: int, dispatcher_pid: int, sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])  # readable: end-of-file, the dispatcher died
    _orphaned(index, dispatcher_pid)


def _orphaned(index: int, dispatcher_pid: int) -> None:
    """Exit at once: nobody reads this engine's results any more, and its tiers' files stay
    as a crash leaves them (which every tier must survive)."""
    with contextlib.suppress(Exception):
        print(
            f"kv-offload engine {index}: its dispatcher (pid {dispatcher_pid}) died; exiting",
            file=sys.stderr,
            flush=True,
        )
    os._exit(ORPHANED_EXIT)


def engine_main(
    index: int,
    stack: StackConfig,
    settings: EngineSettings,
    inbox: Any,
    outbox: Any,
    dispatcher_pid: int,
) -> None:
    """The engine process's body (a ``multiprocessing`` target). ``outbox`` is the writing
    end of this engine's own pipe to the dispatcher (``send`` of one message tuple)."""
    exit_with_dispatcher(index, dispatcher_pid)
    try:
        manager = build_manager(stack)
    except BaseException as exc:  # the dispatcher says which engine could not start and why
        outbox.send((ERROR, index, _why(exc)))
        return
    try:
        probe = ReplayProbe()
        register_probe(manager, probe)
        policy = build_load_wait(settings.load_wait, settings.load_wait_options)
        engine = Engine(
            manager,
            policy,
            settings.block_tokens,
            manager.kv_buffer is not None,
            probe,
            None,
        )
        engine.result.speed = settings.speed
        outbox.send((READY, index, None))

        def report(finished: int) -> None:
            if finished:
                outbox.send((FINISHED, index, finished))

        result = run_engine(engine, QueueArrivals(inbox), step_s=settings.step_s, on_step=report)
        incomplete = drain_for_report(manager)
        summary = _summary(result, manager, probe, incomplete)
        manager.shutdown()
        outbox.send((RESULT, index, summary))
    except BaseException as exc:
        with contextlib.suppress(OSError):  # a dispatcher gone: nobody to tell
            outbox.send((ERROR, index, _why(exc)))
        with contextlib.suppress(Exception):  # the first error is the one reported
            manager.shutdown()


def _summary(
    result: TimedReplayResult, manager: Any, probe: ReplayProbe, incomplete: str | None
) -> dict[str, Any]:
    tiers = manager.tier_stats()
    return {
        "requests": result.requests,
        "blocks": result.blocks,
        "hit_blocks": result.hit_blocks,
        "hits_by_origin": dict(result.hits_by_origin),
        "late_blocks": result.late_blocks,
        "stored_blocks": result.stored_blocks,
        "rejected_stores": result.rejected_stores,
        "verified_blocks": result.verified_blocks,
        "corrupted_blocks": result.corrupted_blocks,
        "steps": result.steps,
        "seconds": result.seconds,
        "promotion_latencies": result.promotion_latencies,
        "promotion_latency_s": latency_summary(result.promotion_latencies),
        "admission_lag_max_s": max(result.admission_lags, default=0.0),
        "evictions": manager.cpu_stats().evictions,
        "tiers": {
            t.name: {
                "promoted_blocks": t.promoted_blocks,
                "failed_promotions": t.failed_promotions,
                "cascaded_blocks": t.cascaded_blocks,
                "dropped_blocks": t.dropped_blocks,
                "bytes_written": t.bytes_written,
                "bytes_read": t.bytes_read,
            }
            for t in tiers
        },
        "tier_jobs": len(probe.jobs),
        "incomplete": incomplete,
        "finished_at": time.monotonic(),
    }


def _why(exc: BaseException) -> str:
    """One line: the error, and where in kv-offload or a plugin it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
