"""The chaos soak: a CPU -> fs -> Redis Cluster stack under a seeded fault schedule, every
invariant checked as it runs (see docs/soak.md).

    python tests/soak/run_soak.py --short            # CI: a few minutes
    python tests/soak/run_soak.py --ops 1000000      # nox -s soak: the full run

It starts its own ``redis-server`` processes (three masters, three replicas, loopback), puts
the fs tier on a small tmpfs where root may mount one, and stops everything it started, also
on failure. Exit status 0 only if every invariant held: no wrong byte, no lookup PENDING past
the bound, no pin, slot or job left after each drain, RSS bounded, and the hit ratio back
within 0.02 of the fault-free run within the stated number of requests after each fault.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "redis_tier")]

import kv_offload  # noqa: E402
from _redis_servers import PASSWORD, PASSWORD_ENV, RedisServer, start_cluster  # noqa: E402
from kv_offload import TieringOffloadingManager  # noqa: E402
from soak_driver import Engine, StepFigures, Workload  # noqa: E402
from soak_faults import KINDS, Environment, mount_small_disk, unmount  # noqa: E402

#: Seconds a lookup may stay PENDING: the stack's promotion_timeout_s plus one scheduler step
#: and a margin for a loaded 2-core machine.
PROMOTION_TIMEOUT_S = 2.0
PENDING_BOUND_S = PROMOTION_TIMEOUT_S + 3.0
#: Requests the hit ratio may take to come back within RECOVERY_MARGIN of the fault-free run.
RECOVERY_REQUESTS = 2500
RECOVERY_MARGIN = 0.02
WINDOW = 400
RSS_GROWTH_LIMIT = 512 << 20
BLOCK = 4096


def stack_config(fs_root: Path, nodes: list[RedisServer], seed: int) -> dict[str, Any]:
    seed_node = nodes[0]
    return {
        "num_blocks": 192,
        "block_size_bytes": BLOCK,
        "promotion_timeout_s": PROMOTION_TIMEOUT_S,
        "promotion_backoff_s": 0.2,
        "drain_timeout_s": 30.0,
        "hooks": {"autoload": False},
        "tiers": [
            {
                "type": "faulty",
                "name": "fs",
                "seed": seed,
                "inner": {"type": "fs", "root_dir": str(fs_root), "capacity_blocks": 1200},
            },
            {
                "type": "faulty",
                "name": "redis",
                "seed": seed + 1,
                "inner": {
                    "type": "redis",
                    "url": seed_node.url(),
                    "password_env": PASSWORD_ENV,
                    "cluster": True,
                    "startup_nodes": [n.address for n in nodes],
                    "namespace": f"soak-{seed}",
                    "timeout_s": 0.5,
                    "connect_timeout_s": 0.3,
                    "retry_after_s": 0.2,
                    "max_retry_after_s": 1.0,
                },
            },
        ],
    }


def build(config: dict[str, Any]) -> TieringOffloadingManager:
    manager = kv_offload.build_manager(config)
    assert isinstance(manager, TieringOffloadingManager)
    return manager


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def check_drained(manager: TieringOffloadingManager, where: str) -> None:
    """After a drain: no job in flight, no pinned or pending CPU block, slots add up."""
    manager.drain()
    stats = manager.get_stats()
    cpu = stats.cpu
    problems = []
    if stats.jobs_in_flight or stats.promotions_queued:
        problems.append(f"{stats.jobs_in_flight} jobs, {stats.promotions_queued} queued")
    if cpu.pinned_blocks or cpu.pending_blocks:
        problems.append(f"{cpu.pinned_blocks} pinned, {cpu.pending_blocks} pending blocks")
    if cpu.free_blocks + cpu.resident_blocks != cpu.capacity:
        problems.append(f"slots: {cpu.free_blocks} free + {cpu.resident_blocks} resident")
    if problems:
        raise AssertionError(f"after {where}: leaked " + "; ".join(problems))


class Soak:
    def __init__(self, args: argparse.Namespace, env: Environment, config: dict[str, Any]):
        self.args = args
        self.env = env
        self.config = config
        self.salt = args.seed.to_bytes(8, "big")
        self.workload = Workload(args.seed)
        self.engine = Engine(env.manager, self.salt)
        self.totals = StepFigures()
        self.requests = 0
        self.block_ops = 0
        self.rss_start = rss()
        self.rss_peak = self.rss_start
        self.report: dict[str, Any] = {"faults": {}, "recovery": {}}

    def run_requests(self, count: int) -> list[int]:
        """``count`` requests; each one's hit count and block count, for hit ratios."""
        hits = []
        for _ in range(count):
            keys = self.workload.next_request()
            figures = self.engine.request(keys, PENDING_BOUND_S)
            self._add(figures)
            hits.append((figures.hits, figures.blocks))
            if self.requests % 500 == 0:
                self.rss_peak = max(self.rss_peak, rss())
                if self.rss_peak - self.rss_start > RSS_GROWTH_LIMIT:
                    raise AssertionError(
                        f"RSS grew by {(self.rss_peak - self.rss_start) >> 20} MiB "
                        f"(bound {RSS_GROWTH_LIMIT >> 20} MiB)"
                    )
        return [h for h, _ in hits], [b for _, b in hits]  # type: ignore[return-value]

    def _add(self, f: StepFigures) -> None:
        t = self.totals
        t.blocks += f.blocks
        t.hits += f.hits
        t.verified += f.verified
        t.wrong += f.wrong
        t.stored += f.stored
        t.hook_errors += f.hook_errors
        t.pending_steps = max(t.pending_steps, f.pending_steps)
        t.pending_seconds = max(t.pending_seconds, f.pending_seconds)
        self.requests += 1
        self.block_ops += f.blocks + f.verified + f.stored  # lookups, loads, stores
        if f.wrong:
            raise AssertionError(f"{f.wrong} block(s) read back with wrong bytes")

    def ratio(self, count: int) -> float:
        hits, blocks = self.run_requests(count)
        return sum(hits) / max(1, sum(blocks))

    def baseline(self) -> float:
        self.run_requests(self.args.warmup)
        value = self.ratio(WINDOW * 3)
        self.report["baseline_hit_ratio"] = round(value, 4)
        return value

    def fault(self, name: str, baseline: float) -> None:
        kind = KINDS[name]
        kind.start(self.env)
        self.report["faults"][name] = self.report["faults"].get(name, 0) + 1
        try:
            self.run_requests(self.args.phase)
        finally:
            kind.clear(self.env)
        cleared = time.monotonic()
        done = 0
        window: list[tuple[int, int]] = []
        recovered = None
        while done < RECOVERY_REQUESTS:
            hits, blocks = self.run_requests(50)
            window.extend(zip(hits, blocks))
            window = window[-WINDOW:]
            done += 50
            if len(window) >= WINDOW:
                ratio = sum(h for h, _ in window) / max(1, sum(b for _, b in window))
                if ratio >= baseline - RECOVERY_MARGIN:
                    recovered = done
                    break
        check_drained(self.env.manager, f"fault {name}")
        entry = self.report["recovery"].setdefault(name, [])
        entry.append(
            {
                "requests": recovered,
                "seconds": round(time.monotonic() - cleared, 2),
            }
        )
        if recovered is None:
            raise AssertionError(
                f"after {name} cleared the hit ratio did not come back within "
                f"{RECOVERY_MARGIN} of {baseline:.3f} in {RECOVERY_REQUESTS} requests"
            )

    def process_kill(self) -> None:
        """Run the stack in a child process on the same fs root, SIGKILL it mid-run, and go
        on here: what the child wrote to fs and Redis is read back and checked."""
        self.env.manager.shutdown()
        seed = str(self.args.seed)
        config = json.dumps(self.config)
        command = [sys.executable, __file__, "--child", "--seed", seed, "--config", config]
        child = subprocess.Popen(command, env={**os.environ})
        time.sleep(self.args.child_seconds)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        self.report["faults"]["process_sigkill"] = (
            self.report["faults"].get("process_sigkill", 0) + 1
        )
        self.env.manager = build(self.config)
        self.engine = Engine(self.env.manager, self.salt)


def child_main(args: argparse.Namespace) -> None:
    """The engine process the soak kills: the same workload, forever (until SIGKILL)."""
    config = json.loads(args.config)
    manager = build(config)
    engine = Engine(manager, args.seed.to_bytes(8, "big"))
    workload = Workload(args.seed + 7)
    while True:
        engine.request(workload.next_request(), PENDING_BOUND_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="the CI variant (a few minutes)")
    parser.add_argument("--ops", type=int, default=None, help="block operations to reach")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--warmup", type=int, default=1500)
    parser.add_argument("--phase", type=int, default=300, help="requests per fault phase")
    parser.add_argument("--child-seconds", type=float, default=3.0)
    parser.add_argument("--max-seconds", type=float, default=None, help="wall-clock limit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ[PASSWORD_ENV] = PASSWORD
    if args.child:
        child_main(args)
        return 0
    ops_target = args.ops or (150_000 if args.short else 1_000_000)
    max_seconds = args.max_seconds or (420.0 if args.short else 3600.0)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kvo-soak-"))
    disk = work / "disk"
    mounted = mount_small_disk(disk, "16m")
    fs_root = (disk if mounted else work) / "kvo"
    nodes = start_cluster(work / "cluster", replicas=1)
    soak: Soak | None = None
    status = 1
    try:
        config = stack_config(fs_root, nodes, args.seed)
        env = Environment(build(config), nodes, fs_root, disk if mounted else None)
        soak = Soak(args, env, config)
        baseline = soak.baseline()
        order = list(KINDS)
        rng = random.Random(args.seed)
        cycle = 0
        # At least one cycle (every fault kind once, and the process kill), then more
        # cycles until the block operations reach the target or the time limit.
        while cycle == 0 or (
            soak.block_ops < ops_target and time.monotonic() - started < max_seconds
        ):
            rng.shuffle(order)
            for name in order:
                soak.fault(name, baseline)
            if cycle == 0 or not args.short:
                soak.process_kill()
                soak.run_requests(WINDOW)
            cycle += 1
        check_drained(soak.env.manager, "the soak")
        soak.env.manager.shutdown()
        status = 0
    finally:
        elapsed = time.monotonic() - started
        if soak is not None:
            t = soak.totals
            soak.report.update(
                {
                    "status": "passed" if status == 0 else "FAILED",
                    "seed": args.seed,
                    "seconds": round(elapsed, 1),
                    "requests": soak.requests,
                    "block_ops": soak.block_ops,
                    "blocks_verified": t.verified,
                    "wrong_bytes_blocks": t.wrong,
                    "max_pending_steps": t.pending_steps,
                    "max_pending_seconds": round(t.pending_seconds, 3),
                    "pending_bound_seconds": PENDING_BOUND_S,
                    "hook_errors_seen": t.hook_errors,
                    "rss_growth_mib": round((soak.rss_peak - soak.rss_start) / (1 << 20), 1),
                    "real_full_disk": mounted,
                }
            )
            text = json.dumps(soak.report, indent=2)
            print(text)
            if args.report is not None:
                args.report.write_text(text + "\n")
        for node in nodes:
            if node.process is not None and node.process.poll() is None:
                os.kill(node.process.pid, signal.SIGCONT)  # a SIGSTOPped one must stop too
            node.stop()
        if mounted:
            unmount(disk)
    return status


if __name__ == "__main__":
    sys.exit(main())
