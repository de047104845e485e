"""Instructions one replay of the bundled trace costs, counted by callgrind: a throughput gate
that a shared, noisy machine cannot blur.

Wall-clock ratios swung 0.64x to 1.57x between batches of identical code on the 2-core
machines this project is developed on; instruction counts repeat within about 1%. A replay's
count is taken as (two replays) minus (one replay) in fresh processes, so interpreter start-up,
imports and trace parsing cancel out. Hash randomisation is pinned (``PYTHONHASHSEED=0``) and
hook-plugin autoloading is off, so only the manager and the policy are measured.

Compare two builds in one run by giving each one's interpreter (e.g. a venv of a baseline
worktree)::

    python benchmarks/replay_instructions.py --python /path/to/base/venv/bin/python \\
        --python .venv/bin/python --policy lru --policy arc --capacity 5000 --requests 3000

The ratio printed is the first interpreter's count over each one's (above 1: fewer
instructions than the first). ``--tier BLOCKS`` measures the tiered manager instead: the CPU
tier in front of an in-memory ``example`` tier of that many blocks (64-byte blocks; the bytes
copied are not what is measured, the bookkeeping is). Needs ``valgrind``; each measurement
takes about a minute.
``--cache-sim`` also simulates the caches and the branch predictor and compares callgrind's
cycle estimate instead (instructions + 10 per L1 miss and per mispredicted branch + 100 per
last-level miss): a change that saves instructions but touches more memory shows there.
Instructions are a proxy for time, not time: a change that trades instructions for memory
stalls can move the two apart, so confirm a large effect with ``benchmarks/replay.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"

#: The measured processes' environment: hash randomisation pinned, no hook plugins autoloaded.
CHILD_ENV = {"PYTHONHASHSEED": "0", "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "1"}

#: How a measured process builds its requests (shared with ``replay_builds.py``): the trace's
#: first ``limit`` requests (0: all), read by this code and not by ``kv_offload.trace``, so that
#: every build replays the same requests whatever its own trace reader does. Its arguments are
#: ``trace policy capacity limit repeat``; the rest of the program replays ``requests``.
READ_REQUESTS = """
import json, sys
from kv_offload import CPUOffloadingManager, ReqContext, make_offload_key
from kv_offload.replay import replay
trace, policy, capacity, limit, repeat = sys.argv[1:6]
requests = []
with open(trace) as lines:
    for i, line in enumerate(lines):
        if int(limit) and i >= int(limit):
            break
        ids = json.loads(line)["hash_ids"]
        keys = [make_offload_key(h) for h in dict.fromkeys(ids)]
        requests.append((ReqContext(req_id=f"r{i}"), keys))
"""

#: Run by each measured interpreter: build the requests, then replay ``repeat`` times. With a
#: tier (``tier`` blocks, the argument after ``repeat``; 0: none) the stack is the CPU tier in
#: front of an in-memory example tier, built from a config as ``build_manager`` does.
CHILD = (
    READ_REQUESTS
    + """
tier = int(sys.argv[6])
for _ in range(int(repeat)):
    if tier:
        from kv_offload import build_manager
        manager = build_manager({
            "num_blocks": int(capacity), "block_size_bytes": 64, "policy": policy,
            "hooks": {"autoload": False},
            "tiers": [{"type": "example", "capacity_blocks": tier}],
        })
    else:
        manager = CPUOffloadingManager(int(capacity), cache_policy=policy)
    result = replay(manager, requests)
    manager.shutdown()
print(result.hit_blocks, result.blocks)
"""
)


#: callgrind's summary lines read with ``--cache-sim``, and what each counts.
SIMULATED = {
    "I1": r"I1  misses:\s+([\d,]+)",
    "D1": r"D1  misses:\s+([\d,]+)",
    "LL": r"LL misses:\s+([\d,]+)",
    "Bm": r"Mispredicts:\s+([\d,]+)",
}


def cycle_estimate(stats: dict[str, int]) -> int:
    """callgrind's documented cycle estimate: an instruction each, 10 per L1 miss and per
    mispredicted branch, 100 per last-level miss."""
    misses = stats["I1"] + stats["D1"] + stats["Bm"]
    return stats["Ir"] + 10 * misses + 100 * stats["LL"]


def instructions(
    python: str,
    trace: Path,
    policy: str,
    capacity: int,
    requests: int,
    simulate: bool = False,
    tier: int = 0,
) -> tuple[dict[str, int], str]:
    """Instructions of one replay (with ``simulate``, also its simulated cache misses and
    mispredicted branches), and its ``hit_blocks blocks`` line (same in both runs)."""
    runs = []
    answer = ""
    for repeat in (1, 2):
        simulation = ["--cache-sim=yes", "--branch-sim=yes"] if simulate else []
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                *simulation,
                "--callgrind-out-file=/dev/null",
                python,
                "-c",
                CHILD,
                str(trace),
                policy,
                str(capacity),
                str(requests),
                str(repeat),
                str(tier),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **CHILD_ENV},
            check=False,
        )
        found = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or found is None:
            sys.exit(f"{python}: the measured replay failed:\n{proc.stderr[-2000:]}")
        stats = {"Ir": int(found.group(1))}
        if simulate:
            for name, pattern in SIMULATED.items():
                line = re.search(pattern, proc.stderr)
                stats[name] = int(line.group(1).replace(",", "")) if line else 0
        runs.append(stats)
        answer = proc.stdout.strip()
    one, two = runs
    return {name: two[name] - one[name] for name in one}, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="interpreter to measure (repeatable)")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--requests", type=int, default=3000, help="first N requests")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument(
        "--tier",
        type=int,
        default=0,
        metavar="BLOCKS",
        help="replay through a tiered stack: the CPU tier in front of an in-memory example "
        "tier of BLOCKS blocks (the tiered manager's path: cascades, lookups, promotions)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="also simulate caches and branches (about 5x slower): the ratio is then of "
        "callgrind's cycle estimate, which also charges L1, last-level and branch misses",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    pythons = args.python or [sys.executable]
    rows = []
    for policy in args.policy or ["lru"]:
        for capacity in args.capacity or [5000]:
            first = None
            for python in pythons:
                stats, answer = instructions(
                    python, args.trace, policy, capacity, args.requests, args.cache_sim, args.tier
                )
                cost = cycle_estimate(stats) if args.cache_sim else stats["Ir"]
                first = cost if first is None else first
                rows.append(
                    {
                        "python": python,
                        "policy": policy,
                        "capacity": capacity,
                        "tier_blocks": args.tier,
                        "instructions": stats["Ir"],
                        **({"simulated": stats, "cycle_estimate": cost} if args.cache_sim else {}),
                        "ratio_to_first": first / cost,
                        "hit_blocks blocks": answer,
                    }
                )
                if not args.json:
                    shown = f"{stats['Ir'] / 1e6:10.1f}M"
                    if args.cache_sim:
                        shown += f"  cycle estimate {cost / 1e6:8.1f}M"
                    print(
                        f"{policy:6} {capacity:>7} {shown}  x{first / cost:.3f}  "
                        f"hits/blocks {answer}  {python}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
