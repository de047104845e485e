"""Redis tier throughput against a raw pipelined SET/GET loop with the same client, same run.

Starts its own ``redis-server`` on a free loopback port (throwaway config, no persistence) and
moves ``--blocks`` blocks of ``--block-kib`` KiB (default 256 x 256 KiB = 64 MiB) per round:

* cascade: ``RedisTier.submit_store`` of the batch (as ``--jobs`` jobs submitted at once, the
  way a step's cascades arrive), until ``get_finished`` reported every job;
* promotion: ``submit_load`` of the batch into other CPU rows (values checked, then copied);
* raw SET / raw GET: the same payloads through a ``redis.Redis`` pipeline of ``--batch``
  commands, single-threaded, twice: with redis-py's default packing (``bytes`` payloads, what a
  user writes) and with memoryview payloads on a :class:`~kv_offload_redis_tier.wire.ZeroCopyPool`
  (the fastest raw loop this client allows). The ratio is against the faster of the two.
* lookups/s: 20,000 keys asked through the tier's ``lookup``, one ``on_schedule_end`` flush,
  answered by one pipelined batch of ``EXISTS`` per 1,024 keys.

Rounds interleave tier and raw runs; best and median wall-clock GB/s are reported, and the
median CPU seconds this process spent per GB (all its threads: the client-side cost). Target:
cascade and promotion >= 0.8x raw. ``--no-hiredis`` hides the hiredis package (to measure what
it buys); without the flag the run also repeats itself in a child process with
``--no-hiredis`` and prints both.

``--auth`` adds a second tier with authenticated blocks (``auth_key_env``, a random secret,
keyed BLAKE3) in its own namespace, measured in the same rounds, interleaved with the plain
tier, and prints authenticated / plain for cascades and promotions (target >= 0.85x; the
hiredis child run is skipped). Use ``--blocks 32 --block-kib 2048`` for 2 MiB blocks.

    python benchmarks/redis_tier.py [--blocks 256] [--block-kib 256] [--rounds 7]
                                    [--jobs 4] [--batch 16] [--io-threads 2] [--no-hiredis]
                                    [--auth] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if "--no-hiredis" in sys.argv:
    sys.modules["hiredis"] = None  # type: ignore[assignment]  # redis-py then parses in Python

import numpy as np
import redis
from kv_offload import CPUKVBuffer, ReqContext, make_offload_key
from kv_offload.tiering import JobDirection, JobMetadata, OffloadingConfig, SecondaryTierFactory
from kv_offload_redis_tier import RedisTier
from kv_offload_redis_tier.wire import ZeroCopyPool
from redis.connection import HIREDIS_AVAILABLE

TARGET = 0.8
AUTH_TARGET = 0.85
AUTH_ENV = "KVO_BENCH_AUTH_SECRET"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            sys.exit("redis-server not found: apt-get install -y redis-server")
        self.port = free_port()
        config = directory / "redis.conf"
        config.write_text(
            f'port {self.port}\nbind 127.0.0.1\ndir {directory}\nsave ""\nappendonly no\n'
            f"maxmemory 2gb\nmaxmemory-policy allkeys-lru\nlogfile {directory / 'log'}\n"
        )
        self.process = subprocess.Popen([binary, str(config)])
        client = redis.Redis(port=self.port)
        for _ in range(500):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.01)
        client.close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def wait_all(tier: RedisTier, count: int) -> None:
    done = 0
    while done < count:
        results = tier.get_finished()
        if any(not r.success for r in results):
            raise RuntimeError(f"a job failed: {tier.get_stats()}")
        done += len(results)
        if done < count:
            time.sleep(0.001)  # an engine polls once per step; a tight spin would steal the GIL


def measure(args: argparse.Namespace, port: int) -> dict[str, Any]:
    block = args.block_kib * 1024
    n = args.blocks
    buffer = CPUKVBuffer(2 * n, block)
    rng = np.random.default_rng(0)
    buffer.array[:n] = rng.integers(0, 256, (n, block), dtype=np.uint8)

    def make_tier(**extra: Any) -> RedisTier:
        tier = SecondaryTierFactory.create_secondary_tier(
            {"type": "redis", "url": f"redis://127.0.0.1:{port}/0", "namespace": "bench",
             "batch_blocks": args.batch, "io_threads": args.io_threads, **extra},
            buffer.view,
            OffloadingConfig(2 * n, block),
        )  # fmt: skip
        assert isinstance(tier, RedisTier)
        return tier

    tier = make_tier()
    signed = None
    if args.auth:
        os.environ[AUTH_ENV] = os.urandom(32).hex()
        signed = make_tier(namespace="bench-auth", auth_key_env=AUTH_ENV)
    keys = [make_offload_key(i) for i in range(n)]
    per_job = -(-n // args.jobs)
    ctx = ReqContext(req_id="bench")
    job_id = [0]

    def jobs(direction: JobDirection, first_slot: int) -> list[JobMetadata]:
        out = []
        for start in range(0, n, per_job):
            slots = np.arange(first_slot + start, first_slot + min(n, start + per_job))
            out.append(JobMetadata(job_id[0], keys[start : start + per_job], slots, direction, ctx))
            job_id[0] += 1
        return out

    def cascade(tier: RedisTier) -> Callable[[], None]:
        def run() -> None:
            batch = jobs(JobDirection.STORE, 0)
            for job in batch:
                tier.submit_store(job)
            wait_all(tier, len(batch))

        return run

    def promote(tier: RedisTier) -> Callable[[], None]:
        def run() -> None:
            batch = jobs(JobDirection.LOAD, n)
            for job in batch:
                tier.submit_load(job)
            wait_all(tier, len(batch))

        return run

    payload_bytes = [buffer.array[i].tobytes() for i in range(n)]
    payload_views = [memoryview(buffer.array[i]) for i in range(n)]
    rkeys = [b"raw:%d" % i for i in range(n)]
    default = redis.Redis(port=port)
    zero_copy = redis.Redis(connection_pool=ZeroCopyPool(port=port))

    def raw_set(client: redis.Redis, values: list[Any]) -> Callable[[], None]:
        def run() -> None:
            for start in range(0, n, args.batch):
                pipe = client.pipeline(transaction=False)
                for i in range(start, min(n, start + args.batch)):
                    pipe.set(rkeys[i], values[i])
                pipe.execute()

        return run

    def raw_get(client: redis.Redis) -> Callable[[], None]:
        def run() -> None:
            for start in range(0, n, args.batch):
                pipe = client.pipeline(transaction=False)
                for i in range(start, min(n, start + args.batch)):
                    pipe.get(rkeys[i])
                pipe.execute()

        return run

    ops: dict[str, Callable[[], None]] = {
        "tier cascade": cascade(tier),
        "raw SET bytes": raw_set(default, payload_bytes),
        "raw SET zero-copy": raw_set(zero_copy, payload_views),
        "tier promotion": promote(tier),
        "raw GET": raw_get(default),
        "raw GET zero-copy": raw_get(zero_copy),
    }
    if signed is not None:
        ops["auth tier cascade"] = cascade(signed)
        ops["auth tier promotion"] = promote(signed)
    for op in ops.values():  # warm-up: connections, server memory
        op()
    times: dict[str, list[float]] = {name: [] for name in ops}
    cpu: dict[str, list[float]] = {name: [] for name in ops}
    for round_ in range(args.rounds):
        # Every other round in reverse order: no operation always runs on a warmer machine.
        order = list(ops.items())
        for name, op in reversed(order) if round_ % 2 else order:
            start, start_cpu = time.perf_counter(), time.process_time()
            op()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    if not np.array_equal(buffer.array[n:], buffer.array[:n]):
        raise RuntimeError("promoted rows differ from the cascaded ones")
    nbytes = n * block
    result: dict[str, Any] = {"hiredis": HIREDIS_AVAILABLE, "bytes_per_round": nbytes, "ops": {}}
    for name, secs in times.items():
        result["ops"][name] = {
            "best_gb_s": nbytes / min(secs) / 1e9,
            "median_gb_s": nbytes / statistics.median(secs) / 1e9,
            # this process's CPU seconds (all threads) per GB moved: the client's cost,
            # much less sensitive to other processes than wall time
            "cpu_s_per_gb": statistics.median(cpu[name]) / (nbytes / 1e9),
        }
    ops_out = result["ops"]
    for tier_op, raws in (
        ("tier cascade", ("raw SET bytes", "raw SET zero-copy")),
        ("tier promotion", ("raw GET", "raw GET zero-copy")),
    ):
        for stat in ("best_gb_s", "median_gb_s"):
            raw = max(ops_out[r][stat] for r in raws)
            ops_out[tier_op][f"ratio_{stat[:-5]}"] = ops_out[tier_op][stat] / raw
    if signed is not None:
        if signed.get_stats()["auth_failures"]:
            raise RuntimeError("authenticated blocks failed their check")
        result["auth_vs_plain"] = {
            op: ops_out[f"auth tier {op}"]["median_gb_s"] / ops_out[f"tier {op}"]["median_gb_s"]
            for op in ("cascade", "promotion")
        }
        result["auth_vs_plain_best"] = {
            op: ops_out[f"auth tier {op}"]["best_gb_s"] / ops_out[f"tier {op}"]["best_gb_s"]
            for op in ("cascade", "promotion")
        }
        signed.shutdown()
    result["lookups_per_s"] = lookups_per_s(tier, args)
    tier.shutdown()
    default.close()
    zero_copy.close()
    buffer.close()
    return result


def lookups_per_s(tier: RedisTier, args: argparse.Namespace) -> dict[str, float]:
    """Fresh keys each round (half stored), asked, flushed once, answered."""
    rates = []
    count = 20_000
    for round_ in range(max(3, args.rounds // 2)):
        keys = [make_offload_key(1_000_000 * (round_ + 1) + i) for i in range(count)]
        ctx = ReqContext(req_id=f"lookups-{round_}")
        start = time.perf_counter()
        for k in keys:
            tier.lookup(k, ctx)
        tier.on_schedule_end()
        if not tier.settle_lookups(60.0):
            raise RuntimeError("lookups did not resolve")
        answered = sum(tier.lookup(k, ctx) is not None for k in keys)
        rates.append(count / (time.perf_counter() - start))
        if answered != count:
            raise RuntimeError(f"{count - answered} lookups unanswered")
        tier.on_request_finished(ctx)
    return {"best": max(rates), "median": statistics.median(rates)}


def report(result: dict[str, Any]) -> None:
    print(
        f"hiredis {'on' if result['hiredis'] else 'off'}: "
        f"{result['bytes_per_round'] / 2**20:.0f} MiB per round"
    )
    for name, row in result["ops"].items():
        ratio = ""
        if "ratio_best" in row:
            verdict = "ok" if row["ratio_best"] >= TARGET else "BELOW TARGET"
            ratio = (
                f"  {row['ratio_best']:.2f}x / {row['ratio_median']:.2f}x raw "
                f"(best / median; target >= {TARGET}: {verdict})"
            )
        best, median = row["best_gb_s"], row["median_gb_s"]
        cost = row["cpu_s_per_gb"]
        print(f"  {name:24s} best {best:.3f} GB/s  median {median:.3f}  cpu {cost:.2f} s/GB{ratio}")
    lk = result["lookups_per_s"]
    print(f"  {'lookups (EXISTS)':24s} best {lk['best']:,.0f}/s  median {lk['median']:,.0f}/s")
    for op, ratio in result.get("auth_vs_plain", {}).items():
        best = result["auth_vs_plain_best"][op]
        verdict = "ok" if ratio >= AUTH_TARGET else "BELOW TARGET"
        print(
            f"  authenticated / plain {op}: {ratio:.2f}x median, {best:.2f}x best "
            f"(target >= {AUTH_TARGET}: {verdict})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=256)
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--io-threads", type=int, default=2, help="the tier's io_threads")
    parser.add_argument("--no-hiredis", action="store_true")
    parser.add_argument("--auth", action="store_true", help="also an authenticated tier")
    parser.add_argument("--port", type=int, help="use this running server (no password)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvo-redis-bench-") as tmp:
        server = None if args.port else Server(Path(tmp))
        port = args.port or (server.port if server else 0)
        try:
            results = [measure(args, port)]
            if not args.no_hiredis and not args.auth and results[0]["hiredis"]:
                child = subprocess.run(
                    [sys.executable, __file__, *(argv or sys.argv[1:]), "--no-hiredis",
                     "--json", "--port", str(port)],
                    capture_output=True, text=True, check=True, env={**os.environ},
                )  # fmt: skip
                results.append(json.loads(child.stdout))
        finally:
            if server is not None:
                server.stop()
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
        return 0
    for result in results:
        report(result)
    if len(results) == 2:
        on, off = results[0]["ops"], results[1]["ops"]
        for name in ("tier cascade", "tier promotion"):
            print(
                f"hiredis on/off, {name}: {on[name]['median_gb_s'] / off[name]['median_gb_s']:.2f}x"
                " (medians)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
