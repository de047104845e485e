"""The bundled trace's replay timed in several builds of kv-offload, interleaved: how much faster
or slower a change is in time, as a ratio against a baseline build measured in the same run.

Each build is an interpreter with that build installed (e.g. a venv of a baseline worktree:
``git worktree add /tmp/base REV`` and ``pip install /tmp/base /tmp/base/plugins/lru ...``).
Rounds run every build once, one after another in a fresh process (the order alternates from
round to round), and each process replays ``--repeat`` times and keeps its best CPU time, so
a build never runs in a quieter minute than the others by design. Per build it reports the
best time over the rounds and the median, with the ratio of the first build's time to each
one's (above 1: faster than the first), for the best times and as the median of each round's
ratio. Hash randomisation is pinned and hook-plugin autoloading is off, as in
``benchmarks/replay_instructions.py``, which counts the same replay's instructions (noise-free,
but blind to memory stalls: confirm with both).

    python benchmarks/replay_builds.py --python /tmp/base-venv/bin/python \\
        --python .venv/bin/python --policy lru --policy arc --capacity 5000 --rounds 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from replay_instructions import CHILD_ENV, DEFAULT_TRACE, READ_REQUESTS  # a sibling module

#: Run by each measured interpreter: build the requests, replay ``repeat`` times, print the best.
CHILD = (
    READ_REQUESTS
    + """
import gc, time
best = None
for _ in range(int(repeat)):
    manager = CPUOffloadingManager(int(capacity), cache_policy=policy)
    gc.collect()
    start = time.process_time()
    result = replay(manager, requests)
    seconds = time.process_time() - start
    best = seconds if best is None else min(best, seconds)
print(json.dumps({"seconds": best, "hit_blocks": result.hit_blocks, "blocks": result.blocks}))
"""
)


def replay_time(
    python: str, trace: Path, policy: str, capacity: int, requests: int, repeat: int
) -> dict[str, Any]:
    """The best of ``repeat`` replays of the first ``requests`` (0: all) in a fresh ``python``
    process."""
    proc = subprocess.run(
        [python, "-c", CHILD, str(trace), policy, str(capacity), str(requests), str(repeat)],
        capture_output=True,
        text=True,
        env={**os.environ, **CHILD_ENV},
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"{python}: the replay failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="interpreter of a build (repeatable)")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="replays per process (best kept)")
    parser.add_argument("--requests", type=int, default=0, help="first N requests (0: all)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    rows = []
    for policy in args.policy or ["lru"]:
        for capacity in args.capacity or [5000]:
            times: dict[str, list[float]] = {python: [] for python in pythons}
            hits: dict[str, int] = {}
            for round_ in range(args.rounds):
                order = pythons if round_ % 2 == 0 else pythons[::-1]
                for python in order:
                    run = replay_time(
                        python, args.trace, policy, capacity, args.requests, args.repeat
                    )
                    times[python].append(run["seconds"])
                    hits[python] = run["hit_blocks"]
            base = times[pythons[0]]
            for python in pythons:
                own = times[python]
                paired = [b / t for b, t in zip(base, own)]
                rows.append(
                    {
                        "python": python,
                        "policy": policy,
                        "capacity": capacity,
                        "best_s": min(own),
                        "median_s": statistics.median(own),
                        "ratio_best": min(base) / min(own),
                        "ratio_median": statistics.median(paired),
                        "hit_blocks": hits[python],
                    }
                )
                if not args.json:
                    print(
                        f"{policy:6} {capacity:>7}  best {min(own):.3f}s median "
                        f"{statistics.median(own):.3f}s  x{min(base) / min(own):.3f} best, "
                        f"x{statistics.median(paired):.3f} median  hits {hits[python]}  {python}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
