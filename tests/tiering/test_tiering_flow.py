"""TieringOffloadingManager end to end, with real bytes in the CPU buffer and in the tiers.

The scheduler flow of docs/architecture.md: lookups in prefix order, ``prepare_load`` of the HITs
(the worker then reads the CPU rows), ``prepare_store`` of the rest (the worker writes them),
``complete_store`` (which cascades to every secondary tier) and ``on_schedule_end()`` at the
end of each step (which submits promotions and collects finished tier jobs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _tiers import RecordingTier, block_bytes, expected_rows, faulty_tier, key
from kv_offload import (
    ConfigError,
    CPUOffloadingManager,
    LookupResult,
    ManagerError,
    OffloadKey,
    ReqContext,
    TieringOffloadingManager,
)
from kv_offload.errors import KeyStateError
from kv_offload.plugins import hookimpl
from kv_offload.tiering import (
    JobDirection,
    JobMetadata,
    OffloadingConfig,
    SecondaryTierFactory,
    TierEntry,
)
from kv_offload_example_tier import ExampleSecondaryTierManager
from kv_offload_faulty_tier import InjectedFault

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.PENDING
BLOCK = 4096  # bytes per block


def keys(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def rand_rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, BLOCK), dtype=np.uint8)


def cpu_tier(
    num_blocks: int, **kw: Any
) -> tuple[CPUOffloadingManager, OffloadingConfig, memoryview]:
    """A CPU tier of ``num_blocks`` with a KV buffer, the tiers' config, and the buffer's view
    the tiers copy through."""
    primary = CPUOffloadingManager(num_blocks, block_size_bytes=BLOCK, **kw)
    assert primary.kv_buffer is not None
    return primary, OffloadingConfig(num_blocks, BLOCK), primary.kv_buffer.view


def stack(num_blocks: int, *tiers: ExampleSecondaryTierManager | None, **kw: object):
    """``(manager, tiers)``: a CPU tier of ``num_blocks`` with a KV buffer, and the tiers
    built over its view (``None`` entries become RecordingTiers named tier0, tier1...)."""
    primary, config, view = cpu_tier(num_blocks, **kw)
    built = [
        t if t is not None else RecordingTier(config, view, f"tier{i}") for i, t in enumerate(tiers)
    ]
    return TieringOffloadingManager(primary, built, drain_timeout=5.0), built


def store(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext, rows=None) -> np.ndarray:
    """The engine's store of ``ids``: prepare, write the bytes into the CPU slots, complete."""
    out = m.prepare_store(keys(*ids), ctx)
    assert out is not None, f"prepare_store({ids}) could not evict"
    assert out.keys_to_store == keys(*ids)
    data = expected_rows(out.keys_to_store, BLOCK) if rows is None else rows
    m.kv_buffer.write_blocks(out.store_spec.block_ids, data)
    m.complete_store(out.keys_to_store, ctx)
    return data


def store_step(m: TieringOffloadingManager, *batches: list[int]) -> None:
    """Store each batch in its own scheduler step (so cascades finish and unpin)."""
    ctx = ReqContext("filler")
    for ids in batches:
        store(m, ids, ctx)
        m.on_schedule_end()


def load(m: TieringOffloadingManager, ids: list[int], ctx: ReqContext) -> np.ndarray:
    """The engine's load: pin, read the rows (CPU -> GPU), unpin."""
    spec = m.prepare_load(keys(*ids), ctx)
    rows = m.kv_buffer.read_blocks(spec.block_ids)
    m.complete_load(keys(*ids), ctx)
    return rows


def assert_clean(m: TieringOffloadingManager) -> None:
    stats = m.get_stats()
    assert stats.jobs_in_flight == 0
    assert stats.promotions_queued == 0
    assert stats.cpu.pinned_blocks == 0
    assert stats.cpu.pending_blocks == 0
    assert stats.cpu.free_blocks + stats.cpu.resident_blocks == stats.cpu.capacity
    assert not m.has_pending_work()


# -- the full round trip --------------------------------------------------------------------


def test_round_trip_through_example_tier() -> None:
    """Random bytes -> CPU -> example tier; evicted from CPU; promoted back; identical."""
    m, (tier,) = stack(4, None)
    a, b = ReqContext("a"), ReqContext("b")
    m.on_new_request(a)
    original = store(m, [1, 2, 3], a, rows=rand_rows(3, seed=1))
    slots_before = [m.primary.block_id(k) for k in keys(1, 2, 3)]
    # The cascade: one store job with all three blocks, pinned in the CPU tier until reported.
    assert [(j.direction, j.keys) for j in tier.jobs] == [(JobDirection.STORE, keys(1, 2, 3))]
    assert m.get_stats().jobs_in_flight == 1 and m.get_stats().cpu.pinned_blocks == 3
    m.on_request_finished(a)
    m.on_schedule_end()
    assert m.get_stats().cpu.pinned_blocks == 0 and len(tier) == 3
    # Later traffic evicts them from the CPU tier; they live on in the tier.
    m.on_new_request(b)
    store(m, [10, 11, 12, 13], b)
    m.on_request_finished(b)
    m.on_schedule_end()
    assert all(m.primary.ref_count(k) is None for k in keys(1, 2, 3))
    assert m.get_stats().cpu.evictions == 3
    # A request with the same prefix: the tier has them, so PENDING until the step ends.
    c = ReqContext("c")
    m.on_new_request(c)
    assert [m.lookup(k, c) for k in keys(1, 2, 3)] == [PENDING] * 3
    assert m.get_stats().promotions_queued == 3 and tier.loads() == []
    assert m.lookup(key(1), c) is PENDING  # asking again promotes nothing twice
    m.on_schedule_end()
    (promotion,) = tier.loads()
    assert promotion.keys == keys(1, 2, 3) and promotion.req_id == "c"
    assert [m.lookup(k, c) for k in keys(1, 2, 3)] == [HIT] * 3
    spec = m.prepare_load(keys(1, 2, 3), c)
    assert spec.block_ids.tolist() == promotion.block_ids
    np.testing.assert_array_equal(m.kv_buffer.read_blocks(spec.block_ids), original)
    m.complete_load(keys(1, 2, 3), c)
    m.on_request_finished(c)
    assert sorted(promotion.block_ids) != sorted(slots_before)  # other slots, same bytes
    stats = m.get_stats()
    assert stats.tiers[0].promoted_blocks == 3 and stats.tiers[0].bytes_read == 3 * BLOCK
    assert stats.tiers[0].cascaded_blocks == 7 and stats.tiers[0].bytes_written == 7 * BLOCK
    assert stats.cpu.loaded_blocks == 3
    assert_clean(m)


def test_round_trip_through_two_tiers(register_tier: Callable[..., None]) -> None:
    """Two example tiers: the first (small) loses old blocks, the second keeps them. The
    second is a runtime-registered tier type built by the factory."""
    register_tier("example-big", "kv_offload_example_tier", "ExampleSecondaryTierManager")
    primary, config, view = cpu_tier(4, enable_events=True)
    small = SecondaryTierFactory.create_secondary_tier(
        {"type": "example", "capacity_blocks": 8}, view, config
    )
    big = SecondaryTierFactory.create_secondary_tier({"type": "example-big"}, view, config)
    assert (small.tier_type, big.tier_type) == ("example", "example-big")
    assert type(big) is ExampleSecondaryTierManager
    m = TieringOffloadingManager(primary, [small, big])
    ctx = ReqContext("r")
    originals = {}
    for first in range(0, 16, 4):  # 16 blocks through a 4-block CPU tier and an 8-block tier
        ids = list(range(first, first + 4))
        originals.update(zip(ids, store(m, ids, ctx, rows=rand_rows(4, seed=first))))
        m.on_schedule_end()
    events = m.take_events()
    assert {e.medium for e in events if not e.removed} == {"CPU", "example", "example-big"}
    assert sum(len(e.keys) for e in events if e.medium == "example-big") == 16
    assert len(small) == 8 and len(big) == 16
    # 12..15 are in the CPU tier; 8..11 in both tiers; 0..7 only in the big tier.
    lookups = [m.lookup(k, ctx) for k in keys(0, 1, 8, 9)]
    assert lookups == [PENDING] * 4
    stats = m.get_stats()
    assert [t.lookup_hits for t in stats.tiers] == [2, 2]  # the first tier that has a key wins
    m.on_schedule_end()
    assert [m.lookup(k, ctx) for k in keys(0, 1, 8, 9)] == [HIT] * 4
    got = load(m, [0, 1, 8, 9], ctx)
    np.testing.assert_array_equal(got, np.stack([originals[i] for i in (0, 1, 8, 9)]))
    stats = m.get_stats()
    assert [t.promoted_blocks for t in stats.tiers] == [2, 2]
    assert [t.failed_promotions for t in stats.tiers] == [0, 0]
    m.shutdown()
    assert len(small) == len(big) == 0  # the example tier releases its rows on shutdown


def test_two_tiers_subclassed_names() -> None:
    """Two tiers of the same class are told apart by tier_type; one that lost a block (it
    failed) does not stop the other from promoting it next time."""
    primary, config, view = cpu_tier(2)
    first = RecordingTier(config, view, "fast", fail_loads=True)
    second = ExampleSecondaryTierManager(config, view, "slow")
    m = TieringOffloadingManager(primary, [first, second])
    ctx = ReqContext("r")
    original = store(m, [1, 2], ctx, rows=rand_rows(2, seed=2))
    m.on_schedule_end()
    store_step(m, [3, 4])
    assert m.lookup(key(1), ctx) is PENDING
    m.on_schedule_end()  # "fast" fails the promotion
    assert m.primary.ref_count(key(1)) is None
    assert m.get_stats().tiers[0].failed_promotions == 1
    first.shutdown()  # "fast" loses everything; "slow" still has the block
    assert m.lookup(key(1), ctx) is PENDING
    m.on_schedule_end()
    np.testing.assert_array_equal(load(m, [1], ctx), original[:1])
    assert [t.promoted_blocks for t in m.get_stats().tiers] == [0, 1]
    # Two tiers of one type built directly are labelled by position, as a config's are (a
    # stack of its own: a CPU manager serves one tiered manager).
    other = TieringOffloadingManager(
        cpu_tier(2)[0], [second, ExampleSecondaryTierManager(config, view, "slow")]
    )
    assert [entry.name for entry in other.entries] == ["1:slow", "2:slow"]
    named = TierEntry(ExampleSecondaryTierManager(config, view, "example"), name="x")
    with pytest.raises(ConfigError, match="give each"):  # a name an unnamed tier's type gives
        TieringOffloadingManager(primary, [named, ExampleSecondaryTierManager(config, view, "x")])


def test_needs_a_kv_buffer() -> None:
    with pytest.raises(ConfigError, match="block_size_bytes"):
        TieringOffloadingManager(CPUOffloadingManager(4), [])


# -- refused and failed promotions ---------------------------------------------------------------


def test_promotion_refused_when_everything_pinned() -> None:
    m, (tier,) = stack(2, None)
    ctx = ReqContext("r")
    store_step(m, [1, 2], [3, 4])  # 1, 2 evicted to the tier
    spec = m.prepare_load(keys(3, 4), ctx)  # every CPU block pinned
    before = m.get_stats().cpu
    assert m.lookup(key(1), ctx) is MISS  # in the tier, but no slot can be freed
    stats = m.get_stats()
    assert stats.tiers[0].lookup_hits == 1 and stats.tiers[0].refused_promotions == 1
    assert stats.promotions_queued == 0
    assert stats.cpu.resident_blocks == before.resident_blocks == 2
    assert stats.cpu.pending_blocks == 0 and stats.cpu.free_blocks == 0
    m.on_schedule_end()
    assert tier.loads() == []  # nothing was submitted
    np.testing.assert_array_equal(
        m.kv_buffer.read_blocks(spec.block_ids), expected_rows(keys(3, 4), BLOCK)
    )
    m.complete_load(keys(3, 4), ctx)
    # Once something is evictable the same key is promoted.
    assert m.lookup(key(1), ctx) is PENDING
    m.on_schedule_end()
    np.testing.assert_array_equal(load(m, [1], ctx), expected_rows(keys(1), BLOCK))
    assert_clean(m)


def test_promotion_refused_while_everything_pending() -> None:
    """Slots reserved for in-flight promotions are not evictable either."""
    m, _ = stack(2, None)
    ctx = ReqContext("r")
    store_step(m, [1, 2], [3, 4], [5, 6])
    assert [m.lookup(k, ctx) for k in keys(1, 2, 3)] == [PENDING, PENDING, MISS]
    assert m.get_stats().tiers[0].refused_promotions == 1
    m.on_schedule_end()
    np.testing.assert_array_equal(load(m, [1, 2], ctx), expected_rows(keys(1, 2), BLOCK))
    assert_clean(m)


def test_failed_promotion_frees_the_slot() -> None:
    primary, config, view = cpu_tier(3)
    tier = RecordingTier(config, view, "t", fail_loads=True)
    m = TieringOffloadingManager(primary, [tier])
    ctx = ReqContext("r")
    store_step(m, [1], [2, 3, 4])  # 1 evicted to the tier; CPU full
    assert m.get_stats().cpu.free_blocks == 0
    assert m.lookup(key(1), ctx) is PENDING
    stats = m.get_stats()
    assert stats.cpu.pending_blocks == 1 and stats.cpu.evictions == 2  # 1, then 2
    m.on_schedule_end()  # the tier reports failure
    assert m.primary.ref_count(key(1)) is None  # the CPU tier forgot the key
    assert m.primary.block_id(key(1)) is None
    stats = m.get_stats()
    assert stats.tiers[0].failed_promotions == 1 and stats.tiers[0].promoted_blocks == 0
    assert stats.cpu.failed_stores == 1
    assert stats.cpu.free_blocks == 1  # the reserved slot is free again
    with pytest.raises(KeyStateError):
        m.prepare_load(keys(1), ctx)
    assert_clean(m)
    # The freed slot is reusable by the engine, without evicting anything.
    store(m, [9], ctx)
    m.on_schedule_end()
    assert m.get_stats().cpu.evictions == 2
    np.testing.assert_array_equal(load(m, [9], ctx), expected_rows(keys(9), BLOCK))
    assert_clean(m)


def test_promotion_fails_when_tier_lost_the_block_meanwhile() -> None:
    """The example tier drops a block between the lookup that promotes it and the step end
    (a cascade in the same step fills the tier): the load job fails, the key ends as a MISS,
    and nothing leaks."""
    primary, config, view = cpu_tier(2)
    tier = ExampleSecondaryTierManager(config, view, "example", capacity_blocks=3)
    m = TieringOffloadingManager(primary, [tier])
    ctx = ReqContext("r")
    store_step(m, [1], [2, 3])  # CPU: 2, 3; tier: 1, 2, 3
    assert m.lookup(key(1), ctx) is PENDING  # evicts 2 from the CPU tier
    store(m, [4], ctx)  # evicts 3 from CPU; its cascade pushes 1 out of the 3-block tier
    assert tier.lookup(key(1), ctx) is False
    m.on_schedule_end()
    assert m.get_stats().tiers[0].failed_promotions == 1
    assert m.lookup(key(1), ctx) is MISS  # nowhere now
    assert_clean(m)
    np.testing.assert_array_equal(load(m, [4], ctx), expected_rows(keys(4), BLOCK))


def test_example_tier_fails_missing_key_cleanly() -> None:
    m, (tier,) = stack(2, None)
    ctx = ReqContext("r")
    store_step(m, [1, 2], [3, 4])
    assert m.lookup(key(1), ctx) is PENDING
    tier.shutdown()  # the tier loses everything before the promotion is submitted
    m.on_schedule_end()
    assert tier.loads()[0].keys == keys(1)
    assert m.lookup(key(1), ctx) is MISS
    stats = m.get_stats()
    assert stats.tiers[0].failed_promotions == 1
    assert_clean(m)


# -- a lookup's promotion never evicts what an earlier lookup answered HIT ------------------------


def test_promotion_does_not_evict_blocks_answered_hit() -> None:
    m, _ = stack(2, None)
    ctx = ReqContext("r")
    store_step(m, [1, 2], [3, 4])  # 1, 2 only in the tier; 3 is the CPU tier's LRU block
    # Prefix 3, 1: 3 answers HIT, 1 needs a slot. The LRU victim would be 3, which the engine
    # is about to load: the promotion must take 4 instead.
    assert m.lookup(key(3), ctx) is HIT
    assert m.lookup(key(1), ctx) is PENDING
    assert m.primary.ref_count(key(4)) is None
    np.testing.assert_array_equal(load(m, [3], ctx), expected_rows(keys(3), BLOCK))
    m.on_schedule_end()
    np.testing.assert_array_equal(load(m, [1, 3], ctx), expected_rows(keys(1, 3), BLOCK))
    assert_clean(m)


def test_promotion_refused_when_only_hits_are_evictable() -> None:
    m, _ = stack(2, None)
    ctx = ReqContext("r")
    store_step(m, [1, 2], [3, 4])
    assert [m.lookup(k, ctx) for k in keys(3, 4, 1)] == [HIT, HIT, MISS]
    assert m.get_stats().tiers[0].refused_promotions == 1
    np.testing.assert_array_equal(load(m, [3, 4], ctx), expected_rows(keys(3, 4), BLOCK))
    m.on_schedule_end()
    assert m.lookup(key(1), ctx) is MISS  # protected until the request finishes
    m.on_request_finished(ctx)
    other = ReqContext("other")
    assert m.lookup(key(1), other) is PENDING  # evicts 3: not this request's HIT
    m.on_schedule_end()
    np.testing.assert_array_equal(load(m, [1], other), expected_rows(keys(1), BLOCK))
    assert_clean(m)


# -- one promotion job per (tier, request) --------------------------------------------------------


def test_promotions_batched_per_tier_and_request() -> None:
    primary, config, view = cpu_tier(16)
    t0 = RecordingTier(config, view, "t0")
    t1 = RecordingTier(config, view, "t1")
    ctx = ReqContext("w")
    # Blocks 0..5 only in t0, 10..15 only in t1 (each tier given its blocks directly, through
    # the CPU tier before the stack is built: the tiered manager is its only caller then).
    for tier, ids in ((t0, range(6)), (t1, range(10, 16))):
        out = primary.prepare_store(keys(*ids), ctx)
        assert out is not None
        assert primary.kv_buffer is not None
        rows = expected_rows(out.keys_to_store, BLOCK)
        primary.kv_buffer.write_blocks(out.store_spec.block_ids, rows)
        primary.complete_store(out.keys_to_store, ctx)
        slots = primary.pin(out.keys_to_store, ctx)
        tier.submit_store(
            JobMetadata(10_000, out.keys_to_store, np.asarray(slots), JobDirection.STORE, ctx)
        )
        tier.get_finished()
        primary.unpin(out.keys_to_store, ctx)
    primary.reset_cache()
    m = TieringOffloadingManager(primary, [t0, t1])
    t0.jobs.clear()
    t1.jobs.clear()
    a, b, c = ReqContext("a"), ReqContext("b"), ReqContext("c")
    assert [m.lookup(k, a) for k in keys(0, 1, 10, 2)] == [PENDING] * 4
    assert [m.lookup(k, b) for k in keys(3, 11, 12, 4)] == [PENDING] * 4
    assert [m.lookup(k, c) for k in keys(5, 13)] == [PENDING] * 2
    assert t0.jobs == t1.jobs == []  # nothing is submitted before the step ends
    assert m.get_stats().promotions_queued == 10
    m.on_request_finished(c)  # a finishing request's promotions go out right away
    assert [(j.req_id, j.keys) for j in t0.loads() + t1.loads()] == [
        ("c", keys(5)),
        ("c", keys(13)),
    ]
    m.on_schedule_end()
    jobs = {(tier.tier_type, j.req_id): j for tier in (t0, t1) for j in tier.loads()}
    assert sorted(jobs) == [
        ("t0", "a"),
        ("t0", "b"),
        ("t0", "c"),
        ("t1", "a"),
        ("t1", "b"),
        ("t1", "c"),
    ]
    assert jobs["t0", "a"].keys == keys(0, 1, 2)  # in lookup order
    assert jobs["t1", "a"].keys == keys(10)
    assert jobs["t0", "b"].keys == keys(3, 4)
    assert jobs["t1", "b"].keys == keys(11, 12)
    assert len({j.job_id for j in jobs.values()}) == 6
    # Each job's slots are the ones reserved for its keys, and hold the right bytes now.
    for job in jobs.values():
        assert [m.primary.block_id(k) for k in job.keys] == job.block_ids
        np.testing.assert_array_equal(
            m.kv_buffer.read_blocks(job.block_ids), expected_rows(job.keys, BLOCK)
        )
    assert all(m.lookup(k, a) is HIT for k in keys(0, 1, 2, 3, 4, 5, 10, 11, 12, 13))
    assert_clean(m)


def test_cascade_is_one_store_job_per_tier_and_pins_until_reported() -> None:
    primary, config, view = cpu_tier(4)
    slow = faulty_tier(config, view, "slow", delay_polls=3, seed=1)
    fast = RecordingTier(config, view, "fast")
    m = TieringOffloadingManager(primary, [slow, fast])
    ctx = ReqContext("r")
    store(m, [1, 2, 3], ctx)
    assert [j.keys for j in fast.stores()] == [keys(1, 2, 3)]
    assert m.primary.ref_count(key(1)) == 2  # one reader per tier job
    m.on_schedule_end()
    assert m.primary.ref_count(key(1)) in (0, 1)
    # While a cascade is in flight its blocks cannot be evicted.
    for _ in range(10):
        if m.primary.ref_count(key(1)) == 0:
            break
        assert m.primary.num_storable_blocks == 1  # 1, 2, 3 pinned: only the free slot
        m.on_schedule_end()
    assert m.primary.ref_count(key(1)) == 0
    assert slow.lookup(key(1), ctx) is True
    assert_clean(m)


# -- tiers that misbehave -------------------------------------------------------------------------


def test_submit_raising_fails_the_job(caplog: pytest.LogCaptureFixture) -> None:
    primary, config, view = cpu_tier(2)
    bad = faulty_tier(config, view, "bad", raise_rate=1.0)
    good = ExampleSecondaryTierManager(config, view, "good")
    m = TieringOffloadingManager(primary, [bad, good])
    ctx = ReqContext("r")
    with caplog.at_level(logging.ERROR, logger="kv_offload.tiering"):
        store(m, [1, 2], ctx)
    assert "raised from submit_store" in caplog.text
    assert any(r.exc_info and isinstance(r.exc_info[1], InjectedFault) for r in caplog.records)
    assert m.primary.ref_count(key(1)) == 1  # the good tier's pin only
    m.on_schedule_end()
    stats = m.get_stats()
    assert stats.tiers[0].failed_cascades == 2 and stats.tiers[1].cascaded_blocks == 2
    assert bad.lookup(key(1), ctx) is False
    store(m, [3, 4], ctx)
    m.on_schedule_end()
    assert m.lookup(key(1), ctx) is PENDING  # promoted from the good tier
    m.on_schedule_end()
    np.testing.assert_array_equal(load(m, [1], ctx), expected_rows(keys(1), BLOCK))
    assert_clean(m)


def test_late_and_duplicate_reports_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    class ReportsTwice(ExampleSecondaryTierManager):
        def get_finished(self):
            finished = super().get_finished()
            return finished + finished

    primary, config, view = cpu_tier(2)
    tier = ReportsTwice(config, view, "twice")
    m = TieringOffloadingManager(primary, [tier])
    ctx = ReqContext("r")
    with caplog.at_level(logging.WARNING, logger="kv_offload.tiering"):
        store(m, [1, 2], ctx)
        m.on_schedule_end()
    assert "already reported" in caplog.text
    assert m.primary.ref_count(key(1)) == 0  # unpinned exactly once
    assert_clean(m)


# -- reset and shutdown --------------------------------------------------------------------------


def test_reset_cache_drains_tier_jobs_first() -> None:
    primary, config, view = cpu_tier(4)
    tier = faulty_tier(config, view, "slow", delay_polls=4, seed=3)
    m = TieringOffloadingManager(primary, [tier], drain_timeout=5.0)
    ctx = ReqContext("r")
    store_step(m, [1, 2], [3, 4])
    for _ in range(5):  # results come within 4 polls
        m.on_schedule_end()
    store(m, [5, 6], ctx)  # evicts 1, 2; 5, 6 are cascading
    assert m.lookup(key(1), ctx) is PENDING  # evicts 3; the promotion is queued
    assert m.get_stats().promotions_queued == 1 and m.get_stats().jobs_in_flight >= 1
    seen: list[tuple[int, int]] = []

    class SeesTheReset:
        @hookimpl
        def kv_offload_cache_reset(self) -> None:  # the CPU tier was just emptied
            stats = m.get_stats()
            seen.append((stats.jobs_in_flight, stats.promotions_queued))

    plugin = SeesTheReset()
    m.plugin_manager.register(plugin)
    assert m.has_pending_work()
    try:
        m.reset_cache()
    finally:
        m.plugin_manager.unregister(plugin)
    assert seen == [(0, 0)], "the CPU tier was reset while tier jobs were in flight"
    stats = m.get_stats()
    assert stats.cpu.resident_blocks == 0 and stats.cpu.free_blocks == 4
    assert stats.tiers[0].cascaded_blocks == 0  # tier counters restart too
    assert_clean(m)
    assert tier.lookup(key(5), ctx) is True  # the tier keeps its blocks
    assert m.lookup(key(5), ctx) is PENDING
    m.on_schedule_end()
    m.drain()
    np.testing.assert_array_equal(load(m, [5], ctx), expected_rows(keys(5), BLOCK))


def test_shutdown_drains_and_shuts_tiers_down() -> None:
    primary, config, view = cpu_tier(4)
    slow = faulty_tier(config, view, "slow", delay_polls=3, seed=4)
    rec = RecordingTier(config, view, "rec")
    m = TieringOffloadingManager(primary, [slow, rec])
    ctx = ReqContext("r")
    store(m, [1, 2, 3], ctx)
    m.on_request_finished(ctx)
    assert rec.finished_reqs == ["r"]
    m.shutdown()
    assert slow.counters.shutdowns == 1 and rec.shutdown_calls == 1
    assert slow.counters.stored_blocks == 3  # the in-flight cascade finished before shutdown
    assert m.get_stats().jobs_in_flight == 0
    m.shutdown()  # idempotent
    assert slow.counters.shutdowns == 1 and rec.shutdown_calls == 1
    with pytest.raises(ManagerError, match="shut down"):
        m.prepare_store(keys(9), ctx)


def test_shutdown_shuts_tiers_down_even_if_drain_times_out() -> None:
    class NeverReports(ExampleSecondaryTierManager):
        def get_finished(self):
            self._finished.clear()
            return []

    primary, config, view = cpu_tier(2)
    stuck = NeverReports(config, view, "stuck")
    rec = RecordingTier(config, view, "rec")
    m = TieringOffloadingManager(primary, [stuck, rec], drain_timeout=0.05)
    store(m, [1], ReqContext("r"))
    with pytest.raises(ManagerError, match=r"1 tier job.*stuck"):
        m.shutdown()
    assert rec.shutdown_calls == 1


def test_complete_store_of_a_promoting_key_is_rejected() -> None:
    m, _ = stack(2, None)
    ctx = ReqContext("r")
    store_step(m, [1, 2], [3, 4])
    assert m.lookup(key(1), ctx) is PENDING
    out = m.prepare_store(keys(1), ctx)
    assert out is not None and out.keys_to_store == []  # already (being) stored
    with pytest.raises(KeyStateError, match="being promoted"):
        m.complete_store(keys(1), ctx)
    m.on_schedule_end()
    assert block_bytes(key(1), BLOCK) == load(m, [1], ctx).tobytes()
    assert_clean(m)
