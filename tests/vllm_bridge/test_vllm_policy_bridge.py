"""Every installed kv-offload policy inside vLLM 0.33's own, unmodified CPUOffloadingManager.

vLLM resolves the policy through its own CachePolicyFactory, from the config keys a user
writes (``eviction_policy`` + ``cache_policy_module_path``); nothing of vLLM is replaced.
"""

from __future__ import annotations

import pytest
from _scheduler_replay import load_trace, replay_kv_offload, replay_vllm
from _vllm import require_vllm
from kv_offload import CachePolicyFactory, CPUOffloadingManager, PluginError, PluginNotFoundError

vllm_manager = require_vllm("vllm.v1.kv_offload.cpu.manager")
vllm_factory = require_vllm("vllm.v1.kv_offload.cpu.policies.factory")
vllm_base = require_vllm("vllm.v1.kv_offload.base")

import kv_offload_vllm  # noqa: E402 - after the skip: the bridge is useless without vLLM

TRACE_REQUESTS = 3000
POLICIES = sorted({info.name for info in CachePolicyFactory.available_policies()})


@pytest.fixture(scope="module")
def trace() -> list[tuple[str, list[bytes]]]:
    return load_trace(TRACE_REQUESTS)


def bridged_manager(policy: str, capacity: int) -> object:
    """vLLM's manager, configured the way the README tells users to."""
    return vllm_manager.CPUOffloadingManager(
        capacity,
        cache_policy=f"kvo_{policy}",
        cache_policy_module_path=kv_offload_vllm.POLICY_MODULE_PATH,
    )


def test_bridged_names_resolve_through_vllms_own_factory() -> None:
    for policy in POLICIES:
        cls = vllm_factory.CachePolicyFactory.get_cache_policy_cls(
            f"kvo_{policy}", kv_offload_vllm.POLICY_MODULE_PATH
        )
        assert issubclass(cls, require_vllm("vllm.v1.kv_offload.cpu.policies.base").CachePolicy)
        assert cls.kvo_policy_class is CachePolicyFactory.get_cache_policy_cls(policy)
    # Without the prefix vLLM's registry answers with its own built-in, not ours.
    builtin = vllm_factory.CachePolicyFactory.get_cache_policy_cls(
        "arc", kv_offload_vllm.POLICY_MODULE_PATH
    )
    assert builtin.__module__.startswith("vllm.")


def test_unknown_policy_is_a_clear_error_through_vllm() -> None:
    with pytest.raises(PluginNotFoundError, match="no_such_policy"):
        bridged_manager("no_such_policy", 10)


@pytest.mark.parametrize("capacity", [1000, 5000])
@pytest.mark.parametrize("policy", POLICIES)
def test_bridged_hit_ratio_equals_kv_offload_manager(
    policy: str, capacity: int, trace: list[tuple[str, list[bytes]]]
) -> None:
    bridged = replay_vllm(bridged_manager(policy, capacity), trace)
    own = replay_kv_offload(CPUOffloadingManager(capacity, cache_policy=policy), trace)
    assert bridged.blocks == own.blocks
    assert bridged.evicted_blocks > 0, "the capacity must be small enough to evict"
    assert bridged.hit_blocks > 0
    assert (bridged.hit_blocks, bridged.stored_blocks, bridged.evicted_blocks) == (
        own.hit_blocks,
        own.stored_blocks,
        own.evicted_blocks,
    )
    assert bridged.rejected_stores == own.rejected_stores
    # Stores ran while the next request's hits were pinned by their in-flight load.
    assert bridged.evicted_in_use == []


@pytest.mark.parametrize("policy", POLICIES)
def test_pinned_and_pending_blocks_are_never_evicted(policy: str) -> None:
    ReqContext = vllm_base.ReqContext
    manager = bridged_manager(policy, 4)
    ctx = ReqContext("a")
    manager.on_new_request(ctx)
    keys = [bytes([i]) * 8 + b"\0\0\0\0" for i in range(8)]
    out = manager.prepare_store(keys[:4], ctx)
    manager.complete_store(keys[:2], ctx)  # keys 2, 3 stay pending
    manager.prepare_load(keys[:1], ctx)  # key 0 pinned
    # Two free slots are needed, only key 1 is idle: vLLM's manager refuses, nothing changes.
    assert manager.prepare_store(keys[4:6], ctx) is None
    out = manager.prepare_store(keys[4:5], ctx)
    assert out.evicted_keys == [keys[1]]
    for key in keys[:1] + keys[2:5]:
        assert manager.lookup(key, ctx) is not vllm_base.LookupResult.MISS


BROKEN_POLICY = """
from kv_offload_lru import LRUCachePolicy

class EvictsPinned(LRUCachePolicy):
    '''Returns the first block it holds, ignoring ref counts and protection.'''

    def evict(self, n, protected):
        key = next(iter(self._blocks))
        block = self._blocks.pop(key)
        return [(key, block)]

class EvictsTwice(LRUCachePolicy):
    '''Returns its (correct) victims twice over.'''

    def evict(self, n, protected):
        victims = super().evict(n, protected)
        return None if victims is None else victims + victims
"""


@pytest.mark.parametrize(
    ("class_name", "problem"),
    [("EvictsPinned", "is pinned, ref_cnt=1"), ("EvictsTwice", "got 2 pair")],
)
def test_broken_policy_is_caught_naming_the_plugin(
    make_module: object, class_name: str, problem: str
) -> None:
    module = make_module(BROKEN_POLICY)  # type: ignore[operator]
    name = f"broken_{class_name.lower()}"
    CachePolicyFactory.register_cache_policy(name, module, class_name)
    try:
        ReqContext = vllm_base.ReqContext
        manager = bridged_manager(name, 2)
        ctx = ReqContext("a")
        manager.on_new_request(ctx)
        keys = [bytes([i]) * 8 for i in range(4)]
        manager.complete_store(manager.prepare_store(keys[:2], ctx).keys_to_store, ctx)
        manager.prepare_load(keys[:1], ctx)  # the first block is pinned
        with pytest.raises(PluginError, match=problem) as info:
            manager.prepare_store(keys[2:3], ctx)
        assert info.value.plugin == name
        assert f"kvo_{name}" in str(info.value) and "evict() contract" in str(info.value)
        assert manager.lookup(keys[0], ctx) is vllm_base.LookupResult.HIT
    finally:
        CachePolicyFactory.unregister_cache_policy(name)
