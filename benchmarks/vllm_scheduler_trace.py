"""The bundled trace through vLLM 0.33's real scheduler, with each offloading policy.

Each policy gets a fresh engine (benchmarks/vllm_engine.py: vLLM's ``Scheduler`` built from
``vllm serve`` flags, only the GPU worker stood in for, no bytes moved) configured as a user
configures it: ``--block-size`` GPU blocks, and ``--kv-transfer-config`` with
``OffloadingConnector`` whose CPU tier holds ``--cpu-blocks`` offloaded blocks of
``--offload-block-size`` tokens (``block_size`` in ``kv_connector_extra_config``), evicting
with the policy: kv-offload's through the bridge (``kvo_<name>``,
``cache_policy_module_path: kv_offload_vllm.policies``) or vLLM's own (``lru``, ``arc``).

The prompts come from the trace's block hashes: each full block of ``hash_ids`` becomes
``--trace-block-tokens`` token ids drawn from a generator seeded by the hash, so requests
sharing a trace prefix share a token prefix (and vLLM's chained block hashes), plus one token
of their own (the prompt's last, partial block, which vLLM never caches). Requests enter in
trace order with at most ``--in-flight`` unfinished at once (the trace's timestamps are not
replayed); each produces one token and finishes.

Reported per policy, from vLLM's own scheduler stats (what its ``vllm:prefix_cache_*`` and
``vllm:external_prefix_cache_*`` metrics count): the offload hit ratio (tokens the connector
found / tokens asked of it, after the GPU prefix cache), prefill tokens saved by the offload
tier (those hits, also as a share of all prompt tokens), GPU prefix-cache hits, and the
scheduler's time per step: ``schedule()`` plus ``update_from_output()``, the policy's
callbacks included, the stand-in worker excluded, as the engine thread's CPU time (mean and
99th percentile over steps; on a shared machine wall time is mostly waiting for a core) and
as wall time (mean). ``--repeat N`` runs the policies N rounds, alternating, and keeps each
policy's fastest round; ``gc.freeze()`` after loading keeps the collector off the trace.

Needs vLLM 0.33 with a CPU torch (the ``nox -s vllm`` environment; noxfile.py's vllm session
is the recipe); ``VLLM_TARGET_DEVICE=cpu`` is set if unset. Without vLLM it says so and exits 0.

    python benchmarks/vllm_scheduler_trace.py [--requests 3000] [--cpu-blocks 5000]
        [--policy kvo_lru --policy lru ...] [--gpu-blocks 8192] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from kv_offload.trace import read_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_engine import BYTES_PER_TOKEN, Engine, cli_args, write_model_dir

TRACE = Path(__file__).resolve().parents[1] / "data" / "conversation_trace.jsonl"
POLICIES = ["kvo_lru", "kvo_prefix-lru", "kvo_arc", "kvo_reuse", "lru", "arc"]
VOCAB = 32000


@dataclass
class Result:
    policy: str
    requests: int
    prompt_tokens: int
    gpu_hit_tokens: int
    offload_queries: int
    offload_hit_tokens: int
    steps: int
    max_num_batched_tokens: int
    #: per step, schedule() + update_from_output(): CPU time of the engine thread (mean, p99)
    #: and wall time (mean)
    step_us_mean: float
    step_us_p99: float
    step_wall_us_mean: float
    wall_s: float

    @property
    def hit_ratio(self) -> float:
        return self.offload_hit_tokens / self.offload_queries if self.offload_queries else 0.0

    @property
    def saved_share(self) -> float:
        return self.offload_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prompts(path: Path, limit: int, block_tokens: int) -> list[tuple[str, list[int]]]:
    """``(request id, token ids)`` per trace request: one block of tokens per full trace
    block, seeded by its hash, then one token of the request's own."""
    out: list[tuple[str, list[int]]] = []
    cache: dict[bytes, list[int]] = {}
    for index, record in enumerate(read_trace(path, limit, block_tokens=block_tokens)):
        tokens: list[int] = []
        for key in record.keys:
            block = cache.get(key)
            if block is None:
                seed = int.from_bytes(key, "big")
                rng = np.random.default_rng(seed)
                block = cache[key] = rng.integers(1, VOCAB, block_tokens).tolist()
            tokens += block
        tokens.append(1 + index % (VOCAB - 1))
        out.append((record.req_id, tokens))
    return out


def kv_transfer_config(policy: str, cpu_bytes: int, offload_block_tokens: int) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "cpu_bytes_to_use": cpu_bytes,
        "block_size": offload_block_tokens,
        "eviction_policy": policy,
    }
    if policy.startswith("kvo_"):
        extra["cache_policy_module_path"] = "kv_offload_vllm.policies"
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def run(
    policy: str,
    requests: list[tuple[str, list[int]]],
    model_dir: Path,
    args: argparse.Namespace,
) -> Result:
    longest = max(len(tokens) for _, tokens in requests)
    gpu_blocks = max(args.gpu_blocks, -(-longest // args.gpu_block_size) + 1)
    cpu_bytes = args.cpu_blocks * args.offload_block_size * BYTES_PER_TOKEN
    flags = cli_args(
        model_dir,
        kv_transfer_config(policy, cpu_bytes, args.offload_block_size),
        block_size=args.gpu_block_size,
        gpu_blocks=gpu_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    engine = Engine(flags, check_bytes=False)
    step_times: list[float] = []
    started = time.perf_counter()
    try:
        pending = iter(requests)
        exhausted = False
        while True:
            while not exhausted and engine.scheduler.get_num_unfinished_requests() < args.in_flight:
                nxt = next(pending, None)
                if nxt is None:
                    exhausted = True
                    break
                engine.add(*nxt)
            if exhausted and not engine.busy():
                break
            before = engine.totals.schedule_cpu_seconds
            engine.step()
            step_times.append(engine.totals.schedule_cpu_seconds - before)
    finally:
        engine.shutdown()
    wall = time.perf_counter() - started
    t = engine.totals
    if t.finished != len(requests):
        raise RuntimeError(f"{policy}: {t.finished} of {len(requests)} requests finished")
    step_times.sort()
    return Result(
        policy=policy,
        requests=len(requests),
        prompt_tokens=t.prompt_tokens,
        gpu_hit_tokens=t.gpu_hit_tokens,
        offload_queries=t.connector_queries,
        offload_hit_tokens=t.connector_hit_tokens,
        steps=t.steps,
        max_num_batched_tokens=engine.vllm_config.scheduler_config.max_num_batched_tokens,
        step_us_mean=1e6 * statistics.fmean(step_times),
        step_us_p99=1e6 * step_times[int(0.99 * (len(step_times) - 1))],
        step_wall_us_mean=1e6 * t.schedule_seconds / t.steps,
        wall_s=wall,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--requests", type=int, default=3000, help="first N requests")
    parser.add_argument("--policy", action="append", help=f"default: {' '.join(POLICIES)}")
    parser.add_argument("--gpu-block-size", type=int, default=16, help="vLLM --block-size")
    parser.add_argument(
        "--gpu-blocks", type=int, default=8192, help="GPU KV blocks (at least the longest prompt's)"
    )
    parser.add_argument(
        "--offload-block-size",
        type=int,
        default=512,
        help="tokens per offloaded block (kv_connector_extra_config block_size)",
    )
    parser.add_argument(
        "--cpu-blocks",
        type=int,
        default=5000,
        help="offloaded blocks the CPU tier holds (cpu_bytes_to_use = blocks x their bytes)",
    )
    parser.add_argument(
        "--trace-block-tokens",
        type=int,
        default=512,
        help="tokens per trace block (Mooncake traces: 512)",
    )
    parser.add_argument("--in-flight", type=int, default=8, help="unfinished requests at most")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="vLLM's per-step token budget (default: vLLM's)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over the policies, alternating; each "
        "policy's fastest round is kept (hits are the same in every round)",
    )
    parser.add_argument(
        "--hash-seed",
        type=int,
        default=0,
        help="PYTHONHASHSEED the run uses (the script "
        "restarts itself with it): vLLM's block hashes and Python's set order of the keys "
        "depend on it, and with them a few blocks' hits",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != str(args.hash_seed):
        argv = list(sys.argv[1:] if argv is None else argv)
        env = {**os.environ, "PYTHONHASHSEED": str(args.hash_seed)}
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)
    try:
        import vllm.v1.core.sched.scheduler  # noqa: F401
    except Exception as exc:  # not installed, or no CPU torch
        print(
            f"vLLM 0.33 with a CPU torch is needed ({type(exc).__name__}: {exc}); "
            "see noxfile.py's vllm session"
        )
        return 0
    requests = prompts(args.trace, args.requests, args.trace_block_tokens)
    gc.collect()
    gc.freeze()  # the trace and vLLM's import graph: no collector passes over them per run
    best: dict[str, Result] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(tmp)
        for _ in range(args.repeat):
            for policy in args.policy or POLICIES:
                result = run(policy, requests, model_dir, args)
                kept = best.get(policy)
                if kept is not None and kept.offload_hit_tokens != result.offload_hit_tokens:
                    raise RuntimeError(f"{policy}: the hits differ between rounds")
                if kept is None or result.step_us_mean < kept.step_us_mean:
                    best[policy] = result
                print(f"{policy}: done in {result.wall_s:.0f} s", file=sys.stderr)
    results = list(best.values())
    if args.json:
        print(json.dumps([asdict(r) | {"hit_ratio": r.hit_ratio} for r in results], indent=2))
        return 0
    r0 = results[0]
    print(
        f"{r0.requests} requests, {r0.prompt_tokens:,} prompt tokens, PYTHONHASHSEED "
        f"{args.hash_seed}; GPU {args.gpu_blocks} x "
        f"{args.gpu_block_size} tokens, CPU tier {args.cpu_blocks} x {args.offload_block_size}"
        f" tokens, {args.in_flight} in flight, {r0.max_num_batched_tokens} tokens per step at most"
    )
    print(
        "| policy | offload hit ratio | prefill tokens saved | share of prompt | GPU hits |"
        " steps | CPU µs/step | CPU µs/step p99 | wall µs/step |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r.policy} | {r.hit_ratio:.4f} | {r.offload_hit_tokens:,} | "
            f"{r.saved_share:.4f} | {r.gpu_hit_tokens:,} | {r.steps:,} | "
            f"{r.step_us_mean:.0f} | {r.step_us_p99:.0f} | {r.step_wall_us_mean:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
