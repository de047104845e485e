"""A fleet replay: the trace through N engine processes that share the stack's shared tiers.

Each engine is a process of its own (:mod:`kv_offload.fleet.engine`) with its own CPU tier
and private tiers; tiers whose storage every engine reaches (a tier class with
``shared_across_engines = True``, such as the Redis tier) are shared through their server.
A private tier with a ``root_dir`` gets a directory per engine (``root_dir/engine-K``), since
two processes must not manage one directory.

The dispatcher (this process) keeps the trace's clock: at each request's arrival it asks the
router (:mod:`kv_offload.fleet.routers`) which live engine takes it, given each engine's
unfinished requests, and sends it there. Every wait is bounded and every engine accounted
for: an engine that cannot start stops the run with its reason; one that dies during the run
is reported (which engine, its exit code or error) and the others' results still count; one
that does not finish in time is stopped and reported. The run never hangs.
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import StackConfig
from ..errors import KVOffloadError
from ..replay_clock import TimedRequest, check_clock
from ..replay_report import latency_summary
from ..tiering import SecondaryTierFactory
from .engine import ERROR, FINISHED, READY, RESULT, EngineSettings, engine_main
from .routers import Router

__all__ = ["FleetError", "FleetPlan", "plan_fleet", "run_fleet"]

#: How long an engine may take to build its stack and say it is ready.
START_TIMEOUT_S = 120.0
#: Past the last request: how long engines may take to finish, on top of their drain and
#: promotion timeouts, before they are stopped.
FINISH_MARGIN_S = 60.0
CPU = "CPU"


class FleetError(KVOffloadError):
    """A fleet replay could not run: an engine did not start, or every engine died."""


@dataclass(frozen=True)
class FleetPlan:
    """The engines' stacks and which tiers they share."""

    stacks: list[StackConfig]
    shared: list[str]
    private: list[str]

    def note(self) -> str | None:
        """What a user should know before reading the figures (``None``: nothing)."""
        if self.stacks and not self.shared:
            kinds = ", ".join(self.private) or "none"
            return (
                f"nothing is shared: every tier of this stack is private to its engine "
                f"(tiers: {kinds}); the fleet is {len(self.stacks)} isolated engines. Add a "
                f'shared tier (type = "redis") to measure what sharing buys'
            )
        return None


def _tier_name(tier: Any) -> str:
    return str(tier.name or tier.type)


def plan_fleet(stack: StackConfig, engines: int) -> FleetPlan:
    """One stack per engine: shared tiers as they are, a private tier's ``root_dir`` moved
    to ``root_dir/engine-K``."""
    shared: list[str] = []
    private: list[str] = []
    for tier in stack.tiers:
        cls = SecondaryTierFactory.registry.resolve(tier.type, tier.module_path)
        (shared if getattr(cls, "shared_across_engines", False) else private).append(
            _tier_name(tier)
        )
    stacks = []
    for index in range(engines):
        tiers = []
        for tier in stack.tiers:
            root = tier.arguments.get("root_dir")
            if _tier_name(tier) in private and isinstance(root, str):
                arguments = {**tier.arguments, "root_dir": str(Path(root) / f"engine-{index}")}
                tier = replace(tier, arguments=arguments)
            tiers.append(tier)
        stacks.append(replace(stack, tiers=tuple(tiers)))
    return FleetPlan(stacks, shared, private)


@dataclass
class _EngineState:
    index: int
    process: Any
    inbox: Any
    ready: bool = False
    sent: int = 0
    finished: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None
    stopped: str | None = None  # why the dispatcher gave up on it

    @property
    def load(self) -> int:
        return self.sent - self.finished

    @property
    def live(self) -> bool:
        return self.result is None and self.error is None and self.stopped is None

    def exit_reason(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code} before reporting"


@dataclass
class _Fleet:
    engines: list[_EngineState]
    outbox: Any
    progress: Callable[[int], None] | None = None

    def pump(self, timeout: float) -> None:
        """Take the engines' messages for up to ``timeout`` seconds, then look for engines
        that died without a word."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                message = self.outbox.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            self._take(*message)
            if time.monotonic() >= deadline:
                break
        for engine in self.engines:
            if engine.live and engine.process.exitcode is not None:
                # It may have sent its last words just before exiting: read them first.
                self._drain_now()
                if engine.live:
                    engine.stopped = engine.exit_reason()

    def _drain_now(self) -> None:
        while True:
            try:
                message = self.outbox.get_nowait()
            except queue.Empty:
                return
            self._take(*message)

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

    def live(self) -> list[_EngineState]:
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
    outbox = context.Queue()
    engines = []
    for index, stack in enumerate(plan.stacks):
        inbox = context.Queue()
        process = context.Process(
            target=engine_main,
            args=(index, stack, settings, inbox, outbox),
            name=f"kv-offload-engine-{index}",
            daemon=True,
        )
        engines.append(_EngineState(index, process, inbox))
    fleet = _Fleet(engines, outbox, progress=progress)
    try:
        for engine in engines:
            engine.process.start()
        _wait_ready(fleet)
        started = time.monotonic()
        _dispatch(fleet, requests, router, settings.speed, started)
        _finish(fleet, finish_timeout_s)
        seconds = time.monotonic() - started
    finally:
        _stop(fleet)
    return _report(fleet, plan, requests, settings, seconds)


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
    router: Router,
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
        chosen = live[_route(router, request, live)]
        chosen.inbox.put((request, due))
        chosen.sent += 1
    for engine in fleet.live():
        engine.inbox.put(None)


def _route(router: Router, request: TimedRequest, live: list[_EngineState]) -> int:
    index = router.route(request.keys, [e.load for e in live])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(live):
        raise FleetError(
            f"router {type(router).__name__} returned {index!r}; route() must return an index "
            f"into the {len(live)} live engines' loads"
        )
    return index


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
    """Every engine process ends: joined, else terminated, else killed."""
    for engine in fleet.engines:
        process = engine.process
        if process.pid is None:
            continue
        process.join(timeout=5.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5.0)
        if process.is_alive():
            process.kill()
            process.join(timeout=5.0)


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _report(
    fleet: _Fleet,
    plan: FleetPlan,
    requests: Sequence[TimedRequest],
    settings: EngineSettings,
    seconds: float,
) -> dict[str, Any]:
    tier_names = plan.shared + plan.private
    per_engine = []
    totals: Counter[str] = Counter()
    origins: Counter[str] = Counter()
    latencies: list[float] = []
    incomplete = []
    for engine in fleet.engines:
        result = engine.result
        row: dict[str, Any] = {"engine": engine.index, "requests_sent": engine.sent}
        if result is None:
            row.update(
                status="failed",
                reason=engine.error or engine.stopped or "no result",
                lost_requests=engine.load,
            )
            per_engine.append(row)
            continue
        blocks = result["blocks"]
        by_origin = result["hits_by_origin"]
        row.update(
            status="ok",
            requests=result["requests"],
            blocks=blocks,
            hit_ratio=_ratio(result["hit_blocks"], blocks),
            hit_ratio_by_tier={
                name: _ratio(by_origin.get(name, 0), blocks) for name in [CPU, *tier_names]
            },
            late_blocks=result["late_blocks"],
            promotion_latency_s=result["promotion_latency_s"],
            corrupted_blocks=result["corrupted_blocks"],
            evictions=result["evictions"],
            tiers=result["tiers"],
        )
        if result["incomplete"]:
            row["incomplete"] = result["incomplete"]
            incomplete.append(f"engine {engine.index}: {result['incomplete']}")
        per_engine.append(row)
        for key in (
            "requests",
            "blocks",
            "hit_blocks",
            "late_blocks",
            "verified_blocks",
            "corrupted_blocks",
            "stored_blocks",
            "rejected_stores",
        ):
            totals[key] += result[key]
        origins.update(by_origin)
        latencies.extend(result["promotion_latencies"])
    blocks = totals["blocks"]
    by_tier = {name: _ratio(origins.get(name, 0), blocks) for name in [CPU, *tier_names]}
    failed = [row for row in per_engine if row["status"] != "ok"]
    trace_seconds = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    return {
        "fleet": {
            "engines": len(fleet.engines),
            "router": None,  # filled in by the caller, which knows the name
            "shared_tiers": plan.shared,
            "private_tiers": plan.private,
            "note": plan.note(),
        },
        "timed": True,
        "speed": settings.speed,
        "step_seconds": settings.step_s,
        "trace_seconds": trace_seconds,
        "seconds": seconds,
        "requests": totals["requests"],
        "requests_sent": sum(e.sent for e in fleet.engines),
        "blocks": blocks,
        "hit_ratio": _ratio(totals["hit_blocks"], blocks),
        "hit_ratio_by_tier": by_tier,
        "shared_tier_share": sum(by_tier[name] for name in plan.shared),
        "late_blocks": totals["late_blocks"],
        "promotion_latency_s": latency_summary(latencies),
        "verified_blocks": totals["verified_blocks"],
        "corrupted_blocks": totals["corrupted_blocks"],
        "stored_blocks": totals["stored_blocks"],
        "rejected_stores": totals["rejected_stores"],
        "engines": per_engine,
        "failed_engines": len(failed),
        "incomplete": "; ".join(incomplete) if incomplete else None,
    }


def finish_timeout(stack: StackConfig) -> float:
    """How long engines may take after the last request: their drain and promotion bounds
    plus a margin (their waiting requests, their shutdown)."""
    bound = stack.drain_timeout_s + stack.promotion_timeout_s + FINISH_MARGIN_S
    return bound if math.isfinite(bound) else FINISH_MARGIN_S
