"""What the Prometheus exporter (kv-offload-prometheus) costs a replay, per block.

The stack is the embedded default config (``kv-offload replay default``: a 5,000-block LRU CPU
tier with a KV buffer of 4 KiB blocks in front of the in-memory example tier, real bytes moved
and checked), replayed over the head of the bundled Mooncake trace (``--limit`` requests,
3000 by default). Four builds, each a fresh ``build_manager`` per run:

* ``no hook plugins``: ``[hooks] autoload = false``, the baseline;
* ``exporter``: ``[hooks] enable = ["prometheus"]`` with ``port = 0``: the exporter watches
  the manager and serves ``/metrics`` on 127.0.0.1, scraped over HTTP by a thread every
  ``--scrape-interval`` seconds (0.5 by default, 30x Prometheus' usual rate) during the run;
* ``exporter, no server``: ``[hooks] enable = ["prometheus"]`` without settings: the hooks'
  cost alone (no HTTP server, no scrapes);
* ``no hook plugins, A/A control``: the baseline again; its ratio to the first is the noise.

Runs are interleaved (each build once, in this order, then again, ``--repeat`` times, 5 by
default). Reported per build: the best time per block and its ratio to the baseline's best,
and the median over rounds of each round's ratio to that round's baseline. Target from the
issue: the exporter at most 15% more time per block.

Time is the process's CPU time around each replay (``--clock cpu``, the default): it includes
the exporter's server thread and the scraper thread (a raw HTTP GET, the body read and
dropped), not the time the process waits for a core on a shared machine. ``--clock wall``
times with ``perf_counter``.

    python benchmarks/prometheus_overhead.py [--limit 3000] [--repeat 5]
                                             [--scrape-interval 0.5] [--clock cpu|wall] [--json]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kv_offload import ReqContext, build_manager
from kv_offload.config import DEFAULT_CONFIG
from kv_offload.replay import ReplayResult, replay
from kv_offload.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / "data" / "conversation_trace.jsonl"
TARGET = 1.15

BUILDS: dict[str, dict[str, Any]] = {
    "no hook plugins": {"autoload": False},
    "exporter": {"enable": ["prometheus"], "prometheus": {"port": 0}},
    "exporter, no server": {"enable": ["prometheus"]},
    "no hook plugins, A/A control": {"autoload": False},
}


class Scraper(threading.Thread):
    """GETs ``/metrics`` every ``interval`` seconds until stopped; counts good scrapes."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.interval = interval
        self.stopped = threading.Event()
        self.scrapes = 0

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.scrape()

    def scrape(self) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
        finally:
            conn.close()
        if b"kv_offload_lookups_total" in body:
            self.scrapes += 1
        return body


def run_once(
    hooks: dict[str, Any],
    requests: list[tuple[ReqContext, list[Any]]],
    interval: float,
    clock: Callable[[], float],
) -> tuple[float, ReplayResult, int]:
    """One replay of one build: (seconds, result, scrapes that saw the manager)."""
    manager = build_manager({**DEFAULT_CONFIG, "hooks": hooks})
    exporter = manager.plugin_manager.get_plugin("prometheus")
    scraper = Scraper(exporter.port, interval) if exporter and exporter.port else None
    try:
        gc.collect()
        if scraper is not None:
            scraper.start()
        start = clock()
        result = replay(manager, requests, data_plane=True)
        seconds = clock() - start
        if scraper is not None:
            scraper.stopped.set()
            scraper.join()
            scraper.scrape()  # one more: the exporter still serves at the end
        return seconds, result, scraper.scrapes if scraper is not None else 0
    finally:
        manager.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--limit", type=int, default=3000, help="requests replayed per run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scrape-interval", type=float, default=0.5)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    requests = [(ReqContext(r.req_id), r.keys) for r in read_trace(args.trace, args.limit)]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    runs: dict[str, list[float]] = {label: [] for label in BUILDS}
    results: dict[str, ReplayResult] = {}
    scrapes: dict[str, int] = dict.fromkeys(BUILDS, 0)
    for _ in range(args.repeat):
        for label, hooks in BUILDS.items():
            seconds, result, scraped = run_once(hooks, requests, args.scrape_interval, clock)
            runs[label].append(seconds)
            results[label] = result
            scrapes[label] += scraped
    blocks = results["no hook plugins"].blocks
    base = runs["no hook plugins"]
    rows = []
    for label, times in runs.items():
        best = min(times)
        rows.append(
            dict(
                build=label,
                hit_ratio=results[label].hit_ratio,
                best_seconds=best,
                us_per_block=best / blocks * 1e6,
                ratio=best / min(base),
                median_paired_ratio=statistics.median(t / b for t, b in zip(times, base)),
                scrapes=scrapes[label],
                runs=times,
            )
        )
    exporter = next(r for r in rows if r["build"] == "exporter")
    verdict = exporter["ratio"] <= TARGET
    if args.json:
        doc = dict(
            trace=args.trace.name,
            requests=len(requests),
            blocks=blocks,
            repeat=args.repeat,
            clock=args.clock,
            scrape_interval=args.scrape_interval,
            target=TARGET,
            meets_target=verdict,
            rows=rows,
        )
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"trace: {args.trace.name}, {len(requests)} requests, {blocks} blocks; default stack "
        f"(CPU 5000 x 4 KiB + example tier, real bytes); best of {args.repeat} interleaved "
        f"runs, {args.clock} time; exporter scraped every {args.scrape_interval} s"
    )
    print(
        f"{'build':<29} {'hit ratio':>9} {'best s':>7} {'us/block':>8} {'x base':>7} "
        f"{'median':>7} {'scrapes':>7}"
    )
    for r in rows:
        print(
            f"{r['build']:<29} {r['hit_ratio']:>9.4f} {r['best_seconds']:>7.3f} "
            f"{r['us_per_block']:>8.2f} {r['ratio']:>7.3f} {r['median_paired_ratio']:>7.3f} "
            f"{r['scrapes']:>7}"
        )
    print(
        f"exporter: {exporter['ratio']:.3f}x the time per block of no hook plugins (target "
        f"<= {TARGET:.2f}: {'ok' if verdict else 'MISS'}); median of paired rounds "
        f"{exporter['median_paired_ratio']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
