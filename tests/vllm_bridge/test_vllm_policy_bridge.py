"""Every installed kv-offload policy inside vLLM's own, unmodified CPUOffloadingManager.

vLLM resolves the policy through its own CachePolicyFactory, from the config keys a user
writes (``eviction_policy`` + ``cache_policy_module_path``); nothing of vLLM is replaced.
"""

from __future__ import annotations

import pytest
from _vllm import require_release, require_vllm, vllm_release
from kv_offload import CPUOffloadingManager, PluginError, ReqContext
from kv_offload.errors import PluginNotFoundError
from kv_offload.policies import CachePolicy, CachePolicyFactory

from benchmarks.scheduler_replay import load_trace, replay_kv_offload, replay_vllm

vllm_manager = require_vllm("vllm.v1.kv_offload.cpu.manager")
vllm_factory = require_vllm("vllm.v1.kv_offload.cpu.policies.factory")
vllm_base = require_vllm("vllm.v1.kv_offload.base")

import kv_offload_vllm  # noqa: E402 - after the skip: the bridge is useless without vLLM

TRACE_REQUESTS = 3000
POLICIES = sorted({info.name for info in CachePolicyFactory.available_policies()})


@pytest.fixture(scope="module")
def trace() -> list[tuple[str, list[bytes]]]:
    return load_trace(TRACE_REQUESTS)


def uses_request_access(policy: str) -> bool:
    """Whether the kv-offload policy overrides the optional ``on_request_access``."""
    cls = CachePolicyFactory.get_cache_policy_cls(policy)
    return cls.on_request_access is not CachePolicy.on_request_access


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
    # Stores ran while the next request's hits were pinned by their in-flight load.
    assert bridged.evicted_in_use == []
    if not vllm_release().reports_request_access and uses_request_access(policy):
        # vLLM 0.32 reports a request's accesses only when it finishes: a policy ranking the
        # blocks of running requests by them decides otherwise than under kv-offload's
        # manager, which reports them as they happen (as vLLM 0.33 does).
        return
    assert (bridged.hit_blocks, bridged.stored_blocks, bridged.evicted_blocks) == (
        own.hit_blocks,
        own.stored_blocks,
        own.evicted_blocks,
    )
    assert bridged.rejected_stores == own.rejected_stores


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


RECORDING_POLICY = """
from kv_offload_lru import LRUCachePolicy


class Recording(LRUCachePolicy):
    '''LRU that logs every callback it gets, in order, with its keys.'''

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        self.log = []

    def _note(self, event, keys=()):
        self.log.append((event, tuple(keys)))

    def insert_many(self, keys, blocks):
        self._note("insert_many", keys)
        super().insert_many(keys, blocks)

    def insert(self, key, block):
        self._note("insert", [key])
        super().insert(key, block)

    def remove(self, key):
        self._note("remove", [key])
        super().remove(key)

    def touch(self, keys, req_context):
        self._note("touch", list(keys))
        super().touch(keys, req_context)

    def evict(self, n, protected):
        victims = super().evict(n, protected)
        self._note("evict", [] if victims is None else [k for k, _ in victims])
        return victims

    def mark_evictable(self, key):
        self._note("mark_evictable", [key])

    def mark_non_evictable(self, key):
        self._note("mark_non_evictable", [key])

    def on_request_access(self, keys, req_context):
        self._note("on_request_access", keys)

    def on_store_miss(self, keys, req_context):
        self._note("on_store_miss", keys)

    def on_request_finished(self, req_context):
        self._note("on_request_finished", [req_context.req_id])
"""


def test_bridged_policy_gets_kv_offload_managers_callbacks_in_its_order(
    make_module: object, trace: list[tuple[str, list[bytes]]]
) -> None:
    """The hit ratios above only agree if a policy sees the same calls: vLLM inserts one key
    at a time and reports a store's misses before its accesses, so the bridge must batch the
    inserts and reorder the two callbacks into kv-offload's order."""
    if not vllm_release().reports_request_access:
        pytest.skip("vLLM 0.32 reports a request's accesses only when it finishes")
    module = make_module(RECORDING_POLICY)  # type: ignore[operator]
    CachePolicyFactory.register_cache_policy("recording", module, "Recording")
    try:
        bridged = bridged_manager("recording", 100)
        bridged_run = replay_vllm(bridged, trace[:300])
        own = CPUOffloadingManager(100, cache_policy="recording")
        own_run = replay_kv_offload(own, trace[:300])
        assert own_run.rejected_stores > 0  # stores refused after their miss was reported
        assert bridged_run.rejected_stores == own_run.rejected_stores
        # A failed store: inserted, then removed.
        failing = [bytes([255, i]) * 4 + b"\0\0\0\0" for i in range(3)]
        for manager, context in ((bridged, vllm_base.ReqContext), (own, ReqContext)):
            ctx = context("failing")
            manager.on_new_request(ctx)  # type: ignore[attr-defined]
            out = manager.prepare_store(failing, ctx)  # type: ignore[attr-defined]
            manager.complete_store(out.keys_to_store, ctx, success=False)  # type: ignore[attr-defined]
            manager.on_request_finished(ctx)  # type: ignore[attr-defined]
        bridged_log = bridged._policy.policy.log  # type: ignore[attr-defined]
        own_log = own._policy.log  # type: ignore[attr-defined]
        assert any(event == "evict" and keys for event, keys in own_log)
        assert ("remove", (failing[0],)) in own_log
        assert not any(event == "insert" for event, _ in bridged_log)
        first = next(
            (i for i, (a, b) in enumerate(zip(bridged_log, own_log)) if a != b),
            min(len(bridged_log), len(own_log)),
        )
        assert bridged_log == own_log, (first, bridged_log[first:][:3], own_log[first:][:3])
    finally:
        CachePolicyFactory.unregister_cache_policy("recording")


@pytest.mark.parametrize("capacity", [1000, 5000])
def test_prefix_lru_scores_exactly_vllms_own_lru(
    capacity: int, trace: list[tuple[str, list[bytes]]]
) -> None:
    """kv-offload's ``prefix-lru`` refreshes every block a request asked for at its end, its
    head last, from on_request_access / on_request_finished alone (vLLM's LRU does it from
    the key groups of its on_request_finished): bridged as ``kvo_prefix-lru`` and under
    kv-offload's own manager it gets exactly vLLM's LRU's hits, where plain ``lru``, which
    counts reuse only, gets fewer at 5,000."""
    require_release("0.33", "0.34", claim="prefix-lru's parity with vLLM's built-in lru")
    bridged = replay_vllm(bridged_manager("prefix-lru", capacity), trace)
    builtin = replay_vllm(vllm_manager.CPUOffloadingManager(capacity, "lru"), trace)
    own = replay_kv_offload(CPUOffloadingManager(capacity, cache_policy="prefix-lru"), trace)
    assert bridged.evicted_blocks > 0
    assert bridged.hit_blocks == builtin.hit_blocks == own.hit_blocks
    if capacity == 5000:
        assert replay_vllm(bridged_manager("lru", capacity), trace).hit_blocks < builtin.hit_blocks
