"""What ``replay`` and ``compare`` share: reading the trace, replaying it through a freshly
built manager and reducing the outcome to the report both commands print."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import Any

from ..base import OffloadingManager
from ..build import build_manager
from ..config import StackConfig
from ..errors import KVOffloadError
from ..load_wait import LoadWaitPolicy, checked_describe
from ..replay import ReplayResult, drain_for_report, replay
from ..replay_clock import MAX_WALL_S, replay_timed
from ..replay_records import ReplayProbe, TimedReplayResult, TimedRequest, register_probe
from ..replay_report import latency_summary, tier_throughput
from ..trace import arrival_seconds, read_trace
from ..types import ReqContext

__all__ = ["Clock", "Trace", "progress_bar", "run"]

logger = logging.getLogger("kv_offload.cli")


class Trace:
    """A trace's requests as the replay takes them, and what was left out to get them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.block_tokens = None if args.keep_partial_blocks else args.block_tokens
        records = list(read_trace(args.trace, args.limit, block_tokens=self.block_tokens))
        self.requests = [(ReqContext(r.req_id), r.keys) for r in records]
        self.partial_blocks = sum(r.partial_blocks for r in records)
        #: Tokens per block, for load-wait budgets (the trace's, partial blocks or not).
        self.tokens_per_block: int = args.block_tokens
        self.timed: list[TimedRequest] | None = None
        #: The trace's line of each request (a timed replay's errors name them).
        self.lines = [r.line for r in records]
        if getattr(args, "speed", None) is not None:  # a timed replay: arrival times needed
            arrivals = arrival_seconds(records, args.trace)
            self.timed = [
                TimedRequest(ctx, keys, at) for (ctx, keys), at in zip(self.requests, arrivals)
            ]

    def describe(self) -> dict[str, Any]:
        return {"block_tokens": self.block_tokens, "partial_blocks_left_out": self.partial_blocks}

    def note(self) -> str:
        if self.block_tokens is None:
            return "partial last blocks included (--keep-partial-blocks)"
        return (
            f"full {self.block_tokens}-token blocks only: {self.partial_blocks} partial last "
            f"blocks neither looked up nor stored (--keep-partial-blocks to include them)"
        )


def progress_bar(total: int, enabled: bool | None, label: str, unit: str = "blk") -> Any:
    """A progress bar on stderr; ``enabled=None`` shows it only when stderr is a terminal."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit=unit,
        unit_scale=True,
        desc=label,
        disable=None if enabled is None else not enabled,  # None: only on a terminal
        file=sys.stderr,
        leave=False,
    )


@dataclass(frozen=True)
class Clock:
    """A timed replay's settings (``kv-offload replay --speed``)."""

    speed: float
    load_wait: LoadWaitPolicy
    step_s: float
    #: The longest the replay may take (wall seconds, ``--max-duration``).
    max_wall_s: float = MAX_WALL_S


def _report(stack: StackConfig, manager: OffloadingManager, result: ReplayResult) -> dict[str, Any]:
    cpu = manager.cpu_stats()
    tiers = manager.tier_stats()
    direct_hits = result.hit_blocks - result.promoted_hit_blocks
    # A promotion that landed after the replay stopped waiting for it was no hit: each tier's
    # share of the hits that came from promotions follows its share of landed promotions
    # (exact with one tier), so the shares add up to the hit ratio.
    landed = sum(t.promoted_blocks for t in tiers)
    per_tier = {
        t.name: result.promoted_hit_blocks * t.promoted_blocks / landed if landed else 0.0
        for t in tiers
    }
    return {
        "config": stack.source,
        "policy": stack.policy,
        "num_blocks": stack.num_blocks,
        "requests": result.requests,
        "blocks": result.blocks,
        "hit_ratio": result.hit_ratio,
        "hit_ratio_by_tier": {
            "CPU": direct_hits / result.blocks if result.blocks else 0.0,
            **{
                name: hits / result.blocks if result.blocks else 0.0
                for name, hits in per_tier.items()
            },
        },
        "evictions": cpu.evictions,
        "promotions": landed,
        "late_promotions": landed - result.promoted_hit_blocks,
        "failed_promotions": sum(t.failed_promotions for t in tiers),
        "cascaded_blocks": sum(t.cascaded_blocks for t in tiers),
        "writes": {
            t.name: {
                "write_policy": t.write_policy,
                "admission": t.admission or None,
                "blocks_written": t.cascaded_blocks,
                "bytes_written": t.bytes_written,
                "refused_blocks": t.refused_blocks,
                "write_back_dropped": t.write_back_dropped,
                # Blocks written per block this tier served as a hit (lower: fewer wasted).
                "writes_per_hit": t.cascaded_blocks / per_tier[t.name]
                if per_tier[t.name]
                else None,
            }
            for t in tiers
        },
        "rejected_stores": result.rejected_stores,
        # Of those, the stores asking for more blocks than the CPU tier holds; the others were
        # refused because tier jobs in flight pinned the blocks eviction needed.
        "rejected_stores_too_large": sum(
            size > stack.num_blocks for size in result.rejected_store_sizes
        ),
        "bytes_moved": {
            "to_tiers": sum(t.bytes_written for t in tiers),
            "from_tiers": sum(t.bytes_read for t in tiers),
        },
        "verified_blocks": result.verified_blocks,
        "corrupted_blocks": result.corrupted_blocks,
        "seconds": result.seconds,
        "blocks_per_second": result.blocks_per_second,
    }


def run(
    stack: StackConfig,
    requests: list[tuple[ReqContext, list[Any]]],
    show: bool | None,
    label: str,
    *,
    clock: Clock | None = None,
    trace: Trace | None = None,
) -> dict[str, Any]:
    """Build ``stack``, replay ``requests`` through it (real bytes when it has a KV buffer),
    shut it down and return the report. A tier that never reported its jobs marks the report
    ``incomplete`` instead of failing it: the measurements stand. With ``clock`` the replay
    keeps the trace's time (``trace.timed``; :mod:`kv_offload.replay_clock`)."""
    manager = build_manager(stack)
    total = sum(len(keys) for _, keys in requests)
    probe = ReplayProbe()
    unregister = register_probe(manager, probe)
    timed: TimedReplayResult | None = None
    try:
        with progress_bar(total, show, label) as bar:
            if clock is not None and trace is not None and trace.timed is not None:
                timed = replay_timed(
                    manager,
                    trace.timed,
                    speed=clock.speed,
                    load_wait=clock.load_wait,
                    block_tokens=trace.tokens_per_block,
                    step_s=clock.step_s,
                    data_plane=manager.kv_buffer is not None,
                    probe=probe,
                    progress=bar.update,
                    max_wall_s=clock.max_wall_s,
                )
                result = _as_replay_result(timed)
            else:
                result = replay(
                    manager,
                    requests,
                    data_plane=manager.kv_buffer is not None,
                    progress=bar.update,
                )
    except BaseException:
        unregister()
        _shutdown_after_error(manager)
        raise
    try:
        incomplete = drain_for_report(manager)
    except KVOffloadError:
        _shutdown_after_error(manager)
        raise
    report = _report(stack, manager, result)  # after the drain: every reported job counted
    if timed is not None and clock is not None:
        report.update(_timed_report(stack, manager, timed, probe, clock))
    unregister()
    try:
        manager.shutdown()
    except KVOffloadError as exc:
        if incomplete is None and not manager.has_pending_work():
            raise
        incomplete = incomplete or str(exc)
    if incomplete is not None:
        report["incomplete"] = incomplete
    return report


def _as_replay_result(timed: TimedReplayResult) -> ReplayResult:
    return ReplayResult(
        timed.requests,
        timed.blocks,
        timed.hit_blocks,
        timed.promoted_hit_blocks,
        timed.stored_blocks,
        timed.rejected_stores,
        timed.verified_blocks,
        timed.corrupted_blocks,
        timed.seconds,
        tuple(timed.rejected_store_sizes),
    )


def _timed_report(
    stack: StackConfig,
    manager: OffloadingManager,
    timed: TimedReplayResult,
    probe: ReplayProbe,
    clock: Clock,
) -> dict[str, Any]:
    """The figures only a timed replay has (they replace the untimed attribution of hits)."""
    blocks = timed.blocks
    by_tier = {"CPU": timed.hits_by_origin.get("CPU", 0) / blocks if blocks else 0.0}
    tiers = manager.tier_stats()
    for t in tiers:
        by_tier[t.name] = timed.hits_by_origin.get(t.name, 0) / blocks if blocks else 0.0
    block_bytes = stack.block_size_bytes or 0
    lags = timed.admission_lags
    last_done = max((job.done for job in probe.jobs), default=timed.started + timed.seconds)
    span = max(last_done, timed.started + timed.seconds) - timed.started
    loop_kept_up = _loop_kept_up(lags, clock.step_s)
    return {
        "timed": True,
        "speed": timed.speed,
        "load_wait": checked_describe(clock.load_wait),
        "step_seconds": clock.step_s,
        "trace_seconds": timed.trace_seconds,
        "steps": timed.steps,
        "hit_ratio_by_tier": by_tier,
        # Blocks PENDING when their request stopped waiting: misses for it.
        "late_blocks": timed.late_blocks,
        "waited_requests": timed.waited_requests,
        "late_promotions": None,  # the untimed replay's figure; see late_blocks
        "dropped_cascade_blocks": sum(t.dropped_blocks for t in tiers),
        "promotion_latency_s": latency_summary(timed.promotion_latencies),
        "admission_lag_s": latency_summary(lags),
        # The engine loop itself kept the trace's pace: 99% of requests admitted within ten
        # steps of their arrival (a loop slower than the trace says nothing about tiers).
        "engine_keeps_up": loop_kept_up,
        "tiers": {
            t.name: tier_throughput(
                t.name,
                probe.jobs,
                t,
                block_bytes,
                timed.trace_seconds,
                timed.speed,
                span,
                loop_kept_up,
            )
            for t in tiers
        },
    }


def _loop_kept_up(lags: list[float], step_s: float) -> bool:
    if not lags:
        return True
    p99 = latency_summary(lags)["p99"]
    return p99 is not None and p99 <= max(10 * step_s, 0.1)


def _shutdown_after_error(manager: Any) -> None:
    """Shut down while an earlier error propagates: that first error is the one reported, so a
    second one from ``shutdown`` (often the same broken hook plugin again) is only logged."""
    try:
        manager.shutdown()
    except Exception as exc:
        logger.warning("also while shutting down after that error: %s: %s", type(exc).__name__, exc)
