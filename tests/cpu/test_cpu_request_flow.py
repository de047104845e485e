"""CPUOffloadingManager: request flow, eviction, events and stats.

Every test runs on each installed policy (``lru`` and ``arc``) and relies only on the
manager's public API: its methods, ``get_stats()``, ``num_free_blocks``,
``num_resident_blocks``, ``ref_count(key)``, ``block_id(key)`` and ``take_events()``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _cpu_helpers import (
    CTX,
    HIT,
    MISS,
    PENDING,
    UNIVERSE,
    ManagerFactory,
    check_occupancy,
    k,
    lookups,
    state_of,
    store,
)
from kv_offload import (
    CPULoadStoreSpec,
    CPUOffloadingManager,
    ManagerError,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
)
from kv_offload.errors import InvalidArgumentError, InvalidKeyError, KeyStateError

# -- request flow ------------------------------------------------------------------------


def test_full_request_flow(make: ManagerFactory) -> None:
    manager = make(8)
    keys = [k(0), k(1), k(2)]
    manager.on_new_request(CTX)

    assert lookups(manager, keys) == [MISS, MISS, MISS]

    out = manager.prepare_store(keys, CTX)
    assert isinstance(out, PrepareStoreOutput)
    assert out.keys_to_store == keys
    assert out.evicted_keys == []
    assert isinstance(out.store_spec, CPULoadStoreSpec)
    store_ids = out.store_spec.block_ids
    assert isinstance(store_ids, np.ndarray) and store_ids.dtype == np.int64
    assert len(store_ids) == len(set(store_ids.tolist())) == 3
    assert all(0 <= b < 8 for b in store_ids.tolist())
    assert [manager.block_id(key) for key in keys] == store_ids.tolist()
    assert [manager.ref_count(key) for key in keys] == [-1, -1, -1]
    assert lookups(manager, keys) == [PENDING] * 3

    manager.complete_store(keys, CTX)
    assert lookups(manager, keys) == [HIT] * 3
    assert [manager.ref_count(key) for key in keys] == [0, 0, 0]

    # prepare_load returns the slots in the caller's key order, as an int64 array.
    order = [k(2), k(0), k(1)]
    spec = manager.prepare_load(order, CTX)
    assert isinstance(spec, CPULoadStoreSpec)
    assert isinstance(spec.block_ids, np.ndarray)
    assert spec.block_ids.dtype == np.int64
    assert spec.block_ids.tolist() == [manager.block_id(key) for key in order]
    assert len(spec) == 3
    assert [manager.ref_count(key) for key in keys] == [1, 1, 1]
    assert lookups(manager, keys) == [HIT] * 3  # pinned blocks stay readable
    manager.complete_load(order, CTX)
    assert [manager.ref_count(key) for key in keys] == [0, 0, 0]

    manager.touch(keys, CTX)
    assert lookups(manager, keys) == [HIT] * 3

    # prepare_store filters keys already stored (ready or pending).
    out2 = manager.prepare_store([k(0), k(3), k(1), k(4)], CTX)
    assert out2 is not None
    assert out2.keys_to_store == [k(3), k(4)]
    assert out2.evicted_keys == []
    assert out2.store_spec.block_ids.dtype == np.int64
    assert out2.store_spec.block_ids.tolist() == [manager.block_id(k(3)), manager.block_id(k(4))]
    out3 = manager.prepare_store([k(3), k(0)], CTX)
    assert out3 is not None
    assert out3.keys_to_store == [] and out3.evicted_keys == [] and len(out3.store_spec) == 0
    manager.complete_store([k(3), k(4)], CTX)
    assert lookups(manager, [k(3), k(4)]) == [HIT, HIT]

    slots = [manager.block_id(key) for key in [*keys, k(3), k(4)]]
    assert len(set(slots)) == 5
    manager.on_request_finished(CTX)
    check_occupancy(manager)


def test_pinned_twice_needs_two_completes(make: ManagerFactory) -> None:
    manager = make(4)
    store(manager, [k(0)])
    manager.prepare_load([k(0)], CTX)
    manager.prepare_load([k(0)], ReqContext(req_id="req-1"))
    assert manager.ref_count(k(0)) == 2
    manager.complete_load([k(0)], CTX)
    assert manager.ref_count(k(0)) == 1
    manager.complete_load([k(0)], ReqContext(req_id="req-1"))
    assert manager.ref_count(k(0)) == 0
    assert manager.get_stats().loaded_blocks == 2


def test_pending_block_answers_pending_and_is_never_evicted(make: ManagerFactory) -> None:
    manager = make(4)
    pending = manager.prepare_store([k(0), k(1)], CTX)
    assert pending is not None
    slots = {key: manager.block_id(key) for key in (k(0), k(1))}
    store(manager, [k(2), k(3)])

    # Two idle blocks can go, the two pending ones cannot.
    out = manager.prepare_store([k(4), k(5)], CTX)
    assert out is not None
    assert sorted(out.evicted_keys) == sorted([k(2), k(3)])
    assert lookups(manager, [k(0), k(1)]) == [PENDING, PENDING]
    assert {key: manager.block_id(key) for key in (k(0), k(1))} == slots

    # Now everything is pending: nothing can be evicted.
    assert manager.prepare_store([k(6)], CTX) is None
    assert lookups(manager, [k(0), k(1), k(4), k(5)]) == [PENDING] * 4
    assert {key: manager.block_id(key) for key in (k(0), k(1))} == slots
    check_occupancy(manager)


def test_pinned_blocks_are_never_evicted(make: ManagerFactory) -> None:
    manager = make(4)
    store(manager, [k(0), k(1), k(2), k(3)])
    manager.touch([k(1), k(0)], CTX)  # most recent: the pinned ones must still survive
    manager.prepare_load([k(2), k(3)], CTX)
    manager.touch([k(0), k(1)], CTX)
    pinned_slots = [manager.block_id(k(2)), manager.block_id(k(3))]

    out = manager.prepare_store([k(4), k(5)], CTX)
    assert out is not None
    assert sorted(out.evicted_keys) == sorted([k(0), k(1)])
    assert [manager.block_id(k(2)), manager.block_id(k(3))] == pinned_slots
    assert [manager.ref_count(k(2)), manager.ref_count(k(3))] == [1, 1]
    assert lookups(manager, [k(2), k(3)]) == [HIT, HIT]
    manager.complete_store([k(4), k(5)], CTX)

    # Only pinned blocks left besides the new ones: evicting 3 is impossible.
    assert manager.prepare_store([k(6), k(7), k(8)], CTX) is None
    manager.complete_load([k(2), k(3)], CTX)
    assert manager.ref_count(k(2)) == 0
    check_occupancy(manager)


def test_keys_of_prepare_store_are_protected_from_its_own_eviction(
    make: ManagerFactory,
) -> None:
    manager = make(4)
    store(manager, [k(0), k(1), k(2), k(3)])
    # k(0), k(1) are already stored and named in the call: they must not make room.
    out = manager.prepare_store([k(0), k(1), k(4), k(5)], CTX)
    assert out is not None
    assert out.keys_to_store == [k(4), k(5)]
    assert sorted(out.evicted_keys) == sorted([k(2), k(3)])
    assert lookups(manager, [k(0), k(1)]) == [HIT, HIT]
    assert lookups(manager, [k(2), k(3)]) == [MISS, MISS]
    check_occupancy(manager)


def test_eviction_is_atomic_when_too_few_blocks_are_evictable(make: ManagerFactory) -> None:
    manager = make(4)
    store(manager, [k(0), k(1), k(2), k(3)])
    manager.prepare_load([k(0), k(1)], CTX)
    before_lookups = lookups(manager, UNIVERSE[:8])

    before = state_of(manager)
    assert manager.prepare_store([k(4), k(5), k(6)], CTX) is None  # needs 3, 2 evictable

    after = state_of(manager)
    # The rejection is counted (and its size, as vLLM counts every allocation asked for);
    # nothing else changes.
    assert after["stats"].rejected_stores == before["stats"].rejected_stores + 1
    assert after["stats"].allocation_sizes.total == before["stats"].allocation_sizes.total + 3
    unchanged = {"rejected_stores": 0, "allocation_sizes": before["stats"].allocation_sizes}
    assert dataclasses.replace(after["stats"], **unchanged) == dataclasses.replace(
        before["stats"], **unchanged
    )
    assert {key: v for key, v in after.items() if key != "stats"} == {
        key: v for key, v in before.items() if key != "stats"
    }
    assert lookups(manager, UNIVERSE[:8]) == before_lookups
    check_occupancy(manager)


def test_eviction_is_atomic_when_protected_keys_block_it(make: ManagerFactory) -> None:
    manager = make(4, enable_events=True)
    store(manager, [k(0), k(1), k(2), k(3)])
    manager.take_events()
    before_lookups = lookups(manager, UNIVERSE[:8])
    before = state_of(manager)

    # 4 idle blocks, but k(0), k(1) are protected: only 2 of the 3 needed can go.
    assert manager.prepare_store([k(0), k(1), k(4), k(5), k(6)], CTX) is None

    after = state_of(manager)
    assert after["stats"].rejected_stores == before["stats"].rejected_stores + 1
    unchanged = {"rejected_stores": 0, "allocation_sizes": before["stats"].allocation_sizes}
    assert dataclasses.replace(after["stats"], **unchanged) == dataclasses.replace(
        before["stats"], **unchanged
    )
    assert after["refs"] == before["refs"] and after["slots"] == before["slots"]
    assert (after["free"], after["resident"]) == (before["free"], before["resident"])
    assert lookups(manager, UNIVERSE[:8]) == before_lookups
    assert manager.take_events() == []

    # The policy's state survived: a feasible eviction still works.
    out = manager.prepare_store([k(0), k(1), k(4), k(5)], CTX)
    assert out is not None
    assert sorted(out.evicted_keys) == sorted([k(2), k(3)])
    check_occupancy(manager)


def test_failed_store_frees_slots_and_keys_miss(make: ManagerFactory) -> None:
    manager = make(4, enable_events=True)
    out = manager.prepare_store([k(0), k(1), k(2)], CTX)
    assert out is not None
    assert manager.num_free_blocks == 1
    manager.complete_store([k(0), k(1), k(2)], CTX, success=False)
    assert lookups(manager, [k(0), k(1), k(2)]) == [MISS, MISS, MISS]
    assert [manager.ref_count(key) for key in (k(0), k(1), k(2))] == [None] * 3
    assert [manager.block_id(key) for key in (k(0), k(1), k(2))] == [None] * 3
    assert manager.num_free_blocks == 4
    assert manager.num_resident_blocks == 0
    stats = manager.get_stats()
    assert stats.failed_stores == 3
    assert stats.stored_blocks == 0
    assert stats.pending_blocks == 0
    # Nothing became loadable: one metadata-only removal (vLLM's failed-store event).
    assert manager.take_events() == [OffloadingEvent([k(0), k(1), k(2)], "CPU", True, True)]
    # The freed slots are reusable for the full capacity.
    store(manager, [k(4), k(5), k(6), k(7)])
    assert sorted(manager.block_id(k(i)) for i in range(4, 8)) == [0, 1, 2, 3]
    # And the failed keys can be stored again.
    assert manager.prepare_store([k(0)], CTX) is not None
    check_occupancy(manager)


def test_partial_failure_of_one_batch(make: ManagerFactory) -> None:
    manager = make(4)
    assert manager.prepare_store([k(0), k(1), k(2)], CTX) is not None
    manager.complete_store([k(1)], CTX, success=False)
    manager.complete_store([k(0), k(2)], CTX)
    assert lookups(manager, [k(0), k(1), k(2)]) == [HIT, MISS, HIT]
    assert manager.num_free_blocks == 2


def test_reset_cache_empties_everything(make: ManagerFactory) -> None:
    manager = make(4)
    store(manager, [k(0), k(1)])
    manager.prepare_load([k(0)], CTX)
    assert manager.prepare_store([k(2)], CTX) is not None
    lookups(manager, [k(0), k(9)])

    manager.reset_cache()

    assert manager.num_free_blocks == 4
    assert manager.num_resident_blocks == 0
    for key in (k(0), k(1), k(2)):
        assert manager.ref_count(key) is None
        assert manager.block_id(key) is None
    assert manager.get_stats() == OffloadingStats(
        capacity=4, lookups=0, hits=0, misses=0, pending=0, stored_blocks=0,
        loaded_blocks=0, failed_stores=0, rejected_stores=0, evictions=0,
        resident_blocks=0, free_blocks=4, pending_blocks=0, pinned_blocks=0,
        evictable_blocks=0,
    )  # fmt: skip
    assert lookups(manager, [k(0), k(1), k(2)]) == [MISS] * 3
    # In-flight transfers are forgotten.
    with pytest.raises(KeyStateError):
        manager.complete_store([k(2)], CTX)
    with pytest.raises(KeyStateError):
        manager.complete_load([k(0)], CTX)
    # The whole capacity is usable again.
    out = store(manager, [k(4), k(5), k(6), k(7)])
    assert out.evicted_keys == []
    assert sorted(out.store_spec.block_ids.tolist()) == [0, 1, 2, 3]
    check_occupancy(manager)


# -- events ------------------------------------------------------------------------------


def test_events_stored_and_removed(make: ManagerFactory) -> None:
    manager = make(2, enable_events=True)
    assert manager.take_events() == []
    assert manager.prepare_store([k(0), k(1)], CTX) is not None
    assert manager.take_events() == []  # nothing loadable yet
    manager.complete_store([k(1), k(0)], CTX)
    events = manager.take_events()
    assert len(events) == 1
    assert isinstance(events[0], OffloadingEvent)
    assert events[0].keys == [k(1), k(0)]
    assert events[0].medium == "CPU"
    assert events[0].removed is False
    assert manager.take_events() == []  # taken once

    out = manager.prepare_store([k(2), k(3)], CTX)
    assert out is not None
    events = manager.take_events()
    assert len(events) == 1
    assert events[0].removed is True
    assert events[0].medium == "CPU"
    assert events[0].keys == out.evicted_keys
    assert sorted(events[0].keys) == sorted([k(0), k(1)])

    manager.complete_store([k(2), k(3)], CTX)
    events = manager.take_events()
    assert [(e.keys, e.removed) for e in events] == [([k(2), k(3)], False)]


def test_no_events_when_disabled(make: ManagerFactory) -> None:
    manager = make(2)
    store(manager, [k(0), k(1)])
    out = store(manager, [k(2), k(3)])
    assert len(out.evicted_keys) == 2
    assert manager.take_events() == []


# -- stats -------------------------------------------------------------------------------


def test_stats_counters(make: ManagerFactory) -> None:
    manager = make(4)
    stats = manager.get_stats()
    assert (stats.lookups, stats.hits, stats.misses, stats.pending) == (0, 0, 0, 0)
    assert stats.usage == 0.0 and stats.occupancy == 0.0 and stats.hit_ratio == 0.0

    assert manager.prepare_store([k(0), k(1)], CTX) is not None
    stats = manager.get_stats()
    assert stats.pending_blocks == 2 and stats.usage == 0.5 and stats.occupancy == 0.5
    assert lookups(manager, [k(0), k(5)]) == [PENDING, MISS]

    manager.complete_store([k(0), k(1)], CTX)
    store(manager, [k(2), k(3)])
    assert lookups(manager, [k(0), k(1), k(2)]) == [HIT, HIT, HIT]
    stats = manager.get_stats()
    assert (stats.lookups, stats.hits, stats.misses, stats.pending) == (5, 3, 1, 1)
    assert stats.hit_ratio == pytest.approx(3 / 5)
    assert stats.stored_blocks == 4
    assert stats.usage == 0.0 and stats.occupancy == 1.0
    assert stats.evictable_blocks == 4

    manager.prepare_load([k(0), k(1), k(2)], CTX)
    stats = manager.get_stats()
    assert stats.pinned_blocks == 3 and stats.usage == 0.75 and stats.evictable_blocks == 1

    out = manager.prepare_store([k(4)], CTX)
    assert out is not None and out.evicted_keys == [k(3)]
    stats = manager.get_stats()
    assert stats.evictions == 1
    assert stats.usage == 1.0 and stats.occupancy == 1.0

    assert manager.prepare_store([k(5)], CTX) is None
    assert manager.get_stats().rejected_stores == 1

    manager.complete_load([k(0), k(1), k(2)], CTX)
    manager.complete_store([k(4)], CTX, success=False)
    stats = manager.get_stats()
    assert stats.loaded_blocks == 3
    assert stats.failed_stores == 1
    assert stats.pinned_blocks == 0 and stats.pending_blocks == 0
    assert stats.occupancy == 0.75 and stats.usage == 0.0
    assert stats.as_dict()["occupancy"] == 0.75
    check_occupancy(manager)


def test_shutdown_then_prepare_store_raises(make: ManagerFactory) -> None:
    manager = make(4)
    store(manager, [k(0)])
    manager.shutdown()
    assert manager.num_resident_blocks == 0
    with pytest.raises(ManagerError, match="prepare_store"):
        manager.prepare_store([k(1)], CTX)
    manager.shutdown()  # idempotent


# -- LRU-specific ------------------------------------------------------------------------


@pytest.fixture
def make_lru() -> ManagerFactory:
    def factory(num_blocks: int = 4, enable_events: bool = False) -> CPUOffloadingManager:
        return CPUOffloadingManager(num_blocks, cache_policy="lru", enable_events=enable_events)

    return factory


def test_lru_evicts_least_recently_touched_idle_block(make_lru: ManagerFactory) -> None:
    manager = make_lru(4)
    store(manager, [k(0), k(1), k(2), k(3)])
    manager.touch([k(0)], CTX)  # order: 1 2 3 0
    out = manager.prepare_store([k(4)], CTX)
    assert out is not None and out.evicted_keys == [k(1)]
    manager.complete_store([k(4)], CTX)

    manager.touch([k(2)], CTX)  # order: 3 0 4 2
    manager.prepare_load([k(3)], CTX)  # 3 is pinned: skipped
    out = manager.prepare_store([k(5)], CTX)
    assert out is not None and out.evicted_keys == [k(0)]
    manager.complete_store([k(5)], CTX)  # order: 3 4 2 5
    manager.complete_load([k(3)], CTX)

    out = manager.prepare_store([k(6), k(7)], CTX)
    assert out is not None and out.evicted_keys == [k(3), k(4)]


def test_lru_failed_eviction_keeps_order(make_lru: ManagerFactory) -> None:
    manager = make_lru(4)
    store(manager, [k(0), k(1), k(2), k(3)])
    # The two oldest are protected, so only k(2), k(3) could go; 3 are needed.
    assert manager.prepare_store([k(0), k(1), k(4), k(5), k(6)], CTX) is None
    out = manager.prepare_store([k(7)], CTX)
    assert out is not None and out.evicted_keys == [k(0)]


def test_lru_failed_touch_keeps_order(make_lru: ManagerFactory) -> None:
    manager = make_lru(4)
    store(manager, [k(0), k(1), k(2), k(3)])
    with pytest.raises(InvalidKeyError):
        manager.touch([k(0), k(1), ["unhashable"]], CTX)  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError):
        manager.touch([k(0), k(1), k(0)], CTX)
    out = manager.prepare_store([k(4)], CTX)
    assert out is not None and out.evicted_keys == [k(0)]
