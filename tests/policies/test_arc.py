"""ARC policy (kv-offload-arc): ARC's rules, the evict() contract, and use through the manager.

Most tests drive the policy directly with blocks bound to a local ref-count table, the way the
manager does, so every rule can be checked against exact list contents. The shipped reference
implementation of the same adapted ARC (``kv_offload_arc.reference``), written for clarity
rather than speed, checks the optimised structures on long random workloads.
"""

from __future__ import annotations

import random

import pytest
from _policy_harness import CTX, PolicyHarness, k, match_reference, run_request
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    ReqContext,
)
from kv_offload.policies import key_queue
from kv_offload_arc import ARCCachePolicy
from kv_offload_arc.reference import ReferenceARCCachePolicy


class Harness(PolicyHarness[ARCCachePolicy]):
    """The policy harness over an ARC policy, plus ARC's own request model."""

    def __init__(self, capacity: int) -> None:
        super().__init__(ARCCachePolicy(capacity), capacity, slots=capacity * 1000)

    def access(self, key: OffloadKey) -> bool:
        """One ARC request: a hit is touched, a miss stored. Returns whether it hit."""
        if self.policy.get(key) is not None:
            self.policy.touch([key], CTX)
            return True
        self.store([key])
        return False


def snapshot(policy: ARCCachePolicy) -> tuple[object, ...]:
    return (
        policy.p,
        policy.t1,
        policy.t2,
        policy.b1,
        policy.b2,
        len(policy),
        {key: policy.get(key) for key in policy.t1 + policy.t2},
    )


def check_invariants(policy: ARCCachePolicy) -> None:
    c = policy.cache_capacity
    t1, t2, b1, b2 = policy.t1, policy.t2, policy.b1, policy.b2
    every = t1 + t2 + b1 + b2
    assert len(set(every)) == len(every), "a key is listed twice"
    assert len(t1) + len(t2) == len(policy) <= c
    assert len(t1) + len(b1) <= c
    assert len(every) <= 2 * c
    assert 0.0 <= policy.p <= c
    for key in t1 + t2:
        assert policy.get(key) is not None
    for key in b1 + b2:
        assert policy.get(key) is None
    # Each queue holds its live keys plus exactly the tombstones it counts.
    for queue, live in ((policy._t1, t1), (policy._b1._queue, b1), (policy._b2._queue, b2)):
        assert len(queue) == len(live) + sum(queue.stale.values())


# -- ARC's rules -------------------------------------------------------------------------


def test_first_sightings_go_to_t1_and_a_touch_promotes_to_t2() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3)])
    assert h.policy.t1 == [k(1), k(2), k(3)]
    h.policy.touch([k(2)], CTX)
    assert h.policy.t1 == [k(1), k(3)]
    assert h.policy.t2 == [k(2)]
    h.policy.touch([k(1)], CTX)
    h.policy.touch([k(2)], CTX)
    assert h.policy.t2 == [k(1), k(2)], "a touch in T2 moves the key to the MRU end"


def test_touch_makes_the_first_key_of_a_request_most_recent() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3)])
    h.policy.touch([k(1), k(2), k(3)], CTX)
    assert h.policy.t2 == [k(3), k(2), k(1)]


def test_victims_become_ghosts_of_the_list_they_left() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3), k(4)])
    h.policy.touch([k(3), k(4)], CTX)  # T1 = [1, 2], T2 = [4, 3]
    victims = h.policy.evict(1, set())
    assert victims is not None and [key for key, _ in victims] == [k(1)]  # |T1| = 2 > p = 0
    assert h.policy.b1 == [k(1)]
    assert h.policy.get(k(1)) is None, "get() never answers for a ghost"
    victims = h.policy.evict(2, set())
    # |T1| = 1 > 0 takes 2 from T1; then |T1| = 0 <= p so REPLACE turns to T2's LRU.
    assert victims is not None and [key for key, _ in victims] == [k(2), k(4)]
    assert h.policy.b1 == [k(1), k(2)]
    assert h.policy.b2 == [k(4)]
    assert h.policy.t2 == [k(3)]
    check_invariants(h.policy)


def test_replace_prefers_t2_once_t1_is_within_its_target() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3), k(4)])
    h.policy.evict(1, set())  # k1 -> B1
    h.store([k(1)])  # B1 hit: p = 1, k1 -> T2
    assert h.policy.p == 1.0
    assert h.policy.t2 == [k(1)]
    h.policy.touch([k(2)], CTX)  # T1 = [3, 4], T2 = [1, 2]
    victims = h.policy.evict(2, set())
    # |T1| = 2 > p = 1: one from T1; then |T1| = 1, not > p: T2's LRU.
    assert victims is not None and [key for key, _ in victims] == [k(3), k(1)]


def test_replace_falls_back_to_the_other_list() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3), k(4)])
    h.policy.touch([k(1), k(2), k(3), k(4)], CTX)  # all in T2, |T1| = 0
    h.set_ref(k(4), 1)  # T2's LRU is pinned
    victims = h.policy.evict(2, {k(3)})  # and the next one protected
    assert victims is not None and [key for key, _ in victims] == [k(2), k(1)]
    h2 = Harness(4)
    h2.store([k(1), k(2), k(3), k(4)])  # all in T1; p = 0, so T1 is preferred anyway
    h2.policy.touch([k(4)], CTX)
    h2.set_ref(k(1), 1)
    h2.set_ref(k(2), 1)
    h2.set_ref(k(3), -1)
    victims = h2.policy.evict(1, set())
    assert victims is not None and [key for key, _ in victims] == [k(4)]
    assert h2.policy.b2 == [k(4)]


def test_b1_ghost_hit_grows_p_and_goes_to_t2() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3), k(4)])
    h.policy.evict(1, set())
    assert h.policy.b1 == [k(1)] and h.policy.b2 == []
    h.store([k(1)])
    assert h.policy.p == 1.0, "grows by 1 when |B2| <= |B1|"
    assert h.policy.t2 == [k(1)]
    assert h.policy.b1 == []
    check_invariants(h.policy)


def test_b1_ghost_hit_grows_p_by_the_ghost_ratio() -> None:
    h = Harness(4)
    h.store([k(i) for i in range(4)])
    h.policy.touch([k(0), k(1), k(2)], CTX)  # T1 = [3], T2 = [2, 1, 0]
    h.store([k(10)])  # |T1| = 1 > p = 0: evicts k3 -> B1
    h.store([k(11)])  # evicts k10 -> B1 = [3, 10]
    assert h.policy.b1 == [k(3), k(10)]
    h.policy.touch([k(11)], CTX)  # T1 empty: REPLACE turns to T2's LRU
    h.store([k(20), k(21), k(22)])
    assert h.policy.b2 == [k(2), k(1), k(0)]
    assert h.policy.b1 == [k(10)], "|T1| + |B1| <= c trimmed B1's LRU"
    h.policy.remove(k(22))  # room, so the next store evicts nothing
    h.store([k(10)])
    assert h.policy.p == 3.0, "grows by |B2| / |B1| = 3 / 1"
    assert h.policy.t2 == [k(11), k(10)]
    check_invariants(h.policy)


def test_b2_ghost_hit_shrinks_p_and_goes_to_t2() -> None:
    h = Harness(10)
    h.store([k(i) for i in range(10)])
    h.policy.touch([k(i) for i in range(6, 10)], CTX)
    h.store([k(i) for i in range(10, 14)])  # T1's LRU 0..3 -> B1
    assert h.policy.b1 == [k(0), k(1), k(2), k(3)]
    for i in range(10, 14):
        h.policy.remove(k(i))
    h.store([k(0), k(1), k(2)])  # three B1 hits (|B2| = 0): p = 3
    assert h.policy.p == 3.0
    assert h.policy.t1 == [k(4), k(5)]
    h.store([k(20), k(21)])  # |T1| = 2 <= p: T2's LRU -> B2
    assert h.policy.b2 == [k(9)]
    h.store([k(22)])  # |T1| = 4 > p: T1's LRU -> B1
    assert h.policy.b1 == [k(3), k(4)]
    h.policy.remove(k(22))
    h.store([k(9)])
    assert h.policy.p == 1.0, "shrinks by |B1| / |B2| = 2 / 1"
    assert h.policy.t2[-1] == k(9) and h.policy.b2 == []
    check_invariants(h.policy)


def test_b2_ghost_hit_never_takes_p_below_zero() -> None:
    h = Harness(4)
    h.store([k(i) for i in range(4)])
    h.policy.touch([k(i) for i in range(4)], CTX)  # all in T2, p = 0
    h.store([k(10)])  # T2's LRU -> B2
    ghost = h.policy.b2[0]
    h.store([ghost])
    assert h.policy.p == 0.0
    assert ghost in h.policy.t2


def test_p_never_exceeds_capacity() -> None:
    h = Harness(3)
    fresh = iter(range(100, 200))
    seen = []
    for _ in range(6):
        # T1 holds the whole cache, so REPLACE's victim is T1's LRU (or T1's anyway, with
        # T2 empty, once p reaches c); re-storing it is a B1 hit with |B2| = 0.
        for key in h.policy.t2:
            h.policy.remove(key)
        h.store([k(next(fresh)) for _ in range(3 - len(h.policy))])
        victims = h.policy.evict(1, set())
        assert victims is not None and h.policy.b1 == [victims[0][0]]
        h.store([victims[0][0]])
        seen.append(h.policy.p)
        check_invariants(h.policy)
    assert seen == [1.0, 2.0, 3.0, 3.0, 3.0, 3.0]


def test_ghosts_stay_bounded_under_a_long_random_workload() -> None:
    rng = random.Random(7)
    h = Harness(50)
    for step in range(20_000):
        key = k(int(rng.paretovariate(0.7)) % 2000 if step % 3 else rng.randrange(10**6))
        h.access(key)
        if step % 97 == 0:
            check_invariants(h.policy)
    check_invariants(h.policy)
    total = len(h.policy.t1) + len(h.policy.t2) + len(h.policy.b1) + len(h.policy.b2)
    assert total == 100, "a busy cache keeps a full 2c history"


def test_scan_does_not_flush_the_frequent_working_set() -> None:
    capacity = 100
    h = Harness(capacity)
    hot = [k(i) for i in range(60)]
    h.store(hot)
    h.policy.touch(hot, CTX)  # second use: T2
    h.store([k(1000 + i) for i in range(40)])  # fill up with one-time keys in T1
    for i in range(10 * capacity):
        assert not h.access(k(10_000 + i))
    assert all(h.policy.get(key) is not None for key in hot)
    assert set(h.policy.t2) == set(hot)
    assert h.policy.p == 0.0, "a scan has no ghost hits, so nothing moves p"
    check_invariants(h.policy)


def test_lru_would_have_flushed_the_same_working_set() -> None:
    manager = CPUOffloadingManager(100, cache_policy="lru")
    hot = [k(i) for i in range(60)]
    run_request(manager, hot)
    run_request(manager, hot)
    for i in range(1000):
        run_request(manager, [k(10_000 + i)])
    assert all(manager.lookup(key, CTX) is LookupResult.MISS for key in hot)


# -- the evict() contract ----------------------------------------------------------------


def test_evict_is_all_or_nothing_and_changes_nothing_on_failure() -> None:
    h = Harness(6)
    h.store([k(i) for i in range(6)])
    h.policy.touch([k(0), k(1)], CTX)
    h.policy.evict(1, set())
    h.store([k(2)])  # a B1 hit: p > 0, and B1/T2 non-empty
    h.set_ref(k(3), 2)
    h.set_ref(k(0), -1)
    before = snapshot(h.policy)
    evictable = len(h.policy) - 2
    assert h.policy.evict(evictable, {k(4)}) is None
    assert snapshot(h.policy) == before
    assert h.policy.evict(len(h.policy) + 1, set()) is None
    assert snapshot(h.policy) == before
    victims = h.policy.evict(evictable - 1, {k(4)})
    assert victims is not None and len(victims) == evictable - 1
    assert {key for key, _ in victims}.isdisjoint({k(0), k(3), k(4)})


def test_evict_zero_returns_an_empty_list() -> None:
    h = Harness(2)
    h.store([k(1)])
    assert h.policy.evict(0, set()) == []
    assert h.policy.t1 == [k(1)]


def test_evict_never_returns_pinned_pending_or_protected_blocks() -> None:
    rng = random.Random(11)
    h = Harness(40)
    for _ in range(3000):
        h.access(k(rng.randrange(150)))
        resident = h.policy.t1 + h.policy.t2
        for key in rng.sample(resident, min(len(resident), 8)):
            h.set_ref(key, rng.choice((-1, 0, 0, 1, 3)))
        protected = set(rng.sample(resident, min(len(resident), 5)))
        busy = {key for key in resident if h.ref(key) != 0}
        n = rng.randrange(1, 12)
        before = snapshot(h.policy)
        victims = h.policy.evict(n, protected)
        if victims is None:
            assert snapshot(h.policy) == before
            assert len(set(resident) - busy - protected) < n
        else:
            keys = [key for key, _ in victims]
            assert len(keys) == n == len(set(keys))
            assert not set(keys) & (busy | protected)
            assert all(h.blocks.refs[block] == 0 for _, block in victims)
            assert set(keys) <= set(h.policy.b1 + h.policy.b2)
        for key in h.policy.t1 + h.policy.t2:
            h.set_ref(key, 0)
        check_invariants(h.policy)


# -- remove, clear, batch insert ---------------------------------------------------------


def test_remove_forgets_a_resident_block_without_making_a_ghost() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3)])
    h.policy.touch([k(3)], CTX)
    h.policy.remove(k(1))
    h.policy.remove(k(3))
    h.policy.remove(k(99))  # absent: a no-op
    assert h.policy.get(k(1)) is None and h.policy.get(k(3)) is None
    assert h.policy.t1 == [k(2)] and h.policy.t2 == []
    assert h.policy.b1 == [] and h.policy.b2 == []
    assert len(h.policy) == 1
    h.store([k(1)])
    assert h.policy.t1 == [k(2), k(1)] and h.policy.p == 0.0, "a removed key returns as new"


def test_clear_resets_lists_ghosts_and_p() -> None:
    h = Harness(4)
    h.store([k(i) for i in range(4)])
    h.policy.evict(2, set())
    h.store([k(0)])
    assert h.policy.p > 0
    h.policy.clear()
    assert h.policy.p == 0.0
    assert (h.policy.t1, h.policy.t2, h.policy.b1, h.policy.b2) == ([], [], [], [])
    assert len(h.policy) == 0 and h.policy.get(k(2)) is None
    h.store([k(0)])
    assert h.policy.t1 == [k(0)], "a former ghost is a first sighting after clear()"


def test_insert_many_matches_inserting_one_by_one() -> None:
    rng = random.Random(5)
    batch, single = Harness(30), Harness(30)
    for _ in range(400):
        keys = list(dict.fromkeys(k(rng.randrange(120)) for _ in range(rng.randrange(1, 9))))
        for h in (batch, single):
            to_store = [key for key in keys if h.policy.get(key) is None]
            hits = [key for key in keys if key not in to_store]
            h.policy.touch(hits, CTX)
            shortfall = len(h.policy) + len(to_store) - h.capacity
            if shortfall > 0:
                assert h.policy.evict(shortfall, set(keys)) is not None
            blocks = [h.blocks.new() for _ in to_store]
            if h is batch:
                h.policy.insert_many(to_store, blocks)
            else:
                for key, block in zip(to_store, blocks):
                    h.policy.insert(key, block)
            for block in blocks:
                h.blocks.refs[block] = 0
        assert snapshot(batch.policy)[:6] == snapshot(single.policy)[:6]


def test_a_ghost_trimmed_by_an_earlier_key_of_the_batch_is_a_plain_miss() -> None:
    h = Harness(4)
    h.store([k(i) for i in range(4)])
    h.policy.touch([k(0), k(1), k(2)], CTX)  # T1 = [3], T2 = [2, 1, 0]
    h.store([k(10)])  # k3 -> B1; T1 = [10]
    assert h.policy.b1 == [k(3)]
    h.policy.remove(k(10))
    h.policy.remove(k(2))
    # Two slots free, no eviction: k20 joins T1 first, |T1| + |B1| = 2 <= c keeps k3 ...
    h.store([k(20), k(3)])
    assert h.policy.p == 1.0 and k(3) in h.policy.t2, "... so k3 is still a B1 hit"

    h = Harness(4)
    h.store([k(i) for i in range(4)])
    h.policy.touch([k(0)], CTX)  # T1 = [1, 2, 3], T2 = [0]
    h.policy.evict(1, set())  # k1 -> B1: |T1| + |B1| = 3
    assert h.policy.b1 == [k(1)]
    h.policy.remove(k(0))
    # The store evicts k2 (B1 = [1, 2], T1 = [3]); then k20 makes |T1| + |B1| = 4 = c and
    # k21 makes it 5, which trims B1's LRU, k1, before k1's own turn comes.
    h.store([k(20), k(21), k(1)])
    assert h.policy.p == 0.0 and h.policy.t1[-1] == k(1), "k1 came back as a first sighting"
    check_invariants(h.policy)


def test_tombstones_never_outgrow_the_live_keys() -> None:
    h = Harness(50)
    for i in range(5000):
        h.store([k(i)])
        h.policy.touch([k(i)], CTX)  # every T1 entry becomes a tombstone at once
        if i % 7 == 0:
            h.store([k(100_000 + i)])
    live_t1 = len(h.policy.t1)
    queue = h.policy._t1
    assert len(queue) - live_t1 <= live_t1 // 4 + key_queue.COMPACT_SLACK
    check_invariants(h.policy)


# -- the optimised structures against a plain reference ----------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("compact_slack", [0, 256])
def test_matches_the_reference_on_random_workloads(
    seed: int, compact_slack: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without slack the tombstone queues rebuild themselves often, which must be invisible.
    monkeypatch.setattr(key_queue, "COMPACT_SLACK", compact_slack)
    c = random.Random(seed).choice((3, 8, 25))
    policy = ARCCachePolicy(c)
    ref = ReferenceARCCachePolicy(c)

    def same_state() -> None:
        expected = (ref.p, list(ref.t1), list(ref.t2), list(ref.b1), list(ref.b2))
        assert (policy.p, policy.t1, policy.t2, policy.b1, policy.b2) == expected
        assert len(policy) == len(ref)
        check_invariants(policy)

    match_reference(policy, ref, c, seed, same_state)


# -- through the manager -----------------------------------------------------------------


def test_manager_resolves_arc_and_keeps_a_hot_prefix_through_a_scan() -> None:
    manager = CPUOffloadingManager(100, cache_policy="arc")
    assert isinstance(manager.policy, ARCCachePolicy)
    hot = [k(i) for i in range(60)]
    assert run_request(manager, hot) == 0
    assert run_request(manager, hot) == 60
    for i in range(1000):
        run_request(manager, [k(10_000 + i)])
    assert run_request(manager, hot) == 60
    stats = manager.get_stats()
    assert stats.resident_blocks == 100
    assert stats.evictions == 1000 - 40


def test_manager_with_arc_never_evicts_pinned_or_pending_blocks() -> None:
    manager = CPUOffloadingManager(8, cache_policy="arc")
    ctx = ReqContext(req_id="a")
    first = [k(i) for i in range(4)]
    out = manager.prepare_store(first, ctx)
    assert out is not None
    manager.complete_store(first, ctx)
    manager.prepare_load(first[:2], ctx)  # pinned
    pending = [k(i) for i in range(10, 14)]
    assert manager.prepare_store(pending, ctx) is not None  # fills the cache, left pending
    assert manager.prepare_store([k(20), k(21), k(22)], ctx) is None, "only 2 evictable"
    out = manager.prepare_store([k(20), k(21)], ctx)
    assert out is not None and sorted(out.evicted_keys) == sorted(first[2:])
    assert manager.lookup(k(1), ctx) is LookupResult.HIT
    assert manager.lookup(k(10), ctx) is LookupResult.PENDING
    assert manager.lookup(k(2), ctx) is LookupResult.MISS
    manager.reset_cache()
    policy = manager.policy
    assert isinstance(policy, ARCCachePolicy)
    assert len(policy) == 0 and policy.p == 0.0
