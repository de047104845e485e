"""What ``replay`` and ``compare`` share: reading the trace, replaying it through a freshly
built manager and reducing the outcome to the report both commands print."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ..base import OffloadingManager
from ..build import build_manager
from ..config import StackConfig
from ..errors import KVOffloadError
from ..replay import ReplayResult, replay
from ..trace import read_trace
from ..types import ReqContext

__all__ = ["Trace", "run"]

logger = logging.getLogger("kv_offload.cli")


class Trace:
    """A trace's requests as the replay takes them, and what was left out to get them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.block_tokens = None if args.keep_partial_blocks else args.block_tokens
        records = list(read_trace(args.trace, args.limit, block_tokens=self.block_tokens))
        self.requests = [(ReqContext(r.req_id), r.keys) for r in records]
        self.partial_blocks = sum(r.partial_blocks for r in records)

    def describe(self) -> dict[str, Any]:
        return {"block_tokens": self.block_tokens, "partial_blocks_left_out": self.partial_blocks}

    def note(self) -> str:
        if self.block_tokens is None:
            return "partial last blocks included (--keep-partial-blocks)"
        return (
            f"full {self.block_tokens}-token blocks only: {self.partial_blocks} partial last "
            f"blocks neither looked up nor stored (--keep-partial-blocks to include them)"
        )


def _progress(total: int, enabled: bool | None, label: str) -> Any:
    """A progress bar on stderr; ``enabled=None`` shows it only when stderr is a terminal."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="blk",
        unit_scale=True,
        desc=label,
        disable=None if enabled is None else not enabled,  # None: only on a terminal
        file=sys.stderr,
        leave=False,
    )


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
        "rejected_stores": result.rejected_stores,
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
) -> dict[str, Any]:
    """Build ``stack``, replay ``requests`` through it (real bytes when it has a KV buffer),
    shut it down and return the report. A tier that never reported its jobs marks the report
    ``incomplete`` instead of failing it: the measurements stand."""
    manager = build_manager(stack)
    total = sum(len(keys) for _, keys in requests)
    try:
        with _progress(total, show, label) as bar:
            result = replay(
                manager, requests, data_plane=manager.kv_buffer is not None, progress=bar.update
            )
    except BaseException:
        _shutdown_after_error(manager)
        raise
    incomplete = None
    drain = getattr(manager, "drain", None)  # a tiered stack: wait for every tier job
    try:
        if drain is not None:
            drain()
    except KVOffloadError as exc:
        if not manager.has_pending_work():
            _shutdown_after_error(manager)
            raise
        # A tier never reported its jobs: the measurements stand, marked incomplete.
        incomplete = str(exc)
    report = _report(stack, manager, result)  # after the drain: every reported job counted
    try:
        manager.shutdown()
    except KVOffloadError as exc:
        if incomplete is None and not manager.has_pending_work():
            raise
        incomplete = incomplete or str(exc)
    if incomplete is not None:
        report["incomplete"] = incomplete
    return report


def _shutdown_after_error(manager: Any) -> None:
    """Shut down while an earlier error propagates: that first error is the one reported, so a
    second one from ``shutdown`` (often the same broken hook plugin again) is only logged."""
    try:
        manager.shutdown()
    except Exception as exc:
        logger.warning("also while shutting down after that error: %s: %s", type(exc).__name__, exc)
