"""Issue 10 #1: a policy whose ``evict()`` breaks its contract leaves no hidden damage.

Contract-breaking victims are put back (the manager is as it was); an ``evict()`` that raises
half-way marks the manager failed until ``reset_cache()`` (see ``kv_offload/cpu/eviction.py``).
The policy is the real LRU plugin with the method the manager asks (``evict_split``, or
``evict`` for a policy that answers in vLLM's pairs only) replaced by a broken one on the
instance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _dists import ModuleFactory
from kv_offload import (
    CPUOffloadingManager,
    LookupResult,
    ManagerError,
    PluginError,
    ReqContext,
    make_offload_key,
)
from kv_offload.policies.base import splits_victims
from kv_offload_lru import LRUCachePolicy

CTX = ReqContext(req_id="evict")
HIT, MISS = LookupResult.HIT, LookupResult.MISS


def k(i: int) -> bytes:
    return make_offload_key(i)


#: Answers through ``evict()`` alone, as a vLLM policy does: the manager asks ``evict()``.
PAIRS_ONLY_LRU = """
from kv_offload_lru import LRUCachePolicy

class PairsOnlyLRU(LRUCachePolicy):
    def evict(self, n, protected):
        return super().evict(n, protected)
"""


@pytest.fixture(params=["evict", "evict_split"])
def form(request: pytest.FixtureRequest) -> str:
    """Which answer the manager asks for: ``evict()``'s pairs or ``evict_split``'s lists."""
    return str(request.param)


@pytest.fixture
def full_manager(
    form: str, make_module: ModuleFactory, register_policy: Callable[..., None]
) -> CPUOffloadingManager:
    """4 slots: k0, k1 idle, k2 pinned, k3 idle; no slot free."""
    if form == "evict":
        register_policy("pairs-only-lru", make_module(PAIRS_ONLY_LRU), "PairsOnlyLRU")
        manager = CPUOffloadingManager(4, cache_policy="pairs-only-lru")
    else:
        manager = CPUOffloadingManager(4)
    assert splits_victims(type(manager.policy)) is (form == "evict_split")
    out = manager.prepare_store([k(0), k(1), k(2), k(3)], CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    manager.prepare_load([k(2)], CTX)
    return manager


def break_evict(manager: CPUOffloadingManager, broken: Callable[..., Any]) -> Callable[[], None]:
    """Make the method the manager asks answer ``broken(policy, real, n, protected)`` (pairs,
    or anything a broken policy returns); returns what repairs it."""
    policy = manager.policy

    def real(n: int, protected: set[bytes]) -> Any:  # the policy's own answer, as pairs
        answer = LRUCachePolicy.evict_split(policy, n, protected)
        return None if answer is None else list(zip(*answer))

    def split(n: int, protected: set[bytes]) -> Any:
        answer = broken(policy, real, n, protected)
        try:
            return [key for key, _ in answer], [block for _, block in answer]
        except (TypeError, ValueError):
            return answer

    if splits_victims(type(manager.policy)):
        policy.evict_split = split  # type: ignore[method-assign]
        return lambda: delattr(policy, "evict_split")
    policy.evict = lambda n, protected: broken(policy, real, n, protected)  # type: ignore[method-assign]
    return lambda: delattr(policy, "evict")


def returns_a_pinned_block(policy: Any, real: Any, n: int, protected: set[bytes]) -> Any:
    victims = real(n - 1, protected) if n > 1 else []
    pinned = policy.get(k(2))
    policy.remove(k(2))  # the hidden damage: the pinned block is gone from the policy
    return [*victims, (k(2), pinned)]


def returns_too_many(policy: Any, real: Any, n: int, protected: set[bytes]) -> Any:
    return real(n + 1, protected)


def returns_no_pairs(policy: Any, real: Any, n: int, protected: set[bytes]) -> Any:
    real(n, protected)  # removed from the policy, and the manager cannot tell which
    return 5


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
def test_contract_breaking_victims_are_put_back(
    broken: Any, form: str, full_manager: CPUOffloadingManager
) -> None:
    manager = full_manager
    before = state(manager)
    repair = break_evict(manager, broken)
    with pytest.raises(PluginError, match="broke the evict\\(\\) contract") as info:
        manager.prepare_store([k(4)], CTX)
    assert info.value.plugin == manager.cache_policy_name
    assert f"fix the policy's {form}()" in str(info.value)
    assert state(manager) == before
    assert [manager.lookup(k(i), CTX) for i in range(4)] == [HIT] * 4
    manager.complete_load([k(2)], CTX)  # the pinned block is still the manager's
    repair()
    # The put-back blocks are evictable again (their recency is that of a new insert).
    out = manager.prepare_store([k(4)], CTX)
    assert out is not None and len(out.evicted_keys) == 1
    assert manager.get_stats().evictions == before[0].evictions + 1


@pytest.mark.parametrize(
    ("broken", "error"),
    [(raises_half_way, "RuntimeError: evict crashed half-way"), (returns_no_pairs, "got 5")],
)
def test_evict_raising_half_way_fails_the_manager_until_reset(
    broken: Any, error: str, full_manager: CPUOffloadingManager
) -> None:
    manager = full_manager
    break_evict(manager, broken)
    with pytest.raises(PluginError, match=error) as info:
        manager.prepare_store([k(4)], CTX)
    assert info.value.plugin == manager.cache_policy_name
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


#: Names a key it never held as its victim (keeping the key it really took the slot from):
#: handing that slot out would give one slot to two keys.
FOREIGN_VICTIM_LRU = """
from kv_offload import make_offload_key
from kv_offload_lru import LRUCachePolicy

class ForeignVictimLRU(LRUCachePolicy):
    def evict_split(self, n, protected):
        got = super().evict_split(n, protected)
        if got is None:
            return None
        keys, blocks = got
        self.insert(keys[0], blocks[0])  # still holds the real victim...
        self.mark_evictable(keys[0])
        return [make_offload_key(999_999), *keys[1:]], blocks  # ...and names another key
"""


def test_a_victim_the_policy_does_not_hold_never_gets_a_slot_twice(
    make_module: ModuleFactory, register_policy: Callable[..., None]
) -> None:
    """It was accepted: prepare_store gave k0's slot to k10 while k0 still lived there (and a
    tiered stack then raised an internal RuntimeError with keys PENDING forever). Now the
    call raises PluginError naming the policy, no slot is handed out twice, and the victims
    it did remove are put back: the slot table records which key each slot was given."""
    register_policy("foreign-victim", make_module(FOREIGN_VICTIM_LRU), "ForeignVictimLRU")
    m = CPUOffloadingManager(4, cache_policy="foreign-victim")
    ctx = ReqContext(req_id="r")
    out = m.prepare_store([k(i) for i in range(4)], CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)
    before = m.get_stats()
    with pytest.raises(PluginError, match="'foreign-victim' broke the evict") as exc:
        m.prepare_store([k(10)], ctx)
    assert exc.value.plugin == "foreign-victim"
    assert "not one it held" in str(exc.value)
    assert m.get_stats() == before
    assert [m.lookup(k(i), ctx) for i in (0, 1, 2, 3, 10)] == [HIT] * 4 + [MISS]
    assert sorted(m.block_id(k(i)) for i in range(4)) == [0, 1, 2, 3]  # type: ignore[type-var]


#: A policy shaped as vLLM's ``CachePolicy`` is (one dict, ``evict()`` pairs, no ``__len__``)
#: whose ``evict()`` breaks as ``BROKEN`` says: ``"twice"`` names the same idle victim ``n``
#: times (removing it once); ``"foreign"`` names keys it never held, each with an idle slot of
#: a key it holds, and removes nothing; ``"swapped"`` removes its victims but names keys it
#: never held in their place. ``Sized`` is the same with ``__len__``.
VLLM_SHAPED = """
from kv_offload.policies import CachePolicy


class VllmShaped(CachePolicy):
    BROKEN = ""

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        self.blocks = {}

    def get(self, key):
        return self.blocks.get(key)

    def insert(self, key, block):
        self.blocks[key] = block

    def remove(self, key):
        self.blocks.pop(key, None)

    def touch(self, keys, req_context):
        for key in keys:
            if key in self.blocks:
                self.blocks[key] = self.blocks.pop(key)

    def clear(self):
        self.blocks.clear()

    def evict(self, n, protected):
        idle = [(k, b) for k, b in self.blocks.items() if b.ref_cnt == 0 and k not in protected]
        if len(idle) < n:
            return None
        if self.BROKEN == "foreign":
            return [(b"ghost-%d" % i, block) for i, (_, block) in enumerate(idle[:n])]
        victims = [idle[0]] * n if self.BROKEN == "twice" else idle[:n]
        for key, _ in dict(victims).items():
            del self.blocks[key]
        if self.BROKEN == "swapped":
            return [(b"ghost-%d" % i, block) for i, (_, block) in enumerate(victims)]
        return victims


class Sized(VllmShaped):
    def __len__(self):
        return len(self.blocks)
"""


@pytest.mark.parametrize("sized", [False, True], ids=["no-len", "len"])
def test_an_evict_naming_one_victim_twice_never_gives_a_slot_twice(
    sized: bool, make_module: ModuleFactory
) -> None:
    """Issue 37 #1: with no ``__len__`` (vLLM's CachePolicy has none) ``prepare_store([k4,
    k5])`` handed slot 0 to both new keys (store_spec [0, 0]) when evict() named one idle
    victim twice: complete_store then raised an internal RuntimeError and k0, k4, k5 answered
    PENDING forever. Now the call raises the PluginError naming the policy, and the manager
    is as it was."""
    name = "Sized" if sized else "VllmShaped"
    m = vllm_shaped_full(sized, make_module)
    before = state(m)
    m.policy.BROKEN = "twice"  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match=r"broke the evict\(\) contract") as info:
        m.prepare_store([k(4), k(5)], CTX)
    assert info.value.plugin == name and info.value.kind == "policy"
    assert "named twice" in str(info.value)
    assert state(m) == before  # stats, ref counts and slots: nothing given, nothing pending
    assert [m.lookup(k(i), CTX) for i in range(6)] == [HIT] * 4 + [MISS] * 2
    m.policy.BROKEN = ""  # type: ignore[attr-defined]
    out = m.prepare_store([k(4), k(5)], CTX)
    assert out is not None and len(set(out.store_spec.block_ids.tolist())) == 2
    m.complete_store(out.keys_to_store, CTX)
    assert [m.lookup(key, CTX) for key in (k(4), k(5))] == [HIT, HIT]
    stats = m.get_stats()
    assert (stats.resident_blocks, stats.pending_blocks, stats.evictions) == (4, 0, 2)


def vllm_shaped_full(sized: bool, make_module: ModuleFactory) -> CPUOffloadingManager:
    """A 4-block manager over ``VllmShaped`` (or ``Sized``), loaded from a module path as a
    user loads an out-of-tree policy, holding k0..k3 idle."""
    name = "Sized" if sized else "VllmShaped"
    with pytest.warns(Warning, match="out-of-tree policy"):
        m = CPUOffloadingManager(
            4, cache_policy=name, cache_policy_module_path=make_module(VLLM_SHAPED)
        )
    assert hasattr(m.policy, "__len__") is sized
    out = m.prepare_store([k(i) for i in range(4)], CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)
    return m


@pytest.mark.parametrize("sized", [False, True], ids=["no-len", "len"])
def test_an_evict_naming_keys_it_does_not_hold_never_gives_a_slot_twice(
    sized: bool, make_module: ModuleFactory
) -> None:
    """Issue 37 #1, the other shape: evict() names keys it never held, each with the idle
    slot of a key it still holds. Without ``__len__`` this was accepted, and the slots of
    k0 and k1 were handed to k4 and k5 while k0 and k1 still lived there. Now: the
    PluginError, and the manager as it was."""
    m = vllm_shaped_full(sized, make_module)
    before = state(m)
    m.policy.BROKEN = "foreign"  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match=r"broke the evict\(\) contract") as info:
        m.prepare_store([k(4), k(5)], CTX)
    assert info.value.kind == "policy" and "not one it held" in str(info.value)
    assert state(m) == before
    assert [m.lookup(k(i), CTX) for i in range(6)] == [HIT] * 4 + [MISS] * 2
    m.policy.BROKEN = ""  # type: ignore[attr-defined]
    out = m.prepare_store([k(4), k(5)], CTX)
    assert out is not None and len(set(out.store_spec.block_ids.tolist())) == 2
    m.complete_store(out.keys_to_store, CTX)
    assert [m.lookup(key, CTX) for key in (k(4), k(5))] == [HIT, HIT]
    assert m.get_stats().resident_blocks == 4


@pytest.mark.parametrize("sized", [False, True], ids=["no-len", "len"])
def test_an_evict_that_drops_its_victims_and_names_others_fails_the_manager(
    sized: bool, make_module: ModuleFactory
) -> None:
    """evict() removes k0 and k1 but names keys it never held: no slot is handed out, and
    since the policy dropped keys it did not name, the manager refuses reads (naming the
    policy) until reset_cache(); no key is left PENDING."""
    m = vllm_shaped_full(sized, make_module)
    m.policy.BROKEN = "swapped"  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match=r"broke the evict\(\) contract") as info:
        m.prepare_store([k(4), k(5)], CTX)
    assert "dropped key" in str(info.value)
    stats = m.get_stats()
    assert (stats.resident_blocks, stats.pending_blocks) == (4, 0)
    with pytest.raises(ManagerError, match=r"VllmShaped|Sized"):
        m.lookup(k(2), CTX)
    m.reset_cache()
    m.policy.BROKEN = ""  # type: ignore[attr-defined]
    out = m.prepare_store([k(4), k(5)], CTX)
    assert out is not None and len(set(out.store_spec.block_ids.tolist())) == 2
