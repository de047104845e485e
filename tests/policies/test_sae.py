"""Session-aware eviction (kv-offload-sae): sessions inferred from prefix sharing, the worst
session evicted first and tail first, the evict() contract, and the same decisions as its
plain reference, step by step and through the manager."""

from __future__ import annotations

import random

import pytest
from _policy_harness import CTX, PolicyHarness, k, match_reference, run_request
from kv_offload import CPUOffloadingManager, OffloadKey
from kv_offload.policies import CachePolicyFactory
from kv_offload_sae import SessionAwareCachePolicy
from kv_offload_sae.reference import ReferenceSessionAwarePolicy


def keys(*ids: int) -> list[OffloadKey]:
    return [k(i) for i in ids]


def manager_with_sae(capacity: int) -> tuple[CPUOffloadingManager, SessionAwareCachePolicy]:
    manager = CPUOffloadingManager(capacity, cache_policy="sae")
    policy = manager.policy
    assert isinstance(policy, SessionAwareCachePolicy)
    return manager, policy


# -- sessions from prefix sharing ----------------------------------------------------------


def test_a_turn_extends_its_conversation_and_a_shared_prefix_becomes_the_parent() -> None:
    manager, policy = manager_with_sae(100)
    run_request(manager, keys(1, 2, 3, 4), "a-1")  # system prompt 1, 2; conversation a: 3, 4
    assert policy.sessions() == [keys(1, 2, 3, 4)]
    run_request(manager, keys(1, 2, 3, 4, 5, 6), "a-2")  # a's next turn: the same session
    assert policy.sessions() == [keys(1, 2, 3, 4, 5, 6)]
    run_request(manager, keys(1, 2, 7, 8), "b-1")  # b shares the system prompt only
    assert policy.sessions() == [keys(3, 4, 5, 6), keys(1, 2), keys(7, 8)]
    run_request(manager, keys(1, 2, 9), "c-1")  # another branch under the same prefix
    assert policy.sessions() == [keys(3, 4, 5, 6), keys(1, 2), keys(7, 8), keys(9)]
    run_request(manager, keys(1, 2, 7, 8, 10), "b-2")
    assert policy.sessions()[2] == keys(7, 8, 10)


def test_a_stored_block_whose_prefix_is_gone_starts_a_session() -> None:
    manager, policy = manager_with_sae(100)
    run_request(manager, keys(1, 2), "a")
    policy.remove(k(1))
    policy.remove(k(2))
    run_request(manager, keys(1, 2, 3), "b")  # k1 and k2 are stored again: one chain
    assert policy.sessions() == [keys(1, 2, 3)]
    policy.remove(k(2))
    run_request(manager, keys(1, 2, 3, 4), "c")
    # k1 hits; the store offers k2, k3, k4 and allocates k2 and k4 (k3 is resident): k2
    # continues k1 from the middle of [k1, k3] (a branch under a split), k4 continues k3.
    assert {tuple(chain) for chain in policy.sessions()} == {(k(1),), (k(3), k(4)), (k(2),)}


def test_without_the_request_callbacks_a_store_is_one_chain() -> None:
    h = PolicyHarness(SessionAwareCachePolicy(10), 10)
    h.store(keys(1, 2, 3))
    h.store(keys(4, 5))
    assert h.policy.sessions() == [keys(1, 2, 3), keys(4, 5)]


# -- which blocks go ------------------------------------------------------------------------


def test_the_worst_session_goes_first_and_its_tail_first() -> None:
    manager, policy = manager_with_sae(100)
    run_request(manager, keys(1, 2, 3), "a")
    run_request(manager, keys(11, 12, 13), "b")
    victims = policy.evict(2, set())
    assert victims is not None
    # No session has come back yet, so the typical gap is 0 and a is overdue (b, used now,
    # is not): a goes first, tail first.
    assert [key for key, _ in victims] == keys(3, 2)
    run_request(manager, keys(11, 12, 13), "b-2")  # b comes back: a gap of 1 request
    run_request(manager, keys(21, 22), "c")
    victims = policy.evict(2, set())
    assert victims is not None
    # a (k1) is overdue. Then every session is expected back sooner than the cache takes to
    # fill (100 blocks at 2 stored per request), where LRU order would keep it too: the
    # least recently used goes first, b.
    assert [key for key, _ in victims] == keys(1, 13)


def test_an_ended_conversation_goes_before_a_live_one() -> None:
    manager, policy = manager_with_sae(1000)
    run_request(manager, keys(1, 2), "old-1")
    run_request(manager, keys(1, 2, 3), "old-2")  # old's gap: 1 request
    for turn in range(10):  # another conversation takes turns; old is silent
        run_request(manager, keys(100, *range(101, 102 + turn)), f"new-{turn}")
    victims = policy.evict(1, set())
    assert victims is not None and victims[0][0] == k(3), "old is overdue: its tail goes"


def test_sessions_that_return_beat_lru_on_a_loop_larger_than_the_cache() -> None:
    """Ten conversations take turns round-robin, each a chain of 6 blocks, through a cache of
    40: LRU evicts each just before it returns and never hits. Once evicted blocks come back
    (their ghosts teach the gap, 10 requests, longer than it takes to store a cache's
    worth of blocks), sae evicts the session expected back last and keeps the others."""
    conversations = [[k(100 * c + i) for i in range(6)] for c in range(10)]
    hits = {}
    for name in ("lru", "sae"):
        manager = CPUOffloadingManager(40, cache_policy=name)
        hits[name] = sum(
            run_request(manager, chain, f"{c}-{turn}")
            for turn in range(6)
            for c, chain in enumerate(conversations)
        )
    assert hits["lru"] == 0
    assert hits["sae"] > 100


def test_branches_go_before_the_prefix_they_hang_from() -> None:
    manager, policy = manager_with_sae(100)
    run_request(manager, keys(1, 2, 3), "a")
    run_request(manager, keys(1, 2, 4), "b")
    victims = policy.evict(3, set())
    assert victims is not None
    assert {key for key, _ in victims[:2]} == {k(3), k(4)}, "the two branches first"
    assert victims[2][0] == k(2), "then the shared prefix, tail first"


# -- the evict() contract ------------------------------------------------------------------


def test_evict_is_all_or_nothing_and_skips_busy_and_protected_blocks() -> None:
    h = PolicyHarness(SessionAwareCachePolicy(6), 6)
    h.store(keys(0, 1, 2))
    h.store(keys(3, 4, 5))
    h.set_ref(k(5), 1)  # pinned
    h.set_ref(k(1), -1)  # pending
    before = (h.policy.sessions(), [h.policy.get(key) for key in keys(0, 1, 2, 3, 4, 5)])
    assert h.policy.evict(4, {k(3)}) is None, "only k0, k2 and k4 are idle and unprotected"
    assert h.policy.evict(7, set()) is None
    assert (h.policy.sessions(), [h.policy.get(key) for key in keys(0, 1, 2, 3, 4, 5)]) == before
    victims = h.policy.evict(2, {k(3)})  # the older chain is overdue: it goes, tail first
    assert victims is not None and [key for key, _ in victims] == keys(2, 0)
    assert all(block.ref_cnt == 0 for _, block in victims)
    assert h.policy.evict(0, set()) == []
    assert h.policy.sessions() == [keys(1), keys(3, 4, 5)]


def test_clear_forgets_everything() -> None:
    manager, policy = manager_with_sae(10)
    run_request(manager, keys(1, 2, 3), "a")
    policy.clear()
    assert len(policy) == 0 and policy.sessions() == []
    run_request(manager, keys(1, 2), "b")
    assert policy.sessions() == [keys(1, 2)]


# -- against the reference -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_reference_on_random_calls(seed: int) -> None:
    c = random.Random(seed).choice((3, 8, 25))
    policy = SessionAwareCachePolicy(c)
    ref = ReferenceSessionAwarePolicy(c)

    def same_state() -> None:
        assert policy.sessions() == ref.chains()
        assert len(policy) == len(ref)

    match_reference(policy, ref, c, seed, same_state, steps=2000)


def conversation_requests(seed: int, count: int) -> list[tuple[str, list[OffloadKey]]]:
    """Interleaved conversations under a few shared system prompts, each turn its last
    prompt plus new blocks, some conversations edited at an earlier turn."""
    rng = random.Random(seed)
    systems = [[k(10_000 * (s + 1) + i) for i in range(rng.randrange(1, 4))] for s in range(3)]
    live: list[list[OffloadKey]] = []
    out = []
    fresh = 0
    for i in range(count):
        if not live or rng.random() < 0.25:
            live.append(list(rng.choice(systems)))
        chain = rng.choice(live)
        if len(chain) > 3 and rng.random() < 0.1:  # an edit: the conversation forks
            chain = chain[: rng.randrange(1, len(chain))]
            live.append(chain)
        for _ in range(rng.randrange(1, 4)):
            fresh += 1
            chain.append(k(fresh))
        out.append((f"r{i}", list(chain)))
        if rng.random() < 0.1:
            live.remove(chain)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_reference_through_the_manager(seed: int) -> None:
    name = "sae-reference-test"
    CachePolicyFactory.register_cache_policy(
        name, "kv_offload_sae.reference", "ReferenceSessionAwarePolicy"
    )
    try:
        requests = conversation_requests(seed, 400)
        capacity = random.Random(seed).choice((20, 60))
        managers = [CPUOffloadingManager(capacity, cache_policy=p) for p in ("sae", name)]
        for req_id, chain in requests:
            hits = [run_request(m, chain, req_id) for m in managers]
            assert hits[0] == hits[1], req_id
            shipped, ref = (m.policy for m in managers)
            assert shipped.sessions() == ref.chains(), req_id
        stats = managers[0].get_stats()
        assert stats.evictions > 0 and stats.hits > 0  # the workload hits and evicts
    finally:
        CachePolicyFactory.unregister_cache_policy(name)


def test_the_heaps_stay_bounded() -> None:
    """Stale heap entries are dropped by the heap that is read; a heap that evictions rarely
    read must still be rebuilt (every heap's length counts), or it grows with every use."""
    manager, policy = manager_with_sae(200)
    for req_id, chain in conversation_requests(7, 3000):
        run_request(manager, chain, req_id)
        bound = 2 * len(policy.sessions()) + 64
        heaps = (policy._by_deadline, policy._by_next_use, policy._by_recency)
        assert max(map(len, heaps)) <= bound, req_id


def test_touch_of_unknown_keys_is_ignored() -> None:
    policy = SessionAwareCachePolicy(4)
    policy.touch([k(1)], CTX)
    policy.remove(k(1))
    assert len(policy) == 0 and policy.sessions() == []
