"""What each write policy and admission costs and keeps: hits against bytes written.

Every variant is a real ``kv-offload replay`` (the CLI, the real stack: a CPU tier of
``--cpu`` blocks in front of a ``--tier``-block ``example`` tier, real bytes, every block read
back and verified) of the same trace, so the ratios are measured in one run against the
baseline, write-through admitting every block. Per variant: the hit ratio, the tier's share
of it, blocks and bytes written to the tier, writes per tier hit, and both ratios against the
baseline. Traces: the bundled ``data/conversation_trace.jsonl`` and generated conversation
traces (``benchmarks/policy_sim.py``'s generator, written as JSONL with a timestamp per
request), whose reuse differs: more turns per conversation, shared prompts of 1-4 blocks.

    python benchmarks/admission.py                      # bundled trace + generated seed 1
    python benchmarks/admission.py --generated 1 --generated 2 --json out.json
    python benchmarks/admission.py --plot DIR            # also the frontier, one SVG per trace

Needs ``kv-offload-admission`` and ``kv-offload-example-tier`` installed (``nox`` installs
every distribution); the plot needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_sim import synthetic_conversations

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "data" / "conversation_trace.jsonl"
BLOCK_BYTES = 64

#: (label, the tier's write-policy and admission keys); the first is the baseline.
VARIANTS: list[tuple[str, str]] = [
    ("write-through, admit all", 'write_policy = "write-through"'),
    ("write-back, admit all", 'write_policy = "write-back"'),
    ("selective, store-threshold", 'write_policy = "write-through-selective"'),
    (
        "selective, seen-before",
        'write_policy = "write-through-selective"\nadmission = "seen-before"',
    ),
    ("selective, tinylfu", 'write_policy = "write-through-selective"\nadmission = "tinylfu"'),
    (
        "selective, conversation-share 20%",
        'write_policy = "write-through-selective"\nadmission = "conversation-share"\n'
        "admission_options = { share_percent = 20 }",
    ),
    (
        "selective, conversation-share 40%",
        'write_policy = "write-through-selective"\nadmission = "conversation-share"',
    ),
    ("write-back, seen-before", 'write_policy = "write-back"\nadmission = "seen-before"'),
    (
        "write-back, conversation-share 40%",
        'write_policy = "write-back"\nadmission = "conversation-share"',
    ),
]


def write_generated(seed: int, path: Path, requests: int) -> Path:
    """The generator's trace as replayable JSONL: one request every 300 ms, whole blocks."""
    with path.open("w") as out:
        for index, ids in enumerate(synthetic_conversations(seed, n=requests)):
            record = {
                "timestamp": index * 300,
                "input_length": len(ids) * 512,
                "output_length": 64,
                "hash_ids": ids,
            }
            out.write(json.dumps(record) + "\n")
    return path


def replay(config: str, trace: Path, folder: Path, cpu: int, tier: int) -> dict[str, object]:
    path = folder / "stack.toml"
    path.write_text(
        f"num_blocks = {cpu}\nblock_size_bytes = {BLOCK_BYTES}\n\n[[tiers]]\n"
        f'type = "example"\ncapacity_blocks = {tier}\n{config}\n'
    )
    command = [sys.executable, "-m", "kv_offload.cli", "replay", str(path), str(trace)]
    command += ["--json", "--no-progress"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr}")
    report: dict[str, object] = json.loads(proc.stdout)
    return report


def measure(trace: Path, cpu: int, tier: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, config in VARIANTS:
            report = replay(config, trace, Path(tmp), cpu, tier)
            writes = report["writes"]["example"]  # type: ignore[index]
            rows.append(
                {
                    "variant": label,
                    "hit_ratio": report["hit_ratio"],
                    "tier_hit_ratio": report["hit_ratio_by_tier"]["example"],  # type: ignore[index]
                    "blocks_written": writes["blocks_written"],
                    "bytes_written": writes["bytes_written"],
                    "writes_per_hit": writes["writes_per_hit"],
                    "write_back_dropped": writes["write_back_dropped"],
                    "corrupted_blocks": report["corrupted_blocks"],
                }
            )
    base = rows[0]
    for row in rows:
        row["hits_vs_base"] = float(row["hit_ratio"]) / float(base["hit_ratio"])  # type: ignore[arg-type]
        row["bytes_vs_base"] = int(row["bytes_written"]) / int(base["bytes_written"])  # type: ignore[call-overload]
    return rows


def print_table(name: str, rows: list[dict[str, object]]) -> None:
    print(f"\n{name}")
    print(
        f"{'variant':36} {'hit ratio':>9} {'tier':>7} {'blocks written':>14} "
        f"{'writes/hit':>10} {'x hits':>7} {'x bytes':>7}"
    )
    for r in rows:
        print(
            f"{r['variant']:36} {r['hit_ratio']:9.4f} {r['tier_hit_ratio']:7.4f} "
            f"{r['blocks_written']:14,} {r['writes_per_hit']:10.2f} "
            f"{r['hits_vs_base']:7.3f} {r['bytes_vs_base']:7.3f}"
        )


def plot(name: str, rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        x, y = float(r["bytes_vs_base"]), float(r["hits_vs_base"])  # type: ignore[arg-type]
        ax.scatter([x], [y])
        ax.annotate(
            str(r["variant"]), (x, y), fontsize=7, xytext=(4, 2), textcoords="offset points"
        )
    ax.axhline(0.9, linestyle=":", color="grey")
    ax.axvline(0.5, linestyle=":", color="grey")
    ax.set_xlabel("bytes written to the tier (x write-through, admit all)")
    ax.set_ylabel("hit ratio (x write-through, admit all)")
    ax.set_title(f"Admission frontier: {name}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=BUNDLED)
    parser.add_argument("--generated", type=int, action="append", help="generator seed")
    parser.add_argument("--requests", type=int, default=12000, help="generated trace length")
    parser.add_argument("--cpu", type=int, default=5000, help="CPU tier blocks")
    parser.add_argument("--tier", type=int, default=20000, help="secondary tier blocks")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--plot", type=Path, help="write one frontier SVG per trace here")
    args = parser.parse_args(argv)
    seeds = args.generated if args.generated is not None else [1]
    results: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        traces = [(args.trace.name, args.trace)] + [
            (
                f"generated conversations, seed {seed}",
                write_generated(seed, Path(tmp) / f"generated-{seed}.jsonl", args.requests),
            )
            for seed in seeds
        ]
        for name, trace in traces:
            rows = measure(trace, args.cpu, args.tier)
            results[name] = rows
            print_table(f"{name}: {args.cpu} CPU blocks + {args.tier}-block tier", rows)
            if args.plot is not None:
                args.plot.mkdir(parents=True, exist_ok=True)
                slug = name.replace(" ", "-").replace(",", "").replace(".jsonl", "")
                plot(name, rows, args.plot / f"frontier-{slug}.svg")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
