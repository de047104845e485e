"""The tiered manager keeps the CPU manager's contract: one ordered event log for the whole
stack, ``prepare_store(..., protected=...)``, the same interface."""

from __future__ import annotations

import pytest
from _tiers import RecordingTier, expected_rows, key
from kv_offload import (
    CPUOffloadingManager,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
    build_manager,
)
from kv_offload.tiering import OffloadingConfig

BLOCK = 64


def keys(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def tiered(num_blocks: int, *names: str, enable_events: bool = True) -> TieringOffloadingManager:
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK, enable_events=enable_events)
    assert primary.kv_buffer is not None
    config = OffloadingConfig(num_blocks, BLOCK)
    tiers = [RecordingTier(config, primary.kv_buffer.view, name) for name in names]
    return TieringOffloadingManager(primary, tiers, drain_timeout=5.0)


def store(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext) -> None:
    out = m.prepare_store(keys(*ids), ctx)
    assert out is not None
    m.kv_buffer.write_blocks(out.store_spec.block_ids, expected_rows(out.keys_to_store, BLOCK))
    m.complete_store(out.keys_to_store, ctx)


def test_events_come_out_in_the_order_they_happened() -> None:
    """CPU store of 0, its cascade, CPU evictions and the next store interleave in time; the
    log must keep that order (it used to put every tier event first)."""
    m = tiered(2, "tierA")
    ctx = ReqContext("r")
    store(m, [0, 1], ctx)
    m.on_schedule_end()  # the cascade of 0 and 1 lands in tierA
    store(m, [2], ctx)  # evicts 0 from the CPU tier, then stores 2
    m.on_schedule_end()
    assert m.take_events() == [
        OffloadingEvent(keys(0, 1), "CPU", removed=False),
        OffloadingEvent(keys(0, 1), "tierA", removed=False),
        OffloadingEvent(keys(0), "CPU", removed=True),
        OffloadingEvent(keys(2), "CPU", removed=False),
        OffloadingEvent(keys(2), "tierA", removed=False),
    ]
    assert m.take_events() == []
    m.shutdown()


def test_events_of_two_tiers_follow_their_cpu_store() -> None:
    m = tiered(8, "tierA", "tierB")
    ctx = ReqContext("r")
    store(m, [0], ctx)
    m.on_schedule_end()
    store(m, [1], ctx)
    m.on_schedule_end()
    media = [(event.medium, event.keys) for event in m.take_events()]
    assert media == [
        ("CPU", keys(0)),
        ("tierA", keys(0)),
        ("tierB", keys(0)),
        ("CPU", keys(1)),
        ("tierA", keys(1)),
        ("tierB", keys(1)),
    ]
    m.shutdown()


def test_no_events_when_disabled() -> None:
    m = tiered(4, "tierA", enable_events=False)
    store(m, [0], ReqContext("r"))
    m.on_schedule_end()
    assert m.take_events() == []
    m.shutdown()


def test_prepare_store_protected_keeps_blocks_from_eviction() -> None:
    m = tiered(2, "tierA")
    ctx = ReqContext("r")
    store(m, [0], ctx)
    store(m, [1], ctx)
    m.on_schedule_end()
    out = m.prepare_store(keys(2), ctx, protected=keys(0))
    assert out is not None
    assert out.evicted_keys == keys(1)  # 0 is older, but protected
    m.complete_store(out.keys_to_store, ctx)
    assert m.prepare_store(keys(3), ctx, protected=keys(0, 2)) is None  # nothing evictable
    assert m.primary.block_id(key(0)) is not None
    m.shutdown()


def test_prepare_store_protected_retries_after_collecting_cascades() -> None:
    """Blocks pinned by finished cascades are released by the retry; ``protected`` still
    holds on the retry."""
    m = tiered(2, "tierA")
    ctx = ReqContext("r")
    store(m, [0, 1], ctx)  # both pinned by their cascade until it is collected
    out = m.prepare_store(keys(2), ctx, protected=keys(0))
    assert out is not None
    assert out.evicted_keys == keys(1)
    m.complete_store(out.keys_to_store, ctx)
    m.shutdown()


@pytest.mark.parametrize("with_tiers", [False, True])
def test_build_manager_returns_the_interface(with_tiers: bool) -> None:
    config: dict[str, object] = {"num_blocks": 4, "block_size_bytes": BLOCK}
    if with_tiers:
        config["tiers"] = [{"type": "example"}]
    m = build_manager(config)
    assert isinstance(m, OffloadingManager)
    assert m.cpu_stats().capacity == 4
    assert [t.name for t in m.tier_stats()] == (["example"] if with_tiers else [])
    assert m.has_pending_work() is False  # part of the interface: the CLI asks either manager
    m.shutdown()
