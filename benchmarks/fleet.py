"""What a shared Redis tier buys a fleet (issue 25): N engines (default 4) replaying the bundled
trace, each with its own CPU tier, with and without a Redis tier they share, per router.

Each engine has a 1,250-block CPU tier (the fleet holds the 5,000 blocks of the default
stack between them). ``isolated``: nothing else, every engine on its own. ``shared redis``:
the same engines with one Redis tier (``capacity`` is the server's memory: ``maxmemory`` with
LRU eviction, sized to 20,000 blocks like the default stack's disk). Without ``--redis-url``
the benchmark starts a ``redis-server`` on a free loopback port for the run (the replay
command itself starts nothing).

    python benchmarks/fleet.py --engines 4 --speed 30 --router round-robin --router hash
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "conversation_trace.jsonl"
BLOCK = 4096


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(directory: Path, max_bytes: int) -> tuple[subprocess.Popen[bytes], str]:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
            "--maxmemory",
            str(max_bytes),
            "--maxmemory-policy",
            "allkeys-lru",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def fleet(config: Path, engines: int, router: str, speed: str, limit: int | None) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "kv_offload.cli", "replay", str(config), str(TRACE), "--json",
        "--no-progress", "--speed", speed, "--engines", str(engines), "--router", router,
    ]  # fmt: skip
    if limit:
        argv += ["--limit", str(limit)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--speed", default="30")
    parser.add_argument("--router", action="append")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--redis-url", help="a server to use instead of starting one")
    parser.add_argument("--capacity", type=int, default=20000, help="Redis tier, in blocks")
    args = parser.parse_args()
    routers = args.router or ["round-robin", "hash"]
    cpu_blocks = 5000 // args.engines
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        url = args.redis_url
        if url is None:
            # Each block is stored with its key and header: allow 10% over the payload.
            server, url = start_redis(Path(tmp), int(args.capacity * BLOCK * 1.1))
        try:
            isolated = Path(tmp) / "isolated.toml"
            isolated.write_text(f"num_blocks = {cpu_blocks}\nblock_size_bytes = {BLOCK}\n")
            shared = Path(tmp) / "shared.toml"
            shared.write_text(
                isolated.read_text()
                + f'[[tiers]]\ntype = "redis"\nurl = "{url}"\n'
                + f'namespace = "bench-{uuid.uuid4().hex[:8]}"\n'
            )
            rows = []
            for router in routers:
                for name, config in (("isolated", isolated), ("shared redis", shared)):
                    report = fleet(config, args.engines, router, args.speed, args.limit)
                    rows.append((router, name, report))
                    print(
                        f"{router:<12} {name:<13} hit ratio {report['hit_ratio']:.4f} "
                        f"(shared tier {report['shared_tier_share']:.4f}) "
                        f"in {report['seconds']:.0f} s",
                        flush=True,
                    )
                    if "redis" in name:  # the next router starts with an empty server
                        subprocess.run(
                            ["redis-cli", "-u", url, "FLUSHALL"], capture_output=True, check=False
                        )
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
    print()
    print(f"{args.engines} engines x {cpu_blocks} CPU blocks, --speed {args.speed}")
    print("| router | stack | hit ratio | from CPU | from Redis | per engine |")
    print("|---|---|---|---|---|---|")
    for router, name, report in rows:
        per = ", ".join(f"{e['hit_ratio']:.3f}" for e in report["engines"] if "hit_ratio" in e)
        print(
            f"| {router} | {name} | {report['hit_ratio']:.4f} | "
            f"{report['hit_ratio_by_tier']['CPU']:.4f} | {report['shared_tier_share']:.4f} | "
            f"{per} |"
        )


if __name__ == "__main__":
    main()
