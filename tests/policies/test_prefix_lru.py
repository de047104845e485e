"""prefix-lru (kv-offload-lru): LRU plus a head-last refresh of a request's keys at its end.

Checked step by step against the plain ``OrderedDict`` statement of the same policy
(``kv_offload_lru.reference.ReferencePrefixLRUCachePolicy``) on random workloads that mix the
request-scoped callbacks in, with the key queue rebuilding itself on every call too; its
memory for requests that never finish is bounded; through the manager it is selected by name
and keeps the shared head of a prefix that plain LRU evicts.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from _policy_harness import CTX, Blocks, k, match_reference, run_request
from kv_offload import (
    CachePolicyFactory,
    CPUOffloadingManager,
    OffloadKey,
    ReqContext,
    build_manager,
)
from kv_offload.block_status import PENDING_REF_CNT
from kv_offload.policies import key_queue
from kv_offload.replay import replay
from kv_offload.trace import read_trace
from kv_offload_lru import LRUCachePolicy, PrefixLRUCachePolicy, prefix
from kv_offload_lru.reference import ReferenceLRUCachePolicy, ReferencePrefixLRUCachePolicy

TRACE = Path(__file__).resolve().parents[2] / "data" / "conversation_trace.jsonl"


def ctx(req_id: str) -> ReqContext:
    return ReqContext(req_id=req_id)


def filled(keys: list[int], blocks: Blocks, capacity: int | None = None) -> PrefixLRUCachePolicy:
    policy = PrefixLRUCachePolicy(capacity or max(len(keys), 1))
    policy.insert_many([k(i) for i in keys], [blocks.new(0) for _ in keys])
    return policy


def check_invariants(policy: PrefixLRUCachePolicy) -> None:
    """One live entry per resident key, every other entry a counted tombstone; the record
    count is the record's size."""
    queue = policy._queue
    assert len(queue) - len(policy) == sum(queue.stale.values())
    assert all(count > 0 for count in queue.stale.values())
    assert sorted(policy.order) == sorted(policy._blocks)
    assert policy._recorded == sum(map(len, policy._asked.values()))


# -- the refresh -----------------------------------------------------------------------------


def test_request_end_makes_its_keys_most_recent_head_last() -> None:
    policy = filled([1, 2, 3, 4, 5, 6], Blocks(10))
    request = ctx("a")
    policy.on_request_access([k(3), k(4)], request)  # its hits
    policy.on_request_access([k(5), k(9)], request)  # its store; k9 is absent: ignored
    assert policy.order == [k(i) for i in (1, 2, 3, 4, 5, 6)]  # nothing moves before the end
    policy.on_request_finished(request)
    assert policy.order == [k(1), k(2), k(6), k(5), k(4), k(3)]
    assert policy._asked == {} and policy._recorded == 0
    check_invariants(policy)


def test_a_request_whose_keys_are_the_newest_is_reordered_in_place() -> None:
    """The common case (hits touched, then the misses stored) leaves no tombstone."""
    blocks = Blocks(10)
    policy = filled([1, 2, 3], blocks)
    request = ctx("a")
    policy.touch([k(2), k(3)], request)  # its hits: the queue is now k1, k3, k2
    policy.on_request_access([k(2), k(3), k(4)], request)
    victims = policy.evict(1, {k(2), k(3), k(4)})
    assert victims is not None and [key for key, _ in victims] == [k(1)]
    policy.insert_many([k(4)], [blocks.new(0)])
    stale_before = sum(policy._queue.stale.values())
    policy.on_request_finished(request)
    assert policy.order == [k(4), k(3), k(2)]
    assert sum(policy._queue.stale.values()) == stale_before
    check_invariants(policy)


def test_keys_evicted_or_removed_before_the_end_are_skipped_and_duplicates_count_once() -> None:
    policy = filled([1, 2, 3, 4], Blocks(10))
    request = ctx("a")
    policy.on_request_access([k(1), k(2), k(1), k(3)], request)
    policy.on_request_access([k(2)], request)
    assert policy._asked["a"] == [k(1), k(2), k(1), k(3), k(2)] and policy._recorded == 5
    victims = policy.evict(1, set())
    assert victims is not None and victims[0][0] == k(1)
    policy.remove(k(3))
    policy.on_request_finished(request)
    assert policy.order == [k(4), k(2)]
    policy.on_request_finished(request)  # twice, or never started: nothing happens
    policy.on_request_finished(ctx("unknown"))
    assert policy.order == [k(4), k(2)]
    check_invariants(policy)


def test_requests_are_kept_apart_and_clear_forgets_their_records() -> None:
    policy = filled([1, 2, 3, 4], Blocks(10))
    policy.on_request_access([k(1)], ctx("a"))
    policy.on_request_access([k(2)], ctx("b"))
    policy.on_request_finished(ctx("b"))
    assert policy.order == [k(1), k(3), k(4), k(2)]
    policy.clear()
    assert len(policy) == 0 and policy._asked == {} and policy._recorded == 0
    policy.insert_many([k(1)], [Blocks(2).new(0)])
    policy.on_request_finished(ctx("a"))  # its record went with the clear
    assert policy.order == [k(1)]


@pytest.mark.parametrize("seed", range(3))
def test_without_request_callbacks_it_is_plain_lru(seed: int) -> None:
    """Callers that never report accesses (or never finish) get lru's decisions, exactly."""
    c = random.Random(seed).choice((3, 8, 25))
    policy = PrefixLRUCachePolicy(c)
    ref = ReferenceLRUCachePolicy(c)

    def same_state() -> None:
        assert policy.order == list(ref.blocks)

    match_reference(policy, ref, c, seed, same_state, steps=1500)


# -- against the plain reference, step by step -------------------------------------------------


def match_prefix_reference(
    policy: PrefixLRUCachePolicy, ref: ReferencePrefixLRUCachePolicy, capacity: int, seed: int
) -> None:
    """Random requests (a few open at once, some never finishing) calling both policies the
    way the manager does: a lookup's hits reported then touched, a store's keys reported then
    evicted for and inserted; plus evictions, pins, removals, clears. After every step the
    order, the blocks ``get`` returns and the per-request records must agree."""
    rng = random.Random(seed)
    blocks = Blocks(200_000)
    universe = rng.choice((2 * capacity, 5 * capacity))
    requests = [f"r{i}" for i in range(rng.choice((2, 6, 12)))]
    for _ in range(2500):
        op = rng.random()
        request = ctx(rng.choice(requests))
        keys = list(dict.fromkeys(k(rng.randrange(universe)) for _ in range(rng.randrange(1, 7))))
        if op < 0.35:  # a store
            policy.on_request_access(keys, request)
            ref.on_request_access(keys, request)
            to_store = [key for key in keys if policy.get(key) is None]
            shortfall = len(policy) + len(to_store) - capacity
            if shortfall > 0:
                victims = policy.evict(shortfall, set(keys))
                assert victims == ref.evict(shortfall, set(keys))
                if victims is None:
                    continue
            new = [blocks.new(rng.choice((0, 0, 0, 0, PENDING_REF_CNT))) for _ in to_store]
            policy.insert_many(to_store, new)
            for key, block in zip(to_store, new):
                ref.insert(key, block)
        elif op < 0.55:  # a load of the resident ones, then their touch
            hits = [key for key in keys if policy.get(key) is not None]
            policy.on_request_access(hits, request)
            ref.on_request_access(hits, request)
            policy.touch(hits, request)
            ref.touch(hits, request)
        elif op < 0.7:
            policy.on_request_finished(request)
            ref.on_request_finished(request)
        elif op < 0.8:
            n = rng.randrange(1, 4)
            assert policy.evict(n, set(keys)) == ref.evict(n, set(keys))
        elif op < 0.9:
            for key in keys:
                resident = policy.get(key)
                if resident is not None:
                    blocks.refs[resident] = rng.choice((PENDING_REF_CNT, 0, 0, 2))
        elif op < 0.995:
            for key in keys:
                policy.remove(key)
                ref.remove(key)
        else:
            policy.clear()
            ref.clear()
        for key in keys:
            assert policy.get(key) is ref.get(key)
        assert policy.order == list(ref.blocks)
        assert policy._asked == ref.requests
        check_invariants(policy)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("compact_slack", [-sys.maxsize, 256])
def test_matches_the_reference_on_random_workloads(
    seed: int, compact_slack: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no slack at all the queue rebuilds itself on every call, which must be invisible.
    monkeypatch.setattr(key_queue, "COMPACT_SLACK", compact_slack)
    c = random.Random(seed).choice((3, 8, 25))
    match_prefix_reference(PrefixLRUCachePolicy(c), ReferencePrefixLRUCachePolicy(c), c, seed)


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_reference_with_tight_record_bounds(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both bounds bite all the time: records are shed and a lone request's is cut."""
    monkeypatch.setattr(prefix, "MAX_OPEN_REQUESTS", 3)
    monkeypatch.setattr(prefix, "MIN_RECORDED_KEYS", 0)  # the key bound is 4 capacities
    c = random.Random(seed).choice((2, 3, 5))
    match_prefix_reference(PrefixLRUCachePolicy(c), ReferencePrefixLRUCachePolicy(c), c, seed)


# -- bounded memory for requests that never finish ---------------------------------------------


def test_requests_that_never_finish_keep_at_most_max_open_requests_records() -> None:
    policy = filled(list(range(10)), Blocks(20))
    for i in range(prefix.MAX_OPEN_REQUESTS + 500):
        policy.on_request_access([k(i % 10)], ctx(f"lost-{i}"))
    assert len(policy._asked) == prefix.MAX_OPEN_REQUESTS
    assert f"lost-{prefix.MAX_OPEN_REQUESTS + 499}" in policy._asked
    assert "lost-499" not in policy._asked and "lost-500" in policy._asked
    check_invariants(policy)


def test_a_request_that_keeps_asking_stays_recorded_while_silent_ones_go() -> None:
    policy = filled(list(range(10)), Blocks(20))
    for i in range(prefix.MAX_OPEN_REQUESTS + 10):
        policy.on_request_access([k(0)], ctx("long-running"))
        policy.on_request_access([k(1)], ctx(f"lost-{i}"))
    assert "long-running" in policy._asked and len(policy._asked) == prefix.MAX_OPEN_REQUESTS


def test_a_request_asking_for_more_than_the_key_bound_keeps_its_head() -> None:
    blocks = Blocks(10)
    policy = filled([0, 1, 2], blocks, capacity=3)
    limit = policy.max_recorded_keys()
    assert limit == prefix.MIN_RECORDED_KEYS
    request = ctx("huge")
    head = [k(i) for i in range(3)]
    policy.on_request_access(head, ctx("other"))
    for start in range(0, 3 * limit, 100):
        policy.on_request_access([k(i) for i in range(start, start + 100)], request)
    assert policy._recorded <= limit and list(policy._asked) == ["huge"]
    assert policy._asked["huge"][:3] == head
    policy.on_request_finished(request)
    assert policy.order == [k(2), k(1), k(0)] and policy._recorded == 0
    check_invariants(policy)


# -- through the manager ---------------------------------------------------------------------


def test_selected_by_name_from_a_toml_config(tmp_path: Path) -> None:
    config = tmp_path / "stack.toml"
    config.write_text('num_blocks = 100\npolicy = "prefix-lru"\n')
    manager = build_manager(config)
    assert type(manager.policy) is PrefixLRUCachePolicy
    assert CachePolicyFactory.get_cache_policy_cls("prefix-lru") is PrefixLRUCachePolicy
    info = next(i for i in CachePolicyFactory.available_policies() if i.name == "prefix-lru")
    assert info.distribution == "kv-offload-lru"


def test_keeps_the_shared_head_of_a_prefix_that_lru_evicts() -> None:
    """A conversation's system prompt (k0..k3) is stored, then each turn hits it and stores
    its own tail. Under lru each tail ends more recent than the head; under prefix-lru the
    head is refreshed last, so other traffic pushes the old tails out first."""
    system = [k(i) for i in range(4)]
    outcomes = {}
    for name in ("lru", "prefix-lru"):
        manager = CPUOffloadingManager(12, cache_policy=name)
        run_request(manager, system, "turn-0")
        run_request(manager, system + [k(100 + i) for i in range(4)], "turn-1")
        for i in range(8):  # unrelated requests, one block each: four evictions
            run_request(manager, [k(1000 + i)], f"other-{i}")
        outcomes[name] = run_request(manager, [*system, k(200)], "turn-2")
    assert outcomes == {"lru": 0, "prefix-lru": 4}


def test_bundled_trace_scores_above_lru_and_matches_the_reference() -> None:
    name = "prefix-lru-reference-test"
    CachePolicyFactory.register_cache_policy(
        name, "kv_offload_lru.reference", "ReferencePrefixLRUCachePolicy"
    )
    try:
        requests = [(ctx(r.req_id), r.keys) for r in read_trace(TRACE)][:2000]
        results = {}
        for policy in ("lru", "prefix-lru", name):
            results[policy] = replay(CPUOffloadingManager(1000, cache_policy=policy), requests)
    finally:
        CachePolicyFactory.unregister_cache_policy(name)
    ours, reference = results["prefix-lru"], results[name]
    assert (ours.hit_blocks, ours.blocks) == (reference.hit_blocks, reference.blocks)
    assert ours.hit_blocks > results["lru"].hit_blocks
    assert isinstance(CPUOffloadingManager(10, "prefix-lru").policy, LRUCachePolicy)


def test_keys_passed_to_on_request_access_are_copied() -> None:
    policy = filled([1, 2, 3], Blocks(4))
    keys: list[OffloadKey] = [k(2)]
    policy.on_request_access(keys, CTX)
    keys.append(k(1))  # the caller reuses its list
    policy.on_request_finished(CTX)
    assert policy.order == [k(1), k(3), k(2)]
