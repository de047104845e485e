"""Replay the bundled Mooncake trace through the manager; report hit ratio and blocks/s.

Per request: lookups in prefix order until the first miss, prepare/complete_load of the hits,
touch, prepare/complete_store of the rest, request finished. The same replay on a bare
``OrderedDict`` LRU is the pure-Python floor, measured in the same run; throughput is reported
as a ratio against it. Bookkeeping memory per resident block is measured with tracemalloc.

    python benchmarks/replay.py [--trace PATH] [--capacity 5000 --capacity 20000] [--repeat 3]
                                [--timer wall|cpu]

``--timer cpu`` times with the process's CPU time instead of the wall clock: on a machine
shared with other work, time spent descheduled then does not count (the replay is one thread
and does no I/O, so both timers measure the same work on a quiet machine).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext
from kv_offload.replay import replay
from kv_offload.trace import read_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"

Requests = list[tuple[ReqContext, list[OffloadKey]]]


def load(path: Path) -> Requests:
    return [(ReqContext(r.req_id), r.keys) for r in read_trace(path)]


def replay_manager(manager: CPUOffloadingManager, requests: Requests) -> tuple[int, int]:
    result = replay(manager, requests)
    return result.hit_blocks, result.blocks


def replay_bare_lru(capacity: int, requests: Requests) -> tuple[int, int]:
    """The floor: the same flow on one OrderedDict, no pins, no validation, no slots."""
    cache: OrderedDict[OffloadKey, None] = OrderedDict()
    hit_total = 0
    total = 0
    for _, keys in requests:
        hits = 0
        for key in keys:
            if key not in cache:
                break
            hits += 1
        for key in reversed(keys[:hits]):
            cache.move_to_end(key)
        for key in keys[hits:]:
            if key not in cache:
                if len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[key] = None
        hit_total += hits
        total += len(keys)
    return hit_total, total


#: The clock best_time() uses (``--timer``).
clock: Callable[[], float] = time.perf_counter


def best_time(fn: Callable[[], tuple[int, int]], repeat: int) -> tuple[float, tuple[int, int]]:
    best = float("inf")
    result = (0, 0)
    for _ in range(repeat):
        gc.collect()
        start = clock()
        result = fn()
        best = min(best, clock() - start)
    return best, result


def bookkeeping_bytes(policy: str, capacity: int, requests: Requests) -> float:
    """Bytes allocated by a manager (and kept) per resident block after the replay."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    manager = CPUOffloadingManager(capacity, cache_policy=policy)
    replay_manager(manager, requests)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / max(manager.num_resident_blocks, 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--timer", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args(argv)
    global clock
    clock = time.process_time if args.timer == "cpu" else time.perf_counter
    capacities = args.capacity or [5000, 20000]
    policies = args.policy or ["lru", "arc"]
    requests = load(args.trace)
    rows = []
    for capacity in capacities:
        floor_t, (floor_hits, total) = best_time(
            lambda: replay_bare_lru(capacity, requests),  # noqa: B023 - called at once
            args.repeat,
        )
        rows.append(
            dict(
                capacity=capacity,
                stack="bare OrderedDict LRU",
                hit_ratio=floor_hits / total,
                blocks_per_s=total / floor_t,
                ratio_vs_floor=1.0,
                bytes_per_block=None,
            )
        )
        for policy in policies:
            t, (hits, total) = best_time(
                lambda: replay_manager(CPUOffloadingManager(capacity, policy), requests),  # noqa: B023
                args.repeat,
            )
            rows.append(
                dict(
                    capacity=capacity,
                    stack=f"CPUOffloadingManager[{policy}]",
                    hit_ratio=hits / total,
                    blocks_per_s=total / t,
                    ratio_vs_floor=floor_t / t,
                    bytes_per_block=bookkeeping_bytes(policy, capacity, requests),
                )
            )
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"trace: {args.trace.name}, {len(requests)} requests, {total} blocks")
    print(
        f"{'capacity':>8}  {'stack':<32} {'hit ratio':>9} {'blocks/s':>12} "
        f"{'x floor':>8} {'B/block':>8}"
    )
    for r in rows:
        mem = "" if r["bytes_per_block"] is None else f"{r['bytes_per_block']:.0f}"
        print(
            f"{r['capacity']:>8}  {r['stack']:<32} {r['hit_ratio']:>9.4f} "
            f"{r['blocks_per_s']:>12,.0f} {r['ratio_vs_floor']:>8.2f} {mem:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
