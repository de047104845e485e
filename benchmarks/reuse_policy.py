"""The reuse-aware policy against LRU and ARC through the real manager, and the targets.

For each capacity: every policy's hit ratio and throughput through ``CPUOffloadingManager``
(runs interleaved, best and median of ``--repeat``), Belady and the infinite cache
(``kv_offload.bounds``), each policy's share of the LRU-to-Belady gap, and bookkeeping bytes
per resident block (tracemalloc, as in ``benchmarks/replay.py``). Then the targets of the
policy, all measured in this run: mean gap share over the capacities with a gap >= 25%, never
below LRU less the safety net's margin (``kv_offload_reuse.safety.MARGIN``), throughput >= 0.5x
LRU's, <= 400 bytes per resident block.

    python benchmarks/reuse_policy.py [--trace PATH] [--keep-partial-blocks] [--repeat 3]
    python benchmarks/reuse_policy.py --synthetic conversations|conversations-slow|zipf|scan

``--synthetic`` replays a generated trace instead (``benchmarks/policy_sim.py`` documents
them): held-out shapes of reuse distance and prefix sharing, to check that nothing is tuned
to the bundled trace.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key
from kv_offload.bounds import belady, gap_share, infinite
from kv_offload.replay import replay
from kv_offload.trace import MOONCAKE_BLOCK_TOKENS, read_trace
from kv_offload_reuse.safety import MARGIN

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"
CAPACITIES = [2000, 5000, 20000, 50000]
POLICIES = ["lru", "arc", "reuse"]

Requests = list[tuple[ReqContext, list[OffloadKey]]]


def run(policy: str, capacity: int, requests: Requests) -> tuple[float, float]:
    """(hit ratio, blocks/s) of one replay through a fresh manager."""
    manager = CPUOffloadingManager(capacity, cache_policy=policy)
    gc.collect()
    start = time.perf_counter()
    result = replay(manager, requests)
    return result.hit_ratio, result.blocks / (time.perf_counter() - start)


def bytes_per_block(policy: str, capacity: int, requests: Requests) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        manager = CPUOffloadingManager(capacity, cache_policy=policy)
        replay(manager, requests)
        gc.collect()
        return (tracemalloc.get_traced_memory()[0] - before) / max(manager.num_resident_blocks, 1)
    finally:
        tracemalloc.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--keep-partial-blocks", action="store_true")
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    parser.add_argument("--synthetic", help="a generated trace of benchmarks/policy_sim.py")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    capacities = args.capacity or CAPACITIES
    policies = list(dict.fromkeys(["lru", *(args.policy or POLICIES)]))
    block_tokens = None if args.keep_partial_blocks else MOONCAKE_BLOCK_TOKENS
    if args.synthetic:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from policy_sim import SYNTHETIC

        generated = SYNTHETIC[args.synthetic](args.seed)
        requests = [
            (ReqContext(f"req-{i}"), [make_offload_key(h) for h in ids])
            for i, ids in enumerate(generated)
        ]
        args.trace = Path(f"synthetic-{args.synthetic}-seed{args.seed}")
    else:
        records = list(read_trace(args.trace, block_tokens=block_tokens))
        requests = [(ReqContext(r.req_id), r.keys) for r in records]
    keys = [k for _, k in requests]
    for policy in policies:  # import every plugin before anything is timed or traced
        CPUOffloadingManager(1, cache_policy=policy)
    unbounded = infinite(keys).hit_ratio
    print(
        f"trace {args.trace.name}: {len(requests)} requests, {sum(map(len, keys))} blocks "
        f"({'every block' if block_tokens is None else 'full blocks only'}); "
        f"infinite cache {unbounded:.4f}"
    )
    print(
        f"{'capacity':>8}  {'policy':<8} {'hit ratio':>9} {'gap closed':>10} "
        f"{'blocks/s best':>13} {'median':>9} {'x LRU':>6} {'median':>6} {'B/block':>8}"
    )
    shares: dict[str, list[float]] = {p: [] for p in policies}
    worst_vs_lru: dict[str, float] = dict.fromkeys(policies, 1.0)  # hit ratio less LRU's
    speed: dict[str, list[float]] = {p: [] for p in policies}
    memory: dict[str, float] = dict.fromkeys(policies, 0.0)
    for capacity in capacities:
        start = time.perf_counter()
        optimum = belady(keys, capacity).hit_ratio
        belady_s = time.perf_counter() - start
        hit: dict[str, float] = {}
        rates: dict[str, list[float]] = {p: [] for p in policies}
        for _ in range(args.repeat):  # interleaved: the machine's noise hits every policy
            for policy in policies:
                hit[policy], rate = run(policy, capacity, requests)
                rates[policy].append(rate)
        for policy in policies:
            share = gap_share(hit[policy], hit["lru"], optimum)
            if share is not None:
                shares[policy].append(share)
            worst_vs_lru[policy] = min(worst_vs_lru[policy], hit[policy] - hit["lru"])
            ratio = max(rates[policy]) / max(rates["lru"])
            median_ratio = statistics.median(rates[policy]) / statistics.median(rates["lru"])
            speed[policy].append(ratio)
            mem = None if args.no_memory else bytes_per_block(policy, capacity, requests)
            if mem is not None:
                memory[policy] = max(memory[policy], mem)
            print(
                f"{capacity:>8}  {policy:<8} {hit[policy]:>9.4f} "
                f"{'' if share is None else f'{share:.1%}':>10} {max(rates[policy]):>13,.0f} "
                f"{statistics.median(rates[policy]):>9,.0f} {ratio:>6.2f} {median_ratio:>6.2f} "
                f"{'' if mem is None else f'{mem:.0f}':>8}"
            )
        print(f"{capacity:>8}  {'belady':<8} {optimum:>9.4f}   (computed in {belady_s:.1f} s)")
    print("\ntargets (this run):")
    for policy in policies:
        if policy == "lru":
            continue
        mean = statistics.mean(shares[policy]) if shares[policy] else float("nan")
        print(
            f"  {policy:<6} mean gap closed over {len(shares[policy])} capacities with a gap: "
            f"{mean:.1%} (>= 25%); worst hit ratio - LRU's: {worst_vs_lru[policy]:+.4f} "
            f"(>= -{MARGIN}); throughput vs LRU: "
            f"{min(speed[policy]):.2f}x-{max(speed[policy]):.2f}x (>= 0.5); max bytes/block: "
            + ("not measured (--no-memory)" if args.no_memory else f"{memory[policy]:.0f} (<= 400)")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
