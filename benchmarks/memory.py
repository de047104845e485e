"""Bookkeeping bytes per resident block across CPU tier sizes, for every policy.

``benchmarks/replay.py`` measures memory at the trace's two capacities. This sweeps many,
because the answer depends on the capacity: CPython resizes a dict that eviction churn keeps
turning over to the next power of two above three times its keys, so a capacity just above a
power-of-two boundary pays for up to twice the table of one just below it. Each run stores
unique keys in batches of 16 until four times the capacity has gone through (every slot
evicted three times), touching a few older keys per batch, then counts the bytes the manager
still holds (tracemalloc) over its resident blocks. The baseline, measured in the same run
on the same keys, is a bare ``OrderedDict`` of key -> slot id with the same churn. The
shipped reference policies (``kv_offload_lru.reference``, ``kv_offload_arc.reference``: plain
``OrderedDict`` versions of the same decisions) run as ``--policy lru-reference`` and
``--policy arc-reference``.

    python benchmarks/memory.py [--capacity N ...] [--policy NAME ...]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key
from kv_offload.policies import CachePolicyFactory

CAPACITIES = [5000, 8000, 12000, 16000, 20000, 30000, 45000, 100_000]
BATCH = 16
REFERENCES = {
    "lru-reference": ("kv_offload_lru.reference", "ReferenceLRUCachePolicy"),
    "arc-reference": ("kv_offload_arc.reference", "ReferenceARCCachePolicy"),
}


def traced_bytes(build: Callable[[], tuple[object, int]]) -> float:
    """Bytes still held by what ``build()`` returns (with its resident count), per block."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        structure, resident = build()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        del structure
        return held / resident
    finally:
        tracemalloc.stop()


def churn_manager(
    policy: str, capacity: int, keys: list[OffloadKey]
) -> Callable[[], tuple[object, int]]:
    def build() -> tuple[object, int]:
        manager = CPUOffloadingManager(capacity, cache_policy=policy)
        ctx = ReqContext(req_id="memory")
        for start in range(0, len(keys), BATCH):
            out = manager.prepare_store(keys[start : start + BATCH], ctx)
            if out is not None:
                manager.complete_store(out.keys_to_store, ctx)
            older = max(0, start - capacity // 2)
            manager.touch(keys[older : older + 4], ctx)
        return manager, manager.num_resident_blocks

    return build


def churn_ordered_dict(capacity: int, keys: list[OffloadKey]) -> Callable[[], tuple[object, int]]:
    def build() -> tuple[object, int]:
        lru: OrderedDict[OffloadKey, int] = OrderedDict()
        for slot, key in enumerate(keys):
            if len(lru) >= capacity:
                lru.popitem(last=False)
            lru[key] = slot % capacity
        return lru, len(lru)

    return build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--policy", action="append")
    args = parser.parse_args(argv)
    capacities = args.capacity or CAPACITIES
    policies = args.policy or ["lru", "arc"]
    for policy in policies:  # import and register plugins before anything is traced
        if policy in REFERENCES:
            CachePolicyFactory.register_cache_policy(policy, *REFERENCES[policy])
        CPUOffloadingManager(1, cache_policy=policy)
    print(f"{'capacity':>9}  {'bare OrderedDict':>16}" + "".join(f"  {p:>8}" for p in policies))
    for capacity in capacities:
        keys = [make_offload_key(i) for i in range(4 * capacity)]
        row = [traced_bytes(churn_ordered_dict(capacity, keys))]
        row += [traced_bytes(churn_manager(policy, capacity, keys)) for policy in policies]
        print(f"{capacity:>9}  {row[0]:>16.0f}" + "".join(f"  {b:>8.0f}" for b in row[1:]))
    print("bytes per resident block; the manager's include its BlockStatus (48) and ref count (8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
