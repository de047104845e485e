"""Issue 10 #1: a policy whose ``evict()`` breaks its contract leaves no hidden damage.

Contract-breaking victims are put back (the manager is as it was); an ``evict()`` that raises
half-way marks the manager failed until ``reset_cache()`` (see ``kv_offload/cpu/eviction.py``).
The policy is the real LRU plugin with its ``evict`` replaced by a broken one on the instance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    ManagerError,
    PluginError,
    ReqContext,
    make_offload_key,
)

CTX = ReqContext(req_id="evict")
HIT, MISS = LookupResult.HIT, LookupResult.MISS


def k(i: int) -> bytes:
    return make_offload_key(i)


def full_manager() -> CPUOffloadingManager:
    """4 slots: k0, k1 idle, k2 pinned, k3 idle; no slot free."""
    manager = CPUOffloadingManager(4)
    out = manager.prepare_store([k(0), k(1), k(2), k(3)], CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    manager.prepare_load([k(2)], CTX)
    return manager


def break_evict(manager: CPUOffloadingManager, broken: Callable[..., Any]) -> Callable[..., Any]:
    policy = manager.policy
    real = policy.evict
    policy.evict = lambda n, protected: broken(policy, real, n, protected)  # type: ignore[method-assign]
    return real


def returns_a_pinned_block(policy: Any, real: Any, n: int, protected: set[bytes]) -> Any:
    victims = real(n - 1, protected) if n > 1 else []
    pinned = policy.get(k(2))
    policy.remove(k(2))  # the hidden damage: the pinned block is gone from the policy
    return [*victims, (k(2), pinned)]


def returns_too_many(policy: Any, real: Any, n: int, protected: set[bytes]) -> Any:
    return real(n + 1, protected)


def raises_half_way(policy: Any, real: Any, n: int, protected: set[bytes]) -> Any:
    real(1, protected)
    raise RuntimeError("evict crashed half-way")


def state(manager: CPUOffloadingManager) -> Any:
    keys = [k(i) for i in range(5)]
    return (
        manager.get_stats(),
        [manager.ref_count(key) for key in keys],
        [manager.block_id(key) for key in keys],
    )


@pytest.mark.parametrize("broken", [returns_a_pinned_block, returns_too_many])
def test_contract_breaking_victims_are_put_back(broken: Any) -> None:
    manager = full_manager()
    before = state(manager)
    real = break_evict(manager, broken)
    with pytest.raises(PluginError, match="broke the evict\\(\\) contract") as info:
        manager.prepare_store([k(4)], CTX)
    assert info.value.plugin == "lru"
    assert state(manager) == before
    assert [manager.lookup(k(i), CTX) for i in range(4)] == [HIT] * 4
    manager.complete_load([k(2)], CTX)  # the pinned block is still the manager's
    manager.policy.evict = real  # type: ignore[method-assign]
    # The put-back blocks are evictable again (their recency is that of a new insert).
    out = manager.prepare_store([k(4)], CTX)
    assert out is not None and len(out.evicted_keys) == 1
    assert manager.get_stats().evictions == before[0].evictions + 1


def test_evict_raising_half_way_fails_the_manager_until_reset() -> None:
    manager = full_manager()
    break_evict(manager, raises_half_way)
    with pytest.raises(PluginError, match="RuntimeError: evict crashed half-way") as info:
        manager.prepare_store([k(4)], CTX)
    assert info.value.plugin == "lru"
    for call in (
        lambda: manager.lookup(k(2), CTX),
        lambda: manager.complete_load([k(2)], CTX),
        lambda: manager.prepare_store([k(5)], CTX),
    ):
        with pytest.raises(ManagerError, match="manager is failed: call reset_cache"):
            call()
    manager.get_stats()  # introspection of the counters still answers
    manager.reset_cache()
    assert manager.lookup(k(2), CTX) is MISS
    assert manager.num_free_blocks == 4
