"""The timed replay's own overhead, and what the fs tier serves at a real pace (issue 25).

Three stacks of the same shape (a 5,000-block CPU tier in front of a 20,000-block tier, 4 KiB
blocks, the bundled trace), each replayed through ``kv-offload replay --json``:

* ``sync untimed``: the in-memory example tier, whose jobs finish at once, at ``--speed
  max``: the baseline, every promotion in time by construction;
* ``sync timed``: the same stack at ``--speed X`` (default 100): the clock, the engine loop
  and the load-wait budget. It must reach the baseline's hit ratio within 0.005, or the
  clock itself costs hits;
* ``fs timed``: the default stack (fs tier on disk, the utilization backpressure gate) at
  ``--speed 30``: the share of the baseline the disk serves in real time (target: 0.8x).

Rounds alternate the order; hit ratios are reported per round (the timed ones vary a little
with the machine's load), with the best and median of each.

    python benchmarks/replay_clock.py --rounds 2 --limit 4000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "conversation_trace.jsonl"
SYNC = """\
num_blocks = 5000
block_size_bytes = 4096
[[tiers]]
type = "example"
capacity_blocks = 20000
"""


def replay(config: str, *options: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "kv_offload.cli", "replay", config, str(TRACE), "--json"]
    proc = subprocess.run(
        [*argv, "--no-progress", *options], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit", type=int, help="only the first N requests")
    parser.add_argument("--sync-speed", default="100")
    parser.add_argument("--fs-speed", default="30")
    args = parser.parse_args()
    limit = ["--limit", str(args.limit)] if args.limit else []
    with tempfile.TemporaryDirectory() as tmp:
        sync = Path(tmp) / "sync.toml"
        sync.write_text(SYNC)
        runs: dict[str, list[dict[str, Any]]] = {
            "sync untimed": [],
            "sync timed": [],
            "fs timed": [],
        }
        plans = [
            ("sync untimed", str(sync), ["--speed", "max"]),
            ("sync timed", str(sync), ["--speed", args.sync_speed]),
            ("fs timed", "default", ["--speed", args.fs_speed]),
        ]
        for round_ in range(args.rounds):
            order = plans if round_ % 2 == 0 else list(reversed(plans))
            for name, config, options in order:
                report = replay(config, *options, *limit)
                runs[name].append(report)
                by_tier = report["hit_ratio_by_tier"]
                tier = next(iter(k for k in by_tier if k != "CPU"))
                print(
                    f"round {round_ + 1}: {name:<13} hit ratio {report['hit_ratio']:.4f} "
                    f"(from {tier} {by_tier[tier]:.4f}) in {report['seconds']:.1f} s",
                    flush=True,
                )
    base = statistics.median(r["hit_ratio"] for r in runs["sync untimed"])
    base_tier = statistics.median(r["hit_ratio_by_tier"]["example"] for r in runs["sync untimed"])
    print()
    print("| run | hit ratio best / median | from the tier best / median | vs sync untimed |")
    print("|---|---|---|---|")
    for name, reports in runs.items():
        ratios = [r["hit_ratio"] for r in reports]
        tier = "fs" if name.startswith("fs") else "example"
        shares = [r["hit_ratio_by_tier"][tier] for r in reports]
        med = statistics.median(ratios)
        versus = f"{med - base:+.4f} hit ratio"
        if name == "fs timed":
            versus += f", tier share x{statistics.median(shares) / base_tier:.3f}"
        print(
            f"| {name} | {max(ratios):.4f} / {med:.4f} | {max(shares):.4f} / "
            f"{statistics.median(shares):.4f} | {versus} |"
        )


if __name__ == "__main__":
    main()
