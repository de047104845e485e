"""Driving a tiered stack the way an engine does: store blocks, ask until the answer is final.

``store`` writes key-derived bytes (``_tiers.block_bytes``) so any later read can be checked
without remembering what was written; ``resolve`` asks ``lookup`` once per scheduler step
(``on_schedule_end`` in between) until no key is ``PENDING``, and gives up after a deadline:
a key that stays ``PENDING`` is a hung request and fails the test.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import kv_offload
import numpy as np
from _tiers import expected_rows
from kv_offload import LookupResult, OffloadKey, ReqContext, TieringOffloadingManager

BLOCK = 16 * 1024


def redis_stack(
    url: str, *, num_blocks: int = 32, policy: str = "lru", block: int = BLOCK, **tier: Any
) -> TieringOffloadingManager:
    config = {
        "num_blocks": num_blocks,
        "block_size_bytes": block,
        "policy": policy,
        "tiers": [{"type": "redis", "url": url, **tier}],
    }
    manager = kv_offload.build_manager(config)
    assert isinstance(manager, TieringOffloadingManager)
    return manager


def store(manager: TieringOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
    """Store ``keys`` (all new) with their key-derived bytes, as the engine's workers would."""
    out = manager.prepare_store(keys, ctx)
    assert out is not None and list(out.keys_to_store) == list(keys), "no room to store"
    manager.kv_buffer.write_blocks(
        out.store_spec.block_ids, expected_rows(keys, manager.kv_buffer.block_size_bytes)
    )
    manager.complete_store(keys, ctx)


def resolve(
    manager: TieringOffloadingManager,
    keys: Sequence[OffloadKey],
    ctx: ReqContext,
    timeout: float = 20.0,
) -> list[LookupResult]:
    """Each key's final answer (``HIT`` or ``MISS``), one lookup round per step."""
    deadline = time.monotonic() + timeout
    while True:
        answers = [manager.lookup(k, ctx) for k in keys]
        if LookupResult.PENDING not in answers:
            return answers
        if time.monotonic() > deadline:
            pending = answers.count(LookupResult.PENDING)
            raise AssertionError(f"{pending} of {len(keys)} lookups still PENDING: hung")
        manager.on_schedule_end()
        time.sleep(0.002)


def load_and_check(
    manager: TieringOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext
) -> None:
    """``keys`` are HITs: load them and compare their bytes with what was stored."""
    spec = manager.prepare_load(keys, ctx)
    rows = manager.kv_buffer.read_blocks(spec.block_ids)
    manager.complete_load(keys, ctx)
    expected = expected_rows(keys, manager.kv_buffer.block_size_bytes)
    assert np.array_equal(rows, expected), "bytes differ from what was stored"


def assert_quiet(manager: TieringOffloadingManager) -> None:
    """No job in flight, no pinned or pending CPU block: nothing leaked."""
    manager.drain(30.0)
    stats = manager.get_stats()
    assert stats.jobs_in_flight == 0 and stats.promotions_queued == 0
    assert stats.cpu.pinned_blocks == 0, stats.cpu
    assert stats.cpu.pending_blocks == 0, stats.cpu
