"""vLLM 0.33's ``tests/v1/kv_offload/cpu/test_manager.py`` scenarios, ported to our API.

A user moving from vLLM asserts slot ids, events and usage figures the way vLLM's own tests
do; these tests replay those scenarios through :class:`~kv_offload.CPUOffloadingManager` so a
difference in behaviour shows up here. Where our API is stricter (``complete_store`` takes
exactly the keys ``prepare_store`` returned; vLLM ignores the others), the port passes those
keys. Our own edge cases of the same features follow each port.
"""

from __future__ import annotations

import pytest
from _cpu_helpers import CTX, HIT, MISS, PENDING, check_occupancy, installed_policies, k
from kv_offload import (
    CPUOffloadingManager,
    OffloadingEvent,
    PrepareStoreOutput,
    TieringOffloadingManager,
    build_manager,
)
from kv_offload.types import SizeHistogram


def ks(*ids: int) -> list[bytes]:
    return [k(i) for i in ids]


def expect_store(
    out: PrepareStoreOutput | None, to_store: list[int], slots: list[int], evicted: list[int]
) -> None:
    assert out is not None
    assert out.keys_to_store == ks(*to_store)
    assert out.store_spec.block_ids.tolist() == slots
    assert out.evicted_keys == ks(*evicted)


def events_of(manager: CPUOffloadingManager) -> list[tuple[set[bytes], bool, bool]]:
    out = []
    for event in manager.take_events():
        assert event.medium == "CPU"
        out.append((set(event.keys), event.removed, event.metadata_only))
    return out


def stored(*ids: int) -> tuple[set[bytes], bool, bool]:
    return set(ks(*ids)), False, False


def evicted(*ids: int) -> tuple[set[bytes], bool, bool]:
    return set(ks(*ids)), True, False


def failed(*ids: int) -> tuple[set[bytes], bool, bool]:
    return set(ks(*ids)), True, True


@pytest.fixture(params=["lru", "arc"])
def policy(request: pytest.FixtureRequest) -> str:
    if request.param not in installed_policies():
        pytest.skip(f"policy plugin {request.param!r} is not installed")
    return str(request.param)


# -- vLLM's test_cpu_manager: the LRU walk-through, slot ids included --------------------------


def test_cpu_manager_lru_walkthrough() -> None:
    m = CPUOffloadingManager(4, cache_policy="lru", enable_events=True)
    expect_store(m.prepare_store(ks(1, 2), CTX), [1, 2], [0, 1], [])
    assert [m.lookup(key, CTX) for key in ks(1, 2)] == [PENDING, PENDING]
    assert events_of(m) == []
    m.complete_store(ks(1, 2), CTX)
    assert events_of(m) == [stored(1, 2)]
    assert [m.lookup(key, CTX) for key in ks(1, 2, 3)] == [HIT, HIT, MISS]

    # Two fresh slots, then the one key 1 freed.
    expect_store(m.prepare_store(ks(2, 3, 4, 5), CTX), [3, 4, 5], [2, 3, 0], [1])
    assert events_of(m) == [evicted(1)]
    assert m.prepare_store(ks(1, 6), CTX) is None  # 3 pending, only key 2 evictable
    m.complete_store(ks(3, 4, 5), CTX)
    assert [m.lookup(key, CTX) for key in ks(1, 2, 3, 4, 5, 0)] == [MISS, HIT, HIT, HIT, HIT, MISS]

    assert m.prepare_load(ks(2, 3), CTX).block_ids.tolist() == [1, 2]
    assert m.prepare_store(ks(6, 7, 8), CTX) is None  # 2 and 3 are being loaded
    m.complete_load(ks(2, 3), CTX)

    # Slots 1, 2, 3 are freed in eviction order and handed out last-freed first.
    expect_store(m.prepare_store(ks(6, 7, 8), CTX), [6, 7, 8], [3, 2, 1], [2, 3, 4])
    m.complete_store(ks(6, 7, 8), CTX)
    m.touch(ks(5, 6, 7), CTX)
    expect_store(m.prepare_store(ks(9), CTX), [9], [1], [8])
    m.complete_store(ks(9), CTX, success=False)
    assert [m.lookup(key, CTX) for key in ks(7, 9)] == [HIT, MISS]
    assert events_of(m) == [
        stored(3, 4, 5),
        evicted(2, 3, 4),
        stored(6, 7, 8),
        evicted(8),
        failed(9),  # vLLM's metadata_only removal
    ]
    check_occupancy(m)


def test_already_stored_block_not_evicted_during_prepare_store(policy: str) -> None:
    """vLLM's regression test: a key of the call that is stored already is not a victim."""
    m = CPUOffloadingManager(4, cache_policy=policy, enable_events=True)
    m.prepare_store(ks(1, 2), CTX)
    m.complete_store(ks(1, 2), CTX)
    m.touch(ks(1), CTX)  # key 2 is now the least recently used
    expect_store(m.prepare_store(ks(2, 3, 4, 5), CTX), [3, 4, 5], [2, 3, 0], [1])
    m.complete_store(ks(3, 4, 5), CTX)
    assert m.lookup(k(2), CTX) is HIT


def test_arc_touch_ordering_reuses_the_evicted_slot() -> None:
    """vLLM's TestARCPolicy.test_touch_ordering: the T1 block goes, its slot is reused."""
    if "arc" not in installed_policies():
        pytest.skip("arc is not installed")
    m = CPUOffloadingManager(4, cache_policy="arc")
    m.prepare_store(ks(1, 2, 3, 4), CTX)
    m.complete_store(ks(1, 2, 3, 4), CTX)
    m.touch(ks(3, 4), CTX)
    m.touch(ks(1, 3, 4), CTX)  # T1 = {2}
    expect_store(m.prepare_store(ks(5), CTX), [5], [1], [2])


def test_prepare_load_preserves_key_order(policy: str) -> None:
    m = CPUOffloadingManager(4, cache_policy=policy)
    out = m.prepare_store(ks(0, 1, 2), CTX)
    assert out is not None
    slot = dict(zip(out.keys_to_store, out.store_spec.block_ids.tolist()))
    m.complete_store(ks(0, 1, 2), CTX)
    for order in ([0, 1, 2], [1, 2, 0]):
        assert m.prepare_load(ks(*order), CTX).block_ids.tolist() == [slot[k(i)] for i in order]
        m.complete_load(ks(0, 1, 2), CTX)


# -- freed slots: last freed, first handed out (our cases) ------------------------------------


def test_failed_store_slots_come_back_last_freed_first(policy: str) -> None:
    m = CPUOffloadingManager(6, cache_policy=policy)
    expect_store(m.prepare_store(ks(0, 1, 2, 3), CTX), [0, 1, 2, 3], [0, 1, 2, 3], [])
    m.complete_store(ks(1, 3), CTX, success=False)  # free list: 1, 3
    m.complete_store(ks(0), CTX, success=False)  # free list: 1, 3, 0
    # Fresh slots 4 and 5 first, then the free list popped: 0, 3, 1.
    expect_store(
        m.prepare_store(ks(10, 11, 12, 13, 14), CTX), [10, 11, 12, 13, 14], [4, 5, 0, 3, 1], []
    )
    check_occupancy(m)


def test_reset_cache_starts_from_slot_zero_again(policy: str) -> None:
    m = CPUOffloadingManager(3, cache_policy=policy)
    m.prepare_store(ks(0, 1, 2), CTX)
    m.complete_store(ks(0, 1, 2), CTX, success=False)
    m.reset_cache()
    expect_store(m.prepare_store(ks(5, 6), CTX), [5, 6], [0, 1], [])


# -- usage figures and the allocation-size histogram ------------------------------------------


def test_cpu_manager_reports_cache_usage_gauge() -> None:
    """vLLM's usage gauge (pending or pinned over capacity), plus read and write usage."""
    m = CPUOffloadingManager(4)
    stats = m.get_stats()
    assert (stats.usage, stats.read_usage, stats.write_usage) == (0.0, 0.0, 0.0)
    m.prepare_store(ks(1, 2), CTX)
    assert m.get_stats().usage == pytest.approx(0.5)
    m.prepare_store(ks(3, 4), CTX)
    stats = m.get_stats()
    assert (stats.usage, stats.write_usage, stats.read_usage) == (1.0, 1.0, 0.0)
    m.complete_store(ks(1, 2, 3), CTX)
    m.prepare_load(ks(1, 2), CTX)
    m.prepare_load(ks(1), CTX)  # a second reader of key 1 does not count twice
    stats = m.get_stats()
    assert (stats.usage, stats.write_usage, stats.read_usage) == (0.75, 0.25, 0.5)
    assert stats.read_usage == max(stats.usage - stats.write_usage, 0.0)  # vLLM's formula
    data = stats.as_dict()
    assert (data["usage"], data["read_usage"], data["write_usage"]) == (0.75, 0.5, 0.25)


def test_allocation_size_histogram_counts_each_prepare_store_that_asks_for_slots() -> None:
    m = CPUOffloadingManager(8)
    assert m.get_stats().allocation_sizes == SizeHistogram()
    m.prepare_store(ks(1), CTX)  # 1 slot
    m.prepare_store(ks(1, 2, 3, 4, 5), CTX)  # 4 slots: key 1 is there already
    m.prepare_store(ks(1, 2), CTX)  # nothing to allocate: not counted
    m.complete_store(ks(1, 2, 3, 4, 5), CTX)
    m.prepare_load(ks(1, 2, 3, 4, 5), CTX)
    assert m.prepare_store([k(i) for i in range(10, 30)], CTX) is None  # 20 asked, refused
    sizes = m.get_stats().allocation_sizes
    assert sizes.bounds == (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)  # vLLM's
    assert sizes.counts[:4] == (1, 1, 0, 1) and sum(sizes.counts[4:]) == 0
    assert (sizes.count, sizes.total) == (3, 25)
    assert sizes.cumulative()[:3] == [(1, 1), (4, 2), (16, 2)]
    assert sizes.cumulative()[-1] == (float("inf"), 3)
    m.reset_cache()  # counters restart
    assert m.get_stats().allocation_sizes == SizeHistogram()


def test_allocation_above_the_last_bound_lands_in_the_inf_bucket() -> None:
    m = CPUOffloadingManager(300_000)
    m.prepare_store([k(i) for i in range(262_145)], CTX)
    sizes = m.get_stats().allocation_sizes
    assert sizes.counts[-1] == 1 and sizes.cumulative()[-2] == (262144, 0)


# -- failed stores in the event stream --------------------------------------------------------


def test_failed_store_is_a_metadata_only_removal(policy: str) -> None:
    m = CPUOffloadingManager(4, cache_policy=policy, enable_events=True)
    m.prepare_store(ks(1, 2), CTX)
    m.complete_store(ks(1, 2), CTX, success=False)
    assert m.take_events() == [OffloadingEvent(ks(1, 2), "CPU", True, True)]
    assert m.take_events() == []


def test_metadata_only_removal_dropped_for_keys_stored_again(policy: str) -> None:
    m = CPUOffloadingManager(4, cache_policy=policy, enable_events=True)
    m.prepare_store(ks(1, 2, 3), CTX)
    m.complete_store(ks(1, 2, 3), CTX, success=False)
    m.prepare_store(ks(1), CTX)
    m.complete_store(ks(1), CTX)  # key 1 stored again
    m.prepare_store(ks(2), CTX)  # key 2's retry is in flight: it owns the key now
    assert events_of(m) == [failed(3), stored(1)]
    m.complete_store(ks(2), CTX, success=False)  # the retry fails too: a new cleanup
    assert events_of(m) == [failed(2)]


def test_metadata_only_removal_dropped_when_every_key_is_back(policy: str) -> None:
    m = CPUOffloadingManager(4, cache_policy=policy, enable_events=True)
    m.prepare_store(ks(1), CTX)
    m.complete_store(ks(1), CTX, success=False)
    m.prepare_store(ks(1), CTX)
    m.complete_store(ks(1), CTX)
    assert events_of(m) == [stored(1)]


def test_metadata_only_removal_kept_when_the_retry_left_again() -> None:
    """Stored again, then evicted before the events were taken: the key is absent, so the
    cleanup stays (in order: it precedes the store and the eviction)."""
    m = CPUOffloadingManager(1, enable_events=True)
    m.prepare_store(ks(1), CTX)
    m.complete_store(ks(1), CTX, success=False)
    m.prepare_store(ks(1), CTX)
    m.complete_store(ks(1), CTX)
    m.prepare_store(ks(2), CTX)  # evicts key 1
    assert events_of(m) == [failed(1), stored(1), evicted(1)]


def test_metadata_only_removals_in_a_tiered_stack() -> None:
    """The stack's one event log: a failed CPU store is a metadata-only CPU removal, dropped
    when the retry landed; the retry's CPU store precedes its cascade to the tier."""
    m = build_manager(
        {
            "num_blocks": 4,
            "block_size_bytes": 64,
            "enable_events": True,
            "tiers": [{"type": "example", "capacity_blocks": 8}],
            "hooks": {"autoload": False},
        }
    )
    assert isinstance(m, TieringOffloadingManager)
    try:
        m.prepare_store(ks(1, 2), CTX)
        m.complete_store(ks(1, 2), CTX, success=False)
        out = m.prepare_store(ks(1), CTX)
        assert out is not None
        m.kv_buffer.write_blocks(out.store_spec.block_ids, bytes(64))
        m.complete_store(ks(1), CTX)
        m.on_schedule_end()  # the cascade to the tier reports
        got = [(e.keys, e.medium, e.removed, e.metadata_only) for e in m.take_events()]
        assert got == [
            (ks(2), "CPU", True, True),
            (ks(1), "CPU", False, False),
            (ks(1), "example", False, False),
        ]
    finally:
        m.shutdown()
