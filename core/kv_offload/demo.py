"""A short tour of the main job: pick policies by name, replay a real trace, compare.

python -m kv_offload.demo [TRACE] [--policy lru --policy arc] [--capacity 5000 ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import KVOffloadError
from .manager import CPUOffloadingManager
from .policy_factory import CachePolicyFactory
from .replay import replay
from .request import ReqContext
from .trace import read_trace


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kv_offload.demo", description=__doc__)
    parser.add_argument(
        "trace", type=Path, nargs="?", default=Path("data/conversation_trace.jsonl")
    )
    parser.add_argument("--policy", action="append", help="policy name (repeatable)")
    parser.add_argument("--capacity", type=int, action="append", help="CPU blocks (repeatable)")
    args = parser.parse_args(argv)
    try:
        requests = [(ReqContext(r.req_id), r.keys) for r in read_trace(args.trace)]
        installed = sorted({p.name for p in CachePolicyFactory.available_policies()})
        print(f"installed policies: {', '.join(installed) or 'none'}")
        policies = args.policy or installed
        total = sum(len(keys) for _, keys in requests)
        print(f"trace {args.trace}: {len(requests)} requests, {total} block lookups\n")
        print(
            f"{'policy':<10} {'CPU blocks':>10} {'hit ratio':>10} {'evictions':>10} "
            f"{'blocks/s':>12}"
        )
        for capacity in args.capacity or [5000, 20000]:
            for policy in policies:
                manager = CPUOffloadingManager(capacity, cache_policy=policy)
                result = replay(manager, requests)
                stats = manager.get_stats()
                print(
                    f"{policy:<10} {capacity:>10} {result.hit_ratio:>10.4f} "
                    f"{stats.evictions:>10} {result.blocks_per_second:>12,.0f}"
                )
    except KVOffloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
