"""The shipped reference policies are real policies: registered at run time, they run in a
manager and take the same decisions there as the optimised ones they guard."""

from __future__ import annotations

import random

import pytest
from _policy_harness import k
from kv_offload import CPUOffloadingManager, LookupResult, ReqContext
from kv_offload.policies import CachePolicyFactory


@pytest.mark.parametrize(
    ("policy", "module", "class_name"),
    [
        ("lru", "kv_offload_lru.reference", "ReferenceLRUCachePolicy"),
        ("arc", "kv_offload_arc.reference", "ReferenceARCCachePolicy"),
        ("sae", "kv_offload_sae.reference", "ReferenceSessionAwarePolicy"),
    ],
)
def test_reference_matches_the_policy_through_the_manager(
    policy: str, module: str, class_name: str
) -> None:
    name = f"{policy}-reference-test"
    CachePolicyFactory.register_cache_policy(name, module, class_name)
    try:
        rng = random.Random(3)
        requests = [
            list(dict.fromkeys(k(int(rng.paretovariate(0.8)) % 400) for _ in range(12)))
            for _ in range(800)
        ]
        outcomes = []
        for selected in (policy, name):
            manager = CPUOffloadingManager(64, cache_policy=selected)
            ctx = ReqContext(req_id="r")
            hits = 0
            for keys in requests:
                found = [key for key in keys if manager.lookup(key, ctx) is LookupResult.HIT]
                hits += len(found)
                manager.touch(found, ctx)
                out = manager.prepare_store(keys, ctx)
                if out is not None:
                    manager.complete_store(out.keys_to_store, ctx)
            stats = manager.get_stats()
            outcomes.append((hits, stats.evictions, stats.resident_blocks))
        assert outcomes[0] == outcomes[1]
        assert outcomes[0][0] > 0 and outcomes[0][1] > 0  # the workload hits and evicts
    finally:
        CachePolicyFactory.unregister_cache_policy(name)
