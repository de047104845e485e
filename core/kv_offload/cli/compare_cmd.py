"""``kv-offload compare``: one trace across policies and CPU-tier sizes, optionally with the
Belady and infinite-cache bounds and a plot."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..bounds import belady, gap_share, infinite
from ..config import parse_config, resolve_config
from ..errors import KVOffloadError
from .output import table
from .plot import plot, pyplot
from .running import Trace, run

__all__ = ["cmd_compare"]


def cmd_compare(args: argparse.Namespace) -> int:
    policies = list(dict.fromkeys(args.policy or ["lru", "arc"]))
    if args.bounds and "lru" not in policies:
        policies.insert(0, "lru")  # the baseline of the gap shares
    capacities = list(dict.fromkeys(args.capacity or [5000, 20000]))
    if args.plot:  # fail before replaying, not after
        if not args.plot.parent.is_dir():
            raise KVOffloadError(f"cannot write plot {str(args.plot)!r}: no such directory")
        pyplot()
    # Every stack is validated before the first replay starts.
    stacks = []
    for capacity in capacities:
        for policy in policies:
            stack = parse_config(
                {"num_blocks": capacity, "policy": policy},
                source=f"--policy {policy} --capacity {capacity}",
            )
            resolve_config(stack)
            stacks.append(stack)
    trace = Trace(args)
    rows = [
        run(stack, trace.requests, args.progress, f"{stack.policy}@{stack.num_blocks}")
        for stack in stacks
    ]
    for row in rows:
        row.update(trace.describe())
    if args.bounds:
        rows = _with_bounds(rows, [keys for _, keys in trace.requests], capacities)
    if args.plot:
        plot(rows, args.plot, args.trace)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ["policy", "CPU blocks", "hit ratio", "evictions", "blocks/s"]
    if args.bounds:
        header.append("LRU-to-Belady gap closed")
    print(
        table(
            [
                [
                    r["policy"],
                    str(r["num_blocks"]),
                    f"{r['hit_ratio']:.4f}",
                    "-" if r["evictions"] is None else str(r["evictions"]),
                    "-" if r["blocks_per_second"] is None else f"{r['blocks_per_second']:,.0f}",
                ]
                + ([_share(r.get("gap_share"))] if args.bounds else [])
                for r in rows
            ],
            header,
        )
    )
    print(f"trace {args.trace}: {trace.note()}")
    if args.bounds:
        print(
            "belady: offline eviction of the block whose next use comes last; infinite: a "
            "cache that never evicts (same access model)"
        )
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _with_bounds(
    rows: list[dict[str, Any]], requests: list[list[Any]], capacities: list[int]
) -> list[dict[str, Any]]:
    """The rows, grouped by capacity, each group followed by its Belady and infinite rows;
    every policy row gains its share of that capacity's LRU-to-Belady gap."""
    unbounded = infinite(requests)
    out: list[dict[str, Any]] = []
    for capacity in capacities:
        group = [r for r in rows if r["num_blocks"] == capacity]
        optimum = belady(requests, capacity)
        lru = next(r["hit_ratio"] for r in group if r["policy"] == "lru")
        for row in group:
            row["gap_share"] = gap_share(row["hit_ratio"], lru, optimum.hit_ratio)
        out += group
        for bound, evictions in ((optimum, optimum.evictions), (unbounded, None)):
            out.append(
                {
                    "policy": bound.name,
                    "num_blocks": capacity,
                    "bound": True,
                    "blocks": bound.blocks,
                    "hit_ratio": bound.hit_ratio,
                    "evictions": evictions,
                    "blocks_per_second": None,
                }
            )
    return out


def _share(share: float | None) -> str:
    return "" if share is None else f"{share:.1%}"
