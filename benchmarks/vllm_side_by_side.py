"""kv-offload's CPUOffloadingManager side by side with vLLM's own, on the same trace replay.

Both managers replay the bundled Mooncake trace (``kv_offload.trace.read_trace``; keys are
``bytes`` built by ``kv_offload.make_offload_key``, the same layout as vLLM's ``OffloadKey``:
block hash + 4-byte big-endian KV-group index) with the same request flow, in the same
process: ``on_new_request``, ``lookup`` in prefix order until the first non-HIT,
``prepare_load`` / ``complete_load`` of the hits, ``touch``, ``prepare_store`` /
``complete_store`` of the rest, ``on_request_finished``. kv-offload's side is
``kv_offload.replay.replay`` itself; vLLM's side is :func:`replay_vllm`, the same loop line for
line against vLLM's API (``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager``, with
``vllm.v1.kv_offload.base.ReqContext``).

Each run gets a fresh manager and fresh request contexts (both libraries keep per-request
state on the context), built before the clock starts. Runs alternate (ours, vLLM, ours,
vLLM, ...) ``--repeat`` times (3 by default) per policy and capacity, and each side's best run
is reported as blocks/s, with the ratio kv-offload / vLLM (above 1: kv-offload is faster) and
both hit ratios. Time is process CPU time around the replay call by default (``--clock
cpu``): on a shared 2-core machine wall time is mostly waiting for a core; ``--clock wall``
uses ``perf_counter``. After the imports and the trace load, ``gc.freeze()`` moves the heap
(vLLM pulls in torch, transformers, ...) out of the collector's reach, so neither side pays
for scanning the other's import graph.

By default the contexts carry no per-key token positions. vLLM's scheduler records
``set_offload_key_position`` for each key; ``--positions`` does that too, on both libraries'
contexts (end token ``(i + 1) * 512`` for the i-th block, before the clock starts), which
changes the ordering of vLLM's LRU and ARC and of kv-offload's ``prefix-lru`` and ``vllm-arc``,
not the flow (kv-offload's ``lru`` and ``arc`` ignore positions).

vLLM is not a dependency of kv-offload, and its full dependency set (CUDA wheels, a pinned
CUDA torch, GBs) is not for a CPU-only machine. Without it this script prints how to set it
up and exits 0. The setup that works (a separate venv, CPU torch from a local
wheel, vLLM without its dependencies, then only the packages that importing
``vllm.v1.kv_offload.cpu.manager`` needs; nothing stubbed)::

    python3 -m venv /tmp/vllmenv
    /tmp/vllmenv/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /tmp/vllmenv/bin/pip install --no-deps vllm==0.33.0
    /tmp/vllmenv/bin/pip install numpy packaging psutil pyzmq urllib3 regex transformers \\
        cbor2 aiohttp requests openai_harmony openai pillow pybase64 cachetools msgspec \\
        cloudpickle uvloop py-cpuinfo prometheus_client
    /tmp/vllmenv/bin/pip install --no-deps xgrammar apache-tvm-ffi==0.1.11 fastapi starlette \\
        opentelemetry-api partial-json-parser llguidance
    /tmp/vllmenv/bin/pip install -e . -e plugins/lru -e plugins/arc

    /tmp/vllmenv/bin/python benchmarks/vllm_side_by_side.py [--trace PATH] \\
        [--capacity 5000 --capacity 20000] [--policy lru --policy arc] [--repeat 3] \\
        [--clock cpu|wall] [--positions] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kv_offload import CPUOffloadingManager, OffloadKey, ReqContext
from kv_offload.replay import replay
from kv_offload.trace import read_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"
VLLM_MANAGER_MODULE = "vllm.v1.kv_offload.cpu.manager"
TOKENS_PER_BLOCK = 512  # the Mooncake traces' block size; only --positions uses it

Trace = list[tuple[str, list[OffloadKey]]]


@dataclass(frozen=True)
class VLLMApi:
    """The few vLLM names the replay needs, imported once."""

    version: str
    manager_cls: Any
    req_context_cls: Any
    hit: Any


@dataclass(frozen=True)
class Counts:
    """What one replay counted; both sides must agree on ``blocks``."""

    blocks: int
    hit_blocks: int
    stored_blocks: int
    rejected_stores: int


def import_vllm() -> VLLMApi | str:
    """vLLM's manager API, or the reason it cannot be imported."""
    try:
        import vllm
        from vllm.v1.kv_offload import base
        from vllm.v1.kv_offload.cpu import manager
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return VLLMApi(
        version=getattr(vllm, "__version__", "?"),
        manager_cls=manager.CPUOffloadingManager,
        req_context_cls=base.ReqContext,
        hit=base.LookupResult.HIT,
    )


def replay_vllm(manager: Any, requests: list[tuple[Any, list[OffloadKey]]], hit: Any) -> Counts:
    """``kv_offload.replay.replay``'s loop, line for line, against vLLM's manager API."""
    hit_total = blocks = stored = rejected = 0
    HIT = hit
    lookup = manager.lookup
    for ctx, keys in requests:
        manager.on_new_request(ctx)
        hits = 0
        for key in keys:
            if lookup(key, ctx) is not HIT:
                break
            hits += 1
        if hits:
            hit_keys = keys[:hits]
            manager.prepare_load(hit_keys, ctx)
            manager.complete_load(hit_keys, ctx)
            manager.touch(hit_keys, ctx)
        if hits < len(keys):
            out = manager.prepare_store(keys[hits:], ctx)
            if out is None:
                rejected += 1
            elif out.keys_to_store:
                manager.complete_store(out.keys_to_store, ctx)
                stored += len(out.keys_to_store)
        manager.on_request_finished(ctx)
        hit_total += hits
        blocks += len(keys)
    return Counts(blocks, hit_total, stored, rejected)


def ours_run(trace: Trace, capacity: int, policy: str, positions: bool) -> Callable[[], Counts]:
    """A fresh kv-offload manager and contexts; the returned call is what gets timed."""
    manager = CPUOffloadingManager(capacity, cache_policy=policy)
    requests = []
    for req_id, keys in trace:
        ctx = ReqContext(req_id)
        if positions:
            for i, key in enumerate(keys):
                ctx.set_offload_key_position(key, (i + 1) * TOKENS_PER_BLOCK)
        requests.append((ctx, keys))

    def run() -> Counts:
        r = replay(manager, requests)
        return Counts(r.blocks, r.hit_blocks, r.stored_blocks, r.rejected_stores)

    return run


def vllm_run(
    api: VLLMApi, trace: Trace, capacity: int, policy: str, positions: bool
) -> Callable[[], Counts]:
    """A fresh vLLM manager and contexts; the returned call is what gets timed."""
    manager = api.manager_cls(capacity, cache_policy=policy)
    requests = []
    for req_id, keys in trace:
        ctx = api.req_context_cls(req_id)
        if positions:
            for i, key in enumerate(keys):
                ctx.set_offload_key_position(key, (i + 1) * TOKENS_PER_BLOCK)
        requests.append((ctx, keys))
    return lambda: replay_vllm(manager, requests, api.hit)


def timed(
    make: Callable[[], Callable[[], Counts]], clock: Callable[[], float]
) -> tuple[float, Counts]:
    run = make()
    gc.collect()
    start = clock()
    counts = run()
    return clock() - start, counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--capacity", type=int, action="append", help="5000 and 20000 if unset")
    parser.add_argument("--policy", action="append", help="lru and arc if unset")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side; best is kept")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument(
        "--positions", action="store_true", help="record token positions on the contexts"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    capacities = args.capacity or [5000, 20000]
    policies = args.policy or ["lru", "arc"]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    api = import_vllm()
    if isinstance(api, str):
        print(
            f"vLLM is not importable here ({api}); nothing to compare, skipping.\n"
            f"Set up a separate venv with vLLM as described in the docstring of "
            f"{Path(__file__).name} and run this script with that venv's python.",
            file=sys.stderr,
        )
        return 0

    trace: Trace = [(r.req_id, r.keys) for r in read_trace(args.trace)]
    gc.collect()
    gc.freeze()

    rows = []
    for capacity in capacities:
        for policy in policies:
            best_ours = best_vllm = float("inf")
            ours = theirs = None
            for _ in range(args.repeat):
                t, ours = timed(
                    lambda: ours_run(trace, capacity, policy, args.positions),  # noqa: B023
                    clock,
                )
                best_ours = min(best_ours, t)
                t, theirs = timed(
                    lambda: vllm_run(api, trace, capacity, policy, args.positions),  # noqa: B023
                    clock,
                )
                best_vllm = min(best_vllm, t)
            assert ours is not None and theirs is not None
            if ours.blocks != theirs.blocks:
                raise SystemExit(f"block counts differ: {ours.blocks} vs {theirs.blocks}")
            rows.append(
                dict(
                    capacity=capacity,
                    policy=policy,
                    blocks=ours.blocks,
                    kv_offload_blocks_per_s=ours.blocks / best_ours,
                    vllm_blocks_per_s=theirs.blocks / best_vllm,
                    ratio=best_vllm / best_ours,
                    kv_offload_hit_ratio=ours.hit_blocks / ours.blocks,
                    vllm_hit_ratio=theirs.hit_blocks / theirs.blocks,
                    kv_offload_stored=ours.stored_blocks,
                    vllm_stored=theirs.stored_blocks,
                    kv_offload_rejected_stores=ours.rejected_stores,
                    vllm_rejected_stores=theirs.rejected_stores,
                )
            )
    if args.json:
        doc = dict(
            trace=args.trace.name,
            requests=len(trace),
            vllm_version=api.version,
            clock=args.clock,
            repeat=args.repeat,
            positions=args.positions,
            rows=rows,
        )
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    blocks = rows[0]["blocks"] if rows else 0
    print(
        f"trace: {args.trace.name}, {len(trace)} requests, {blocks} blocks; vLLM "
        f"{api.version}; best of {args.repeat}, {args.clock} time"
        + ("; contexts carry positions" if args.positions else "")
    )
    print(
        f"{'capacity':>8}  {'policy':<6} {'kv-offload blk/s':>16} {'vLLM blk/s':>12} "
        f"{'ratio':>6}  {'hit kv-offload':>14} {'hit vLLM':>9}"
    )
    for r in rows:
        print(
            f"{r['capacity']:>8}  {r['policy']:<6} {r['kv_offload_blocks_per_s']:>16,.0f} "
            f"{r['vllm_blocks_per_s']:>12,.0f} {r['ratio']:>6.2f}  "
            f"{r['kv_offload_hit_ratio']:>14.4f} {r['vllm_hit_ratio']:>9.4f}"
        )
    print("ratio = kv-offload blocks/s / vLLM blocks/s (above 1: kv-offload is faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
