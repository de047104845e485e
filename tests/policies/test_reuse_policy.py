"""Reuse-aware policy (kv-offload-reuse): its rules, the evict() contract, bounded memory,
a step-by-step match with a straightforward reference, and use through the manager."""

from __future__ import annotations

import random

import pytest
from _policy_harness import CTX, PolicyHarness, k, match_reference, run_request
from kv_offload import CPUOffloadingManager, LookupResult, OffloadKey, ReqContext, build_manager
from kv_offload_reuse import SLOTS_PER_BLOCK, WINDOW, ReuseCachePolicy, slot_of
from kv_offload_reuse.reference import ReferenceReusePolicy


class Harness(PolicyHarness[ReuseCachePolicy]):
    def __init__(self, capacity: int) -> None:
        super().__init__(ReuseCachePolicy(capacity), capacity)


def distinct_slots(policy: ReuseCachePolicy, n: int) -> list[OffloadKey]:
    """``n`` keys whose history slots differ (Python's hash is salted per process), so that
    no collision in the table can blur a test of its rules."""
    size = len(policy.memory.table)
    keys: dict[int, OffloadKey] = {}
    i = 0
    while len(keys) < n:
        keys.setdefault(slot_of(k(i), size)[0], k(i))
        i += 1
    return list(keys.values())


def snapshot(policy: ReuseCachePolicy) -> tuple[object, ...]:
    return (
        policy.p,
        policy.t1,
        policy.t2,
        bytes(policy.memory.table),
        policy.memory.epoch,
        policy.memory.stored_in_epoch,
        [list(c) for c in policy.memory.evicted],
    )


# -- the rules -----------------------------------------------------------------------------


def test_first_sightings_go_to_t1_and_a_touch_promotes_to_t2() -> None:
    h = Harness(4)
    h.store([k(1), k(2), k(3)])
    assert h.policy.t1 == [k(1), k(2), k(3)] and h.policy.t2 == []
    h.policy.touch([k(1), k(2)], CTX)
    assert h.policy.t1 == [k(3)] and h.policy.t2 == [k(2), k(1)], "first key most recent"
    assert h.policy.p == 2.0, "p starts at c / 2: no preference before any evidence"


def test_a_block_stored_again_within_the_window_is_a_reuse() -> None:
    c = 8
    h = Harness(c)
    first, *others = distinct_slots(h.policy, 3 * c)
    h.store([first])
    for key in others:  # the first key is evicted, then several caches go by
        h.store([key])
    assert h.policy.get(first) is None
    assert h.policy.remembered(first) is not None
    before = h.policy.p
    h.store([first])
    assert first in h.policy.t2, "remembered beyond ARC's ghost horizon: straight to T2"
    assert h.policy.p == before, "too old for ARC's ghost lists: p does not move"


def test_a_recent_ghost_moves_p_as_in_arc() -> None:
    h = Harness(8)
    keys = distinct_slots(h.policy, 101)

    def k(i: int) -> OffloadKey:
        return keys[i]

    h.store([k(i) for i in range(8)])
    h.policy.touch([k(7)], CTX)  # T1 = 0..6, T2 = [7]; |T1| = 7 > p = 4
    h.store([k(100)])  # evicts k0 from T1
    assert h.policy.remembered(k(0)) == (1, 1), "left T1 one epoch ago (c / 8 = 1 store)"
    assert h.policy.ghost_sizes() == (1, 0)
    h.store([k(0)])  # a B1 hit: p grows by max(1, |B2| / |B1|) = 1
    assert h.policy.p == 5.0 and k(0) in h.policy.t2
    assert h.policy.remembered(k(0)) is None, "the record is consumed"
    h.policy.touch(h.policy.t1, CTX)  # everything in T2 now
    victims = h.policy.evict(1, set())
    assert victims is not None
    (gone, _) = victims[0]
    assert h.policy.remembered(gone) == (2, 0), "left T2 in this epoch"
    h.store([gone])  # a B2 hit: p shrinks by max(1, |B1| / |B2|) = 1
    assert h.policy.p == 4.0


def test_memory_is_bounded_and_forgets_after_the_window() -> None:
    c = 16
    h = Harness(c)
    size = len(h.policy.memory.table)
    assert size == SLOTS_PER_BLOCK * c
    first, *others = distinct_slots(h.policy, (WINDOW + 2) * c)
    h.store([first])
    for key in others[:c]:
        h.store([key])
    assert h.policy.remembered(first) is not None
    for key in others[c:]:
        h.store([key])
    assert h.policy.remembered(first) is None, "evicted more than WINDOW caches of stores ago"
    rng = random.Random(3)
    for i in range(20_000):
        h.store([k(rng.randrange(10**6)) for _ in range(rng.randrange(1, 4))])
        if i % 5 == 0:
            h.policy.touch([k(rng.randrange(10**6))], CTX)
    assert len(h.policy.memory.table) == size
    epochs = {w >> 2 & 63 for w in h.policy.memory.table if w}
    assert len(epochs) <= 64
    # Nothing older than the window: every remembered eviction is at most 63 epochs old.
    stored_since = {(h.policy.memory.epoch - e) % 64 for e in epochs}
    assert max(stored_since) < 64
    assert sum(map(sum, h.policy.memory.evicted)) <= WINDOW * c + c


def test_the_deepest_remembered_key_vouches_for_its_prefix() -> None:
    c = 8
    h = Harness(c)
    chain = distinct_slots(h.policy, 4)
    size = len(h.policy.memory.table)
    taken = {slot_of(key, size)[0] for key in chain}
    # Fillers whose slots miss the chain's, so no collision can blur the test.
    fillers = [key for key in map(k, range(100, 10_000)) if slot_of(key, size)[0] not in taken]
    h.store(chain)
    for key in fillers[: 2 * c]:
        h.store([key])
    assert all(h.policy.remembered(key) is not None for key in chain)
    table = h.policy.memory.table
    slot, _ = slot_of(chain[1], len(table))
    table[slot] = 0  # as if a collision had overwritten k1's record
    h.store([*chain, k(999)])
    assert h.policy.t2[-4:] == chain, "k1 too: k3 was requested before, so was its prefix"
    assert h.policy.t1[-1] == k(999)


def test_remove_leaves_no_memory_and_clear_forgets_everything() -> None:
    h = Harness(4)
    h.store([k(1), k(2)])
    h.policy.remove(k(1))
    h.policy.remove(k(99))  # absent: a no-op
    assert h.policy.get(k(1)) is None and h.policy.remembered(k(1)) is None
    h.store([k(3), k(4), k(5), k(6)])
    h.policy.clear()
    assert len(h.policy) == 0 and h.policy.p == 2.0
    assert not any(h.policy.memory.table)


# -- the evict() contract ------------------------------------------------------------------


def test_evict_is_all_or_nothing_and_skips_busy_and_protected_blocks() -> None:
    h = Harness(6)
    h.store([k(i) for i in range(6)])
    h.policy.touch([k(0), k(1)], CTX)
    h.set_ref(k(2), 1)  # pinned
    h.set_ref(k(3), -1)  # pending
    before = snapshot(h.policy)
    assert h.policy.evict(4, {k(4)}) is None, "only k0, k1 and k5 are idle and unprotected"
    assert snapshot(h.policy) == before
    assert h.policy.evict(7, set()) is None
    assert snapshot(h.policy) == before
    victims = h.policy.evict(2, {k(4)})
    assert victims is not None and [key for key, _ in victims] == [k(5), k(1)]
    assert all(block.ref_cnt == 0 for _, block in victims)
    assert h.policy.evict(0, set()) == []


# -- against the reference -----------------------------------------------------------------


def table_of(policy: ReuseCachePolicy) -> dict[int, tuple[int, int, int]]:
    return {
        slot: (word >> 8, word >> 2 & 63, (word & 3) - 1)
        for slot, word in enumerate(policy.memory.table)
        if word
    }


@pytest.mark.parametrize("seed", range(8))
def test_matches_the_reference_on_random_workloads(seed: int) -> None:
    c = random.Random(seed).choice((3, 8, 25))
    policy = ReuseCachePolicy(c)
    ref = ReferenceReusePolicy(c)

    def same_state() -> None:
        assert (policy.p, policy.t1, policy.t2) == ref.state()
        assert table_of(policy) == ref.table
        assert len(policy) == len(ref.t1) + len(ref.t2)

    match_reference(policy, ref, c, seed, same_state, steps=2500)


# -- through the manager -------------------------------------------------------------------


def test_selected_by_name_in_config_and_keeps_a_returning_conversation() -> None:
    manager = build_manager({"num_blocks": 100, "policy": "reuse"})
    assert isinstance(manager.policy, ReuseCachePolicy)
    convo = [k(i) for i in range(40)]
    assert run_request(manager, convo) == 0
    for i in range(350):  # pushes it out, and past ARC's ghost horizon
        run_request(manager, [k(10_000 + i)])
    assert run_request(manager, convo) == 0  # ... it comes back: remembered, stored in T2
    for i in range(80):  # one-time blocks now churn through T1 only
        run_request(manager, [k(20_000 + i)])
    # Each block's record can be lost to a hash collision, but the deepest remembered one
    # vouches for the whole prefix before it.
    assert run_request(manager, convo) >= 30
    lru = CPUOffloadingManager(100, cache_policy="lru")
    run_request(lru, convo)
    for i in range(350):
        run_request(lru, [k(10_000 + i)])
    run_request(lru, convo)
    for i in range(80):
        run_request(lru, [k(20_000 + i)])
    assert run_request(lru, convo) == 0, "LRU lost it to the same churn"
    manager.shutdown()


# -- the miniature caches --------------------------------------------------------------------


def test_sample_rate_keeps_miniatures_small() -> None:
    from kv_offload_reuse.duel import MIN_RATE, sample_rate

    for capacity in (100, 2000, 5000, 20_000, 50_000, 10**6):
        rate = sample_rate(capacity)
        assert rate >= MIN_RATE and rate & (rate - 1) == 0
        assert capacity // rate < 1024


def test_miniatures_replay_each_request_and_the_cache_follows_the_leader() -> None:
    manager = CPUOffloadingManager(2000, cache_policy="reuse")
    policy = manager.policy
    assert isinstance(policy, ReuseCachePolicy)
    minis = policy._miniatures
    assert [mini.policy.mode for mini in minis] == ["adaptive", "frequency", "ghosts"]
    assert {mini.capacity for mini in minis} == {2000 // 32}
    rng = random.Random(5)
    prompts = [[k(10**6 * p + i) for i in range(rng.randint(2, 30))] for p in range(400)]
    fresh = iter(range(10**9, 2 * 10**9))
    for i in range(3000):
        prompt = prompts[int(rng.paretovariate(1.0)) % len(prompts)]
        ctx = ReqContext(req_id=f"r{i}")
        keys = [*prompt, *(k(next(fresh)) for _ in range(rng.randint(1, 8)))]
        hits = 0
        while hits < len(keys) and manager.lookup(keys[hits], ctx) is LookupResult.HIT:
            hits += 1
        if hits:
            manager.prepare_load(keys[:hits], ctx)
            manager.complete_load(keys[:hits], ctx)
            manager.touch(keys[:hits], ctx)
        out = manager.prepare_store(keys[hits:], ctx)
        if out is not None:
            manager.complete_store(out.keys_to_store, ctx)
        before = policy.mode
        manager.on_request_finished(ctx)
        scores = {mini.policy.mode: mini.score for mini in minis}
        if policy.mode != before:
            assert scores[policy.mode] == max(scores.values()) > scores[before]
        assert scores[policy.mode] == max(scores.values()) or policy.mode == before
    assert all(mini.score > 0 for mini in minis)
    assert policy._sampled == {}, "every finished request's sampled keys were replayed"
    for mini in minis:
        assert len(mini.policy) + len(mini.free) == mini.capacity, "no miniature slot leaked"


def test_sampled_keys_of_unfinished_requests_are_bounded() -> None:
    from kv_offload_reuse.policy import _MAX_OPEN_REQUESTS

    policy = ReuseCachePolicy(5000)
    for i in range(_MAX_OPEN_REQUESTS + 500):
        policy.on_request_access([k(j) for j in range(i * 40, i * 40 + 40)], ReqContext(f"r{i}"))
    assert len(policy._sampled) <= _MAX_OPEN_REQUESTS


class RecencyOnly(ReuseCachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity, miniatures=False, mode="recency")


def test_the_recency_mode_is_exactly_lru_through_the_manager() -> None:
    from pathlib import Path

    from kv_offload.policies.factory import CachePolicyFactory
    from kv_offload.replay import replay
    from kv_offload.trace import read_trace

    trace = Path(__file__).resolve().parents[2] / "data" / "conversation_trace.jsonl"
    requests = [(ReqContext(r.req_id), r.keys) for r in read_trace(trace, 1500, block_tokens=512)]
    CachePolicyFactory.register_cache_policy("reuse-recency", __name__, "RecencyOnly")
    try:
        for capacity in (200, 1000):
            lru = replay(CPUOffloadingManager(capacity, "lru"), requests)
            recency = replay(CPUOffloadingManager(capacity, "reuse-recency"), requests)
            assert recency.hit_blocks == lru.hit_blocks > 0
    finally:
        CachePolicyFactory.unregister_cache_policy("reuse-recency")


def test_a_touch_in_the_recency_mode_keeps_the_block_in_slot_0() -> None:
    """Regression: the recency mode's touch took ``t1.pop(key) or t2.pop(key)``; a
    BlockStatus is an int, so the block in slot 0 read as absent and left both lists while
    staying resident (never evictable again; the safety net's eviction then broke)."""
    from kv_offload.policies import BlockStatus

    policy = ReuseCachePolicy(4, miniatures=False, mode="recency", safety=False)
    policy.insert_many([k(1), k(2)], [BlockStatus(0), BlockStatus(1)])
    policy.touch([k(1)], CTX)
    assert policy.t1 + policy.t2 == [k(2), k(1)]


def test_an_unknown_mode_is_a_config_error() -> None:
    from kv_offload import ConfigError

    with pytest.raises(ConfigError, match="mode must be one of"):
        ReuseCachePolicy(10, mode="fastest")


def test_in_the_ghosts_mode_only_arcs_own_ghosts_are_reuses() -> None:
    """The ``ghosts`` mode is ARC's rule for T2: a block stored again beyond ARC's ghost
    horizon is a first sighting (T1) even though the long memory remembers it; one that
    comes back while still one of ARC's ghosts goes to T2, with the keys before it."""
    c = 8
    policy = ReuseCachePolicy(c, miniatures=False, mode="ghosts", safety=False)
    h = PolicyHarness(policy, c)
    first, *others = distinct_slots(policy, 3 * c)
    h.store([first])
    for key in others:
        h.store([key])
    assert policy.remembered(first) is not None
    h.store([first])
    assert first in policy.t1 and policy.remembered(first) is None, "too old: T1, consumed"
    keys = distinct_slots(policy, 3 * c + 20)[-12:]
    h.store(keys[:8])
    policy.touch([keys[7]], CTX)  # T1 = keys 0..6, T2 = [7]: T1 is over p = 4
    h.store([keys[8]])  # evicts keys[0] from T1: one of ARC's ghosts now
    assert policy.remembered(keys[0]) is not None
    h.store([keys[9], keys[0]])
    assert keys[0] in policy.t2 and keys[9] in policy.t2, "a ghost and the key before it"
