"""CPUOffloadingManager: request flow, eviction, events, stats and bad input.

Every test runs on each installed policy (``lru`` and ``arc``) and relies only on the
manager's public API: its methods, ``get_stats()``, ``num_free_blocks``,
``num_resident_blocks``, ``ref_count(key)``, ``block_id(key)`` and ``take_events()``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from kv_offload import (
    CachePolicyFactory,
    ConfigError,
    CPULoadStoreSpec,
    CPUOffloadingManager,
    InvalidArgumentError,
    InvalidKeyError,
    KeyStateError,
    KVOffloadError,
    LookupResult,
    ManagerError,
    OffloadingEvent,
    OffloadingStats,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)

POLICIES = ("lru", "arc")

HIT = LookupResult.HIT
MISS = LookupResult.MISS
PENDING = LookupResult.PENDING

CTX = ReqContext(req_id="req-0")


def _installed_policies() -> set[str]:
    return {info.name for info in CachePolicyFactory.available_policies()}


def k(i: int) -> bytes:
    """The i-th test key."""
    return make_offload_key(i)


# Keys used by the tests; snapshots look at all of them.
UNIVERSE = [k(i) for i in range(32)]

ManagerFactory = Callable[..., CPUOffloadingManager]


@pytest.fixture(params=POLICIES)
def policy(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name not in _installed_policies():
        # Only a policy that is not installed at all is skipped; one that is installed but
        # fails to import makes the manager constructor raise, so the tests fail.
        pytest.skip(f"policy plugin {name!r} is not installed")
    return name


@pytest.fixture
def make(policy: str) -> ManagerFactory:
    def factory(num_blocks: int = 4, enable_events: bool = False) -> CPUOffloadingManager:
        return CPUOffloadingManager(num_blocks, cache_policy=policy, enable_events=enable_events)

    return factory


# -- helpers -----------------------------------------------------------------------------


def store(manager: CPUOffloadingManager, keys: Iterable[bytes]) -> PrepareStoreOutput:
    """prepare_store + complete_store(success=True); the keys become HIT."""
    out = manager.prepare_store(list(keys), CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    return out


def state_of(manager: CPUOffloadingManager, keys: Iterable[bytes] = UNIVERSE) -> dict[str, Any]:
    """Everything observable without changing state (no lookups: they count)."""
    return {
        "stats": manager.get_stats(),
        "free": manager.num_free_blocks,
        "resident": manager.num_resident_blocks,
        "refs": {key: manager.ref_count(key) for key in keys},
        "slots": {key: manager.block_id(key) for key in keys},
    }


def lookups(manager: CPUOffloadingManager, keys: Iterable[bytes]) -> list[LookupResult]:
    return [manager.lookup(key, CTX) for key in keys]


def check_occupancy(manager: CPUOffloadingManager) -> None:
    stats = manager.get_stats()
    assert manager.num_free_blocks + manager.num_resident_blocks == manager.num_blocks
    assert stats.free_blocks == manager.num_free_blocks
    assert stats.resident_blocks == manager.num_resident_blocks
    assert stats.capacity == manager.num_blocks
    assert stats.hits + stats.misses + stats.pending == stats.lookups
    assert (
        stats.pending_blocks + stats.pinned_blocks + stats.evictable_blocks == stats.resident_blocks
    )


def assert_raises_intact(
    manager: CPUOffloadingManager,
    exc_type: type[BaseException],
    call: Callable[[], object],
    *fragments: str,
) -> pytest.ExceptionInfo[BaseException]:
    """``call`` raises ``exc_type`` naming every fragment, and leaves the manager unchanged."""
    before = state_of(manager)
    with pytest.raises(exc_type) as info:
        call()
    assert isinstance(info.value, KVOffloadError)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert state_of(manager) == before
    check_occupancy(manager)
    return info


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
    # The rejection is counted; nothing else changes.
    assert after["stats"].rejected_stores == before["stats"].rejected_stores + 1
    assert dataclasses.replace(after["stats"], rejected_stores=0) == dataclasses.replace(
        before["stats"], rejected_stores=0
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
    assert dataclasses.replace(after["stats"], rejected_stores=0) == dataclasses.replace(
        before["stats"], rejected_stores=0
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
    assert manager.take_events() == []  # nothing became loadable
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


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_blocks", [0, -1, -100])
def test_config_num_blocks_not_positive(policy: str, num_blocks: int) -> None:
    with pytest.raises(ConfigError, match="num_blocks") as info:
        CPUOffloadingManager(num_blocks, cache_policy=policy)
    assert str(num_blocks) in str(info.value)


@pytest.mark.parametrize("num_blocks", [4.0, "4", None, True, [4]])
def test_config_num_blocks_not_int(policy: str, num_blocks: object) -> None:
    with pytest.raises(ConfigError, match="num_blocks"):
        CPUOffloadingManager(num_blocks, cache_policy=policy)  # type: ignore[arg-type]


@pytest.fixture
def busy(make: ManagerFactory) -> CPUOffloadingManager:
    """k0..k2 ready (k2 pinned once), k3 pending, one slot free, k9 absent."""
    manager = make(5)
    store(manager, [k(0), k(1), k(2)])
    assert manager.prepare_store([k(3)], CTX) is not None
    manager.prepare_load([k(2)], CTX)
    lookups(manager, [k(0), k(3), k(9)])  # non-zero counters
    return manager


def test_prepare_load_missing_key(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.prepare_load([k(9)], CTX), "prepare_load", repr(k(9))
    )
    assert info.value.key == k(9)  # type: ignore[attr-defined]
    assert info.value.operation == "prepare_load"  # type: ignore[attr-defined]


def test_prepare_load_pending_key(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.prepare_load([k(3)], CTX), "prepare_load", repr(k(3))
    )
    assert info.value.key == k(3)  # type: ignore[attr-defined]


def test_complete_load_without_pin(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_load([k(0)], CTX), "complete_load", repr(k(0))
    )
    assert info.value.key == k(0)  # type: ignore[attr-defined]
    assert info.value.operation == "complete_load"  # type: ignore[attr-defined]


def test_complete_load_missing_and_pending_keys(busy: CPUOffloadingManager) -> None:
    for key in (k(9), k(3)):
        assert_raises_intact(
            busy, KeyStateError, lambda key=key: busy.complete_load([key], CTX),
            "complete_load", repr(key),
        )  # fmt: skip


def test_complete_load_more_often_than_pinned(busy: CPUOffloadingManager) -> None:
    busy.complete_load([k(2)], CTX)
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_load([k(2)], CTX), "complete_load", repr(k(2))
    )


def test_complete_store_never_prepared(busy: CPUOffloadingManager) -> None:
    info = assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_store([k(9)], CTX), "complete_store",
        repr(k(9)),
    )  # fmt: skip
    assert info.value.key == k(9)  # type: ignore[attr-defined]
    assert info.value.operation == "complete_store"  # type: ignore[attr-defined]
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_store([k(9)], CTX, success=False),
        "complete_store", repr(k(9)),
    )  # fmt: skip


def test_complete_store_already_completed(busy: CPUOffloadingManager) -> None:
    for key in (k(0), k(2)):  # idle, pinned
        for success in (True, False):
            assert_raises_intact(
                busy, KeyStateError,
                lambda key=key, success=success: busy.complete_store([key], CTX, success),
                "complete_store", repr(key),
            )  # fmt: skip
    # Completing twice: the second one fails.
    busy.complete_store([k(3)], CTX)
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_store([k(3)], CTX), "complete_store",
        repr(k(3)),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("operation", "keys"),
    [
        ("prepare_load", [k(0), k(1), k(0)]),
        ("complete_load", [k(2), k(2)]),
        ("prepare_store", [k(5), k(6), k(5)]),
        ("prepare_store", [k(0), k(0)]),  # already stored, still a duplicate
        ("complete_store", [k(3), k(3)]),
        ("touch", [k(0), k(1), k(1)]),
    ],
)
def test_duplicate_keys(busy: CPUOffloadingManager, operation: str, keys: list[bytes]) -> None:
    method = getattr(busy, operation)
    info = assert_raises_intact(
        busy, InvalidArgumentError, lambda: method(keys, CTX), operation, repr(keys[-1])
    )
    assert not isinstance(info.value, InvalidKeyError)


BAD_KEY: Any = [b"not", b"hashable"]


def test_unhashable_key_in_lookup(busy: CPUOffloadingManager) -> None:
    assert_raises_intact(
        busy, InvalidKeyError, lambda: busy.lookup(BAD_KEY, CTX), "lookup", repr(BAD_KEY)
    )
    assert_raises_intact(busy, InvalidKeyError, lambda: busy.lookup({}, CTX), "lookup")


@pytest.mark.parametrize(
    ("operation", "keys"),
    [
        ("prepare_load", [k(0), BAD_KEY]),
        ("complete_load", [k(2), BAD_KEY]),
        ("prepare_store", [k(5), BAD_KEY]),
        ("complete_store", [k(3), BAD_KEY]),
        ("touch", [k(0), BAD_KEY]),
        ("prepare_load", [BAD_KEY]),
        ("prepare_store", [set()]),
    ],
)
def test_unhashable_key_in_batch(
    busy: CPUOffloadingManager, operation: str, keys: list[Any]
) -> None:
    method = getattr(busy, operation)
    info = assert_raises_intact(
        busy, InvalidKeyError, lambda: method(keys, CTX), operation, repr(keys[-1])
    )
    assert isinstance(info.value, InvalidArgumentError)  # catchable as the parent


@pytest.mark.parametrize(
    "operation", ["prepare_load", "complete_load", "prepare_store", "complete_store", "touch"]
)
@pytest.mark.parametrize("keys", [k(0), 7, None], ids=["single-key", "int", "None"])
def test_a_batch_that_is_not_a_collection_of_keys(
    busy: CPUOffloadingManager, operation: str, keys: Any
) -> None:
    """A single key where a list belongs is the classic slip: named, and nothing changes."""
    method = getattr(busy, operation)
    info = assert_raises_intact(
        busy, InvalidArgumentError, lambda: method(keys, CTX), operation, "collection"
    )
    if isinstance(keys, bytes):
        assert "pass [key]" in str(info.value)


def _req_id_cleared() -> ReqContext:
    """ReqContext refuses a non-str req_id; the manager still checks a context changed later."""
    ctx = ReqContext(req_id="cleared")
    ctx.req_id = None  # type: ignore[assignment]
    return ctx


BAD_CONTEXTS: list[Any] = [_req_id_cleared(), object(), None, "req-0"]


CTX_OPERATIONS = [
    "on_new_request", "lookup", "prepare_load", "complete_load", "touch", "prepare_store",
    "complete_store", "on_request_finished",
]  # fmt: skip


def _ctx_calls(manager: CPUOffloadingManager, ctx: Any) -> dict[str, Callable[[], object]]:
    return {
        "on_new_request": lambda: manager.on_new_request(ctx),
        "lookup": lambda: manager.lookup(k(0), ctx),
        "prepare_load": lambda: manager.prepare_load([k(0)], ctx),
        "complete_load": lambda: manager.complete_load([k(2)], ctx),
        "touch": lambda: manager.touch([k(0)], ctx),
        "prepare_store": lambda: manager.prepare_store([k(5)], ctx),
        "complete_store": lambda: manager.complete_store([k(3)], ctx),
        "on_request_finished": lambda: manager.on_request_finished(ctx),
    }


@pytest.mark.parametrize("ctx", BAD_CONTEXTS, ids=["req_id_none", "object", "none", "str"])
@pytest.mark.parametrize("operation", CTX_OPERATIONS)
def test_context_without_req_id(busy: CPUOffloadingManager, ctx: Any, operation: str) -> None:
    calls = _ctx_calls(busy, ctx)
    assert set(calls) == set(CTX_OPERATIONS)
    call = calls[operation]
    assert_raises_intact(busy, InvalidArgumentError, call, operation, "req_id")


def test_prepare_load_last_key_bad_pins_nothing(busy: CPUOffloadingManager) -> None:
    for last in (k(9), k(3)):  # missing, pending
        assert_raises_intact(
            busy, KeyStateError, lambda last=last: busy.prepare_load([k(0), k(1), k(2), last], CTX),
            "prepare_load", repr(last),
        )  # fmt: skip
    assert_raises_intact(
        busy, InvalidKeyError, lambda: busy.prepare_load([k(0), k(1), BAD_KEY], CTX),
        "prepare_load",
    )  # fmt: skip
    assert_raises_intact(
        busy, InvalidArgumentError, lambda: busy.prepare_load([k(0), k(1), k(1)], CTX),
        "prepare_load",
    )  # fmt: skip
    assert [busy.ref_count(k(0)), busy.ref_count(k(1)), busy.ref_count(k(2))] == [0, 0, 1]


def test_complete_load_last_key_bad_unpins_nothing(busy: CPUOffloadingManager) -> None:
    busy.prepare_load([k(0), k(1)], CTX)
    assert_raises_intact(
        busy, KeyStateError, lambda: busy.complete_load([k(0), k(1), k(2), k(9)], CTX),
        "complete_load", repr(k(9)),
    )  # fmt: skip
    assert [busy.ref_count(k(0)), busy.ref_count(k(1)), busy.ref_count(k(2))] == [1, 1, 1]


def test_complete_store_last_key_bad_completes_nothing(busy: CPUOffloadingManager) -> None:
    assert busy.prepare_store([k(4)], CTX) is not None
    for success in (True, False):
        assert_raises_intact(
            busy, KeyStateError,
            lambda success=success: busy.complete_store([k(3), k(4), k(0)], CTX, success),
            "complete_store", repr(k(0)),
        )  # fmt: skip
    assert lookups(busy, [k(3), k(4)]) == [PENDING, PENDING]


def test_prepare_store_last_key_bad_allocates_nothing(busy: CPUOffloadingManager) -> None:
    assert_raises_intact(
        busy, InvalidKeyError, lambda: busy.prepare_store([k(5), k(6), BAD_KEY], CTX),
        "prepare_store",
    )  # fmt: skip
    assert_raises_intact(
        busy, InvalidArgumentError, lambda: busy.prepare_store([k(5), k(6), k(5)], CTX),
        "prepare_store",
    )  # fmt: skip
    assert busy.ref_count(k(5)) is None


def test_validation_does_not_rely_on_assert(policy: str) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        assert False, "unreachable without -O"
        from kv_offload import CPUOffloadingManager, KeyStateError, ReqContext
        m = CPUOffloadingManager(4, cache_policy={policy!r})
        ctx = ReqContext(req_id="r")
        try:
            m.prepare_load([b"missing"], ctx)
        except KeyStateError:
            pass
        else:
            sys.exit("prepare_load of a missing key did not raise under -O")
        try:
            m.complete_store([b"missing"], ctx)
        except KeyStateError:
            pass
        else:
            sys.exit("complete_store of a missing key did not raise under -O")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
