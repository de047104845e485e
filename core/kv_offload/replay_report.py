"""The figures of a timed replay's report that need more than counting: latency percentiles,
each tier's achieved throughput against what the trace demands of it, and the plain verdict
a user planning a deployment reads ("fs keeps up to about 40x real time at 256 KiB blocks").

A tier's demand is what the trace asks of it: every block cascaded to it (those its gate
dropped included) and every block promoted from it, in bytes, over the trace's duration (1x)
and over the replay's (the chosen speed). Its throughput is the bytes it moved over the time
it was busy: the union of its jobs' intervals, each from submission to the step that collected
its result. Collection happens at step ends, so a job looks up to one step longer than it was:
the throughput is a lower bound, exact once the tier is saturated (then its jobs overlap and
the union is the whole run).

Hence the verdict: a tier keeps up when it dropped at most 1% of its cascades, was busy at
most 90% of the run and its throughput's multiple of the 1x demand (``keeps_up_to_x``) reaches
the chosen speed; then it keeps up at that speed and *at least* to that multiple. When its
throughput falls short of the speed it falls behind, and keeps up to about that multiple
(exact once saturated); when only its drops or its busy time fail, it is at its limit (no
headroom for the trace's bursts). No verdict contradicts ``keeps_up_to_x``. There is none
(``keeps_up`` is ``None``) when the replay loop itself fell behind the trace (it measured the
loop, not the tier, and asked the tier for less than the trace demands: lower ``--speed``),
or when the trace spans no time (every request at one instant: no demand rate).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from .config.memory import human
from .replay_records import TierJob

__all__ = ["busy_seconds", "latency_summary", "tier_throughput"]


def latency_summary(samples: Sequence[float]) -> dict[str, float | int | None]:
    """``count``, ``p50``, ``p99`` and ``max`` of ``samples`` (seconds; ``None`` if empty)."""
    if not samples:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "p50": _percentile(ordered, 0.50),
        "p99": _percentile(ordered, 0.99),
        "max": ordered[-1],
    }


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank percentile of sorted ``ordered``."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def busy_seconds(jobs: Iterable[TierJob]) -> float:
    """The length of the union of the jobs' intervals ``[done - seconds, done]``."""
    intervals = sorted((job.done - job.seconds, job.done) for job in jobs)
    total = 0.0
    end = -math.inf
    for lo, hi in intervals:
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def tier_throughput(
    name: str,
    jobs: Sequence[TierJob],
    stats: Any,
    block_bytes: int,
    trace_seconds: float,
    speed: float,
    span_s: float,
    loop_kept_up: bool = True,
) -> dict[str, Any]:
    """One tier's row of the report: demand at 1x and at ``speed``, throughput, verdict.
    ``span_s`` is the wall time from the replay's start to its last collected job;
    ``loop_kept_up`` whether the replay loop kept the trace's pace (else: no verdict)."""
    mine = [job for job in jobs if job.tier == name]
    dropped = stats.dropped_blocks
    moved = stats.bytes_written + stats.bytes_read
    demanded = moved + (dropped + stats.failed_cascades) * block_bytes
    busy = busy_seconds(mine)
    achieved = moved / busy if busy > 0 else None
    demand_1x = demanded / trace_seconds if trace_seconds > 0 else None
    demand_speed = demand_1x * speed if demand_1x is not None else None
    keeps_up_to = achieved / demand_1x if achieved is not None and demand_1x else None
    utilization = min(1.0, busy / span_s) if span_s > 0 else 0.0
    offered = stats.cascaded_blocks + dropped
    fine = dropped <= DROP_TOLERANCE * offered and utilization <= SATURATED
    keeps_up: bool | None = None
    if trace_seconds <= 0:
        verdict = (
            f"{name}: no verdict: the trace spans 0 s (all its requests arrive at one "
            f"instant), so there is no demand rate to keep up with; it moved {human(moved)}"
        )
    elif not loop_kept_up:
        verdict = (
            f"{name}: no verdict at {speed:g}x real time: the replay loop itself fell behind "
            f"the trace, so {name} was asked for less than the trace demands and its figures "
            "measure the loop; lower --speed"
        )
    elif keeps_up_to is None or achieved is None:
        verdict = (
            f"{name}: moved nothing, so no verdict (nothing was cascaded to or promoted from it)"
        )
    else:
        keeps_up = fine and keeps_up_to >= speed
        verdict = _verdict(
            name, fine, dropped, offered, utilization, speed, keeps_up_to, block_bytes, achieved
        )
    return {
        "demanded_bytes": demanded,
        "moved_bytes": moved,
        "demand_bytes_per_s_1x": demand_1x,
        "demand_bytes_per_s_at_speed": demand_speed,
        "achieved_bytes_per_s": achieved,
        "busy_seconds": busy,
        "utilization": utilization,
        "jobs": len(mine),
        "dropped_blocks": dropped,
        "keeps_up_to_x": keeps_up_to,
        "keeps_up": keeps_up,
        "verdict": verdict,
    }


#: A tier busy (a job in flight) more than this share of the replay has no headroom left.
SATURATED = 0.9
#: Cascades a tier may drop and still keep up: a burst's few, not a steady shedding.
DROP_TOLERANCE = 0.01


def _verdict(
    name: str,
    fine: bool,
    dropped: int,
    offered: int,
    utilization: float,
    speed: float,
    keeps_up_to: float,
    block_bytes: int,
    achieved: float,
) -> str:
    """The sentence for a tier measured at the trace's pace; ``fine``: few drops and some
    idle time. Each branch agrees with ``keeps_up_to`` against ``speed``."""
    size = _size(block_bytes)
    rate = f"{human(int(achieved))}/s"
    shed = f"{dropped} of {offered} cascaded blocks dropped" if dropped else "nothing dropped"
    if keeps_up_to < speed:
        return (
            f"{name} falls behind at {speed:g}x real time (busy {utilization:.0%} of the time, "
            f"{shed}); it moved {rate} while busy: it keeps up to about {keeps_up_to:.1f}x "
            f"real time at {size} blocks"
        )
    if fine:
        return (
            f"{name} keeps up at {speed:g}x real time (busy {utilization:.0%} of the time, "
            f"{shed}); moving {rate} while busy, it keeps up to at least about "
            f"{keeps_up_to:.0f}x real time at {size} blocks"
        )
    why = shed if dropped > DROP_TOLERANCE * offered else "its jobs queue"
    return (
        f"{name} is at its limit at {speed:g}x real time (busy {utilization:.0%} of the time, "
        f"{why}): moving {rate} while busy, {keeps_up_to:.1f}x the 1x demand, it has no "
        f"headroom for the trace's bursts at {size} blocks"
    )


def _size(n: int) -> str:
    """``256 KiB``: block sizes in binary units, as they are configured."""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:g} {unit}"
        value /= 1024
    return f"{value:g} GiB"
