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
instructions than the first). Needs ``valgrind``; each measurement takes about a minute.
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

#: Run by each measured interpreter: build the requests, then replay ``repeat`` times.
CHILD = """
import json, sys
from kv_offload import CPUOffloadingManager, ReqContext, make_offload_key
from kv_offload.replay import replay
trace, policy, capacity, limit, repeat = sys.argv[1:6]
requests = []
with open(trace) as lines:
    for i, line in enumerate(lines):
        if i >= int(limit):
            break
        ids = json.loads(line)["hash_ids"]
        keys = [make_offload_key(h) for h in dict.fromkeys(ids)]
        requests.append((ReqContext(req_id=f"r{i}"), keys))
for _ in range(int(repeat)):
    manager = CPUOffloadingManager(int(capacity), cache_policy=policy)
    result = replay(manager, requests)
    manager.shutdown()
print(result.hit_blocks, result.blocks)
"""


def instructions(
    python: str, trace: Path, policy: str, capacity: int, requests: int
) -> tuple[int, str]:
    """Instructions of one replay, and its ``hit_blocks blocks`` line (same in both runs)."""
    counts = []
    answer = ""
    for repeat in (1, 2):
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                python,
                "-c",
                CHILD,
                str(trace),
                policy,
                str(capacity),
                str(requests),
                str(repeat),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0", "KV_OFFLOAD_DISABLE_PLUGIN_AUTOLOAD": "1"},
            check=False,
        )
        found = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or found is None:
            sys.exit(f"{python}: the measured replay failed:\n{proc.stderr[-2000:]}")
        counts.append(int(found.group(1)))
        answer = proc.stdout.strip()
    return counts[1] - counts[0], answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="interpreter to measure (repeatable)")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--capacity", type=int, action="append")
    parser.add_argument("--requests", type=int, default=3000, help="first N requests")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    pythons = args.python or [sys.executable]
    rows = []
    for policy in args.policy or ["lru"]:
        for capacity in args.capacity or [5000]:
            first = None
            for python in pythons:
                count, answer = instructions(python, args.trace, policy, capacity, args.requests)
                first = count if first is None else first
                rows.append(
                    {
                        "python": python,
                        "policy": policy,
                        "capacity": capacity,
                        "instructions": count,
                        "ratio_to_first": first / count,
                        "hit_blocks blocks": answer,
                    }
                )
                if not args.json:
                    print(
                        f"{policy:6} {capacity:>7} {count / 1e6:10.1f}M  x{first / count:.3f}  "
                        f"hits/blocks {answer}  {python}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
