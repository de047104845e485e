"""Replaying a request trace through a manager: the request flow of a serving engine.

Per request: ``lookup`` in prefix order until the first non-HIT, ``prepare_load`` /
``complete_load`` of the hits, ``touch``, ``prepare_store`` / ``complete_store`` of the rest,
``on_request_finished``. The loop is tight on purpose: benchmarks time it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from .keys import OffloadKey
from .lookup import LookupResult
from .manager import CPUOffloadingManager
from .request import ReqContext

__all__ = ["ReplayResult", "replay"]


@dataclass(frozen=True)
class ReplayResult:
    """What a replay measured: prefix-hit blocks over all blocks, and how fast."""

    requests: int
    blocks: int
    hit_blocks: int
    stored_blocks: int
    rejected_stores: int
    seconds: float

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def blocks_per_second(self) -> float:
        return self.blocks / self.seconds if self.seconds else 0.0


def replay(
    manager: CPUOffloadingManager,
    requests: Iterable[tuple[ReqContext, list[OffloadKey]]],
) -> ReplayResult:
    """Run every request through ``manager``; see the module docstring for the flow."""
    hit_total = blocks = stored = rejected = count = 0
    HIT = LookupResult.HIT
    lookup = manager.lookup
    start = time.perf_counter()
    for ctx, keys in requests:
        manager.on_new_request(ctx)
        hits = 0
        for key in keys:
            if lookup(key, ctx) is not HIT:
                break
            hits += 1
        if hits:
            hit_keys = keys[:hits]
            manager.prepare_load(hit_keys, ctx)
            manager.complete_load(hit_keys, ctx)
            manager.touch(hit_keys, ctx)
        if hits < len(keys):
            out = manager.prepare_store(keys[hits:], ctx)
            if out is None:
                rejected += 1
            elif out.keys_to_store:
                manager.complete_store(out.keys_to_store, ctx)
                stored += len(out.keys_to_store)
        manager.on_request_finished(ctx)
        hit_total += hits
        blocks += len(keys)
        count += 1
    return ReplayResult(count, blocks, hit_total, stored, rejected, time.perf_counter() - start)
