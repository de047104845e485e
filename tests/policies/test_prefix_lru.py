"""prefix-lru (kv-offload-lru): vLLM 0.33's LRU as a kv-offload policy.

Checked on the issue's smallest case (a 4-block tier, with and without key positions), on
the rules one at a time (provisional request ranks, the refresh at request end, what a
request's record leaves out), step by step against the plain statement of the same policy
(``kv_offload_lru.reference.ReferencePrefixLRUCachePolicy``) through two managers on seeded
scheduler flows; through the manager it is selected by name and keeps the shared head of a
prefix that plain LRU evicts. ``tests/vllm_bridge/test_vllm_parity.py`` holds it to vLLM's
own ``lru``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _policy_harness import Blocks, k, run_request
from _scheduler_flow import kv_offload_side, run_flow
from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext, build_manager
from kv_offload.policies import CachePolicyFactory
from kv_offload.replay import replay
from kv_offload.trace import read_trace
from kv_offload_lru import PrefixLRUCachePolicy

TRACE = Path(__file__).resolve().parents[2] / "data" / "conversation_trace.jsonl"


def ctx(req_id: str, positions: dict[OffloadKey, int] | None = None) -> ReqContext:
    context = ReqContext(req_id=req_id)
    for key, end in (positions or {}).items():
        context.set_offload_key_position(key, end)
    return context


def positioned(req_id: str, keys: list[OffloadKey]) -> ReqContext:
    """A context with every key's end token, as vLLM's scheduler records them."""
    return ctx(req_id, {key: (i + 1) * 16 for i, key in enumerate(keys)})


def stored(manager: CPUOffloadingManager, keys: list[OffloadKey], context: ReqContext) -> list:
    """Store ``keys`` and complete the store; returns the evicted keys."""
    out = manager.prepare_store(keys, context)
    assert out is not None
    manager.complete_store(out.keys_to_store, context)
    return out.evicted_keys


# -- the case ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "with_positions", "victim"),
    [
        ("prefix-lru", False, 0),
        ("prefix-lru", True, 3),
        ("lru", False, 0),
        ("lru", True, 0),
    ],
)
def test_four_block_tier_evicts_the_running_requests_tail_first_with_positions(
    policy: str, with_positions: bool, victim: int
) -> None:
    """q1 asks for a0..a4; a0..a3 fill a 4-block tier; a4 needs a slot. With positions a
    running request ranks its blocks tail first (vLLM's lru evicts a3), without them in
    store order (a0); plain lru ignores positions."""
    keys = [k(i) for i in range(5)]
    manager = CPUOffloadingManager(4, cache_policy=policy)
    q1 = positioned("q1", keys) if with_positions else ctx("q1")
    manager.on_new_request(q1)
    assert stored(manager, keys[:4], q1) == []
    assert stored(manager, keys[4:], q1) == [keys[victim]]


# -- the rules, one at a time -----------------------------------------------------------------


def test_request_end_makes_its_keys_newest_head_last() -> None:
    manager = CPUOffloadingManager(10, cache_policy="prefix-lru")
    policy = manager.policy
    assert isinstance(policy, PrefixLRUCachePolicy)
    stored(manager, [k(i) for i in range(1, 7)], ctx("fill"))
    request = ctx("a")
    manager.prepare_load([k(3), k(4)], request)  # its hits
    manager.complete_load([k(3), k(4)], request)
    assert policy.order == [k(i) for i in range(1, 7)]  # nothing moves before the end
    stored(manager, [k(5), k(9)], request)  # k5 again (resident), k9 new
    manager.on_request_finished(request)
    assert policy.order == [k(1), k(2), k(6), k(9), k(5), k(4), k(3)]
    manager.on_request_finished(request)  # twice, or never started: nothing happens
    manager.on_request_finished(ctx("unknown"))
    assert policy.order == [k(1), k(2), k(6), k(9), k(5), k(4), k(3)]


def test_a_running_request_holds_its_blocks_at_one_rank_tail_first() -> None:
    """Its first ask fixes the request's rank: what other requests store later ranks newer,
    and its own later stores join it by position, not at the newest end."""
    manager = CPUOffloadingManager(10, cache_policy="prefix-lru")
    policy = manager.policy
    assert isinstance(policy, PrefixLRUCachePolicy)
    mine = [k(i) for i in range(4)]
    request = positioned("mine", mine)
    stored(manager, mine[:2], request)
    stored(manager, [k(50)], ctx("other"))
    stored(manager, mine[2:], request)
    assert policy.order == [k(3), k(2), k(1), k(0), k(50)]
    manager.on_request_finished(request)
    assert policy.order == [k(50), k(3), k(2), k(1), k(0)]


def test_a_resident_block_asked_for_moves_up_to_the_requests_rank_never_down() -> None:
    manager = CPUOffloadingManager(10, cache_policy="prefix-lru")
    policy = manager.policy
    assert isinstance(policy, PrefixLRUCachePolicy)
    stored(manager, [k(1), k(2)], ctx("old"))
    request = positioned("asks", [k(1), k(7)])
    stored(manager, [k(7)], request)  # the request's rank: newer than k1, k2
    stored(manager, [k(9)], ctx("later"))
    manager.prepare_load([k(1)], request)  # k1 joins the request's rank, head last
    manager.complete_load([k(1)], request)
    assert policy.order == [k(2), k(7), k(1), k(9)]
    late = positioned("late", [k(2), k(12)])
    stored(manager, [k(12)], late)  # the rank of "late" is fixed here
    manager.touch([k(2)], ctx("toucher"))  # a fresh rank, newer than that of "late"
    manager.prepare_load([k(2)], late)  # so k2 stays where it is
    manager.complete_load([k(2)], late)
    assert policy.order == [k(7), k(1), k(9), k(12), k(2)]


def test_blocks_still_being_stored_do_not_join_a_request_that_offers_them() -> None:
    """vLLM's manager leaves a block whose store is in flight out of a store's accesses, so
    the refresh at the end of a request that only offered it again does not move it."""
    manager = CPUOffloadingManager(10, cache_policy="prefix-lru")
    policy = manager.policy
    assert isinstance(policy, PrefixLRUCachePolicy)
    writer = ctx("writer")
    out = manager.prepare_store([k(1)], writer)
    assert out is not None
    stored(manager, [k(2)], ctx("other"))
    again = ctx("again")
    assert manager.prepare_store([k(1)], again) is not None  # pending: not this request's
    manager.on_request_finished(again)
    manager.complete_store([k(1)], writer)
    assert policy.order == [k(1), k(2)]


def test_clear_starts_a_new_generation_of_request_records() -> None:
    manager = CPUOffloadingManager(10, cache_policy="prefix-lru")
    policy = manager.policy
    assert isinstance(policy, PrefixLRUCachePolicy)
    request = ctx("a")
    stored(manager, [k(1), k(2)], request)
    manager.reset_cache()
    stored(manager, [k(3)], ctx("b"))
    stored(manager, [k(4)], ctx("c"))
    manager.on_request_finished(request)  # its record is from before the reset
    assert policy.order == [k(3), k(4)]


# -- against the plain reference, step by step --------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "all", "partial"])
@pytest.mark.parametrize("seed", range(4))
def test_matches_the_reference_through_the_manager(seed: int, mode: str) -> None:
    """Two managers, the shipped policy and its plain statement, on a seeded scheduler flow:
    every lookup, store, eviction, event and counter equal after every step."""
    name = "prefix-lru-reference-flow"
    CachePolicyFactory.register_cache_policy(
        name, "kv_offload_lru.reference", "ReferencePrefixLRUCachePolicy"
    )
    try:
        capacity = (4, 12, 8, 16)[seed]
        filters = {"store_threshold": 2, "max_tracker_size": 25} if seed % 2 else {}
        sides = [
            kv_offload_side(
                policy,
                CPUOffloadingManager(capacity, cache_policy=policy, enable_events=True, **filters),
            )
            for policy in ("prefix-lru", name)
        ]
        report = run_flow(sides, seed, 2000, mode, capacity=capacity, groups=1 + seed % 2)
    finally:
        CachePolicyFactory.unregister_cache_policy(name)
    assert report.evicted_blocks > 0 and report.hits > 0 and report.finished > 0


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


def test_keys_passed_to_on_request_access_are_copied() -> None:
    policy = PrefixLRUCachePolicy(4)
    blocks = Blocks(4)
    policy.insert_many([k(1), k(2), k(3)], [blocks.new(0) for _ in range(3)])
    request = ctx("a")
    keys: list[OffloadKey] = [k(2)]
    policy.on_request_access(keys, request)
    keys.append(k(1))  # the caller reuses its list
    policy.on_request_finished(request)
    assert policy.order == [k(1), k(3), k(2)]
