"""vllm-arc (kv-offload-vllm-arc): vLLM 0.33's ARC variant, rule by rule, through kv-offload's
manager. ``tests/vllm_bridge/test_vllm_parity.py`` holds it to vLLM's own ``arc`` step by
step; these tests need no vLLM and say what each rule is.
"""

from __future__ import annotations

import pytest
from _policy_harness import k
from kv_offload import CPUOffloadingManager, LookupResult, OffloadKey, ReqContext
from kv_offload.policies import CachePolicyFactory
from kv_offload_arc import ARCCachePolicy
from kv_offload_vllm_arc import VLLMARCCachePolicy


def manager_of(capacity: int) -> tuple[CPUOffloadingManager, VLLMARCCachePolicy]:
    manager = CPUOffloadingManager(capacity, cache_policy="vllm-arc")
    policy = manager.policy
    assert isinstance(policy, VLLMARCCachePolicy)
    return manager, policy


def stored(manager: CPUOffloadingManager, keys: list[OffloadKey], ctx: ReqContext) -> list:
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    return out.evicted_keys


def loaded(manager: CPUOffloadingManager, keys: list[OffloadKey], ctx: ReqContext) -> None:
    manager.prepare_load(keys, ctx)
    manager.complete_load(keys, ctx)


def test_selected_by_name_from_its_own_distribution() -> None:
    assert CachePolicyFactory.get_cache_policy_cls("vllm-arc") is VLLMARCCachePolicy
    info = next(i for i in CachePolicyFactory.available_policies() if i.name == "vllm-arc")
    assert info.distribution == "kv-offload-vllm-arc"
    assert CachePolicyFactory.get_cache_policy_cls("arc") is ARCCachePolicy  # unchanged


def test_stores_enter_t1_and_a_reuse_counts_once_at_request_end() -> None:
    manager, policy = manager_of(8)
    first = ReqContext("first")
    stored(manager, [k(0), k(1), k(2)], first)
    manager.on_request_finished(first)
    assert policy.t1 == [k(2), k(1), k(0)] and policy.t2 == []  # head newest
    second = ReqContext("second")
    loaded(manager, [k(0), k(1)], second)
    assert policy.t2 == []  # nothing moves before the request ends
    stored(manager, [k(0), k(1), k(3)], second)  # k0, k1 offered again: still one use
    manager.on_request_finished(second)
    # Reused: k0, k1 to T2, head last; inserted only: k3 to T1's newest end.
    assert policy.t1 == [k(2), k(3)] and policy.t2 == [k(1), k(0)]
    assert manager.lookup(k(0), second) is LookupResult.HIT  # slot 0 (a falsy int) is found


def test_a_returning_ghost_enters_t1_and_moves_the_target_once_per_request() -> None:
    manager, policy = manager_of(2)
    ctx = ReqContext("a")
    stored(manager, [k(0), k(1)], ctx)
    assert stored(manager, [k(2)], ctx) == [k(0)]
    assert policy.b1 == [k(0)] and policy.target == 0
    retry = ReqContext("retry")
    manager.prepare_load([k(1), k(2)], retry)  # both pinned: the store must fail
    assert manager.prepare_store([k(0)], retry) is None
    assert policy.target == 1  # the ghost hit counted at the miss, before the eviction
    assert manager.prepare_store([k(0)], retry) is None
    assert policy.target == 1  # the same request missing it again does not count
    manager.complete_load([k(1), k(2)], retry)
    assert stored(manager, [k(0)], retry) == [k(1)]
    assert policy.target == 1 and k(0) in policy.t1 and k(0) not in policy.b1


def test_eviction_takes_t1_while_it_is_at_least_its_target_else_t2() -> None:
    manager, policy = manager_of(4)
    ctx = ReqContext("fill")
    stored(manager, [k(0), k(1), k(2), k(3)], ctx)
    manager.touch([k(0), k(1)], ctx)  # an explicit touch is an immediate use
    assert policy.t1 == [k(2), k(3)] and policy.t2 == [k(1), k(0)]
    policy._target = 2.0  # T1 holds 2, at its target: T1 gives the first victim
    assert stored(manager, [k(4), k(5)], ReqContext("b")) == [k(2), k(1)]
    assert policy.b1 == [k(2)] and policy.b2 == [k(1)]


def test_touch_keeps_a_block_being_stored_in_t1() -> None:
    manager, policy = manager_of(4)
    ctx = ReqContext("a")
    out = manager.prepare_store([k(0), k(1)], ctx)
    assert out is not None
    manager.touch([k(0)], ctx)
    assert policy.t1 == [k(1), k(0)] and policy.t2 == []


def test_ghost_lists_are_cut_to_the_capacity_each() -> None:
    manager, policy = manager_of(2)
    for i in range(6):
        ctx = ReqContext(f"r{i}")
        stored(manager, [k(i)], ctx)
        manager.on_request_finished(ctx)
    assert policy.t1 == [k(4), k(5)] and policy.b1 == [k(2), k(3)]


def test_reset_cache_forgets_ghosts_target_and_request_records() -> None:
    manager, policy = manager_of(2)
    ctx = ReqContext("a")
    stored(manager, [k(0), k(1)], ctx)
    loaded(manager, [k(0)], ctx)
    stored(manager, [k(2)], ctx)
    policy._target = 1.5
    manager.reset_cache()
    assert (policy.t1, policy.t2, policy.b1, policy.b2, policy.target) == ([], [], [], [], 0)
    stored(manager, [k(0)], ReqContext("b"))
    manager.on_request_finished(ctx)  # its reuse of k0 was before the reset
    assert policy.t1 == [k(0)] and policy.t2 == []


@pytest.mark.parametrize("n", [0, -1])
def test_evicting_nothing_returns_nothing(n: int) -> None:
    assert VLLMARCCachePolicy(4).evict(n, set()) == []
