"""What the managers' entry guard (kv_offload.concurrency) costs the replay, in one process.

The baseline is a subclass of ``CPUOffloadingManager`` whose guarded methods are the same
methods' bodies without the guard (``concurrency.unguarded``: every guarded method, ``lookup``
included, is an ``entry_guarded`` wrapper around its body), so the figure is the whole guard's
cost: the wrappers' frames and the tokens of every call. Writing the guard out in ``lookup``,
to save its wrapper frame, would save 0.66% of a replay's instructions under callgrind
(706.1M against 710.8M, the first 3,000 requests at 5,000 blocks): too little to keep a second
copy of its body, so every method has the same wrapper. Both replay the bundled trace,
interleaved, timed with the process's CPU time (other work on a shared machine does not
count); reported as throughput ratios, best and median. Separate-process runs of
``benchmarks/replay.py`` against an older checkout measure the same thing with more noise.

    python benchmarks/guard_overhead.py [--rounds 12] [--capacity 5000] [--policy lru]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kv_offload import CPUOffloadingManager
from kv_offload.concurrency import unguarded
from kv_offload.replay import replay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import DEFAULT_TRACE, load


def unguarded_class() -> type[CPUOffloadingManager]:
    """``CPUOffloadingManager`` with every guarded method replaced by its unguarded body."""
    bodies = {}
    for cls in CPUOffloadingManager.__mro__:
        for name, value in vars(cls).items():
            if hasattr(value, "__wrapped__") and name not in bodies:
                bodies[name] = unguarded(value)
    if "prepare_store" not in bodies or "complete_store" not in bodies:
        raise SystemExit("no guarded methods found: has kv_offload.concurrency changed?")
    return type("UnguardedCPUOffloadingManager", (CPUOffloadingManager,), bodies)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--capacity", type=int, default=5000)
    parser.add_argument("--policy", action="append")
    args = parser.parse_args(argv)
    requests = load(DEFAULT_TRACE)
    blocks = sum(len(keys) for _, keys in requests)
    stacks = {"unguarded": unguarded_class(), "guarded": CPUOffloadingManager}
    print(f"trace: {DEFAULT_TRACE.name}, {blocks} blocks, capacity {args.capacity}")
    for policy in args.policy or ["lru", "arc"]:
        times: dict[str, list[float]] = {name: [] for name in stacks}
        for _ in range(args.rounds):
            for name, cls in stacks.items():
                manager = cls(args.capacity, cache_policy=policy)
                gc.collect()
                start = time.process_time()
                replay(manager, requests)
                times[name].append(time.process_time() - start)
        base_best, base_median = min(times["unguarded"]), statistics.median(times["unguarded"])
        best, median = min(times["guarded"]), statistics.median(times["guarded"])
        print(
            f"{policy}: unguarded {blocks / base_best:,.0f} blocks/s (median "
            f"{blocks / base_median:,.0f}), guarded {blocks / best:,.0f} (median "
            f"{blocks / median:,.0f}); throughput ratio best {base_best / best:.3f}, "
            f"median {base_median / median:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
