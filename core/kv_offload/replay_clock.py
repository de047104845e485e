"""A timed replay: requests arrive at the trace's pace and an engine loop steps in real time.

:func:`kv_offload.replay.replay` runs a trace as fast as the manager goes, which says nothing
about a disk or a network: their jobs take real time, and at a thousand times the trace's pace
a backpressure gate rightly drops nearly every cascade. Here the trace's ``timestamp`` (ms) is
the clock, scaled by ``speed``:

* request ``r`` arrives ``r.arrival_s / speed`` seconds of wall time after the start;
* the engine steps every ``step_s`` seconds (sooner never; later when a step's work takes
  longer, and then the lag is measured): it admits the requests that arrived, schedules every
  waiting request it can, and ends the step with ``on_schedule_end()``, which submits the
  step's promotions and collects finished tier jobs;
* scheduling a request looks its blocks up in prefix order up to the first ``MISS``: the
  ``HIT`` blocks before the first ``PENDING`` one are its hits; blocks further on that a tier
  holds are asked too, so one step queues the request's whole promotion (one job per tier);
* a request with a ``PENDING`` block waits, asked again each step, until none of its prefix is
  ``PENDING`` or its load-wait budget (:mod:`kv_offload.load_wait`) is spent; blocks still
  ``PENDING`` then are misses for it, counted as *late* (their promotions still land);
* then, as in the untimed replay: load and verify the hits, store the rest, finish.

Tier jobs run on the tiers' own threads meanwhile. Every wait is bounded: a request's wait by
its budget and the manager's promotion deadline, the loop by :data:`MAX_REQUEST_WAIT_S`, and
the whole replay by ``max_wall_s`` (:data:`MAX_WALL_S`): a replay planned longer (a trace with
a gap of hours, or timestamps in the wrong unit) is refused before it starts rather than left
to sleep silently (:class:`ClockPlan`).

What the replay records, and where each hit came from: :mod:`kv_offload.replay_records`;
where requests come from: :mod:`kv_offload.arrivals`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .arrivals import Arrivals, TraceArrivals
from .errors import ConfigError
from .keys import OffloadKey
from .load_wait import LoadWaitPolicy, checked_budget_s
from .replay import Manager, block_bytes
from .replay_records import CPU, ReplayProbe, TimedReplayResult, TimedRequest
from .types import LookupResult

__all__ = [
    "DEFAULT_STEP_S",
    "MAX_WALL_S",
    "ClockPlan",
    "Engine",
    "MAX_REQUEST_WAIT_S",
    "check_clock",
    "duration",
    "replay_timed",
    "run_engine",
]

#: An engine step when nothing slows it down (vLLM's steps take 10-50 ms on a GPU).
DEFAULT_STEP_S = 0.01
#: A safety net only: a request still waiting this long (wall seconds) stops waiting.
#: The manager resolves every ``PENDING`` answer within its ``promotion_timeout_s``.
MAX_REQUEST_WAIT_S = 120.0
#: The longest wall time a timed replay may plan to take unless its caller allows more: past
#: it the trace more likely has a gap of hours, or timestamps in another unit than ms.
MAX_WALL_S = 6 * 3600.0

_HIT = LookupResult.HIT
_PENDING = LookupResult.PENDING


class _Waiting:
    """A request admitted and not yet scheduled."""

    __slots__ = ("budget", "pending_since", "request", "since")

    def __init__(self, request: TimedRequest) -> None:
        self.request = request
        self.since: float | None = None  # wall time it first found a PENDING block
        self.budget = 0.0
        self.pending_since: dict[OffloadKey, float] = {}


class Engine:
    """One engine's request handling (lookups, waiting, loads, stores); one per run.
    :func:`run_engine` steps it."""

    def __init__(
        self,
        manager: Manager,
        load_wait: LoadWaitPolicy,
        block_tokens: int,
        data_plane: bool,
        probe: ReplayProbe,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.manager = manager
        self.load_wait = load_wait
        self.block_tokens = block_tokens
        self.buffer = manager.kv_buffer if data_plane else None
        if data_plane and self.buffer is None:
            raise ConfigError(
                "data_plane replay needs a manager with a KV buffer (block_size_bytes)"
            )
        self.size = self.buffer.block_size_bytes if self.buffer is not None else 0
        self.probe = probe
        self.progress = progress
        self.result = TimedReplayResult()

    def schedule(self, waiting: _Waiting, now: float) -> bool:
        """Look the request up; run it (True) unless it waits for promotions (False)."""
        request = waiting.request
        ctx, keys = request.ctx, request.keys
        lookup = self.manager.lookup
        hits = 0
        pending: list[OffloadKey] = []
        for key in keys:
            answer = lookup(key, ctx)
            if answer is _HIT:
                if not pending:
                    hits += 1
            elif answer is _PENDING:
                pending.append(key)
            else:
                break
        if pending:
            since = waiting.pending_since
            for key in pending:
                since.setdefault(key, now)
            if waiting.since is None:
                waiting.since = now
                waiting.budget = min(
                    checked_budget_s(self.load_wait, len(keys), self.block_tokens),
                    MAX_REQUEST_WAIT_S,
                )
                if waiting.budget > 0:
                    self.result.waited_requests += 1
            if now - waiting.since < waiting.budget:
                return False
            self.result.late_blocks += len(pending)
        self.run_request(waiting, hits)
        return True

    def run_request(self, waiting: _Waiting, hits: int) -> None:
        """Load (and verify) the request's ``hits`` first blocks, store the rest, finish."""
        manager, result, buffer = self.manager, self.result, self.buffer
        ctx, keys = waiting.request.ctx, waiting.request.keys
        if hits:
            hit_keys = keys[:hits]
            spec = manager.prepare_load(hit_keys, ctx)
            if buffer is not None:
                got = buffer.read_blocks(spec.block_ids)
                expected = block_bytes(hit_keys, self.size)
                result.corrupted_blocks += int(np.count_nonzero((got != expected).any(axis=1)))
                result.verified_blocks += hits
            manager.complete_load(hit_keys, ctx)
            manager.touch(hit_keys, ctx)
            origin = self.probe.origin
            by_origin = result.hits_by_origin
            since = waiting.pending_since
            now = time.monotonic()
            for key in hit_keys:
                by_origin[origin.pop(key, CPU)] += 1
                started = since.get(key)
                if started is not None:
                    result.promotion_latencies.append(now - started)
        if hits < len(keys):
            out = manager.prepare_store(keys[hits:], ctx)
            if out is None:
                result.rejected_stores += 1
                result.rejected_store_sizes.append(len(keys) - hits)
            elif out.keys_to_store:
                stored = out.keys_to_store
                if buffer is not None:
                    buffer.write_blocks(out.store_spec.block_ids, block_bytes(stored, self.size))
                manager.complete_store(stored, ctx)
                origin = self.probe.origin
                for key in stored:  # stored by the engine: a later hit is the CPU tier's
                    origin.pop(key, None)
                result.stored_blocks += len(stored)
        manager.on_request_finished(ctx)
        result.requests += 1
        result.blocks += len(keys)
        result.hit_blocks += hits
        if self.progress is not None:
            self.progress(len(keys))


def run_engine(
    engine: Engine,
    arrivals: Arrivals,
    *,
    step_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_step: Callable[[int], None] | None = None,
) -> TimedReplayResult:
    """Step ``engine`` in real time until ``arrivals`` is exhausted and no request waits:
    admit what arrived, schedule what can run, end the step, sleep to the next one.
    ``on_step`` hears how many requests each step finished (a fleet reports its load)."""
    manager, result = engine.manager, engine.result
    waiting: list[_Waiting] = []
    lags = result.admission_lags
    start = result.started = clock()
    next_step = start
    while not arrivals.exhausted() or waiting:
        now = clock()
        if not waiting:
            # Idle: step until the next arrival so tier jobs keep being collected.
            wake = min(arrivals.next_at(now), next_step)
            if wake > now:
                sleep(wake - now)
                now = clock()
        for request, arrived in arrivals.due(now):
            lags.append(now - arrived)
            manager.on_new_request(request.ctx)
            waiting.append(_Waiting(request))
        finished = len(waiting)
        if waiting:
            waiting = [w for w in waiting if not engine.schedule(w, now)]
        finished -= len(waiting)
        manager.on_schedule_end()
        result.steps += 1
        if on_step is not None:
            on_step(finished)
        next_step = max(next_step + step_s, now)
        delay = next_step - clock()
        if delay > 0 and waiting:
            sleep(delay)
    result.seconds = clock() - start
    return result


def duration(seconds: float) -> str:
    """``12 s``, ``2.0 min``, ``33.3 h``, ``1.2e+13 days``: a span a user can picture."""
    if not seconds < math.inf:
        return "forever"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    days = seconds / 86400
    return f"{days:,.0f} days" if days < 1e6 else f"{days:.2g} days"


@dataclass(frozen=True)
class ClockPlan:
    """How long a timed replay of a trace takes, known before it starts: the trace's span and
    its longest gap between two requests (trace seconds; ``gap_after``: the index of the
    request before it), and the wall time at ``speed``."""

    trace_seconds: float
    longest_gap_s: float
    gap_after: int
    speed: float

    @classmethod
    def of(cls, arrivals: Sequence[float], speed: float) -> ClockPlan:
        """The plan of requests arriving at ``arrivals`` (sorted trace seconds)."""
        gap, after = 0.0, 0
        for index in range(1, len(arrivals)):
            step = arrivals[index] - arrivals[index - 1]
            if step > gap:
                gap, after = step, index - 1
        span = arrivals[-1] - arrivals[0] if arrivals else 0.0
        return cls(span, gap, after, float(speed))

    @property
    def wall_seconds(self) -> float:
        return self.trace_seconds / self.speed

    def pace(self) -> str:
        """``59.0 min of trace at 30x real time``."""
        return f"{duration(self.trace_seconds)} of trace at {self.speed:g}x real time"

    def describe(self) -> str:
        """``59.0 min of trace at 30x real time: about 2.0 min``."""
        return f"{self.pace()}: about {duration(self.wall_seconds)}"

    def speed_for(self, max_wall_s: float) -> float:
        """The smallest round speed (two significant digits) that fits ``max_wall_s``."""
        needed = self.trace_seconds / max_wall_s
        shown = float(f"{needed:.2g}")
        return shown if shown >= needed else float(f"{needed * 1.05:.2g}")

    def refusal(self, max_wall_s: float, gap: str, fixes: str) -> ConfigError | None:
        """The error refusing this plan when it takes longer than ``max_wall_s``, else None.
        ``gap`` names where the longest gap is, ``fixes`` what the user can do (the CLI and
        the API name their own options)."""
        if self.wall_seconds <= max_wall_s:
            return None
        return ConfigError(
            f"a timed replay of this trace would take {duration(self.wall_seconds)} "
            f"({self.pace()}), over the {duration(max_wall_s)} allowed; its longest gap is "
            f"{duration(self.longest_gap_s)} of trace ({gap}): "
            f"{fixes}"
        )


def check_clock(speed: float, step_s: float) -> None:
    """Refuse a speed or step that is not a positive finite number."""
    if isinstance(speed, bool) or not (isinstance(speed, (int, float)) and 0 < speed < math.inf):
        raise ConfigError(f"speed must be a positive finite number, got {speed!r}")
    if isinstance(step_s, bool) or not (isinstance(step_s, (int, float)) and 0 < step_s < math.inf):
        raise ConfigError(f"step_s must be a positive finite number, got {step_s!r}")


def replay_timed(
    manager: Manager,
    requests: Sequence[TimedRequest],
    *,
    speed: float,
    load_wait: LoadWaitPolicy,
    block_tokens: int,
    step_s: float = DEFAULT_STEP_S,
    data_plane: bool = False,
    probe: ReplayProbe | None = None,
    progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    max_wall_s: float = MAX_WALL_S,
) -> TimedReplayResult:
    """Replay ``requests`` (sorted by ``arrival_s``) at ``speed`` times the trace's pace; see
    the module docstring. ``probe`` must be registered on the manager's plugin manager for
    the run (its hooks attribute hits to tiers); without one every hit counts as the CPU's.
    A replay that would take longer than ``max_wall_s`` is refused before it starts."""
    check_clock(speed, step_s)
    if isinstance(max_wall_s, bool) or not (
        isinstance(max_wall_s, (int, float)) and max_wall_s > 0
    ):
        raise ConfigError(f"max_wall_s must be a positive number, got {max_wall_s!r}")
    plan = ClockPlan.of([r.arrival_s for r in requests], speed)
    refused = plan.refusal(
        max_wall_s,
        f"after request {plan.gap_after}",
        f"raise speed to {plan.speed_for(max_wall_s):g} or more, replay it untimed "
        "(kv_offload.replay.replay), or allow it with a larger max_wall_s",
    )
    if refused is not None:
        raise refused
    engine = Engine(manager, load_wait, block_tokens, data_plane, probe or ReplayProbe(), progress)
    engine.result.speed = float(speed)
    if requests:
        engine.result.trace_seconds = requests[-1].arrival_s - requests[0].arrival_s
    arrivals = TraceArrivals(requests, float(speed), clock())
    return run_engine(engine, arrivals, step_s=step_s, clock=clock, sleep=sleep)
